"""What a parsed capture holds: per-host tables and device facts, and the multi-host profile."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataclasses import dataclass, field
from enum import StrEnum

from tpudiag.model.allocator import HostMemoryTimeline
from tpudiag.model.hardware import ChipSpec, GpuDevice, VmemBandwidth

if TYPE_CHECKING:  # pandas is imported where tables are built: a host's parse begins without it
    import pandas as pd


class Platform(StrEnum):
    """The kind of device a host's trace records; the value is what reports print."""

    TPU = "TPU"
    GPU = "GPU"
    CPU = "CPU"  # no device plane: a host-only capture

    @property
    def cores_word(self) -> str:
        """What rules call the units that run ops: `TensorCores`, `GPUs`, `XLA CPU threads`."""
        return {"TPU": "TensorCores", "GPU": "GPUs", "CPU": "XLA CPU threads"}[self.value]

    @property
    def core_word(self) -> str:
        """What a finding calls one unit in passing (`each core's`, `the other 3 GPUs`): a GPU is a GPU."""
        return "GPU" if self is Platform.GPU else "core"


class PeaksSource(StrEnum):
    """Where a host's peak FLOP/s and HBM bandwidth come from; the value is what reports print."""

    TRACE = "trace"  # the device plane's own stats
    HARDWARE_TABLE = "hardware table"  # public figures for the generation (`tpudiag.model.hardware`)
    NONE = "none"  # neither: utilizations are not shown


@dataclass(frozen=True)
class DeviceInfo:
    platform: Platform
    device_type: str  # as the trace names it, e.g. "TPU v6 Lite"; "" when absent
    chip: ChipSpec | None  # matched hardware spec, None when unknown
    peak_flops_per_s: float | None  # per core (plane)
    hbm_bytes_per_s: float | None  # per core (plane)
    peaks_source: PeaksSource
    n_cores: int  # TensorCore (or GPU) planes
    n_chips: int
    n_sparse_cores: int = 0
    gpu: GpuDevice | None = None  # a GPU plane's capabilities (`model.hardware.gpu_device`)
    # Peak VMEM bandwidth per core: the plane's own stats, else the chip's table entry; None unknown
    vmem: VmemBandwidth | None = None

    @property
    def ridge_flops_per_byte(self) -> float | None:
        if self.peak_flops_per_s and self.hbm_bytes_per_s:
            return self.peak_flops_per_s / self.hbm_bytes_per_s
        return None


class StepKind(StrEnum):
    """What a host's steps were read from; the value is what reports print."""

    STEPS_LINE = "Steps line"  # the device's `Steps` line
    ANNOTATIONS = "step annotations"  # a CPU run: jax.profiler.StepTraceAnnotation on `/host:CPU`
    XLA_MODULES = "XLA Modules"  # executions of one module on the `XLA Modules` line
    NONE = "none"  # no steps: the capture counts as one


@dataclass(frozen=True)
class StepSource:
    kind: StepKind
    module: str = ""  # for XLA_MODULES: the module whose executions are the steps
    program_id: int = 0  # for XLA_MODULES: its program id
    left_out: int = 0  # for XLA_MODULES: executions not matched on every core, so not steps


@dataclass(frozen=True)
class WindowThresholds:
    """Covered fractions that class a collective window hidden (at or above) or exposed (at or below)."""

    hidden: float = 0.9
    exposed: float = 0.1


@dataclass(frozen=True)
class CollectiveDigest:
    """A host's collective windows (`analysis.collective_windows`), folded three ways and with no
    thresholds applied: each window's covered fraction is kept (one row per distinct fraction of an
    op), so any thresholds class them later, on the driver, without the events. Tables follow
    `tpudiag.model.schemas`."""

    steps: pd.DataFrame  # COLLECTIVE_STEPS: exposed time per (core, step, kind, family)
    ops: pd.DataFrame  # COLLECTIVE_OPS: windows and summed times per op
    coverage: pd.DataFrame  # COLLECTIVE_COVERAGE: per op, its windows' distinct covered fractions


@dataclass(frozen=True)
class CollectiveClasses:
    """Every host's collective windows classed with one set of thresholds (`Analysis.collectives`),
    what the exposed-collective rule reads; tables follow `tpudiag.model.schemas`."""

    thresholds: WindowThresholds
    steps: pd.DataFrame  # COLLECTIVE_STEPS: exposed time per (host, core, step, kind, family)
    ops: pd.DataFrame  # COLLECTIVE_CLASSES: per (host, op), windows per class and summed times

    @property
    def empty(self) -> bool:
        return self.ops.empty


