"""The one diagnosis pipeline: read (`tpudiag.inputs`) -> analyse -> join -> rules -> report.

`diagnose()` is what every command (`report`, `diff`, `check`, `tui`, `lab`) and a notebook call;
`compare()` runs it on two inputs for `diff` and `check`. Inputs:

- a capture (logdir, run directory or `.xplane.pb`), optionally with compiler dumps (`dumps=`);
- compiler dumps alone (an XLA dump, an LLO dump, both, or a `tpudiag compile` output): the
  static mode. The program is laid out on a modelled timeline from the compiler's own estimate
  (cycles at the stated clock, else the FLOPs/bytes roofline; `tpudiag.compiler.simulate`) and
  every rule that has its inputs runs on it; savings are labelled `compiler estimate`, but one in
  bytes, modelled from the buffers. When the TPU generation is unknown (no target file, no
  `chip=`), no timeline can be modelled: the rules that need only the dumps (spills) still run and
  the others are skipped with the reason.

Each stage returns a frozen value: `Inputs` (every file read once, the chip decided once),
`Analysed` (measured, or modelled in memory in static mode), `JoinResult`, the findings and the
`Report`. Warnings are gathered once, into the report (`tpudiag.report_builder`), so every command
shows the same ones for the same inputs.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from tpudiag import arguments
from tpudiag.analysis.join import HloSource, JoinResult, join_compiled
from tpudiag.analysis.profile_analysis import Analysis, analyze
from tpudiag.errors import InputError, UsageError
from tpudiag.model.findings import Finding
from tpudiag.model.allocator import HostMemoryTimeline
from tpudiag.model.profile import HostFailure
from tpudiag.inputs import READING, Inputs, read_inputs
from tpudiag.model.hardware import CHIP_NAMES, ChipChoice, ChipSpec
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.memory import MemoryReport, OomError
from tpudiag.model.report import Mode, Report, RuleSkip
from tpudiag.parsers.dump_dir import load_dumps
from tpudiag.report_builder import build_report, dump_only_report

if TYPE_CHECKING:  # typing only: keep `import tpudiag.pipeline` free of the compiler and diff modules
    from tpudiag.analysis.cost_model import ProgramEstimate
    from tpudiag.analysis.diff import Diff as AnalysisDiff
    from tpudiag.analysis.diff import NoiseOptions
    from tpudiag.compiler.static_report import StaticReport

STAGES = (READING, "analysing steps and ops", "running the rules", "building the report")


@dataclass(frozen=True)
class Diagnosis:
    """Everything one diagnosis found; `report` is what every renderer takes.

    mode: `Mode.TRACE` (a capture, measured) or `Mode.STATIC` (compiler dumps alone; times are the
    compiler's estimate on a modelled timeline). `analysis` is None only in static mode when no
    timeline could be modelled (unknown TPU generation). `static` is the per-op static report of
    a compiler dump (None for a capture, or when no program could be read). `input_path`, `mode`,
    `compiled` and `chip` (the one chip every stage used, and its source) are `inputs`'.
    """

    inputs: Inputs  # what was read (`tpudiag.inputs`), once
    analysis: Analysis | None
    join: JoinResult | None
    findings: tuple[Finding, ...]
    skipped: tuple[RuleSkip, ...]
    warnings: tuple[str, ...]
    report: Report
    static: StaticReport | None = None
    rules_run: tuple[str, ...] = ()  # the selected rules that had their inputs and ran (`skipped`: the others)

    @property
    def input_path(self) -> str:
        return self.inputs.path

    @property
    def mode(self) -> Mode:
        return self.inputs.mode

    @property
    def compiled(self) -> CompiledInputs:
        return self.inputs.compiled

    @property
    def chip(self) -> ChipChoice:
        return self.inputs.chip

    def ops_frame(self) -> pd.DataFrame:
        """One row per op (as the report lists them, slowest first), compiled facts included."""
        from tpudiag.model.report import OpRow

        cols = [f.name for f in OpRow.__dataclass_fields__.values()]
        return pd.DataFrame([[getattr(o, c) for c in cols] for o in self.report.ops], columns=cols)

    def steps_frame(self) -> pd.DataFrame:
        """One row per (host, core, step): start, duration and the breakdown (`schemas.STEPS`)."""
        from tpudiag.model import schemas

        return self.analysis.steps.copy() if self.analysis is not None else schemas.STEPS.empty()

    def memory_over_time(self) -> list[HostMemoryTimeline]:
        """Per host file, each allocator's peak, timeline and live set at the peak, where the capture
        traced its allocator (`tpudiag memory PATH`); [] for compiler dumps. Read in the diagnosis's
        own pass over the host files with `diagnose(..., memory_timeline=True)`, else anew here."""
        return self.memory_timelines()[0]

    def memory_timelines(self) -> tuple[list[HostMemoryTimeline], list[HostFailure]]:
        """`memory_over_time()` and the host files whose allocator events could not be read."""
        from tpudiag.analysis.memory_timeline import capture_memory_timelines, profile_memory_timelines

        if self.mode is not Mode.TRACE or self.analysis is None:
            return [], []
        read = profile_memory_timelines(self.analysis.profile)
        return read if read is not None else capture_memory_timelines(self.input_path)

    def memory(self) -> MemoryReport:
        """The device memory of the compiled programs (`tpudiag memory`): peaks, live buffers, levers."""
        from tpudiag.analysis.device_memory import memory_report

        return memory_report(self.input_path, self.compiled, self.compiled.oom_errors, programs=self.report.memory)

    def write_trace(self, path: Path | str):
        """Write the device timeline of the analysed steps, with the findings marked on their ops, as
        Chrome trace-event JSON for Perfetto (`tpudiag report --trace-out`; `render.trace_events`).
        Returns what was written (`TraceSummary`); a UsageError when there is no timeline (compiler
        dumps of an unknown generation) or `path` is an input or inside one."""
        from tpudiag.render.trace_events import write_trace

        if self.analysis is None:
            raise UsageError("no timeline to export: the TPU generation of these dumps is unknown",
                             hint="pass --chip with the generation they were compiled for")
        local = "://" not in self.input_path  # a URL has no directory here to protect
        return write_trace(self.analysis, self.findings, Path(path), [Path(self.input_path)] if local else [])

    def findings_frame(self) -> pd.DataFrame:
        """One row per finding: rule, code, severity, message, saving and its basis, fix, ops and
        their sites (`op: file.py:LINE, JAX op name`, `; `-separated)."""
        rows = [{"rule": f.rule, "code": f.code, "severity": f.severity.label(), "message": f.message,
                 "saving_ps": f.saving.ps, "saving_basis": f.saving.basis,
                 "saving_explanation": f.saving.explanation, "fix": f.fix,
                 "host": f.host, "ops": ", ".join(f.ops),
                 "sites": "; ".join(f"{s.op}: {s.label()}" for s in f.sites)} for f in self.findings]
        return pd.DataFrame(rows, columns=["rule", "code", "severity", "message", "saving_ps", "saving_basis",
                                           "saving_explanation", "fix", "host", "ops", "sites"])


@dataclass(frozen=True)
class Diff:
    """Two diagnoses and the noise-aware comparison of their analyses (`tpudiag.analysis.diff`)."""

    base: Diagnosis
    new: Diagnosis
    result: AnalysisDiff  # its `warnings` include both inputs' diagnosis warnings, prefixed base:/new:


def _hlo_sources(compiled: CompiledInputs) -> list[HloSource]:
    """The join's sources: dump programs first (their bytes win), then the capture's own."""
    from tpudiag.parsers.hlo_program import instruction_bytes

    return [HloSource(h.program, instruction_bytes(h.program), h.origin, h.generation)
            for h in (*compiled.hlo, *compiled.embedded)]


def _rules_config(path: Path | None, config, select, ignore):
    from tpudiag.rules import RulesConfig, load_config

    if isinstance(config, RulesConfig):
        rules_config = config
    else:
        rules_config = load_config(path, config)
    rules_config = rules_config.with_cli(select, ignore)
    rules_config.resolve()  # option errors are usage errors: report them before reading the input
    return rules_config


def check_diagnose_arguments(kwargs: dict, where: str = "tpudiag.diagnose") -> dict:
    """`diagnose()`'s keyword arguments (and `path`) checked: a `UsageError` naming the first wrong
    one, an unknown name included; returns them normalised (`dumps` a list of paths, `select` and
    `ignore` lists, numbers as floats), so a generator is read once, here. `tpudiag.profile()`
    calls it when it is called, for the diagnosis it makes after its block."""
    from tpudiag.rules import RulesConfig

    arguments.check_keywords(kwargs, _DIAGNOSE_ARGUMENTS, where)
    out = dict(kwargs)
    checks = {
        "path": arguments.check_path, "dumps": arguments.check_dumps, "chip": arguments.check_chip,
        "jobs": arguments.check_jobs, "progress": arguments.check_progress, "clock_ghz": arguments.check_clock_ghz,
        "config": lambda v: arguments.check_config(v, RulesConfig),
        "select": lambda v: arguments.check_rule_names(v, "select"),
        "ignore": lambda v: arguments.check_rule_names(v, "ignore"),
        "scheduler": arguments.check_scheduler, "error": arguments.check_error_text,
        "memory_timeline": lambda v: arguments.check_flag(v, "memory_timeline"),
    }
    for name, value in kwargs.items():
        checked = checks[name](value)
        if name != "chip":  # the caller's own value travels on: `diagnose` decides the ChipSpec
            out[name] = checked
    return out


def diagnose(path: Path | str | None = None, *, dumps: Iterable[Path | str] = (), config=None,
             chip: str | ChipSpec | None = None, jobs: int | None = None,
             progress: Callable[[str], None] | None = None, select: str | Sequence[str] | None = None,
             ignore: str | Sequence[str] | None = None, clock_ghz: float | None = None,
             scheduler=None, error: str | None = None, memory_timeline: bool = False) -> Diagnosis:
    """Diagnose a capture, a capture with compiler dumps, or compiler dumps alone.

    path: a logdir, run directory or `.xplane.pb`; or a compiler dump directory (static mode);
      or an fsspec URL of a capture (`gs://bucket/logdir`, with the cloud extra);
      None: the bundled example and its dumps.
    dumps: a compiler dump directory, or an iterable of them, joined to a capture's ops and given
      to the rules (a single str or PathLike is one directory).
    config: a rule configuration file (TOML) or a `RulesConfig`; None looks next to the input.
    chip: the TPU generation (`v4`, `v5e`, `v5p`, `v6e`, `tpu7x`) where the files do not say it.
    jobs: processes parsing host files (at least 1; None: one per CPU).
    progress: called with a short text at each stage (and per host file while reading).
    select / ignore: rule names or codes, as `--select` / `--ignore`.
    clock_ghz: static mode: the clock (positive, finite) turning estimated cycles into time (else
      the public one, else the FLOPs/bytes roofline).
    scheduler: a Dask distributed scheduler address (`tcp://host:8786`) or `distributed.Client`:
      the hosts are parsed as tasks on that cluster, whose workers read the files themselves.
    error: the text of a `RESOURCE_EXHAUSTED` error from JAX (`--error FILE`): joined to the
      compiled program, for the `hbm-pressure` rule and the memory view.
    memory_timeline: a capture's allocator events are read too, in the same pass over each host
      file, for `Diagnosis.memory_over_time()` (`tpudiag memory PATH`).

    Raises the project's errors (`tpudiag.errors`) for unreadable inputs and bad options: an
    argument of the wrong type or value is a `UsageError` naming it (`tpudiag.arguments`).
    """
    from tpudiag.examples_data import bundled_capture, bundled_dumps
    from tpudiag.parsers.capture_files import HostUrl, as_location
    from tpudiag.rules import run_rules

    args = check_diagnose_arguments(dict(path=path, dumps=dumps, config=config, chip=chip, jobs=jobs,
                                         progress=progress, select=select, ignore=ignore, clock_ghz=clock_ghz,
                                         scheduler=scheduler, error=error, memory_timeline=memory_timeline))
    path, dumps, jobs, progress, clock_ghz = args["path"], args["dumps"], args["jobs"], args["progress"], args["clock_ghz"]
    bundled = path is None
    if path is None:
        path = bundled_capture()
        dumps = dumps or list(bundled_dumps())
    path = as_location(path)
    remote = isinstance(path, HostUrl)  # a URL: no config file beside it, and no compiler dump directory
    chip_spec = arguments.check_chip(chip)
    oom_errors = parse_error_text(error)
    rules_config = _rules_config(None if remote else path, config, args["select"], args["ignore"])
    inputs = read_inputs(path, dumps, chip_spec, oom_errors=oom_errors, jobs=jobs, progress=progress,
                         scheduler=scheduler, memory_timeline=args["memory_timeline"])
    if bundled and oom_errors:  # the bundled example is nobody's program: an --error text stands alone
        inputs = replace(inputs, compiled=replace(inputs.compiled, oom_errors_joinable=False))
    _stage(progress, 1)
    analysed = _analyse(inputs, clock_ghz)
    join = _join(analysed.analysis, inputs.compiled, inputs.chip)
    _stage(progress, 2)
    memory = _memory(inputs, _near_fraction(rules_config), analysed.analysis)
    findings, skipped = run_rules(analysed.analysis, rules_config, inputs.compiled, join=join,
                                  static=inputs.mode is Mode.STATIC, memory=memory)
    _stage(progress, 3)
    report = _report(inputs, analysed, join, findings, tuple(skipped), memory, rules_config.warnings)
    skipped_names = {s.rule for s in skipped}
    ran = tuple(rule.name for rule, _ in rules_config.resolve() if rule.name not in skipped_names)
    return Diagnosis(inputs=inputs, analysis=analysed.analysis, join=join, findings=report.findings,
                     skipped=tuple(skipped), warnings=report.warnings, report=report, static=analysed.static,
                     rules_run=ran)


_DIAGNOSE_ARGUMENTS = ("path", "dumps", "config", "chip", "jobs", "progress", "select", "ignore", "clock_ghz",
                       "scheduler", "error", "memory_timeline")


def parse_error_text(error: str | None) -> tuple[OomError, ...]:
    """`--error`: the out-of-memory error in a JAX error text; a text without one is a usage error."""
    if error is None:
        return ()
    from tpudiag.parsers.oom_error import OomSizeError, parse_oom_error

    try:
        parsed = parse_oom_error(error)
    except OomSizeError as exc:
        raise UsageError(f"--error: {exc}", hint="pass the error text JAX printed, unedited") from exc
    if parsed is None:
        raise UsageError("--error: no out-of-memory message (`RESOURCE_EXHAUSTED: Ran out of memory ...`) in the text",
                         hint="pass the error JAX printed when the compile or run failed")
    return (parsed,)


def _stage(progress: Callable[[str], None] | None, i: int) -> None:
    if progress is not None:
        progress(STAGES[i])


@dataclass(frozen=True)
class Analysed:
    """The analysis stage's value: the capture's analysis, measured, or in static mode the one of
    the program's modelled timeline and its static report; `warnings` lead the report's own."""

    analysis: Analysis | None  # None: static mode with no timeline (`Inputs.no_timeline`)
    static: StaticReport | None
    warnings: tuple[str, ...]


def _analyse(inputs: Inputs, clock_ghz: float | None) -> Analysed:
    if inputs.capture is not None:
        return Analysed(analyze(inputs.capture, per_step=inputs.per_step), None, inputs.warnings)
    if inputs.program is None:
        return Analysed(None, None, inputs.warnings)
    from tpudiag.analysis.cost_model import estimate_program
    from tpudiag.compiler.static_report import build_static_report

    estimate = estimate_program(inputs.program, clock_ghz)  # once, for the static report and the timeline
    static = build_static_report(inputs.program, estimate=estimate)
    return Analysed(_modelled_analysis(inputs, estimate), static, (*inputs.warnings, *static.warnings))


def _modelled_analysis(inputs: Inputs, estimate: ProgramEstimate) -> Analysis:
    """The compiled program on a modelled timeline (`tpudiag simulate`, kept in memory), analysed
    like a capture."""
    from tpudiag.compiler.simulate import RUN_NAME, simulate_in_memory
    from tpudiag.parsers.capture import profile_from_xspace

    modelled = simulate_in_memory(inputs.program, roofline_without_clock=True, estimate=estimate)
    return analyze(profile_from_xspace(modelled.xspace, inputs.path, RUN_NAME))


def _join(analysis: Analysis | None, compiled: CompiledInputs, choice: ChipChoice) -> JoinResult | None:
    """The compiled facts of each op (None without a timeline), set on the analysis too, since the
    rules and the report read them there."""
    if analysis is None:
        return None
    analysis.join = join_compiled(analysis.ops, _hlo_sources(compiled), compiled.llo, chip=choice.spec,
                                  chip_source=choice.source)
    return analysis.join


def _memory(inputs: Inputs, near_fraction: float, analysis=None) -> tuple:
    """The device memory of the compiled programs, for the memory rules and the report's memory
    section, with a GPU capture's memory size as their HBM's. A compile output read as the modelled
    program is not read again."""
    from tpudiag.analysis.device_memory import program_memories, with_gpu_memory

    program = inputs.program
    outputs = {program.path: program} if program is not None and not program.bare else {}
    memory = program_memories(inputs.compiled, inputs.compiled.oom_errors, outputs=outputs, near_fraction=near_fraction)
    gpu = analysis.profile.hosts[0].device.gpu if analysis is not None and analysis.profile.hosts else None
    return with_gpu_memory(memory, gpu.memory_bytes) if gpu is not None else memory


def _near_fraction(rules_config) -> float:
    """hbm-pressure's `near_fraction` as configured: levers are offered from it on (the memory
    view follows the rule even when the rule is not selected)."""
    from tpudiag.rules.hbm_pressure import NAME, Options

    try:
        return Options(**dict(rules_config.options.get(NAME, {}))).near_fraction
    except (TypeError, ValueError):
        return Options().near_fraction  # a bad option is reported by the rule's own resolve


def _report(inputs: Inputs, analysed: Analysed, join: JoinResult | None, findings, skipped: tuple[RuleSkip, ...],
            memory: tuple, config_warnings: Sequence[str]) -> Report:
    """The report stage: every warning joins the report's one list here (`report_builder`)."""
    from tpudiag.analysis.device_memory import join_warnings
    from tpudiag.analysis.kernels import pallas_kernels

    extra = (*analysed.warnings, *join_warnings(inputs.compiled.oom_errors, memory,
                                                inputs.compiled.oom_errors_joinable))
    if analysed.analysis is None:
        report = dump_only_report(Path(inputs.path), inputs.compiled, findings, skipped, extra, config_warnings)
    else:
        # A modelled timeline's profile already names the input (`_modelled_analysis`).
        report = build_report(analysed.analysis, tuple(findings), rules_skipped=skipped, dumps=inputs.compiled.labels,
                              join=join, extra_warnings=extra, config_warnings=config_warnings,
                              mode=inputs.mode)
    return replace(report, memory=memory, kernels=pallas_kernels(inputs.compiled, memory))


