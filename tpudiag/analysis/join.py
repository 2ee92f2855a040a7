"""Join compiled facts to trace ops: layout bytes, spills and estimated cycles beside measured time.

A trace op is one HLO instruction of one program: the ops table keys it by `program_id`, `module`
(the HLO module name, e.g. `jit_train_step`) and `name` (the HLO instruction name, `fusion.7`).
Compiled facts come from

- HLO programs (`HloSource`): an XLA dump (`--xla_dump_to`) or the HloProto a capture embeds on
  `/host:metadata`. A program joins a trace program by program id, else by module name; the
  instruction of the same name gives the op's logical and padded bytes (operands + result, as
  `instruction_bytes` counts them) and, when its backend_config has one, the compiler's cycles.
- LLO dumps (`LloDump`, `--xla_jf_dump_to`): the per-op table gives spill stores and fills and the
  static profile's cycles. A dump names its HLO module when its files do; otherwise it joins the
  trace program whose op names it shares.

Names alone are weak evidence: two compilations of one module share most instruction names
(`fusion.7`) but not their shapes or costs. So a source joins a trace program only when most of
the ops agree (`JoinOptions.min_agreement`): the name exists in the program and, for a program
found by module name, the trace's `shape_with_layout` equals the instruction's shape (when both
are known; a program id identifies the compiled program itself, so names suffice there); for an
LLO dump, its op names exist in the program and their opcodes agree. Given the trace's chip, a
source compiled for another target is refused outright: an XLA dump's `target_arguments` name
the generation, an LLO dump's MXU count bounds it, and an LLO dump written with an XLA dump
shares its target (a one-op Pallas program compiles to the same names and shapes on v5e and
v6e). A source that matches nothing becomes a warning naming it, never a silent empty column.

Estimated cycles are per execution of the op (the static profile's `cycles_per_instance`; its
`estimated_cycles` sums over identical ops deduplicated into one row). Ops the static profile does
not estimate (remote DMA: collectives, `LOCAL_AND_REMOTE`) get NA, never their printed 0; so do
the 0 cycles an HLO `bundle_analysis_data` gives a collective or an async start/done.

Pure: no I/O. `tpudiag.pipeline` parses the dumps and the capture's protos and passes them in.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import PurePath

import numpy as np
import pandas as pd

from tpudiag.model import schemas
from tpudiag.model.compiled import CompiledProgram, Instruction
from tpudiag.model.hardware import ChipSource, ChipSpec
from tpudiag.model.inputs import CAPTURE_ORIGIN  # HloSource.origin of the HloProtos a capture embeds
from tpudiag.model.llo import NO_HLO, LloDump, LloTableSchema
from tpudiag.model.schemas import Column


# Per trace op, in the order of the ops table given to `join_compiled`.
JOINED = LloTableSchema("joined_ops", (
    Column("logical_bytes", "Int64", "operands + result, logical bytes; NA without a matching HLO program"),
    Column("padded_bytes", "Int64", "operands + result in their tiled TPU layouts; NA without a matching program"),
    Column("spill_stores", "Int64", "VMEM spill stores (LLO per-op table); NA without a matching LLO dump"),
    Column("spill_fills", "Int64", "VMEM spill fills (LLO per-op table); NA without a matching LLO dump"),
    Column("estimated_cycles", "Int64", "compiler-estimated cycles of one execution; NA when no dump estimates "
                                        "it (remote DMA and collectives are never estimates)"),
    Column("cycles_source", "category", "llo_static_profile, bundle_analysis_data or window_config (HLO "
                                        "backend_config); '' when NA"),
    Column("hlo_origin", "category", "dump directory or `capture` the HLO facts come from; '' when unmatched"),
    Column("hlo_match", "category", "how the HLO program was found: program_id or module; '' when unmatched"),
    Column("llo_origin", "category", "LLO dump directory the spill and cycle facts come from; '' when unmatched"),
))

_TRACE_COLUMNS = ["host", "program_id", "module", "name", "shape_with_layout"]
_COMMENT = re.compile(r"/\*.*?\*/")


@dataclass(frozen=True)
class JoinOptions:
    """Thresholds of the join.

    min_agreement: the share of a trace program's ops (or of an LLO dump's ops) that must agree
    with a compiled source for it to join at all; a different compilation of the same module
    shares names but falls well below (transformer step, v6e dump against a v5e trace: 0.54).
    """

    min_agreement: float = 0.9

    def __post_init__(self) -> None:
        if not 0.0 < self.min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be in (0, 1], got {self.min_agreement}")


@dataclass(frozen=True)
class HloSource:
    """One compiled HLO program with its per-instruction bytes (`parsers.hlo_program.instruction_bytes`)."""

    program: CompiledProgram
    instruction_bytes: pd.DataFrame  # model.compiled.INSTRUCTION_BYTES of `program`
    origin: str  # the dump directory, or CAPTURE_ORIGIN
    generation: str = ""  # TPU generation the program was compiled for (dump target), '' when unknown

    @property
    def from_dump(self) -> bool:
        return self.origin != CAPTURE_ORIGIN


@dataclass(frozen=True)
class SourceMatch:
    """How one compiled source fared against one trace program."""

    kind: str  # 'hlo' or 'llo'
    origin: str
    module: str  # the source's HLO module ('' for an LLO dump that names none)
    trace_program: str  # the trace module name
    program_id: int
    agreeing: int  # ops that agree (see the module docstring)
    compared: int  # ops compared: the trace program's ops (HLO) or the dump's ops (LLO)
    accepted: bool
    how: str  # program_id or module (HLO); module or names (LLO)


@dataclass(frozen=True)
class JoinResult:
    columns: pd.DataFrame  # JOINED, indexed like the ops table given
    n_ops: int
    hlo_matched: int  # ops with layout bytes
    llo_matched: int  # ops with LLO facts
    dump_matched: int  # ops with a fact from a dump (not from the capture's own protos)
    matches: tuple[SourceMatch, ...]
    sources: tuple[str, ...]  # origins that joined at least one op
    warnings: tuple[str, ...] = field(default_factory=tuple)
    # The compiled program each trace program joined, by (program_id, module): the first accepted
    # source, dumps before the capture's protos. Rules read an op's math from it (`model.matmuls`).
    programs: dict[tuple[int, str], CompiledProgram] = field(default_factory=dict)
    # An LLO program the timeline does not list (a Pallas kernel inside a scanned layer) -> the entry
    # op that runs it, whose row holds its spills (`_roll_up_nested`). The spill rule times it so.
    runs_inside: dict[str, str] = field(default_factory=dict)

    def program_for(self, program_id, module: str) -> CompiledProgram | None:
        return self.programs.get((int(program_id), str(module)))


def _norm_shape(text: str) -> str:
    return "".join(_COMMENT.sub("", text).split())


def _by_name(program: CompiledProgram) -> dict[str, Instruction]:
    """Instruction by name over every computation (HLO names are unique within a module)."""
    out: dict[str, Instruction] = {}
    for (_, name), inst in program.instructions.items():
        out.setdefault(name, inst)
    return out


def _hlo_agreement(names: Sequence[str], shapes: Sequence[str], insts: dict[str, Instruction]) -> np.ndarray:
    """Per trace op: its name is an instruction and the shapes agree where both are known."""
    ok = np.zeros(len(names), dtype=bool)
    for i, (name, shape) in enumerate(zip(names, shapes)):
        inst = insts.get(name)
        if inst is None:
            continue
        ok[i] = not shape or not inst.shape_text or _norm_shape(shape) == _norm_shape(inst.shape_text)
    return ok


def _same_opcode(printed: str, inst: Instruction) -> bool:
    """An LLO dump's opcode as printed (`slice-done`) against the parsed one (async-done wrapping slice)."""
    if printed in (inst.opcode, inst.wrapped_opcode):
        return True
    return inst.opcode.startswith("async-") and printed == inst.wrapped_opcode + inst.opcode[len("async"):]


