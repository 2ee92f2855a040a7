"""Queries behind the interactive views: filter and sort the report's ops, and one op's detail.

Pure functions of the `Report` (and, for the detail, the `Analysis` whose tables hold the HLO
text and per-core counts). Values a capture does not carry are None, never 0: the views print
them as n/a. Padding is the compiled join's padded vs logical bytes (operands and result) when
a dump or the capture's HLO gave them, else the result's tiled layout alone; spills are the LLO
dump's VMEM spill stores plus fills, joined to the op (`tpudiag.analysis.join`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from tpudiag.analysis.profile_analysis import Analysis
from tpudiag.model.kernels import KernelView
from tpudiag.model.findings import Finding
from tpudiag.model.report import OpRow, Report
from tpudiag.parsers.layout import parse_shape


@dataclass(frozen=True)
class OpFilter:
    """Which ops to show. Empty fields match everything; `text` matches name, source, shape or
    category, case-insensitively."""

    text: str = ""
    category: str = ""
    host: str = ""
    program: str = ""

    @property
    def active(self) -> bool:
        return bool(self.text or self.category or self.host or self.program)


@lru_cache(maxsize=65536)
def padding_fraction(shape_with_layout: str) -> float | None:
    """Share of the result's bytes in its tiled layout that are padding; None when unknown.

    None when the shape has no tiled layout or the layout parser cannot read the text.
    """
    if ":T(" not in shape_with_layout:
        return None
    try:
        shape = parse_shape(shape_with_layout)
    except ValueError:  # ShapeSyntaxError and unknown dtypes
        return None
    padded = shape.padded_bytes
    return (padded - shape.logical_bytes) / padded if padded else None


def op_padding(op: OpRow) -> float | None:
    """Padding share of the op's bytes: compiled operands and result when joined, else its result."""
    padded, logical = op.padded_bytes, op.logical_bytes
    if padded and logical is not None:
        return (padded - logical) / padded
    return padding_fraction(op.shape_with_layout)


def spills(op: OpRow) -> int | None:
    """VMEM spill stores plus fills from the LLO dump; None when no LLO dump covers the op."""
    stores, fills = op.spill_stores, op.spill_fills
    if stores is None and fills is None:
        return None
    return (stores or 0) + (fills or 0)


@dataclass(frozen=True)
class SortColumn:
    key: str
    label: str
    value: Callable[[OpRow], float | None]


SORT_COLUMNS: tuple[SortColumn, ...] = (
    # Self time per step and core (the op's share of core time x its host's mean step), as the report's
    # first screen shows it; the capture's total where there are no steps.
    SortColumn("self_time", "per step", lambda op: op.shown_time_ps),
    SortColumn("flop_util", "FLOP util", lambda op: op.flop_utilization),
    SortColumn("hbm_bw", "HBM BW", lambda op: op.hbm_bw if op.hbm_bytes else None),
    SortColumn("padding", "padding", op_padding),
    SortColumn("spills", "spills", lambda op: None if spills(op) is None else float(spills(op))),
)
_SORT_BY_KEY = {c.key: c for c in SORT_COLUMNS}


def sort_column(key: str) -> SortColumn:
    try:
        return _SORT_BY_KEY[key]
    except KeyError as exc:
        raise ValueError(f"unknown sort column {key!r}; expected one of {', '.join(_SORT_BY_KEY)}") from exc


def filter_ops(ops: tuple[OpRow, ...], f: OpFilter) -> tuple[OpRow, ...]:
    text = f.text.strip().lower()

    def keep(op: OpRow) -> bool:
        if f.category and op.category != f.category:
            return False
        if f.host and op.host != f.host:
            return False
        if f.program and op.program != f.program:
            return False
        if text:
            hay = f"{op.name}\n{op.category}\n{op.source}\n{op.shape_with_layout}\n{op.program}".lower()
            return text in hay
        return True

    return tuple(op for op in ops if keep(op))


def sort_ops(ops: tuple[OpRow, ...], key: str = "self_time", descending: bool = True) -> tuple[OpRow, ...]:
    """Ops sorted by a `SORT_COLUMNS` key; ops without a value (n/a) go last either way.

    Ties keep the report's order (self time, descending), so the sort is stable and predictable.
    """
    col = sort_column(key)
    known = [op for op in ops if col.value(op) is not None]
    unknown = [op for op in ops if col.value(op) is None]
    known.sort(key=col.value, reverse=descending)  # list.sort is stable, also reversed
    return tuple(known) + tuple(unknown)


@dataclass(frozen=True)
class Facets:
    """The values the ops can be filtered by, sorted."""

    categories: tuple[str, ...]
    hosts: tuple[str, ...]
    programs: tuple[str, ...]


def facets(ops: tuple[OpRow, ...]) -> Facets:
    return Facets(categories=tuple(sorted({op.category for op in ops})), hosts=tuple(sorted({op.host for op in ops})),
                  programs=tuple(sorted({op.program for op in ops})))


@dataclass(frozen=True)
class CoreCount:
    device: str
    occurrences: int
    self_time_ps: int


@dataclass(frozen=True)
class OpDetail:
    op: OpRow
    hlo_text: str  # the instruction as compiled; "" when the trace does not carry it
    tf_op: str  # the JAX name stack
    padding: float | None
    spills: int | None
    per_core: tuple[CoreCount, ...]
    findings: tuple[Finding, ...]  # findings that cite this op (on its host, or on every host)
    llo_available: bool  # whether LLO dumps were given for this capture
    kernel: KernelView | None = None  # the op's Pallas kernel (`Report.kernels`), when it is one


def findings_citing(report: Report, op: OpRow) -> tuple[Finding, ...]:
    return tuple(f for f in report.findings if op.name in f.ops and f.host in ("", op.host))


def op_detail(analysis: Analysis, report: Report, op: OpRow) -> OpDetail:
    host = next((h for h in analysis.profile.hosts if h.host == op.host), None)
    hlo_text = tf_op = ""
    per_core: list[CoreCount] = []
    if host is not None:
        meta = host.op_metadata
        m = meta[(meta["program_id"] == op.program_id) & (meta["name"] == op.name)]
        if not m.empty:
            hlo_text = str(m["hlo_text"].iloc[0] or "")
            tf_op = str(m["tf_op"].iloc[0] or "")
        ev = analysis.digests[host.host].op_cores
        mine = ev[(ev["program_id"] == op.program_id) & (ev["name"] == op.name)]
        if not mine.empty:
            g = mine.groupby("device", observed=True).agg(n=("n", "sum"), self_ps=("self_ps", "sum"))
            per_core = [CoreCount(str(d), int(r.n), int(r.self_ps)) for d, r in g.iterrows()]
    return OpDetail(op=op, hlo_text=hlo_text, tf_op=tf_op, padding=op_padding(op),
                    spills=spills(op), per_core=tuple(per_core), findings=findings_citing(report, op),
                    llo_available=bool(report.summary.dumps),
                    kernel=next((k for k in report.kernels if k.op == op.name and k.program == op.program), None))


def find_op(report: Report, name: str, host: str = "") -> OpRow | None:
    """The op named `name` (on `host` when given) with the most self time."""
    return next((op for op in report.ops if op.name == name and (not host or op.host == host)), None)