@dataclass(frozen=True)
class StepTables:
    """The per-step tables, steps x ops rows each: a training capture runs most ops once per step,
    so these are the big part of a digest. Reduced over a host's cores on its worker, then folded
    over the hosts as they arrive (max or sum per key), so the driver holds one set, not one per
    host. Tables follow `tpudiag.model.schemas`."""

    op_step_worst: pd.DataFrame  # OP_STEP_WORST: self time per (step, op name) on the worst core
    op_step_sums: pd.DataFrame  # OP_STEP_SUMS: self time per (step, program, op), summed over cores
    collective_op_steps: pd.DataFrame  # COLLECTIVE_OP_STEPS: exposed time per (step, kind, op), worst core


@dataclass
class HostDigest:
    """What the analysis and the rules need from one host's events, a small fraction of their size.

    Computed where the host is parsed (a pool process or a Dask worker), so the driver keeps one
    digest per host instead of every host's events: its memory grows with the largest host, not
    with the number of hosts. Tables follow `tpudiag.model.schemas`.
    """

    steps: pd.DataFrame  # STEPS
    step_source: StepSource
    ops: pd.DataFrame  # OPS
    core_span_ps: int  # sum over cores of (last end - first start)
    n_events: int
    op_cores: pd.DataFrame  # OP_CORES: count and self time per (core, op)
    op_means: pd.DataFrame  # OP_MEANS: per op, mean over steps of its worst core's self time
    collectives: CollectiveDigest  # not classed: `Analysis.collectives(thresholds)` classes them
    per_step: StepTables | None  # None once folded into the capture's (`analysis.host_digest.StepFold`)
    idle_gaps: pd.DataFrame  # analysis.idle: one row per idle interval
    idle_steps: pd.DataFrame  # analysis.idle: per (core, step) period, idle and causes
    executions: bool  # the steps are module executions (no Steps line)
    host_transfers: pd.DataFrame  # HOST_TRANSFERS: per (core, step, direction) async copies to or from host memory


@dataclass
class HostTrace:
    """One host's capture, parsed. Tables follow `tpudiag.model.schemas`."""

    host: str
    path: str
    device: DeviceInfo
    events: pd.DataFrame | None  # None once digested away from the driver (`digest` holds what is needed)
    op_metadata: pd.DataFrame
    step_markers: pd.DataFrame  # columns: device, core, step, start_ps, dur_ps
    modules: pd.DataFrame
    async_windows: pd.DataFrame
    hlo_protos: dict[int, bytes] = field(default_factory=dict)  # hosts of one run share equal ones
    warnings: list[str] = field(default_factory=list)
    host_threads: int = 0
    modelled: bool = False  # device planes carry `tpudiag_modelled` (written by `tpudiag simulate`)
    # `/host:CPU` TraceMe events (schemas.HOST_EVENTS) on the device time origin; None: no host plane
    host_events: pd.DataFrame | None = None
    # The `/host:CPU` plane is on another clock than the device planes, with no anchor to align them,
    # so its spans were not used (docs/time-axis.md)
    host_clock_apart: bool = False
    digest: HostDigest | None = None  # set by `analysis.host_digest`; events may then be dropped
    source: str = ""  # where to read the file again (absolute path or URL); `path` is as the user gave it
    # The allocator's timeline read in the same pass, when asked (`tpudiag memory`,
    # `analysis.memory_timeline.timeline_of_planes`), or why it could not be read; None: not asked
    memory_timeline: HostMemoryTimeline | HostFailure | None = None


@dataclass(frozen=True)
class HostFailure:
    """A host file that could not be analysed, with the one-line reason and the error's hint."""

    path: str
    message: str
    hint: str | None = None  # what to do about it (`gunzip -k`, raise the size cap), as the error gave it

    def text(self) -> str:
        """The reason as a report lists it: the message, then the hint where there is one."""
        return f"{self.message}; hint: {self.hint}" if self.hint else self.message


@dataclass
class Profile:
    """Every host of one capture. `failures` lists host files skipped with their reasons."""

    input_path: str
    run: str
    hosts: list[HostTrace]
    failures: list[HostFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    modelled: bool = False  # True for captures written by `tpudiag simulate`
    # The hosts' per-step tables once `analysis.analyze` folded them (and freed each host's own),
    # so a second analysis of the same profile reads the fold instead of the tables it freed.
    step_fold: StepTables | None = field(default=None, compare=False, repr=False)
