"""What-if compiles: would this XLA flag or compiler option help, answered without a TPU.

`whatif()` compiles a JAX function for a TPU topology deviceless (`tpudiag.compiler.driver`), once
per variant (first, so a mistyped setting fails fast) and once with the default settings,
diagnoses each compile output on its modelled timeline (static mode, as `tpudiag report DIR`) and
compares each variant with the baseline (`pipeline.compare_diagnoses`). Every time is modelled from the compiler's own estimates and the
ICI model of `tpudiag simulate`; the HBM peak is the compiler's `memory_analysis()`. Nothing is
measured, and the results say so.

Settings: `--xla-flag NAME=VALUE` goes to LIBTPU_INIT_ARGS when libtpu registers NAME and to
XLA_FLAGS when XLA does (`compiler.flags`: both registries listed without a TPU, cached); a name
neither registers is a usage error. `--option KEY=VALUE` goes to
`lowered.compile(compiler_options={KEY: VALUE})`, a per-compile override.

A flag is one flag: a value with whitespace or a second `--` is refused (it would become more
flags in the variable), and so is a setting of the dumps (`*dump*`): tpudiag dumps every compile
the same way, and checks that the variants' dumps match the baseline's before comparing them.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import InputError, UsageError

if TYPE_CHECKING:
    from tpudiag.analysis.diff import Diff as AnalysisDiff
    from tpudiag.compiler.driver import CompileRun
    from tpudiag.compiler.flags import FlagRegistry
    from tpudiag.pipeline import Diagnosis

COMPILER_OPTIONS = "compiler_options"  # where an `--option` goes: `lowered.compile(compiler_options=...)`
BASELINE_DIR = "baseline"


@dataclass(frozen=True)
class Setting:
    """One `--xla-flag NAME=VALUE` (kind `xla-flag`) or `--option KEY=VALUE` (kind `option`)."""

    kind: str
    name: str
    value: str
    goes_to: str = ""  # LIBTPU_INIT_ARGS or XLA_FLAGS for a flag (`compiler.flags`), compiler_options for an option

    @property
    def flag(self) -> str:
        return f"--{self.name}={self.value}"

    @property
    def option_value(self) -> bool | int | float | str:
        """The value as jax's compiler_options take it: a bool, int or float where it reads as one."""
        low = self.value.lower()
        if low in ("true", "false"):
            return low == "true"
        for kind in (int, float):
            try:
                return kind(self.value)
            except ValueError:
                pass
        return self.value

    def __str__(self) -> str:
        return f"--{self.kind} {self.name}={self.value}"

    def routed(self) -> str:
        """The setting and where it went: `--xla-flag NAME=VALUE (LIBTPU_INIT_ARGS)`."""
        return f"{self} ({self.goes_to})" if self.goes_to else str(self)


def parse_setting(text: str, kind: str, registry: FlagRegistry | None = None) -> Setting:
    """`NAME=VALUE` (a leading `--` allowed) -> Setting, an `xla-flag` routed by `registry` (an
    option goes to compiler_options); UsageError otherwise. One flag only: a value may hold no
    whitespace and no second `--`, and no setting may change the dumps tpudiag compares."""
    from tpudiag.compiler.flags import split_flag

    name, value = split_flag(text, f"--{kind}")
    if "dump" in name.lower():
        raise UsageError(f"--{kind} `{name}`: tpudiag sets the dumps of every compile itself, the same for the "
                         "baseline and each variant, so that they compare",
                         hint="`tpudiag compile` with XLA_FLAGS/LIBTPU_INIT_ARGS of your own dumps as you choose")
    if kind == "option":
        return Setting(kind, name, value, COMPILER_OPTIONS)
    if registry is None:
        return Setting(kind, name, value)
    return Setting(kind, name, value, registry.route(name, f"--{kind}").value)


