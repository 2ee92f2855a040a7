"""What-if compiles: would this XLA flag or compiler option help, answered without a TPU.

`whatif()` compiles a JAX function for a TPU topology deviceless (`tpudiag.compiler.driver`), once
per variant (first, so a mistyped setting fails fast) and once with the default settings,
diagnoses each compile output on its modelled timeline (static mode, as `tpudiag report DIR`) and
compares each variant with the baseline (`pipeline.compare_diagnoses`). Every time is modelled from the compiler's own estimates and the
ICI model of `tpudiag simulate`; the HBM peak is the compiler's `memory_analysis()`. Nothing is
measured, and the results say so.

Settings: `--xla-flag NAME=VALUE` goes to LIBTPU_INIT_ARGS for libtpu's own flags (`xla_tpu_*`,
`xla_jf_*`, `xla_mosaic_*`, `xla_sc_*`) and to XLA_FLAGS otherwise; `--option KEY=VALUE` goes to
`lowered.compile(compiler_options={KEY: VALUE})`, a per-compile override.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import UsageError

if TYPE_CHECKING:
    from tpudiag.analysis.diff import Diff as AnalysisDiff
    from tpudiag.pipeline import Diagnosis

LIBTPU_PREFIXES = ("xla_tpu_", "xla_jf_", "xla_mosaic_", "xla_sc_")
_SETTING = re.compile(r"^(?:--)?([A-Za-z][A-Za-z0-9_]*)=(.*)$")
BASELINE_DIR = "baseline"


@dataclass(frozen=True)
class Setting:
    """One `--xla-flag NAME=VALUE` (kind `xla-flag`) or `--option KEY=VALUE` (kind `option`)."""

    kind: str
    name: str
    value: str

    @property
    def libtpu(self) -> bool:
        return self.kind == "xla-flag" and self.name.startswith(LIBTPU_PREFIXES)

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


def parse_setting(text: str, kind: str) -> Setting:
    """`NAME=VALUE` (a leading `--` allowed) -> Setting; UsageError otherwise."""
    m = _SETTING.match(text.strip())
    if m is None or not m.group(2):
        raise UsageError(f"--{kind} `{text}`: expected NAME=VALUE",
                         hint="e.g. --xla-flag xla_tpu_enable_latency_hiding_scheduler=false")
    return Setting(kind, m.group(1), m.group(2))


@dataclass(frozen=True)
class Variant:
    """Settings compiled together, against the baseline's defaults."""

    settings: tuple[Setting, ...]

    @property
    def label(self) -> str:
        return " ".join(map(str, self.settings))

    @property
    def libtpu_flags(self) -> tuple[str, ...]:
        return tuple(s.flag for s in self.settings if s.libtpu)

    @property
    def xla_flags(self) -> tuple[str, ...]:
        return tuple(s.flag for s in self.settings if s.kind == "xla-flag" and not s.libtpu)

    @property
    def compiler_options(self) -> dict:
        return {s.name: s.option_value for s in self.settings if s.kind == "option"}


def plan_variants(xla_flags: Sequence[str], options: Sequence[str], each: bool = False) -> tuple[Variant, ...]:
    """One variant of every setting together, or (`each`) one variant per setting."""
    settings = [parse_setting(t, "xla-flag") for t in xla_flags] + [parse_setting(t, "option") for t in options]
    if not settings:
        raise UsageError("nothing to compare: give at least one --xla-flag NAME=VALUE or --option KEY=VALUE")
    names = [(s.kind, s.name) for s in settings]
    if len(set(names)) != len(names) and not each:
        raise UsageError("a setting is given twice in one variant", hint="use --each to compile one variant per setting")
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
    base = _compiled(compile_program(target, topo, out / BASELINE_DIR, static_profile, timeout_s=timeout),
                     clock_ghz)
    noise = NoiseOptions(min_relative=min_change)
    results = []
    for variant, run in zip(variants, runs):
        new = _compiled(run, clock_ghz)
        results.append(VariantResult(variant, new, compare_diagnoses(base.diagnosis, new.diagnosis, noise).result))
    return WhatIf(target=target, topology=topo.name, out=out, baseline=base, variants=tuple(results))
