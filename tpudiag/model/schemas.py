"""Declared column schemas for the bulk tables. Times are int64 picoseconds.

Parsers and analyses build their tables through `TableSchema.frame` so every table has exactly
its declared columns and dtypes; consumers call `require` to fail early and precisely.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    import pandas as pd

# pandas is imported by the functions that build tables, not here: a host file's parse, which
# declares its tables through these schemas, begins without it (`parsers.read_ahead`).


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # a pandas dtype name; "category" for repeated strings
    doc: str


@dataclass(frozen=True)
class TableSchema:
    name: str
    columns: tuple[Column, ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    def frame(self, data: dict[str, object] | None = None, length: int | None = None,
              owned: bool = False) -> pd.DataFrame:
        """A DataFrame with exactly this schema's columns, cast to their dtypes.

        Missing columns are an error, not a default: a parser that forgets one is a bug.
        `owned`: the columns are new arrays that nothing else holds or writes, so the frame keeps
        them as they are instead of copying those of one dtype into one block (pandas' default):
        on millions of events that copy is a large part of building the table.
        """
        import pandas as pd

        data = data or {}
        missing = [c.name for c in self.columns if c.name not in data]
        if missing and length != 0:
            raise ValueError(f"{self.name} table: missing columns {missing}")
        cols = {}
        for c in self.columns:
            value = data.get(c.name, np.empty(0, dtype=object if c.dtype in ("category", "string") else c.dtype))
            cols[c.name] = _cast(value, c.dtype)
        from_blocks = _blocks_constructor() if owned else None
        if from_blocks is not None and _blockable(cols):
            n = len(next(iter(cols.values()))) if cols else 0
            return from_blocks([(v.reshape(1, -1) if isinstance(v, np.ndarray) else v, np.array([i]))
                                 for i, v in enumerate(cols.values())],
                                index=pd.RangeIndex(n), columns=pd.Index(self.names))
        return pd.DataFrame(cols, columns=self.names)

    def empty(self) -> pd.DataFrame:
        return self.frame(length=0)

    def of_host(self, frame: pd.DataFrame, host: str | None = None) -> pd.DataFrame:
        """This schema's table from `frame`'s columns, every row on `host` (for a schema with a host
        column). Categorical columns are kept as they are: re-encoding strings is the costly part on
        tables of many rows."""
        import pandas as pd

        data = {c: (frame[c].array if isinstance(frame[c].dtype, pd.CategoricalDtype) else frame[c].to_numpy())
                for c in self.names if c != "host"}
        if "host" in self.names:
            data["host"] = pd.Categorical.from_codes(np.zeros(len(frame), dtype=np.int8), categories=[host])
        return self.frame(data)

    def stack(self, frames: list[pd.DataFrame], hosts: list[str] | None = None) -> pd.DataFrame:
        """Tables of this schema in one; with a host column, each row's `host` is set to its table's
        (distinct) host. Categorical columns are merged by their categories, not re-encoded."""
        import pandas as pd

        hosts = hosts if hosts is not None else [""] * len(frames)
        pairs = [(f, h) for f, h in zip(frames, hosts) if len(f)]
        if not pairs:
            return self.empty()
        data: dict[str, object] = {}
        for c in self.columns:
            if c.name == "host":
                codes = np.repeat(np.arange(len(pairs), dtype=np.int32), [len(f) for f, _ in pairs])
                data["host"] = pd.Categorical.from_codes(codes, categories=[h for _, h in pairs])
            elif c.dtype == "category":
                from pandas.api.types import union_categoricals

                data[c.name] = union_categoricals([_categorical(f[c.name]) for f, _ in pairs], ignore_order=True)
            else:
                data[c.name] = np.concatenate([f[c.name].to_numpy() for f, _ in pairs])
        return self.frame(data)

    def require(self, df: pd.DataFrame, columns: list[str] | None = None) -> None:
        """Raise ValueError naming the missing or mistyped columns of `df`."""
        wanted = [c for c in self.columns if columns is None or c.name in columns]
        missing = [c.name for c in wanted if c.name not in df.columns]
        if missing:
            raise ValueError(f"{self.name} table lacks columns {missing}")
        wrong = [f"{c.name} ({df[c.name].dtype}, want {c.dtype})" for c in wanted
                 if not _dtype_ok(df[c.name].dtype, c.dtype)]
        if wrong:
            raise ValueError(f"{self.name} table has mistyped columns: {', '.join(wrong)}")


def _blocks_constructor():
    """pandas >= 3's frame from its blocks as given, without consolidating them; None before."""
    try:
        from pandas.api.internals import create_dataframe_from_blocks
    except ImportError:
        return None
    return create_dataframe_from_blocks


def _blockable(cols: dict[str, object]) -> bool:
    """Columns a frame may keep as its blocks: numeric numpy arrays and categoricals of one length
    (an object array would be inferred as strings by the constructor, and not here)."""
    import pandas as pd

    lengths = {len(v) for v in cols.values()}
    return len(lengths) == 1 and all(
        isinstance(v, pd.Categorical) or (isinstance(v, np.ndarray) and v.ndim == 1 and v.dtype.kind in "biuf")
        for v in cols.values())


def _categorical(column: pd.Series) -> pd.Categorical:
    import pandas as pd

    return column.array if isinstance(column.dtype, pd.CategoricalDtype) else pd.Categorical(column.to_numpy())


def _cast(value, dtype: str):
    import pandas as pd

    if dtype == "category":
        if isinstance(value, pd.Categorical):
            return value
        return pd.Categorical(value)
    if dtype == "string":
        return pd.array(value, dtype="string")
    return np.asarray(value, dtype=dtype)


def _dtype_ok(actual, wanted: str) -> bool:
    import pandas as pd

    if wanted == "category":
        return isinstance(actual, pd.CategoricalDtype)
    if wanted == "string":
        return pd.api.types.is_string_dtype(actual)
    return str(actual) == wanted


EVENTS = TableSchema("events", (
    Column("host", "category", "host the event was recorded on (XSpace hostname or file stem)"),
    Column("device", "category", "plane name, e.g. /device:TPU:0 or /device:TPU:0 SparseCore 0"),
    Column("core", "int32", "core index parsed from the plane name (N in /device:TPU:N)"),
    Column("chip", "int32", "chip id: core_details.local_chip_id, else the core index"),
    Column("program_id", "uint64", "XLA program (module) id from the op metadata; 0 when absent"),
    Column("module", "category", "XLA module name, e.g. jit_train_step"),
    Column("name", "category", "HLO instruction name (metadata display_name)"),
    Column("category", "category", "hlo_category, e.g. convolution fusion, all-gather"),
    Column("start_ps", "int64", "absolute start in ps (device_offset_ps when present)"),
    Column("dur_ps", "int64", "duration in ps (device_duration_ps when present)"),
    Column("self_ps", "int64", "duration minus directly nested children on the same line"),
    Column("depth", "int16", "nesting depth on its line; 0 = top level"),
    Column("step", "int64", "step number the event starts in; -1 when outside every step"),
))

OP_METADATA = TableSchema("op_metadata", (
    Column("host", "category", "host"),
    Column("program_id", "uint64", "program id"),
    Column("name", "category", "HLO instruction name"),
    Column("category", "category", "hlo_category"),
    Column("symbol_id", "uint64", "symbol id (0 when absent: XProf drops such ops)"),
    Column("flops", "float64", "FLOPs per occurrence"),
    Column("model_flops", "float64", "model FLOPs per occurrence"),
    Column("bytes_accessed", "float64", "bytes accessed per occurrence, all memory spaces"),
    Column("hbm_bytes", "float64", "HBM bytes per occurrence (memory_access_breakdown; else bytes_accessed)"),
    Column("shape_with_layout", "string", "result shape with TPU layout"),
    Column("source", "string", "source file:line"),
    Column("tf_op", "string", "JAX name stack"),
    Column("hlo_text", "string", "full HLO instruction text (metadata name)"),
))

OPS = TableSchema("ops", (
    Column("host", "category", "host"),
    Column("program_id", "uint64", "program id"),
    Column("module", "category", "module name"),
    Column("name", "category", "HLO instruction name"),
    Column("category", "category", "hlo_category"),
    Column("occurrences", "int64", "number of executions, summed over cores"),
    Column("total_time_ps", "int64", "summed duration over occurrences and cores (core-ps, as XProf)"),
    Column("self_time_ps", "int64", "summed self time"),
    Column("flops", "float64", "total FLOPs (per-occurrence FLOPs x occurrences)"),
    Column("bytes_accessed", "float64", "total bytes accessed"),
    Column("hbm_bytes", "float64", "total HBM bytes"),
    Column("flop_rate", "float64", "FLOP/s = flops / total time (XProf's definition); NaN above the peak "
                                   "(`analysis.limits`: not a physical rate)"),
    Column("hbm_bw", "float64", "HBM bytes/s = hbm_bytes / total time; NaN above the peak"),
    Column("operational_intensity", "float64", "flops / bytes_accessed; NaN without bytes"),
    Column("flop_utilization", "float64", "flop_rate / peak FLOP/s of one core; NaN without a peak"),
    Column("hbm_utilization", "float64", "hbm_bw / peak HBM bandwidth of one core; NaN without a peak"),
    Column("bound_by", "category", "what binds the op (`analysis.ops.BoundBy`): Compute, HBM or VMEM (the "
                                   "largest utilization, as XProf; HBM's counts what copies brought into VMEM "
                                   "for it); collective; host link; latency when it reaches no roof"),
    Column("family", "category", "collective family (all-gather, all-reduce, ...) or '' for non-collectives"),
    Column("shape_with_layout", "string", "result shape with layout"),
    Column("source", "string", "source file:line"),
    Column("tf_op", "string", "JAX name stack"),
    Column("group_size", "int64", "collectives: participants per replica group (0 for other ops)"),
    Column("group_source", "category", "collectives: `replica_groups` (the HLO text), `shapes` (the ratio of "
                                       "result and operand), `assumed` (every chip of the host) or ''"),
    Column("ici_bytes", "float64", "collectives: bytes each device sends over ICI, total over occurrences, "
                                   "modelled from the payload and the ring algorithm (`model.collectives`)"),
    Column("ici_time_ps", "int64", "collectives: time the transfer took, total over occurrences: the async "
                                   "window (start to done) for an async pair, else the op's total time"),
    Column("ici_bw", "float64", "ici_bytes / ici_time; NaN where none, or where above the chip's ICI peak"),
    Column("ici_utilization", "float64", "ici_bw / the chip's ICI peak (every link one way); NaN without one"),
    Column("ici_latency_bound", "bool", "collectives: its bytes would cross ICI at peak in less than the fixed "
                                        "latency and it achieved under 10 % of the peak (`model.collectives`)"),
    Column("hbm_read_bytes", "float64", "bytes of operands in HBM, total, modelled from the HLO text's layouts "
                                        "(`analysis.op_bytes`); async copy pairs count on their start"),
    Column("hbm_write_bytes", "float64", "bytes of results in HBM, total, modelled"),
    Column("vmem_read_bytes", "float64", "bytes of operands in VMEM (`S(1)`), total, modelled"),
    Column("vmem_write_bytes", "float64", "bytes of results in VMEM, total, modelled"),
    Column("host_read_bytes", "float64", "bytes of operands in host memory (`S(5)`), total, modelled"),
    Column("host_write_bytes", "float64", "bytes of results in host memory, total, modelled"),
    Column("copied_hbm_bytes", "float64", "operand bytes an async copy or slice brought into VMEM from HBM, "
                                          "total, modelled: what the op's HBM roofline counts beside hbm_bytes"),
    Column("moves", "string", "async copy and slice starts: source->destination space (`hbm->vmem`, "
                              "`host->hbm`), else ''"),
    Column("hbm_intensity", "float64", "flops / (hbm_bytes + copied_hbm_bytes); NaN without FLOPs or HBM bytes"),
    Column("vmem_utilization", "float64", "the larger of VMEM read and write bandwidth utilization: its VMEM bytes "
                                          "(modelled) over its total time, over the peak (`DeviceInfo.vmem`); NaN "
                                          "without VMEM bytes or a peak, or above the peak"),
    Column("vmem_intensity", "float64", "flops / VMEM bytes of the direction (read or write) whose utilization is "
                                        "the larger; NaN without FLOPs, VMEM bytes or a VMEM peak"),
    Column("bound_basis", "category", "how bound_by was decided (`analysis.ops.BoundBasis`)"),
))

STEPS = TableSchema("steps", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("step", "int64", "step number (group_id, else the order of the step marker)"),
    Column("start_ps", "int64", "step start"),
    Column("dur_ps", "int64", "step duration"),
    Column("busy_ps", "int64", "union of op intervals inside the step"),
    Column("compute_ps", "int64", "busy time in ops that are not collectives, I/O or host transfers"),
    Column("collective_ps", "int64", "busy time in collectives (synchronous ones and waits on async done)"),
    Column("io_ps", "int64", "busy time in infeed, outfeed and host send/recv"),
    Column("host_transfer_ps", "int64", "busy time in async copies to or from host memory (analysis.host_transfers)"),
    Column("idle_ps", "int64", "dur_ps - busy_ps"),
))

