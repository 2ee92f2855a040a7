"""The one diagnosis pipeline: input -> analysis -> compiled join -> rules -> report.

`diagnose()` is what every command (`report`, `diff`, `check`, `tui`, `lab`) and a notebook call;
`compare()` runs it on two inputs for `diff` and `check`. Inputs:

- a capture (logdir, run directory or `.xplane.pb`), optionally with compiler dumps (`dumps=`);
- compiler dumps alone (an XLA dump, an LLO dump, both, or a `tpudiag compile` output): the
  static mode. The program is laid out on a modelled timeline from the compiler's own estimate
  (cycles at the stated clock, else the FLOPs/bytes roofline; `tpudiag.compiler.simulate`) and
  every rule that has its inputs runs on it; savings are labelled `compiler estimate`. When the
  TPU generation is unknown (no target file, no `chip=`), no timeline can be modelled: the rules
  that need only the dumps (spills) still run and the others are skipped with the reason.

Warnings are gathered once, into the report (`tpudiag.report_builder`), so every command shows the
same ones for the same inputs.
"""

from __future__ import annotations

import tempfile
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
from tpudiag.model.hardware import CHIP_NAMES, ChipChoice, ChipSource, ChipSpec, decide_chip
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.memory import MemoryReport, OomError
from tpudiag.model.report import Mode, Report, RuleSkip
from tpudiag.report_builder import build_report, dump_only_report

if TYPE_CHECKING:  # typing only: keep `import tpudiag.pipeline` free of the compiler and diff modules
    from tpudiag.analysis.diff import Diff as AnalysisDiff
    from tpudiag.analysis.diff import NoiseOptions
    from tpudiag.compiler.static_report import StaticReport

STAGES = ("reading host files", "analysing steps and ops", "running the rules", "building the report")


@dataclass(frozen=True)
class Diagnosis:
    """Everything one diagnosis found; `report` is what every renderer takes.

    mode: `Mode.TRACE` (a capture, measured) or `Mode.STATIC` (compiler dumps alone; times are the
    compiler's estimate on a modelled timeline). `analysis` is None only in static mode when no
    timeline could be modelled (unknown TPU generation). `static` is the per-op static report of
    a compiler dump (None for a capture, or when no program could be read).
    """

    input_path: str
    mode: Mode
    analysis: Analysis | None
    compiled: CompiledInputs
    join: JoinResult | None
    findings: tuple[Finding, ...]
    skipped: tuple[RuleSkip, ...]
    warnings: tuple[str, ...]
    report: Report
    static: StaticReport | None = None
    chip: ChipChoice = ChipChoice(None, ChipSource.UNKNOWN)  # the one chip every stage used, and its source

    def ops_frame(self) -> pd.DataFrame:
        """One row per op (as the report lists them, slowest first), compiled facts included."""
        from tpudiag.model.report import OpRow

        cols = [f.name for f in OpRow.__dataclass_fields__.values()]
        return pd.DataFrame([vars(o) for o in self.report.ops], columns=cols)

    def steps_frame(self) -> pd.DataFrame:
        """One row per (host, core, step): start, duration and the breakdown (`schemas.STEPS`)."""
        from tpudiag.model import schemas

        return self.analysis.steps.copy() if self.analysis is not None else schemas.STEPS.empty()

    def memory_over_time(self) -> list[HostMemoryTimeline]:
        """Per host file, each allocator's peak, timeline and live set at the peak, where the capture
        traced its allocator (`tpudiag memory PATH`); [] for compiler dumps. Reads the host planes anew."""
        from tpudiag.analysis.memory_timeline import capture_memory_timelines

        return capture_memory_timelines(self.input_path)[0] if self.mode is Mode.TRACE else []

    def memory(self) -> MemoryReport:
        """The device memory of the compiled programs (`tpudiag memory`): peaks, live buffers, levers."""
        from tpudiag.compiler.memory import memory_report

        return memory_report(self.input_path, self.compiled, self.compiled.oom_errors, programs=self.report.memory)

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


def parse_chip(chip: str | ChipSpec | None) -> ChipSpec | None:
    """`--chip` / `chip=` as a ChipSpec; a name not in `CHIP_NAMES` is a usage error."""
    return arguments.check_chip(chip)


