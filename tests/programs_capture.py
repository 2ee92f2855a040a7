"""Captures of several XLA programs per chip, with no `Steps` line, as a JAX inference run writes them.

Each chip is a `/device:TPU:N` plane with an `XLA Modules` line (one event per execution, named
`<module>(<program id>)`) and an `XLA Ops` line whose op metadata carry `program_id` as a uint64
stat, as the real v6e capture in `tests/fixtures/real/` does. `/host:metadata` keys each program's
HloProto by its id read as a signed int64, as XProf writes it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tpudiag.model.program_ids import as_int64
from tpudiag.proto import HloProto
from tpudiag.writers.xspace_builder import U64, XSpaceBuilder

US = 1_000_000  # ps
HIGH_ID = 12190760917235803885  # jit_f's id in the real v6e capture: above 2^63
OTHER_HIGH_ID = 9646411105960254074  # jit__psum's there


@dataclass(frozen=True)
class Execution:
    """One execution of `module` on a chip: from `start_ps` for `dur_ps`, one op `op` filling `busy`
    of it (fraction) from its start."""

    module: str
    program_id: int
    start_ps: int
    dur_ps: int
    op: str = "fusion"
    busy: float = 1.0


def write_programs_capture(path: Path, chips: list[list[Execution]], hlo: bool = True) -> Path:
    """`path`/plugins/profile/run/host.xplane.pb holding `chips[i]`'s executions on `/device:TPU:i`."""
    space = XSpaceBuilder("host")
    programs: dict[int, str] = {}
    for chip, executions in enumerate(chips):
        plane = space.plane(f"/device:TPU:{chip}", plane_id=chip + 1)
        plane.set_stat("device_type_string", "TPU v6 Lite")
        plane.set_stat("peak_teraflops_per_second", 918.0)
        plane.set_stat("peak_hbm_bw_gigabytes_per_second", 1640.0)
        modules = plane.line("XLA Modules", 1)
        ops = plane.line("XLA Ops", 2)
        for e in sorted(executions, key=lambda e: e.start_ps):
            programs[e.program_id] = e.module
            modules.event(plane.event_metadata(f"{e.module}({e.program_id})"), e.start_ps, e.dur_ps,
                          {"run_id": U64(1)})
            md = plane.event_metadata(f"%{e.op} = f32[8]{{0}} fusion()", e.op,
                                      {"program_id": U64(e.program_id), "symbol_id": U64(1),
                                       "hlo_category": "loop fusion", "bytes_accessed": 1024})
            ops.event(md, e.start_ps, int(e.dur_ps * e.busy))
    if hlo:
        meta = space.plane("/host:metadata", plane_id=100)
        for pid, module in programs.items():
            proto = HloProto()
            proto.hlo_module.name = module
            meta.event_metadata(f"{module}({pid})", stats={"Hlo Proto": proto.SerializeToString()},
                                metadata_id=as_int64(pid))
    run = path / "plugins" / "profile" / "run"
    space.write(run / "host.xplane.pb")
    return run
