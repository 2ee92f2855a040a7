"""Join the per-file facts into one row per HLO op (`OPS`), keyed by HLO instruction name.

Sources, in order of preference, and why:
- spill counts: the TLP bundle profile (cheap, every generation, per HLO op), else the spill
  instructions found in the op's own `final_bundles`;
- bundles: the op's own program's schedule analysis, else its per-bundle-utilization row count, else
  the denominator of its bundle-profile counter line (one slot per bundle);
- cycles: the static LLO profile; its 0 for remote-DMA ops is not an estimate, so it becomes NA.
"""

from __future__ import annotations

import pandas as pd

from tpudiag.model.hlo_names import collective_family
from tpudiag.model.llo import OPS, BundleUtilization, RegisterPressure, ScheduleAnalysis
from tpudiag.parsers.llo.static_profile import REMOTE

TOP_LEVEL = "TLP"
_ASYNC_FUSION = "async_collective_fusion"  # v5e compute that carries a collective's steps
_TOP_INLINING_CALLER = "<top-inlining-caller>"
_COLLECTIVE_OPCODES = frozenset({
    "all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute",
    "all-reduce-start", "all-reduce-done", "all-gather-start", "all-gather-done",
    "collective-permute-start", "collective-permute-done", "ragged-all-to-all",
})


def _joinable(name: str) -> bool:
    return bool(name) and not name.startswith("<")


# A counter line of the bundle profile: one slot per bundle, so its denominator is the op's static bundles.
BUNDLE_COUNTER = "VMEM_SPILL_COUNT"


def _profile_sums(profile: pd.DataFrame) -> tuple[dict, dict, dict]:
    """Per HLO: {unit: count} for counter units, the mean MXU matmul fraction, and its static bundles
    (the denominator of its `BUNDLE_COUNTER` line)."""
    if profile.empty:
        return {}, {}, {}
    # Prefer the top-level program's profile: it lists every op once.
    top = profile[profile["program"] == TOP_LEVEL]
    rows = top if not top.empty else profile
    counters = (rows.groupby(["hlo", "unit"], observed=True)["count"].sum()
                .unstack(fill_value=0).to_dict(orient="index"))
    mxu = rows[rows["unit"].astype(str).str.startswith("MXU_") & rows["op"].astype(str).str.startswith("matmul")]
    fractions: dict[str, float] = {}
    if not mxu.empty:
        per_op = mxu.groupby(["hlo", "unit", "op"], observed=True)[["count", "capacity"]].sum()
        per_op = per_op[per_op["capacity"] > 0]
        per_unit = (per_op["count"] / per_op["capacity"]).groupby(level=["hlo", "unit"]).sum()
        fractions = per_unit.groupby(level="hlo").mean().to_dict()
    counter = rows[rows["unit"].astype(str) == BUNDLE_COUNTER]
    bundles = {str(h): int(c) for h, c in counter.groupby("hlo", observed=True)["capacity"].max().items() if c > 0}
    return counters, fractions, bundles