def load_dumps(paths: Iterable[Path | str]) -> CompiledInputs:
    """LLO dumps (`--xla_jf_dump_to`) and XLA dumps (`--xla_dump_to`) from directories; a `tpudiag
    compile` output directory gives both (its `llo/`, `static_profile/` and `xla/`). A directory
    holding neither is an input error naming it."""
    from tpudiag.compiler.dump_dir import dump_parts, generation_for_target, llo_for_programs
    from tpudiag.parsers.hlo_text import load_hlo_dump
    from tpudiag.parsers.llo.load import load_llo_dump

    llo, hlo, labels, warnings = [], [], [], []
    for path in paths:
        path = Path(path)
        found, causes = [], []
        parts = dump_parts(path)
        dump = None
        try:
            dump = load_hlo_dump(parts.xla)
            hlo.extend(HloInput(p, str(dump.path), generation_for_target(p.target)) for p in dump.programs)
            warnings.extend([*dump.warnings, *(w for p in dump.programs for w in p.warnings)])
        except InputError as exc:
            causes.append(f"XLA: {exc.message}")
        try:
            llo.append(load_llo_dump(parts.llo, static_profile_dir=parts.static_profile))
            if dump is not None:  # the compile the XLA dump is about, when the directory has several
                llo[-1] = llo_for_programs(parts, llo[-1], dump.programs)
            found.append("LLO")
            warnings.extend(llo[-1].warnings)
        except InputError as exc:
            causes.insert(0, f"LLO: {exc.message}")
        if dump is not None:
            found.append("XLA")
        if not found:  # both causes: a damaged dump must say what is damaged, not only "not a dump"
            raise InputError("neither an LLO dump (`--xla_jf_dump_to`) nor an XLA dump (`--xla_dump_to`) ("
                             + "; ".join(causes) + ")",
                             path=path, hint="pass the directory the compiler wrote its dump files to")
        labels.append(f"{path} ({' + '.join(found)})")
    return CompiledInputs(llo=tuple(llo), hlo=tuple(hlo), labels=tuple(labels),
                          warnings=tuple(dict.fromkeys(warnings)))


def _hlo_sources(compiled: CompiledInputs) -> list[HloSource]:
    """The join's sources: dump programs first (their bytes win), then the capture's own."""
    from tpudiag.parsers.hlo_program import instruction_bytes

    return [HloSource(h.program, instruction_bytes(h.program), h.origin, h.generation)
            for h in (*compiled.hlo, *compiled.embedded)]


def _join(analysis: Analysis, compiled: CompiledInputs, chip: ChipSpec | None) -> JoinResult:
    return join_compiled(analysis.ops, _hlo_sources(compiled), compiled.llo, chip=chip)


def _rules_config(path: Path | None, config, select, ignore):
    from tpudiag.rules import RulesConfig, load_config

    if isinstance(config, RulesConfig):
        rules_config = config
    else:
        rules_config = load_config(path, config)
    rules_config = rules_config.with_cli(select, ignore)
    rules_config.resolve()  # option errors are usage errors: report them before reading the input
    return rules_config


def _as_list(value: str | Sequence[str] | None) -> list[str] | None:
    return [value] if isinstance(value, str) else (list(value) if value is not None else None)