MODULES = TableSchema("modules", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("program_id", "uint64", "program id"),
    Column("module", "category", "module name"),
    Column("start_ps", "int64", "execution start"),
    Column("dur_ps", "int64", "execution duration"),
))

ASYNC_WINDOWS = TableSchema("async_windows", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("name", "category", "async op name (the start op, e.g. all-gather-start.1)"),
    Column("family", "category", "collective family or copy"),
    Column("start_ps", "int64", "window start (start op begins)"),
    Column("end_ps", "int64", "window end (done op ends)"),
    Column("source", "category", "'Async XLA Ops' line or 'start/done pair'"),
))

HOST_EVENTS = TableSchema("host_events", (
    Column("thread", "category", "host thread (the /host:CPU line's display name, else its name)"),
    Column("name", "category", "TraceMe name, e.g. PjitFunction(train_step), TransferFromDevice"),
    Column("start_ps", "int64", "start in ps on the device planes' time origin"),
    Column("dur_ps", "int64", "duration in ps"),
))

# The allocator's events of `/host:CPU` (`MemoryAllocation` / `MemoryDeallocation`), the source of
# XProf's memory profile; read only for `tpudiag memory` (`parsers.allocator_events`).
ALLOCATOR_EVENTS = TableSchema("allocator_events", (
    Column("allocator", "category", "memory id: the `allocator_name` stat (e.g. GPU_0_bfc), else the "
                                    "`index_on_host` / `device_ordinal` number"),
    Column("allocation", "bool", "True for MemoryAllocation, False for MemoryDeallocation"),
    Column("time_ps", "int64", "on the host's time axis (docs/time-axis.md), as host events are placed"),
    Column("heap_bytes", "int64", "`bytes_allocated`: bytes the allocator has handed out after the event"),
    Column("stack_bytes", "int64", "`bytes_reserved`: bytes reserved outside the heap (stack)"),
    Column("free_bytes", "int64", "`bytes_available`: bytes the allocator can still hand out"),
    Column("fragmentation", "float64", "`fragmentation`: the allocator's own figure, 0-1"),
    Column("lifetime_peak_bytes", "int64", "`peak_bytes_in_use`: the allocator's peak since it was made"),
    Column("requested_bytes", "int64", "`requested_bytes`: what the caller asked for"),
    Column("allocation_bytes", "int64", "`allocation_bytes`: what the allocator gave (rounded up)"),
    Column("address", "int64", "`addr`: the chunk's address (pairs a deallocation with its allocation)"),
    Column("step_id", "int64", "`group_id` (the step), -1 when absent"),
    Column("op", "category", "`tf_op`: the framework op that asked, when the producer says"),
    Column("region_type", "category", "`region_type`, e.g. output, temp, persist"),
    Column("data_type", "int64", "`data_type`: a TensorFlow DataType number (0 = not given)"),
    Column("shape", "category", "`shape`: the tensor's shape, when given"),
    Column("thread", "category", "the /host:CPU line the event is on"),
    Column("annotation", "category", "the host events enclosing it on its line: the jit function it ran in "
                                     "(`PjitFunction(loss_fn)`) and the innermost, e.g. `Build buffer allocations`"),
))