def _hlo_cycles(inst: Instruction) -> tuple[int | None, str]:
    if inst.estimated_cycles is None:
        return None, ""
    no_estimate = inst.collective_family or inst.async_role or inst.is_continuation
    if inst.estimated_cycles == 0 and no_estimate:
        return None, ""  # the static profile's 0 for remote DMA: not an estimate
    return int(inst.estimated_cycles), inst.cycles_source


def _int_or_na(value):
    return pd.NA if value is None or value is pd.NA or (isinstance(value, float) and np.isnan(value)) else int(value)


def _llo_names(dump: LloDump) -> pd.DataFrame:
    ops = dump.ops
    names = ops["name"].astype(str)
    keep = (names != "") & (names != NO_HLO) & ~names.str.startswith("<")
    # the names of the rows kept: a Series assigned to an empty frame would bring its rows back
    return ops[keep].assign(name=names[keep])


def _llo_module(dump: LloDump) -> str:
    return dump.compile.module_name if dump.compile is not None else ""


def _llo_mxus(dump: LloDump) -> tuple[int | None, bool]:
    """MXUs per core the dump was compiled for: exact from a utilization capacity header, else a
    lower bound from the highest `MXU_i` unit of the bundle profile; (None, False) when neither."""
    for u in dump.utilization:
        col = u.column("MXU")
        if col is not None and col.capacity > 0:
            return col.capacity, True
    units = dump.bundle_profile["unit"].astype(str)
    index = units[units.str.fullmatch(r"MXU_\d+")].str[4:].astype(int)
    return (int(index.max()) + 1, False) if len(index) else (None, False)