def diagnose(path: Path | str | None = None, *, dumps: Iterable[Path | str] = (), config=None,
             chip: str | ChipSpec | None = None, jobs: int | None = None,
             progress: Callable[[str], None] | None = None, select: str | Sequence[str] | None = None,
             ignore: str | Sequence[str] | None = None, clock_ghz: float | None = None,
             scheduler=None, error: str | None = None) -> Diagnosis:
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

    Raises the project's errors (`tpudiag.errors`) for unreadable inputs and bad options: an
    argument of the wrong type or value is a `UsageError` naming it (`tpudiag.arguments`).
    """
    from tpudiag.compiler.dump_dir import is_dump_directory, is_hlo_text_file
    from tpudiag.examples_data import bundled_capture, bundled_dumps
    from tpudiag.parsers.capture import HostUrl, as_location

    path, dumps = arguments.check_path(path), arguments.check_dumps(dumps)  # UsageError for a wrong type/value
    jobs, progress = arguments.check_jobs(jobs), arguments.check_progress(progress)
    clock_ghz = arguments.check_clock_ghz(clock_ghz)
    if path is None:
        path = bundled_capture()
        dumps = dumps or list(bundled_dumps())
    path = as_location(path)
    remote = isinstance(path, HostUrl)  # a URL: no config file beside it, and no compiler dump directory
    chip_spec = parse_chip(chip)
    oom_errors = parse_error_text(error)
    rules_config = _rules_config(None if remote else path, config, _as_list(select), _as_list(ignore))
    if not remote and (is_dump_directory(path) or is_hlo_text_file(path)):
        if dumps:
            raise UsageError("`--dumps` joins compiled programs to a trace, and PATH is a compiler dump directory",
                             path=path, hint="pass the capture as PATH and the dumps with --dumps")
        return _diagnose_static(path, rules_config, chip_spec, clock_ghz, progress, oom_errors)
    return _diagnose_trace(path, dumps, rules_config, chip_spec, jobs, progress, scheduler, oom_errors)


def parse_error_text(error: str | None) -> tuple[OomError, ...]:
    """`--error`: the out-of-memory error in a JAX error text; a text without one is a usage error."""
    if error is None:
        return ()
    from tpudiag.parsers.oom_error import parse_oom_error

    parsed = parse_oom_error(error)
    if parsed is None:
        raise UsageError("--error: no out-of-memory message (`RESOURCE_EXHAUSTED: Ran out of memory ...`) in the text",
                         hint="pass the error JAX printed when the compile or run failed")
    return (parsed,)


def _stage(progress: Callable[[str], None] | None, i: int) -> None:
    if progress is not None:
        progress(STAGES[i])


def _diagnose_trace(path, dumps: list[Path], rules_config, chip: ChipSpec | None, jobs: int | None,
                    progress: Callable[[str], None] | None, scheduler=None,
                    oom_errors: tuple[OomError, ...] = ()) -> Diagnosis:
    from tpudiag.analysis.host_digest import StepFold, parse_and_digest
    from tpudiag.parsers.capture import find_capture, load_capture
    from tpudiag.parsers.dask_hosts import check_scheduler
    from tpudiag.parsers.hlo_proto import capture_hlo_inputs
    from tpudiag.rules import run_rules

    find_capture(path)  # fail fast with the precise input error, before parsing any dump
    check_scheduler(scheduler)  # likewise for an address that is not a Dask scheduler
    loaded = load_dumps(dumps)
    _stage(progress, 0)
    # Each host is digested where it is parsed, and its per-step tables are folded into the
    # capture's as it arrives: the driver holds small per-host digests and one fold, no events.
    fold = StepFold()
    profile = load_capture(path, jobs=jobs, progress=progress, scheduler=scheduler,
                           per_host=parse_and_digest, on_host=fold.add)
    _stage(progress, 1)
    analysis = analyze(profile, per_step=fold.result())
    hosts = profile.hosts
    choice = decide_chip(trace=hosts[0].device.chip if hosts else None, user=chip, what="capture")
    compiled = replace(loaded, embedded=capture_hlo_inputs(profile), chip=choice.spec, oom_errors=oom_errors)
    join = _join(analysis, compiled, choice.spec)
    analysis.join = join  # compiled facts per op, for the rules and the report
    _stage(progress, 2)
    memory = _memory(compiled)
    findings, skipped = run_rules(analysis, rules_config, compiled, join=join, memory=memory)
    _stage(progress, 3)
    # The chip's warnings, then what reading `--dumps` set aside, after the capture's own.
    report = build_report(analysis, tuple(findings), rules_skipped=tuple(skipped), dumps=compiled.labels, join=join,
                          extra_warnings=(*choice.warnings, *compiled.warnings),
                          config_warnings=rules_config.warnings)
    report = replace(report, memory=memory)
    return Diagnosis(input_path=str(path), mode=Mode.TRACE, analysis=analysis, compiled=compiled, join=join,
                     findings=report.findings, skipped=tuple(skipped), warnings=report.warnings, report=report,
                     chip=choice)


def _diagnose_static(path: Path, rules_config, chip: ChipSpec | None, clock_ghz: float | None,
                     progress: Callable[[str], None] | None, oom_errors: tuple[OomError, ...] = ()) -> Diagnosis:
    """Compiler dumps alone: a modelled timeline from the compiler's estimate when the generation is
    known, the dump-only rules otherwise. Exit 2 (InputError) only when nothing can be read."""
    from tpudiag.compiler.dump_dir import dump_chip, load_dump_directory
    from tpudiag.compiler.static_report import build_static_report
    from tpudiag.rules import run_rules

    _stage(progress, 0)
    compiled = load_dumps([path])
    warnings: list[str] = []  # what the report shows after the modelled capture's own warnings
    output = static = analysis = join = None
    try:
        output = load_dump_directory(path, chip=chip)
    except InputError as exc:
        if not compiled.llo and not compiled.hlo:
            raise
        warnings.append(f"no modelled timeline: {exc.message}; rules that need it are skipped"
                        + (f" (hint: {exc.hint})" if exc.hint else ""))
    if output is not None:
        choice = output.chip  # its warnings are the output's, shown with the static report's
        static = build_static_report(output, clock_ghz=clock_ghz)
        warnings.extend(static.warnings)
        _stage(progress, 1)
        analysis = _modelled_analysis(output, path, clock_ghz)
        join = _join(analysis, compiled, choice.spec)
        analysis.join = join
    else:
        target = compiled.hlo[0].program.target if compiled.hlo else ""
        choice = dump_chip(target, compiled.llo[0] if compiled.llo else None, chip)
        warnings.extend(choice.warnings)
        warnings.extend(w for dump in compiled.llo for w in dump.warnings)
    compiled = replace(compiled, chip=choice.spec, oom_errors=oom_errors)
    _stage(progress, 2)
    memory = _memory(compiled)
    findings, skipped = run_rules(analysis, rules_config, compiled, join=join, static=True, memory=memory)
    _stage(progress, 3)
    if analysis is not None:
        report = build_report(analysis, tuple(findings), rules_skipped=tuple(skipped), dumps=compiled.labels,
                              join=join, extra_warnings=warnings, config_warnings=rules_config.warnings)
        report = replace(report, summary=replace(report.summary, input_path=str(path), mode=Mode.STATIC))
    else:
        report = dump_only_report(path, compiled, findings, skipped, warnings, rules_config.warnings)
    report = replace(report, memory=memory)
    return Diagnosis(input_path=str(path), mode=Mode.STATIC, analysis=analysis, compiled=compiled, join=join,
                     findings=report.findings, skipped=tuple(skipped), warnings=report.warnings, report=report,
                     static=static, chip=choice)


def _memory(compiled: CompiledInputs) -> tuple:
    """The device memory of the compiled programs, for the memory rules and the report's memory section."""
    from tpudiag.compiler.memory import program_memories

    return program_memories(compiled, compiled.oom_errors)