@dataclass(frozen=True)
class Variant:
    """Settings compiled together, against the baseline's defaults."""

    settings: tuple[Setting, ...]

    @property
    def label(self) -> str:
        """Each setting and where it went."""
        return " ".join(s.routed() for s in self.settings)

    @property
    def libtpu_flags(self) -> tuple[str, ...]:
        from tpudiag.compiler.flags import LIBTPU

        return tuple(s.flag for s in self.settings if s.kind == "xla-flag" and s.goes_to == LIBTPU)

    @property
    def xla_flags(self) -> tuple[str, ...]:
        from tpudiag.compiler.flags import XLA

        return tuple(s.flag for s in self.settings if s.kind == "xla-flag" and s.goes_to == XLA)

    @property
    def compiler_options(self) -> dict:
        return {s.name: s.option_value for s in self.settings if s.kind == "option"}


def plan_variants(xla_flags: Sequence[str], options: Sequence[str], each: bool = False,
                  registry: FlagRegistry | None = None) -> tuple[Variant, ...]:
    """One variant of every setting together, or (`each`) one variant per setting. Each flag is
    routed by `registry` (default: the installed libtpu's and XLA's, `compiler.flags.flag_registry`),
    after every setting has been checked, so a typo costs no listing."""
    settings = [parse_setting(t, "xla-flag") for t in xla_flags] + [parse_setting(t, "option") for t in options]
    if not settings:
        raise UsageError("nothing to compare: give at least one --xla-flag NAME=VALUE or --option KEY=VALUE")
    names = [(s.kind, s.name) for s in settings]
    if len(set(names)) != len(names) and not each:
        raise UsageError("a setting is given twice in one variant", hint="use --each to compile one variant per setting")
    if xla_flags:
        if registry is None:
            from tpudiag.compiler.flags import flag_registry

            registry = flag_registry()
        settings = [parse_setting(t, "xla-flag", registry) for t in xla_flags] + settings[len(xla_flags):]
    return tuple(Variant((s,)) for s in settings) if each else (Variant(tuple(settings)),)


@dataclass(frozen=True)
class Compiled:
    """One compile, diagnosed on its modelled timeline."""

    out: Path
    diagnosis: Diagnosis
    compile_s: float | None
    hbm_peak_bytes: int | None  # the compiler's memory_analysis peak per device; None where it gave none
    schedule_sha: str  # of the optimised, scheduled HLO text: equal text, equal schedule
    async_collectives: int  # start/done pairs in the entry schedule
    sync_collectives: int

    @property
    def step_ps(self) -> float | None:
        """The modelled step time (median over steps; the modelled steps are identical)."""
        steps = self.diagnosis.steps_frame()
        return float(steps["dur_ps"].median()) if len(steps) else None

    @property
    def exposed_collective_ps(self) -> float | None:
        """Modelled collective time per step and core that no compute hides (sync ops, waits on dones)."""
        steps = self.diagnosis.steps_frame()
        return float(steps["collective_ps"].mean()) if len(steps) else None


@dataclass(frozen=True)
class VariantResult:
    variant: Variant
    compiled: Compiled
    diff: AnalysisDiff  # baseline -> variant, all modelled

    def finding_changes(self) -> tuple[tuple, tuple, tuple]:
        """(appeared, gone, in both): findings pair through their ops (`tpudiag.analysis.diff`), so a
        finding on an op the new compile named differently (`fusion.203` becoming
        `subtract_convert_fusion.2`) is the same finding, changed or unchanged, not one gone and one new."""
        d = self.diff
        return d.findings_appeared, d.findings_resolved, d.findings_persisting


@dataclass(frozen=True)
class WhatIf:
    target: str
    topology: str
    out: Path
    baseline: Compiled
    variants: tuple[VariantResult, ...]