def _target_mismatches(chip: ChipSpec | None, source: ChipSource, hlo: Sequence[HloSource],
                       llo: Sequence[LloDump]) -> dict[str, str]:
    """Origin -> why its target is not the diagnosis's chip (generation, MXUs per core), naming
    where that chip came from: the trace ran on it, or a dump or `--chip` said it."""
    if chip is None:
        return {}
    ours = f"the trace ran on {chip.generation}" if source is ChipSource.TRACE else \
        f"the chip is {chip.generation} ({source.value})"
    out: dict[str, str] = {}
    for s in hlo:
        if s.generation and s.generation.lower() != chip.generation.lower():
            out[s.origin] = f"compiled for {s.generation}, {ours}"
    for d in llo:
        mxus, exact = _llo_mxus(d)
        if mxus is not None and (mxus > chip.mxu_per_core or (exact and mxus != chip.mxu_per_core)):
            out[d.path] = (f"compiled for {mxus}{'' if exact else '+'} MXUs per core, {ours}, which has "
                           f"{chip.mxu_per_core}")
            continue
        # An LLO dump names no target; one written with a mistargeted XLA dump (the same directory,
        # or `llo/` beside `xla/` in a `tpudiag compile` output) shares its target.
        for s in hlo:
            if s.origin in out and _same_compile_output(s.origin, d.path):
                out[d.path] = out[s.origin]
                break
    return out


def _same_compile_output(xla_dir: str, llo_dir: str) -> bool:
    xla, llo = PurePath(xla_dir), PurePath(llo_dir)
    return xla == llo or (xla.name == "xla" and llo.name == "llo" and xla.parent == llo.parent)


