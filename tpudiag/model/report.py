"""The report object: everything any renderer (terminal, JSON, markdown, TUI) shows.

Renderers compute nothing: every number they print is a field here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import overload

from tpudiag.model.kernels import KernelView
from tpudiag.model.findings import Finding
from tpudiag.model.memory import ProgramMemory
from tpudiag.model.profile import PeaksSource, Platform
from tpudiag.model.hardware import VmemBandwidth
from tpudiag.model.text import short_names
from tpudiag.model.units import fmt_time

# The legends of the `bound by` values that say why nothing binds an op (`analysis.ops.BoundBy`).
BOUND_LEGENDS = {
    "no cost data": "a GPU kernel no HLO op launched, or a custom call (Transformer Engine's attention, "
                    "`__cublas$gemm`) XLA's cost analysis gives no FLOPs or bytes: it has no rate and no level binds it",
    "no peak known": "its FLOPs or bytes are recorded, but not the device's peak to hold them against (XLA's CPU "
                     "runtime records none), so no level is said to bind it",
}
# The legend of the ops tables' time cell "outside steps" (`OpRow.outside_steps`).
OUTSIDE_STEPS = ("outside steps: an op of a program other than the one whose executions are the steps; it runs "
                 "between steps (see Programs)")


class Mode(StrEnum):
    """What a diagnosis read; the value is the JSON's `summary.mode`."""

    TRACE = "trace"  # a capture: times are measured
    STATIC = "static"  # compiler dumps alone: times are the compiler's estimate on a modelled timeline


@dataclass(frozen=True)
class Distribution:
    """Step times in ps over the steps analysed."""

    count: int
    mean_ps: float
    p50_ps: float
    p90_ps: float
    min_ps: int
    max_ps: int


@dataclass(frozen=True)
class Breakdown:
    """Mean per step and core, in ps; compute + collective + io + host transfers + idle = step.
    `step_ps` is the mean core's step: the step time (`Summary.step_time`, the slowest core's per
    step) is longer when cores differ, and renderers say so (`step_differs`)."""

    step_ps: float
    compute_ps: float
    collective_ps: float
    io_ps: float
    idle_ps: float
    host_transfer_ps: float = 0.0  # async copies to or from host memory (`analysis.host_transfers`)

    @property
    def duty_cycle(self) -> float:
        return (self.step_ps - self.idle_ps) / self.step_ps if self.step_ps else 0.0

    def step_differs(self, step_time: Distribution | None) -> bool:
        """Whether the step time's mean differs from this breakdown's step by more than 0.5 %."""
        return step_time is not None and abs(step_time.mean_ps - self.step_ps) > 0.005 * step_time.mean_ps


@dataclass(frozen=True)
class HostSummary:
    host: str
    path: str
    device_type: str
    n_chips: int
    n_cores: int
    n_events: int
    step_time: Distribution | None
    breakdown: Breakdown | None
    slowest_core: str  # plane name of the core with the most work per step (`analysis.core_balance`)
    step_numbers: tuple[int, ...] = ()  # the steps analysed on this host, in order
    step_times_ps: tuple[int, ...] = ()  # per step in `step_numbers`: the slowest core's step


@dataclass(frozen=True)
class CompiledJoin:
    """How many trace ops got compiled facts (`tpudiag.analysis.join`), and from where."""

    n_ops: int
    with_layout: int  # ops with logical/padded bytes
    with_llo: int  # ops with LLO spills/cycles
    from_dumps: int  # ops with a fact from a `--dumps` directory (not the capture's own HLO)
    sources: tuple[str, ...]  # dump directories, or `capture`, that gave facts
    with_cycles: int = 0  # ops with an estimated cycle count (LLO static profile or HLO backend_config)