def build_ops(*, programs: set[str], bundle_profile: pd.DataFrame, static_profile: pd.DataFrame,
              spill_instructions: pd.DataFrame, spill_slots: pd.DataFrame, slot_programs: set[str],
              bundle_programs: set[str], schedule: pd.DataFrame, vmem_allocations: pd.DataFrame,
              has_vmem_report: bool, utilization: tuple[BundleUtilization, ...],
              schedules: tuple[ScheduleAnalysis, ...],
              register_pressure: tuple[RegisterPressure, ...]) -> pd.DataFrame:
    counters, mxu_fractions, profile_bundles = _profile_sums(bundle_profile)
    opcodes: dict[str, str] = {}
    calls: dict[str, str] = {}
    for name, opcode, called in zip(bundle_profile["hlo"].astype(str), bundle_profile["opcode"].astype(str),
                                    bundle_profile["calls"].astype(str)):
        if opcode:
            opcodes.setdefault(name, opcode)
        if called:
            calls.setdefault(name, called)
    static = {str(r.hlo): r for r in static_profile.itertuples(index=False)}
    tlp_bundles = (schedule[schedule["program"] == TOP_LEVEL].groupby("hlo", observed=True)["bundles"].sum()
                   .to_dict() if not schedule.empty else {})
    vmem = {}
    if not vmem_allocations.empty:
        for hlo, group in vmem_allocations.groupby("hlo", observed=True):
            blocks = group.drop_duplicates(["block"])
            vmem[str(hlo)] = (int(group.loc[group["is_spill"], "size_bytes"].sum()),
                              int(blocks.loc[blocks["block_type"] == "SCOPED", "block_bytes"].sum()),
                              int(blocks.loc[blocks["block_type"] == "HLO_TEMPORARY", "block_bytes"].sum()))
    util = {u.program: u for u in utilization}
    sched = {s.program: s for s in schedules}
    pressure = {r.program: r.pressure for r in register_pressure if r.register_class == "vregs"}

    names = {n for n in bundle_profile["hlo"].astype(str) if _joinable(n)}
    names |= {n for n in static}
    names |= {n for n in vmem if n != _TOP_INLINING_CALLER}
    names |= {n for n in tlp_bundles if _joinable(n)}
    names |= {p for p in programs if _joinable(p) and p != TOP_LEVEL}

    cols: dict[str, list] = {c: [] for c in OPS.names}
    for name in sorted(names):
        c = counters.get(name, {})
        est = static.get(name)
        opcode = opcodes.get(name, "")
        remote = est is not None and est.dma_instruction_type == REMOTE
        own_spills = spill_instructions[spill_instructions["program"] == name] if name in bundle_programs else None
        u, s = util.get(name), sched.get(name)
        cols["name"].append(name)
        called = calls.get(name, "")
        cols["llo_program"].append(name if name in programs else "")
        cols["opcode"].append(opcode)
        cols["calls"].append(called)
        cols["is_collective"].append(remote or opcode in _COLLECTIVE_OPCODES or bool(collective_family(name))
                                     or bool(collective_family(called)) or called.startswith(_ASYNC_FUSION))
        cols["estimated_cycles"].append(None if est is None or remote else int(est.total_cycles))
        cols["cycles_per_instance"].append(None if est is None or remote else int(est.estimated_cycles))
        cols["num_equivalent_hlos"].append(None if est is None else int(est.num_equivalent_hlos))
        cols["cycles_status"].append("no-static-profile" if est is None
                                     else "not-estimated-remote-dma" if remote else "estimate")

        def count(unit, kind):
            if unit in c:
                return int(c[unit])
            if own_spills is not None:
                return int((own_spills["kind"] == kind).sum())
            return None

        cols["spill_stores"].append(count("VMEM_SPILL_COUNT", "vmem_spill"))
        cols["spill_fills"].append(count("VMEM_FILL_COUNT", "vmem_fill"))
        cols["smem_spill_stores"].append(count("SMEM_SPILL_COUNT", "smem_spill"))
        cols["smem_spill_fills"].append(count("SMEM_FILL_COUNT", "smem_fill"))
        cols["spill_slots"].append(int(((spill_slots["program"] == name) & (spill_slots["space"] == "vmem")).sum())
                                   if name in slot_programs else None)
        v = vmem.get(name)
        # The report lists the ops that hold VMEM; an op it omits holds none.
        absent = 0 if has_vmem_report else None
        cols["vmem_spill_bytes"].append(v[0] if v else absent)
        cols["vmem_scoped_bytes"].append(v[1] if v else absent)
        cols["vmem_temporary_bytes"].append(v[2] if v else absent)
        cols["bundles"].append(s.total_bundles if s else (u.bundles if u else profile_bundles.get(name)))
        cols["tlp_bundles"].append(float(tlp_bundles.get(name, float("nan"))))
        busy = u.mxu_busy_fraction if u else None
        cols["mxu_busy_fraction"].append(float("nan") if busy is None else busy)
        cols["mxu_matmul_fraction"].append(float(mxu_fractions.get(name, float("nan"))))
        cols["hbm_to_vmem_starvation"].append(int(c["HBM_TO_VMEM_ESTIMATED_STARVATION"])
                                              if "HBM_TO_VMEM_ESTIMATED_STARVATION" in c else None)
        cols["vmem_to_hbm_starvation"].append(int(c["VMEM_TO_HBM_ESTIMATED_STARVATION"])
                                              if "VMEM_TO_HBM_ESTIMATED_STARVATION" in c else None)
        cols["register_pressure"].append(pressure.get(name))
    return OPS.frame(cols)