def join_compiled(ops: pd.DataFrame, hlo: Iterable[HloSource] = (), llo: Iterable[LloDump] = (),
                  options: JoinOptions | None = None, chip: ChipSpec | None = None,
                  chip_source: ChipSource = ChipSource.TRACE) -> JoinResult:
    """Per trace op, the facts of the same op in the compiled sources (see the module docstring).

    `ops` needs the OPS columns host, program_id, module, name and shape_with_layout. Sources are
    tried in the order given for bytes (put dumps before the capture's protos); cycles come from
    the LLO static profile first, then from the first HLO source that has an estimate. With the
    trace's `chip`, a source compiled for another target is not joined, however well names agree;
    `chip_source` says where the chip came from, for the warning.
    """
    options = options or JoinOptions()
    schemas.OPS.require(ops, _TRACE_COLUMNS)
    hlo = tuple(hlo)
    llo = tuple(llo)
    wrong_target = _target_mismatches(chip, chip_source, hlo, llo)
    n = len(ops)
    logical = [pd.NA] * n
    padded = [pd.NA] * n
    stores = [pd.NA] * n
    fills = [pd.NA] * n
    runs_inside: dict[str, str] = {}
    cycles = [pd.NA] * n
    cycles_src = [""] * n
    hlo_origin = [""] * n
    hlo_how = [""] * n
    llo_origin = [""] * n
    from_dump = np.zeros(n, dtype=bool)
    matches: list[SourceMatch] = []
    joined_programs: dict[tuple[int, str], CompiledProgram] = {}
    warnings: list[str] = [f"compiler dump `{origin}` was {why}: its facts are not joined"
                           for origin, why in wrong_target.items()]

    names_all = ops["name"].astype(str).to_numpy()
    shapes_all = ops["shape_with_layout"].astype(str).fillna("").to_numpy()
    shapes_all = np.where(ops["shape_with_layout"].isna().to_numpy(), "", shapes_all)
    pids = ops["program_id"].to_numpy()
    modules = ops["module"].astype(str).to_numpy()
    keys = list(dict.fromkeys(zip(pids.tolist(), modules.tolist())))
    insts = [_by_name(s.program) for s in hlo]
    byte_tables = [s.instruction_bytes.drop_duplicates("name").set_index("name") for s in hlo]
    llo_tables = [_llo_names(d) for d in llo]
    llo_rows = [t.drop_duplicates("name", keep="last").set_index("name") for t in llo_tables]

    for pid, module in keys:
        rows = np.flatnonzero((pids == pid) & (modules == module))
        names = names_all[rows]
        accepted_hlo: list[int] = []
        rejected: list[SourceMatch] = []
        for k, source in enumerate(hlo):
            prog = source.program
            if source.origin in wrong_target:
                continue
            if prog.program_id is not None and prog.program_id == pid:
                how = "program_id"
            elif prog.module == module and (prog.program_id is None or source.from_dump):
                how = "module"
            else:
                continue
            # A program id identifies the compiled program itself: names suffice. A module name does
            # not (recompiles, other targets), so there the shapes must agree too.
            shapes = shapes_all[rows] if how == "module" else np.full(len(rows), "", dtype=object)
            agree = _hlo_agreement(names, shapes, insts[k])
            ok = bool(agree.any() and agree.sum() >= options.min_agreement * len(rows))
            match = SourceMatch("hlo", source.origin, prog.module, module, int(pid), int(agree.sum()), len(rows),
                                ok, how)
            matches.append(match)
            if not ok:
                rejected.append(match)
                continue
            accepted_hlo.append(k)
            joined_programs.setdefault((int(pid), str(module)), prog)
            table = byte_tables[k]
            for row, name, good in zip(rows, names, agree):
                if not good:
                    continue
                if hlo_origin[row] == "":
                    b = table.loc[name] if name in table.index else None
                    if b is not None:
                        logical[row] = int(b["logical_bytes"])
                        padded[row] = int(b["padded_bytes"])
                        hlo_origin[row] = source.origin
                        hlo_how[row] = how
                        from_dump[row] |= source.from_dump
                if cycles[row] is pd.NA and cycles_src[row] == "":
                    c, src = _hlo_cycles(insts[k][name])
                    if c is not None:
                        cycles[row], cycles_src[row] = c, src
                        from_dump[row] |= source.from_dump
        accepted_origins = {hlo[k].origin for k in accepted_hlo}
        for m in rejected:  # a dump of several recompiles may hold the right one beside others
            if m.origin not in accepted_origins:
                warnings.append(
                    f"compiled program `{m.module}` from `{m.origin}` does not match the trace's `{module}`: only "
                    f"{m.agreeing} of {m.compared} ops agree in name and shape (another compilation?); its layouts "
                    "and cycles are not joined")
        reference = set(names.tolist())
        for k in accepted_hlo:
            reference |= set(insts[k])
        for j, dump in enumerate(llo):
            named = _llo_module(dump)
            if dump.path in wrong_target:
                continue
            if named and named != module:
                continue
            table = llo_tables[j]
            if table.empty:
                continue
            found = table["name"].isin(reference).to_numpy()
            conflicts = np.zeros(len(table), dtype=bool)
            if accepted_hlo:
                hlo_insts = insts[accepted_hlo[0]]
                for i, (name, opcode) in enumerate(zip(table["name"], table["opcode"].astype(str))):
                    inst = hlo_insts.get(name)
                    conflicts[i] = bool(opcode) and inst is not None and not _same_opcode(opcode, inst)
            agreeing = int((found & ~conflicts).sum())
            ok = agreeing > 0 and agreeing >= options.min_agreement * len(table)
            matches.append(SourceMatch("llo", dump.path, named, module, int(pid), agreeing, len(table), ok,
                                       "module" if named else "names"))
            if not ok:
                if named or agreeing:
                    warnings.append(
                        f"LLO dump `{dump.path}` does not match the trace's `{module}`: only {agreeing} of "
                        f"{len(table)} of its ops are ops of that program (another compilation?); its spills "
                        "and cycles are not joined")
                continue
            facts = llo_rows[j]
            for row, name in zip(rows, names):
                if name not in facts.index or llo_origin[row]:
                    continue
                r = facts.loc[name]
                llo_origin[row] = dump.path
                from_dump[row] = True
                stores[row] = _int_or_na(r["spill_stores"])
                fills[row] = _int_or_na(r["spill_fills"])
                status = str(r["cycles_status"])
                if status == "estimate":
                    cycles[row], cycles_src[row] = _int_or_na(r["cycles_per_instance"]), "llo_static_profile"
                elif status == "not-estimated-remote-dma":
                    cycles[row], cycles_src[row] = pd.NA, ""
            if accepted_hlo:
                runs_inside.update(_roll_up_nested(facts, dump.path, dict(zip(names, rows)),
                                                   hlo[accepted_hlo[0]].program, stores, fills, llo_origin,
                                                   from_dump))

    columns = JOINED.frame({
        "logical_bytes": logical, "padded_bytes": padded, "spill_stores": stores, "spill_fills": fills,
        "estimated_cycles": cycles, "cycles_source": cycles_src, "hlo_origin": hlo_origin, "hlo_match": hlo_how,
        "llo_origin": llo_origin})
    columns.index = ops.index
    used = [s for s in dict.fromkeys([*hlo_origin, *llo_origin]) if s]
    given = [s.origin for s in hlo if s.from_dump] + [d.path for d in llo]
    unused = [g for g in dict.fromkeys(given) if g not in used]
    for origin in unused:
        tried = [m for m in matches if m.origin == origin]
        # an LLO dump that names no module and shares no name with a program was tried without a
        # warning (it is tried against every program): it is named here, as one never tried is
        silent = all(m.kind == "llo" and not m.module and not m.agreeing for m in tried)
        if silent and origin not in wrong_target:
            sides = {m for m in _source_modules(origin, hlo, llo) if m}
            held = f"holds {', '.join(f'`{s}`' for s in sorted(sides))}" if sides else "names no module"
            runs = ", ".join(f"`{m}`" for m in dict.fromkeys(modules.tolist())) or "no ops"
            warnings.append(f"compiler dump `{origin}` matched none of the {n} trace ops: it {held}, the trace "
                            f"runs {runs} (dumps from another compilation?)")
    if given and not from_dump.any():
        warnings.append(f"compiler dumps were given but none matched any of the {n} trace ops: no padding, "
                        "spill or cycle figures come from them")
    hlo_matched = int(columns["padded_bytes"].notna().sum())
    llo_matched = int((columns["llo_origin"] != "").sum())
    return JoinResult(columns=columns, n_ops=n, hlo_matched=hlo_matched, llo_matched=llo_matched,
                      dump_matched=int(from_dump.sum()), matches=tuple(matches), sources=tuple(used),
                      warnings=tuple(dict.fromkeys(warnings)), programs=joined_programs,
                      runs_inside=runs_inside)