@dataclass(frozen=True)
class HostTransferRate:
    """Async copies between host memory and HBM in one direction (`analysis.host_transfers`)."""

    direction: str  # `host to HBM` (prefetch) or `HBM to host` (offload)
    ops: tuple[str, ...]  # the copy-done ops, most time first
    transfers_per_step: float  # mean per step and core
    bytes_per_step: float  # the arrays' logical bytes, mean per step and core
    wait_ps: float  # time the core spends in the copies' ops, mean per step and core
    # measured: bytes over the union of the copies' windows, mean over cores; None when there is no
    # window, or when it exceeds the nominal link (`above_link`): a window that does not hold the
    # whole transfer, not a speed to show
    achieved_bytes_per_s: float | None
    link_bytes_per_s: float | None  # the generation's nominal host link per direction (model.hardware); None: unknown
    dtypes: tuple[str, ...] = ()  # element types moved
    above_link: bool = False  # the windows imply more than the nominal link: the rate is not shown

    @property
    def link_share(self) -> float | None:
        """Achieved over the nominal link; None when either is unknown."""
        if not self.achieved_bytes_per_s or not self.link_bytes_per_s:
            return None
        return self.achieved_bytes_per_s / self.link_bytes_per_s

    def line(self) -> str:
        """`host to HBM: 16.0 GB per step (3 copies, f32), waited 575.8 ms, at 27.1 GB/s per core (85% of
        the host link's nominal 32 GB/s)`: the one text of it, for every renderer."""
        from tpudiag.model.units import fmt_bandwidth, fmt_pct, fmt_time

        what = f"{self.transfers_per_step:.3g} cop{'y' if round(self.transfers_per_step, 3) == 1 else 'ies'}"
        if self.dtypes:
            what += ", " + "/".join(self.dtypes)
        text = (f"{self.direction}: {self.bytes_per_step / 1e9:.3g} GB per step ({what}), waited "
                f"{fmt_time(self.wait_ps)}")
        if self.achieved_bytes_per_s:
            text += f", at {fmt_bandwidth(self.achieved_bytes_per_s)} per core (measured)"
        elif self.above_link:
            text += ", rate n/a (the copies' windows imply more than the nominal link: they do not hold the whole transfer)"
        if self.link_bytes_per_s:
            share = self.link_share
            text += f"; {fmt_pct(share) + ' of ' if share is not None else ''}the host link's nominal " \
                    f"{fmt_bandwidth(self.link_bytes_per_s)}"
        else:
            text += "; the host link's bandwidth for this chip is unknown"
        return text


@dataclass(frozen=True)
class Summary:
    input_path: str
    run: str
    platform: Platform
    device_type: str
    generation: str
    hosts: tuple[str, ...]
    n_chips: int
    n_cores: int
    peak_flops_per_s: float | None  # per core
    hbm_bytes_per_s: float | None  # per core
    peaks_source: PeaksSource
    step_source: str  # "Steps line", "XLA Modules (<module>)" or "none"
    step_time: Distribution | None  # per step: max over every core of every host
    host_spread_ps: float  # max - min of per-host mean step times
    slowest_host: str
    breakdown: Breakdown | None
    modelled: bool
    dumps: tuple[str, ...] = ()
    compiled: CompiledJoin | None = None  # how trace ops were joined to compiled programs
    mode: Mode = Mode.TRACE
    host_transfers: tuple[HostTransferRate, ...] = ()  # per direction; () without async host copies
    step_program: str = ""  # the module whose executions are the steps (no `Steps` line); '' otherwise
    # Without steps: the share of the cores' time some op runs, Σ busy / Σ span (each core from its
    # first op to its last, `analysis.idle.capture_windows`); None when the capture has steps.
    busy_share: float | None = None
    vmem: VmemBandwidth | None = None  # peak VMEM bandwidth per core and its source; None: no VMEM roof
    n_cores_with_ops: int | None = None  # cores (GPUs) that ran at least one op, over hosts; None: not counted
    gpu_peaks_source: str = ""  # a GPU's: how its peaks were made (`GpuDevice.peaks_source`); '' otherwise

    @property
    def chip_word(self) -> str:
        """What the report calls one device: a GPU is a GPU, not a chip."""
        return "GPU" if self.platform is Platform.GPU else "chip"

    def devices_text(self, cores: bool = False) -> str:
        """`8 chips` on a TPU (`4 chips · 4 cores` with `cores`, as headers show it); on a GPU `8 GPUs
        (1 ran kernels)`: a plane without events is counted apart; on a CPU one device, XLA's threads."""
        if self.platform is Platform.CPU:
            return "one device (XLA's CPU threads)"
        if self.platform is not Platform.GPU:
            chips = f"{self.n_chips} chip{'s' * (self.n_chips != 1)}"
            return f"{chips} · {self.n_cores} core{'s' * (self.n_cores != 1)}" if cores else chips
        n = self.n_cores
        active = self.n_cores_with_ops
        busy = f" ({active} ran kernels)" if active is not None and active < n else ""
        return f"{n} GPU{'s' * (n != 1)}{busy}"

    @property
    def ridge_flops_per_byte(self) -> float | None:
        """Operational intensity where the roofline's HBM slope meets its compute roof."""
        if self.peak_flops_per_s and self.hbm_bytes_per_s:
            return self.peak_flops_per_s / self.hbm_bytes_per_s
        return None