# Live bytes of JAX's device memory profile by source line (`analysis.live_buffers`).
LIVE_BYTES_BY_LINE = TableSchema("live_bytes_by_line", (
    Column("file", "category", "source file of the frame the buffers are attributed to"),
    Column("line", "int64", "line number in that file"),
    Column("function", "category", "function executing that line"),
    Column("buffers", "int64", "live buffers made there"),
    Column("bytes", "int64", "their bytes, summed over devices"),
    Column("devices", "int64", "devices holding them"),
    Column("internal", "bool", "no frame outside JAX: attributed to JAX's innermost frame"),
))

# A host's digest (`model.profile.HostDigest`): per-event facts reduced where the host is parsed.
# Per-step tables (`StepTables`: OP_STEP_SUMS, OP_STEP_WORST, COLLECTIVE_OP_STEPS) are reduced over
# the host's cores, then folded over the hosts as they arrive, so they carry no host column.

OP_CORES = TableSchema("op_cores", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("program_id", "uint64", "program id"),
    Column("name", "category", "HLO instruction name"),
    Column("n", "int64", "events of this op on this core"),
    Column("self_ps", "int64", "their summed self time"),
    Column("in_steps_ps", "int64", "of which inside a step of this core (what per-step comparisons read)"),
))

HOST_TRANSFERS = TableSchema("host_transfers", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("step", "int64", "step of the copy-done; -1 outside every step"),
    Column("name", "category", "the copy-done op"),
    Column("direction", "category", "`host to HBM` or `HBM to host` (analysis.host_transfers.Direction)"),
    Column("dtype", "category", "the array's element type"),
    Column("bytes", "int64", "the array's logical bytes"),
    Column("start_ps", "int64", "window start: the copy-start (the copy-done's own start when unpaired)"),
    Column("end_ps", "int64", "window end: the end of the copy-done"),
    Column("wait_ps", "int64", "self time of its copy-start and copy-done (the core busy in them)"),
))