def _roll_up_nested(facts: pd.DataFrame, origin: str, row_of: dict[str, int], program: CompiledProgram,
                    stores: list, fills: list, llo_origin: list, from_dump: np.ndarray) -> dict[str, str]:
    """Spills of LLO programs that are no trace op, added to the entry op that runs them.

    An LLO program is named after its HLO instruction; one below the entry computation (a Pallas
    kernel's custom call in a scanned layer, inside the `while` body) has no row of its own where
    the timeline lists entry instructions only (the static report). Its spills belong to the
    entry op the XLA dump says runs it; where the trace has the instruction itself, it keeps them.
    Returns each rolled-up program's entry op.
    """
    entry_op = program.entry_op_of
    owners: dict[str, str] = {}
    for name, stored, filled in zip(facts.index, facts["spill_stores"], facts["spill_fills"]):
        if name in row_of:
            continue
        row = row_of.get(entry_op.get(name, ""))
        if row is None or llo_origin[row] not in ("", origin):
            continue
        for column, value in ((stores, stored), (fills, filled)):
            if value is not pd.NA and not pd.isna(value):
                column[row] = (0 if column[row] is pd.NA else column[row]) + int(value)
        llo_origin[row] = origin
        from_dump[row] = True
        owners[name] = entry_op[name]
    return owners


def _source_modules(origin: str, hlo: Sequence[HloSource], llo: Sequence[LloDump]) -> list[str]:
    return [s.program.module for s in hlo if s.origin == origin] + [_llo_module(d) for d in llo if d.path == origin]