@dataclass(frozen=True, slots=True)  # slots: a pod's report holds tens of thousands of rows
class OpRow:
    host: str
    program_id: int
    program: str
    name: str
    category: str
    occurrences: int
    total_time_ps: int
    self_time_ps: int
    time_share: float  # self time / core-time of the analysed window
    flops: float
    bytes_accessed: float
    hbm_bytes: float
    flop_rate: float | None  # None where above the peak (`analysis.limits`: not a physical rate)
    hbm_bw: float | None  # None where above the peak
    operational_intensity: float | None
    flop_utilization: float | None
    hbm_utilization: float | None
    bound_by: str  # `analysis.ops.BoundBy`: Compute, HBM, VMEM, collective, host link or latency
    family: str
    shape_with_layout: str
    source: str  # `file.py:LINE` of the op's metadata; '' when unknown
    tf_op: str  # JAX op name (metadata op_name, the name stack); '' when unknown
    # Compiled facts of the same op (`tpudiag.analysis.join`); None when no dump or embedded HLO tells.
    logical_bytes: int | None = None  # operands + result
    padded_bytes: int | None = None  # operands + result in their tiled layouts
    spill_stores: int | None = None  # VMEM spill stores (LLO dump)
    spill_fills: int | None = None  # VMEM spill fills (LLO dump)
    estimated_cycles: int | None = None  # compiler estimate for one execution; never for remote DMA
    # Collectives (`analysis.ops`): ICI traffic per device, modelled from payload, group and algorithm.
    group_size: int = 0  # participants per replica group; 0 for other ops
    group_source: str = ""  # `model.collectives.GroupSource`: replica_groups, shapes or assumed
    ici_bytes: float = 0.0  # bytes each device sends over ICI, total over occurrences
    ici_bw: float | None = None  # ici_bytes over the transfer's time (the async window for a pair)
    ici_utilization: float | None = None  # ici_bw / the chip's ICI peak
    ici_latency_bound: bool = False  # far below the ICI peak at a size the fixed latency dominates
    # Self time per step and core: time_share x the host's mean step (None without steps); what the
    # first screen shows, so no cell is larger than the step.
    step_self_time_ps: float | None = None
    # An op of a program other than the one whose executions are the steps (no Steps line): it runs
    # between steps, so it has no per-step figure (its self time is in self_time_ps).
    outside_steps: bool = False
    # Bytes by memory space, totals over occurrences, modelled from the HLO text's layouts
    # (`analysis.op_bytes`); hbm_bytes above is XLA's cost analysis as the trace records it.
    hbm_read_bytes: float = 0.0
    hbm_write_bytes: float = 0.0
    vmem_read_bytes: float = 0.0
    vmem_write_bytes: float = 0.0
    host_read_bytes: float = 0.0
    host_write_bytes: float = 0.0
    copied_hbm_bytes: float = 0.0  # operand bytes async copies or slices brought into VMEM from HBM
    moves: str = ""  # async copy or slice starts: `hbm->vmem`, `host->hbm`, ...
    hbm_intensity: float | None = None  # flops / (hbm_bytes + copied_hbm_bytes)
    vmem_utilization: float | None = None  # VMEM bandwidth utilization, the larger of read and write
    vmem_intensity: float | None = None  # flops / VMEM bytes of that direction
    bound_basis: str = ""  # `analysis.ops.BoundBasis`: how bound_by was decided

    @property
    def shown_time_ps(self) -> float | None:
        """The ops tables' time: per step and core where the op's host has steps, else its self time
        over the capture; None for an op outside the steps (it has no per-step time)."""
        if self.outside_steps:
            return None
        return self.step_self_time_ps if self.step_self_time_ps is not None else float(self.self_time_ps)

    @property
    def time_cell(self) -> str:
        """`shown_time_ps` as the tables print it."""
        return "outside steps" if self.shown_time_ps is None else fmt_time(self.shown_time_ps)

    @property
    def bound_shown(self) -> str:
        """`bound by` as tables show it: a `*` where the bytes its copies brought decided it (the
        tables' legend says so)."""
        return self.bound_by + ("*" if self.bound_basis == "intensity with copied bytes" else "")


@dataclass(frozen=True)
class CategoryTime:
    """Self time of every op of one HLO category, summed over ops, occurrences, cores and hosts."""

    category: str
    n_ops: int
    self_time_ps: int  # core-ps, as OpRow.self_time_ps
    time_share: float  # self time / core-time of the analysed window, all hosts