def _modelled_analysis(output, path: Path, clock_ghz: float | None) -> Analysis:
    """The compiled program on a modelled timeline (`tpudiag simulate`), analysed like a capture."""
    from tpudiag.compiler.simulate import simulate
    from tpudiag.parsers.capture import load_capture

    with tempfile.TemporaryDirectory(prefix="tpudiag-static-") as tmp:
        simulate(output, Path(tmp), clock_ghz=clock_ghz, roofline_without_clock=True)
        profile = load_capture(Path(tmp), jobs=1)
    profile.input_path = str(path)  # the temporary capture is gone; name what the user gave
    for host in profile.hosts:
        host.path = str(path)
    profile.modelled = True
    return analyze(profile)


def compare(base: Path | str, new: Path | str, *, base_dumps: Iterable[Path | str] = (),
            new_dumps: Iterable[Path | str] = (), config=None, chip: str | ChipSpec | None = None,
            jobs: int | None = None, clock_ghz: float | None = None,
            noise: NoiseOptions | None = None, scheduler=None) -> Diff:
    """Diagnose `base` and `new` and compare them beyond run-to-run noise (`tpudiag diff`).

    A compiler dump or `tpudiag compile` output is compared through its modelled timeline (static
    mode); the result then says the run is modelled. The result's warnings hold both diagnoses'
    warnings (prefixed `base:` / `new:`), so `diff` shows what `report` shows for the same input.
    """
    # Checked before either input is read: a bad argument must not cost a whole diagnosis first.
    arguments.check_path(base, "base")
    arguments.check_path(new, "new")
    base_dumps = arguments.check_dumps(base_dumps, "base_dumps")  # a generator is read once, here
    new_dumps = arguments.check_dumps(new_dumps, "new_dumps")
    arguments.check_chip(chip)
    arguments.check_jobs(jobs)
    arguments.check_clock_ghz(clock_ghz)
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
                           new_compiled=n.join.columns if n.join is not None else None)
    warnings = [*result.warnings, *(f"base: {w}" for w in b.warnings), *(f"new: {w}" for w in n.warnings)]
    return Diff(base=b, new=n, result=replace(result, warnings=tuple(dict.fromkeys(warnings))))


__all__ = ["CHIP_NAMES", "Diagnosis", "Diff", "compare", "diagnose", "load_dumps",
           "parse_chip"]