OP_STEP_SUMS = TableSchema("op_step_sums", (
    Column("step", "int64", "step number; -1 for events outside every step"),
    Column("program_id", "uint64", "program id"),
    Column("name", "category", "HLO instruction name"),
    Column("self_ps", "int64", "self time in that step, summed over the cores (of a host, or of every host)"),
))

OP_STEP_WORST = TableSchema("op_step_worst", (
    Column("step", "int64", "step number; -1 for events outside every step (the whole capture without steps)"),
    Column("name", "category", "HLO instruction name (every program's op of that name together)"),
    Column("self_ps", "int64", "self time in that step on its busiest core (of a host, or of every host)"),
))

OP_MEANS = TableSchema("op_means", (
    Column("host", "category", "host"),
    Column("name", "category", "HLO instruction name"),
    Column("self_ps", "float64", "mean over the host's steps of the op's self time on its worst core in each"),
))

COLLECTIVE_STEPS = TableSchema("collective_steps", (
    Column("host", "category", "host"),
    Column("device", "category", "plane name"),
    Column("core", "int32", "core index"),
    Column("step", "int64", "step the windows start in; -1 outside every step"),
    Column("kind", "category", "'async' (start to done) or 'sync'"),
    Column("family", "category", "collective family"),
    Column("exposed_ps", "int64", "exposed time of the family's windows on this core in this step"),
))