@dataclass(frozen=True)
class ProgramTime:
    """One XLA program's executions on the `XLA Modules` lines, over every core of every host
    (`analysis.programs`): the step program and the others beside it."""

    module: str
    program_id: int  # unsigned 64-bit (`model.program_ids`)
    executions: int  # on the core that ran it most
    cores: int  # cores, over every host, that ran it
    time_ps: int  # its executions' device time summed over those cores (core-ps)
    mean_ps: float  # mean execution
    share: float  # of every program's device time
    step: bool  # its executions are the steps (no `Steps` line)


@dataclass(frozen=True)
class RuleSkip:
    rule: str
    reason: str


def skips_by_reason(skips) -> list[tuple[str, tuple[str, ...]]]:
    """(reason, the rules skipped for it) in first-seen order: one line per reason, not per rule."""
    grouped: dict[str, list[str]] = {}
    for skip in skips:
        grouped.setdefault(skip.reason, []).append(skip.rule)
    return [(reason, tuple(rules)) for reason, rules in grouped.items()]


class OpRows(Sequence[OpRow]):
    """A report's op rows, made from the analysis's columns when they are read, a block at a time.

    A pod's report has one row per op per host (hundreds per host): held as `OpRow` objects they
    took 0.4 MB per host on the driver, and the report's JSON another 0.6 MB; made as they are read
    (and written as they are made, `render.json_format.json_pieces`), they cost the driver nothing
    per host beyond the columns it keeps anyway. Reads like the tuple it replaces: `len`, indexing,
    slices (tuples), iteration in order, equality with any sequence of rows.
    """

    BLOCK = 2048  # rows made at a time while iterating

    __slots__ = ("_n", "_make")

    def __init__(self, n: int, make: Callable[[int, int], list[OpRow]]) -> None:
        self._n = n
        self._make = make  # (start, stop) -> the rows at those positions, in order

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, i: int) -> OpRow: ...
    @overload
    def __getitem__(self, i: slice) -> tuple[OpRow, ...]: ...

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step != 1:
                return tuple(self)[i]
            return tuple(self._make(start, stop)) if start < stop else ()
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError("op row index out of range")
        return self._make(i, i + 1)[0]

    def __iter__(self) -> Iterator[OpRow]:
        for start in range(0, self._n, self.BLOCK):
            yield from self._make(start, min(self._n, start + self.BLOCK))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"OpRows({self._n} rows)"


@dataclass(frozen=True)
class OpsShown:
    """What the terminal and markdown reports show of the op rows, read in one pass (a pod's rows
    are made as they are read: `OpRows`): the first `top` ops besides collectives and the first
    `top` collectives, by self time, with how many of each there are."""

    compute: tuple[OpRow, ...]
    n_compute: int
    collectives: tuple[OpRow, ...]
    n_collectives: int
    per_step: bool  # some op has a per-step time (the capture has steps)

    compute_names: tuple[str, ...]  # `compute`'s names as a table cell shows them (`model.text.short_names`)

    @property
    def outside_steps(self) -> bool:
        """Some shown op runs between steps (another program than the step's): the legends say so."""
        return any(op.outside_steps for op in self.compute + self.collectives)

    @property
    def names_shortened(self) -> bool:
        """Some shown name is not the op's own: the table's legend says so."""
        return any(shown != op.name for shown, op in zip(self.compute_names, self.compute))

    @classmethod
    def of(cls, ops: Sequence[OpRow], top: int) -> OpsShown:
        compute: list[OpRow] = []
        collectives: list[OpRow] = []
        n_compute = n_collectives = 0
        per_step = False
        for op in ops:
            per_step = per_step or op.step_self_time_ps is not None
            if op.family:
                n_collectives += 1
                if len(collectives) < top:
                    collectives.append(op)
            else:
                n_compute += 1
                if len(compute) < top:
                    compute.append(op)
        names = tuple(short_names([op.name for op in compute]))
        return cls(tuple(compute), n_compute, tuple(collectives), n_collectives, per_step, names)


@dataclass(frozen=True)
class Report:
    summary: Summary
    hosts: tuple[HostSummary, ...]
    ops: Sequence[OpRow]  # sorted by self time, descending; `OpRows` (made when read) or a tuple
    findings: tuple[Finding, ...]
    rules_skipped: tuple[RuleSkip, ...] = ()
    warnings: tuple[str, ...] = ()
    failures: tuple[str, ...] = ()  # host files that could not be analysed
    categories: tuple[CategoryTime, ...] = ()  # sorted by self time, descending
    memory: tuple[ProgramMemory, ...] = ()  # device memory of the compiled programs with a buffer assignment
    programs: tuple[ProgramTime, ...] = ()  # XLA programs by device time, descending
    kernels: tuple[KernelView, ...] = ()  # Pallas kernels of the compiled programs (`analysis.kernels`)