def _compiled(run, clock_ghz: float | None) -> Compiled:
    from tpudiag.compiler.static_report import CollectiveMode
    from tpudiag.model.compile_output import HLO_TEXT_FILE
    from tpudiag.pipeline import diagnose

    d = diagnose(run.out, clock_ghz=clock_ghz)
    text = (run.out / HLO_TEXT_FILE).read_bytes()
    collectives = d.static.collectives if d.static is not None else ()
    peak = run.facts.get("peak_memory_in_bytes")
    return Compiled(out=run.out, diagnosis=d, compile_s=run.facts.get("compile_s"),
                    hbm_peak_bytes=int(peak) if isinstance(peak, (int, float)) else None,
                    schedule_sha=hashlib.sha256(text).hexdigest()[:12],
                    async_collectives=sum(c.mode is CollectiveMode.ASYNC for c in collectives),
                    sync_collectives=sum(c.mode is CollectiveMode.SYNC for c in collectives))


def dumps_present(out: Path) -> tuple[str, ...]:
    """Which dumps a compile output holds (`xla`, `llo`, `static_profile`: folders with files)."""
    from tpudiag.model.compile_output import LLO_DIR, PROFILE_DIR, XLA_DIR

    return tuple(d for d in (XLA_DIR, LLO_DIR, PROFILE_DIR)
                 if (out / d).is_dir() and any(p.is_file() for p in (out / d).rglob("*")))


def check_same_dumps(base: CompileRun, run: CompileRun, what: str) -> None:
    """InputError unless `run` was dumped as `base` was: the same dump options, recorded by the
    driver, and the same dumps written. Compared otherwise, a variant's LLO facts (spills, cycles)
    would differ from the baseline's for want of a dump, not because of its setting."""
    ours, theirs = run.facts.get("dump_options"), base.facts.get("dump_options")
    if ours != theirs:
        raise InputError(f"{what} was compiled with other dump options than the baseline ({ours} against "
                         f"{theirs}): not compared", path=run.out)
    ours, theirs = dumps_present(run.out), dumps_present(base.out)
    if ours != theirs:
        raise InputError(f"{what} holds other dumps than the baseline ({', '.join(ours) or 'none'} against "
                         f"{', '.join(theirs) or 'none'}): not compared", path=run.out,
                         hint="its compiler's stderr (`compiler-stderr.txt`) says why a dump is missing")


def whatif(target: str, topology: str, variants: Sequence[Variant], out: Path, *, static_profile: bool | None = None,
           clock_ghz: float | None = None, timeout_s: float | None = None, min_change: float = 0.005,
           progress: Callable[[str], None] | None = None) -> WhatIf:
    """Compile the baseline and each variant of `target` for `topology` into `out`, and compare them."""
    from tpudiag.analysis.diff import NoiseOptions
    from tpudiag.compiler.driver import DEFAULT_TIMEOUT_S, compile_program
    from tpudiag.compiler.topology import parse_topology
    from tpudiag.pipeline import compare_diagnoses

    topo = parse_topology(topology)
    say = progress or (lambda _text: None)
    timeout = timeout_s or DEFAULT_TIMEOUT_S
    # The variants first: a mistyped flag or option fails in seconds, before the baseline's compile
    runs = []
    for i, variant in enumerate(variants, 1):
        say(f"compiling variant {i} of {len(variants)} for {topo.name}: {variant.label}")
        runs.append(compile_program(target, topo, out / f"variant-{i}", static_profile, variant.libtpu_flags,
                                    timeout, xla_flags=variant.xla_flags, compiler_options=variant.compiler_options))
    say(f"compiling the baseline for {topo.name}")
    base_run = compile_program(target, topo, out / BASELINE_DIR, static_profile, timeout_s=timeout)
    for i, run in enumerate(runs, 1):
        check_same_dumps(base_run, run, f"variant {i}")
    base = _compiled(base_run, clock_ghz)
    noise = NoiseOptions(min_relative=min_change)
    results = []
    for variant, run in zip(variants, runs):
        new = _compiled(run, clock_ghz)
        results.append(VariantResult(variant, new, compare_diagnoses(base.diagnosis, new.diagnosis, noise).result))
    return WhatIf(target=target, topology=topo.name, out=out, baseline=base, variants=tuple(results))