COLLECTIVE_OP_STEPS = TableSchema("collective_op_steps", (
    Column("step", "int64", "step the windows start in; -1 outside every step"),
    Column("kind", "category", "'async' or 'sync'"),
    Column("name", "category", "collective op name (an async start op, or a synchronous collective)"),
    Column("exposed_ps", "int64", "its exposed time in that step on its worst core (of a host, or of every host)"),
))

COLLECTIVE_OPS = TableSchema("collective_ops", (
    Column("host", "category", "host"),
    Column("kind", "category", "'async' or 'sync'"),
    Column("family", "category", "collective family"),
    Column("name", "category", "collective op name"),
    Column("source", "category", "'Async XLA Ops' line, 'start/done pair' or 'XLA Ops'"),
    Column("double_suffix", "bool", "the name has a double numeric suffix (`all-gather-start.1.0`)"),
    Column("n", "int64", "windows, every core and step"),
    Column("span_ps", "int64", "summed window spans"),
    Column("covered_ps", "int64", "summed time covered by compute on the same core"),
    Column("exposed_ps", "int64", "span minus covered"),
))

COLLECTIVE_COVERAGE = TableSchema("collective_coverage", (
    Column("op", "int32", "row of the op in its host's COLLECTIVE_OPS table"),
    Column("covered_fraction", "float64", "a window's covered time over its span, exactly as classes compare it"),
    Column("compute_inside", "bool", "a compute op starts inside the window"),
    Column("n", "int64", "windows of the op with this fraction and `compute_inside`"),
))

COLLECTIVE_CLASSES = TableSchema("collective_classes", (
    *COLLECTIVE_OPS.columns,
    Column("n_hidden", "int64", "windows covered at least the hidden threshold"),
    Column("n_partial", "int64", "windows between the thresholds"),
    Column("n_exposed", "int64", "windows covered at most the exposed threshold"),
    Column("n_adjacent", "int64", "not-hidden windows with no compute op starting inside"),
))