def compare(base: Path | str, new: Path | str, *, base_dumps: Iterable[Path | str] = (),
            new_dumps: Iterable[Path | str] = (), config=None, chip: str | ChipSpec | None = None,
            jobs: int | None = None, clock_ghz: float | None = None,
            noise: NoiseOptions | None = None, scheduler=None) -> Diff:
    """Diagnose `base` and `new` and compare them beyond run-to-run noise (`tpudiag diff`).

    A compiler dump or `tpudiag compile` output is compared through its modelled timeline (static
    mode); the result then says the run is modelled. The result's warnings hold both diagnoses'
    warnings (prefixed `base:` / `new:`), so `diff` shows what `report` shows for the same input.
    """
    from tpudiag.analysis.diff import NoiseOptions

    # Checked before either input is read: a bad argument must not cost a whole diagnosis first.
    arguments.check_path(base, "base")
    arguments.check_path(new, "new")
    base_dumps = arguments.check_dumps(base_dumps, "base_dumps")  # a generator is read once, here
    new_dumps = arguments.check_dumps(new_dumps, "new_dumps")
    check_diagnose_arguments(dict(config=config, chip=chip, jobs=jobs, clock_ghz=clock_ghz, scheduler=scheduler),
                             "tpudiag.compare")
    arguments.check_instance(noise, "noise", NoiseOptions, "a NoiseOptions")
    b = diagnose(base, dumps=base_dumps, config=config, chip=chip, jobs=jobs, clock_ghz=clock_ghz,
                 scheduler=scheduler)
    n = diagnose(new, dumps=new_dumps, config=config, chip=chip, jobs=jobs, clock_ghz=clock_ghz,
                 scheduler=scheduler)
    return compare_diagnoses(b, n, noise)


def compare_diagnoses(b: Diagnosis, n: Diagnosis, noise: NoiseOptions | None = None) -> Diff:
    """`compare` of two diagnoses already made (`tpudiag whatif` diagnoses its baseline once)."""
    from tpudiag.analysis.diff import NoiseOptions, diff_analyses

    for d in (b, n):
        if d.analysis is None:
            raise InputError("no timeline to compare: the TPU generation of these dumps is unknown",
                             path=d.input_path, hint="pass --chip with the generation they were compiled for")
    result = diff_analyses(b.analysis, n.analysis, list(b.findings), list(n.findings), noise or NoiseOptions(),
                           base_compiled=b.join.columns if b.join is not None else None,
                           new_compiled=n.join.columns if n.join is not None else None,
                           base_programs=b.join.programs if b.join is not None else None,
                           new_programs=n.join.programs if n.join is not None else None)
    warnings = [*result.warnings, *(f"base: {w}" for w in b.warnings), *(f"new: {w}" for w in n.warnings)]
    return Diff(base=b, new=n, result=replace(result, warnings=tuple(dict.fromkeys(warnings))))


__all__ = ["CHIP_NAMES", "Diagnosis", "Diff", "compare", "diagnose", "load_dumps"]
