"""The report's Pallas kernels: each kernel a compiled program states (`CompiledProgram.kernels`),
with its scoped VMEM against the scoped limit (the program's device memory, `analysis.device_memory`,
where it has them: one figure for the memory view and this) and, where an LLO dump is at hand, its
static bundles, the share of each unit's slots it issues, and its spills and fills. All compiler
figures, none measured.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from tpudiag.analysis.device_memory import used_scoped_vmem_bytes
from tpudiag.model.hardware import DEFAULT_SCOPED_VMEM_BYTES
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.kernels import KernelView, UnitShare
from tpudiag.model.llo import BundleDma
from tpudiag.model.memory import ProgramMemory

# Bundle-profile units shown, in order: (shown name, the profile's units, their ops). Indexed units
# (MXU_i, XLU_i) are given by prefix. The bundle count is the LLO op row's (`parsers.llo.ops`).
_UNITS = (("MXU matmul", ("MXU_",), "matmul"), ("XLU", ("XLU_",), "all"), ("VECTOR_ALU", ("VECTOR_ALU",), ""),
          ("VECTOR_LOAD", ("VECTOR_LOAD_AND_MISC",), ""),
          ("VECTOR_STORE", ("VECTOR_STORE", "VECTOR_STORE_AND_MISC"), ""),
          ("VECTOR_EUP", ("VECTOR_EUP",), ""), ("SCALAR_ALU", ("SCALAR_ALU",), ""))


def pallas_kernels(compiled: CompiledInputs, memory: Sequence[ProgramMemory] = ()) -> tuple[KernelView, ...]:
    """One view per Pallas kernel of the programs the rules read, by program then op name."""
    chip = compiled.chip
    out = []
    for program in compiled.programs:
        mem = next((m for m in memory if m.module == program.module), None)
        use = {v.op: v.scoped_bytes for v in mem.vmem_ops} if mem is not None else {}
        if mem is not None and mem.vmem_scoped_limit_bytes:
            limit, source = mem.vmem_scoped_limit_bytes, mem.vmem_limit_source
        elif chip is not None and chip.generation in DEFAULT_SCOPED_VMEM_BYTES:
            limit, source = DEFAULT_SCOPED_VMEM_BYTES[chip.generation], f"default for {chip.generation}, measured"
        else:
            limit, source = None, ""
        for name in sorted(program.kernels):
            inst = program.find(name)
            profile, row = _llo(compiled, name)
            dma, dma_type = _dma(compiled, name)
            out.append(KernelView(
                op=name, program=program.module, kernel=program.kernels[name],
                call_site=f"{Path(inst.source_file).name}:{inst.source_line}" if inst and inst.source_file else "",
                vmem_used_bytes=use.get(name, used_scoped_vmem_bytes(inst.backend_config) if inst else None),
                vmem_limit_bytes=limit, vmem_limit_source=source,
                # the compiled call's `bundle_analysis_data`, else the static LLO profile's (an XLA
                # dump's HLO is written before the backend estimates it)
                estimated_cycles=(inst.estimated_cycles if inst is not None and inst.estimated_cycles is not None
                                  else _int(row, "estimated_cycles")),
                bundles=_int(row, "bundles"), units=_units(profile),
                spill_stores=_int(row, "spill_stores"), spill_fills=_int(row, "spill_fills"),
                final_bundles=dma.bundles if dma else None, dma_issue_bundles=dma.issue_bundles if dma else None,
                dma_wait_bundles=dma.wait_bundles if dma else None, dma_instruction_type=dma_type))
    return tuple(out)


def _llo(compiled: CompiledInputs, op: str) -> tuple[pd.DataFrame, dict | None]:
    """The op's bundle-profile rows (the top-level program's) and its LLO op row, from the first
    LLO dump that has it."""
    for dump in compiled.llo:
        rows = dump.ops[dump.ops["name"] == op]
        profile = dump.bundle_profile[dump.bundle_profile["hlo"].astype(str) == op]
        top = profile[profile["program"].astype(str) == "TLP"]
        if not rows.empty or not profile.empty:
            return (top if not top.empty else profile), (rows.iloc[0].to_dict() if not rows.empty else None)
    return pd.DataFrame(), None


def _dma(compiled: CompiledInputs, op: str) -> tuple[BundleDma | None, str]:
    """The DMA counts of the kernel's own LLO program (named after its custom call) in the first LLO
    dump with its `final_bundles`, and the static profile's DMA type of the op in the first that has it."""
    counts = next((d for d in (dump.dma_for(op) for dump in compiled.llo) if d is not None and d.bundles), None)
    kind = ""
    for dump in compiled.llo:
        rows = dump.static_profile[dump.static_profile["hlo"].astype(str) == op]
        if not rows.empty and not pd.isna(rows.iloc[0]["dma_instruction_type"]):
            kind = str(rows.iloc[0]["dma_instruction_type"])
            break
    return counts, kind


def _units(profile: pd.DataFrame) -> tuple[UnitShare, ...]:
    """Each unit's slot share: per instance, the sum over its ops of count / capacity; the mean over instances."""
    if profile.empty:
        return ()
    profile = profile[profile["capacity"] > 0]
    units, ops = profile["unit"].astype(str), profile["op"].astype(str)
    out = []
    for shown, names, op in _UNITS:
        indexed = names[0].endswith("_")
        match = units.str.startswith(names[0]) if indexed else units.isin(names)
        rows = profile[match & (ops.str.startswith(op) if op else ops.eq(""))]
        if rows.empty:
            continue
        per_instance = (rows["count"] / rows["capacity"]).groupby(rows["unit"].astype(str)).sum()
        out.append(UnitShare(shown, float(per_instance.mean())))
    return tuple(out)


def _int(row: dict | None, key: str) -> int | None:
    value = row.get(key) if row is not None else None
    return None if value is None or pd.isna(value) else int(value)
