"""Async copies to and from host memory: found from the op metadata, their direction, bytes and rate."""

from __future__ import annotations

import numpy as np
import pandas as pd

from tpudiag.analysis.host_transfers import Direction, host_copies, transfer_rates
from tpudiag.model import schemas
from tpudiag.model.compiled import HOST_MEMORY_SPACE, memory_space_name, memory_spaces_in

HBM = "f32[4,128]{1,0:T(8,128)}"
HOST = "f32[4,128]{1,0:T(8,128)S(5)}"
VMEM = "f32[4,128]{1,0:T(8,128)S(1)}"
CTX = "u32[]{:S(2)}"


def test_memory_spaces_in_shape_text():
    assert memory_spaces_in(f"({HBM}, {HOST}, {CTX})") == (5, 2)
    assert memory_spaces_in(HBM) == () and memory_spaces_in("") == ()
    assert memory_space_name(HOST_MEMORY_SPACE) == "host" and memory_space_name(1) == "vmem"


def _meta(rows: list[tuple[str, str, str, str]]) -> pd.DataFrame:
    n = len(rows)
    return schemas.OP_METADATA.frame({
        "host": ["h"] * n, "program_id": np.full(n, 7, dtype=np.uint64), "name": [r[0] for r in rows],
        "category": [r[1] for r in rows], "symbol_id": np.ones(n, dtype=np.uint64), "flops": np.zeros(n),
        "model_flops": np.zeros(n), "bytes_accessed": np.zeros(n), "hbm_bytes": np.zeros(n),
        "shape_with_layout": [r[2] for r in rows], "source": [""] * n, "tf_op": [""] * n,
        "hlo_text": [r[3] for r in rows]})


def test_direction_and_bytes_from_the_copy_start_and_the_done_follows_it():
    copies = host_copies(_meta([
        ("copy-start.3", "copy-start", f"({HBM}, {HOST}, {CTX})", ""),  # prefetch: source in host memory
        # its done names it as the operand, although the suffixes differ
        ("copy-done.9", "copy-done", HBM, f"%copy-done.9 = {HBM} copy-done(({HBM}, {HOST}, {CTX}) %copy-start.3)"),
        ("copy-start.4", "copy-start", f"({HOST}, {HBM}, {CTX})", ""),  # offload
        ("copy-done.4", "copy-done", HOST, ""),  # no HLO text: paired by its suffix
        ("copy-start.5", "copy-start", f"({VMEM}, {HBM}, {CTX})", ""),  # on-chip prefetch: not a host transfer
        ("copy-done.5", "copy-done", VMEM, ""),
    ]))
    assert {k[1]: (c.role, c.direction) for k, c in copies.items()} == {
        "copy-start.3": ("start", Direction.TO_DEVICE), "copy-done.9": ("done", Direction.TO_DEVICE),
        "copy-start.4": ("start", Direction.TO_HOST), "copy-done.4": ("done", Direction.TO_HOST)}
    assert copies[(7, "copy-done.9")].bytes == 4 * 128 * 4 and copies[(7, "copy-done.9")].dtype == "f32"


def _transfers(bytes_: int, start_ps: int, end_ps: int) -> pd.DataFrame:
    return schemas.HOST_TRANSFERS.frame({
        "host": ["h"], "device": ["/device:TPU:0"], "core": np.array([0], dtype=np.int32), "step": np.array([0]),
        "name": ["copy-done"], "direction": [Direction.TO_DEVICE.value], "dtype": ["f32"],
        "bytes": np.array([bytes_]), "start_ps": np.array([start_ps]), "end_ps": np.array([end_ps]),
        "wait_ps": np.array([end_ps - start_ps])})


def test_a_rate_above_the_nominal_link_is_not_shown():
    # 1 GB over 10 ms: 100 GB/s, above a 32 GB/s nominal link: the window cannot hold the whole transfer.
    (fast,) = transfer_rates(_transfers(10**9, 0, 10**10), schemas.STEPS.empty(), 32e9)
    assert fast.achieved_bytes_per_s is None and fast.above_link and "rate n/a" in fast.line()
    (ok,) = transfer_rates(_transfers(10**8, 0, 10**10), schemas.STEPS.empty(), 32e9)
    assert ok.achieved_bytes_per_s == 1e10 and ok.link_share == 10e9 / 32e9 and "31.2% of" in ok.line()
    (unknown,) = transfer_rates(_transfers(10**8, 0, 10**10), schemas.STEPS.empty(), None)
    assert unknown.achieved_bytes_per_s == 1e10 and "bandwidth for this chip is unknown" in unknown.line()
