"""Async copies to and from host memory: found from the op metadata, their direction, bytes and rate."""

from __future__ import annotations

import numpy as np
import pytest
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


# ---- each step on hand-built inputs ------------------------------------------------------------

OFFLOAD = f"({HOST}, {HBM}, {CTX})"  # copy-start result: (destination, source, context)
PREFETCH = f"({HBM}, {HOST}, {CTX})"
F32_4x128 = 4 * 128 * 4  # logical bytes of f32[4,128]


def test_a_copy_is_known_by_its_category_or_else_by_its_name():
    copies = host_copies(_meta([
        ("copy-start.1", "Copy-Start", OFFLOAD, ""),  # the category in any case
        ("copy-start.2", "data formatting", OFFLOAD, ""),  # an odd category: the name says start
        ("copy-done.2", "data formatting", HOST, ""),  # ... and done
        ("fusion.3", "loop fusion", OFFLOAD, ""),  # neither: no copy, whatever its shape
    ]))
    assert {k: (c.role, c.direction, c.bytes, c.dtype) for k, c in copies.items()} == {
        (7, "copy-start.1"): ("start", Direction.TO_HOST, F32_4x128, "f32"),
        (7, "copy-start.2"): ("start", Direction.TO_HOST, F32_4x128, "f32"),
        (7, "copy-done.2"): ("done", Direction.TO_HOST, F32_4x128, "f32")}


def test_a_copy_start_without_a_shape_reads_its_result_from_the_hlo_text():
    text = f"%copy-start.8 = {PREFETCH} copy-start({HOST} %param.1), cross_program_prefetch_index=0"
    copies = host_copies(_meta([("copy-start.8", "copy-start", "", text)]))
    assert copies == {(7, "copy-start.8"): host_copies(_meta([("copy-start.8", "copy-start", PREFETCH, "")]))[
        (7, "copy-start.8")]}
    assert copies[(7, "copy-start.8")].direction is Direction.TO_DEVICE


@pytest.mark.parametrize("shape", [
    f"({HOST}, {HOST}, {CTX})",  # host to host: never crosses the link
    HOST,  # not a (destination, source, context) tuple
    f"({HOST})",  # a tuple of one
    f"(({HOST}, {HBM}), {HBM}, {CTX})",  # a destination that is no array
    f"({HOST}, ({HBM}, {HBM}), {CTX})",  # a source that is no array
    "f32[4,128]{1,0:T(8,128)S(5)",  # damaged text naming host memory
])
def test_a_copy_start_that_moves_nothing_over_the_host_link_is_no_host_copy(shape):
    assert host_copies(_meta([("copy-start.1", "copy-start", shape, ""), ("copy-done.1", "copy-done", HBM, "")])) == {}


def test_no_copies_no_table():
    assert host_copies(_meta([])) == {}
    assert host_copies(_meta([("fusion.1", "loop fusion", HBM, "")])) == {}


def test_a_done_pairs_with_the_start_of_its_own_program():
    meta = _meta([("copy-start.1", "copy-start", OFFLOAD, ""), ("copy-done.1", "copy-done", HOST, "")])
    other = meta.assign(program_id=np.full(2, 8, dtype=np.uint64))
    mixed = schemas.OP_METADATA.frame({c: np.concatenate([meta[c].to_numpy(), other[c].to_numpy()])
                                       for c in schemas.OP_METADATA.names})
    # program 8's start is a prefetch: each done follows the start of its own program
    mixed.loc[2, "shape_with_layout"] = PREFETCH
    copies = host_copies(mixed)
    assert copies[(7, "copy-done.1")].direction is Direction.TO_HOST
    assert copies[(8, "copy-done.1")].direction is Direction.TO_DEVICE
    # a done whose start is no host copy is none either
    assert (9, "copy-done.1") not in copies


def test_a_done_named_after_a_start_the_program_lacks_is_paired_by_its_suffix():
    # the operand it names is not a host copy; the suffix finds copy-start.4
    copies = host_copies(_meta([
        ("copy-start.4", "copy-start", PREFETCH, ""),
        ("copy-done.4", "copy-done", HBM, f"%copy-done.4 = {HBM} copy-done(({HBM}, {HOST}, {CTX}) %copy-start.99)"),
    ]))
    assert copies[(7, "copy-done.4")].direction is Direction.TO_DEVICE


TPU0, TPU1 = "/device:TPU:0", "/device:TPU:1"


def _events(rows: list[tuple]) -> pd.DataFrame:
    """EVENTS from (device, core, program_id, name, start_ps, dur_ps, self_ps, step) rows."""
    dev, core, pid, name, start, dur, self_ps, step = zip(*rows)
    n = len(rows)
    return schemas.EVENTS.frame({
        "host": ["h"] * n, "device": list(dev), "core": list(core), "chip": list(core), "program_id": list(pid),
        "module": ["m"] * n, "name": list(name), "category": ["x"] * n, "start_ps": list(start),
        "dur_ps": list(dur), "self_ps": list(self_ps), "depth": [0] * n, "step": list(step)})


def _copy(name: str, role: str, direction=Direction.TO_HOST, bytes_=F32_4x128, dtype="f32", program=7):
    from tpudiag.analysis.host_transfers import HostCopy

    return (program, name), HostCopy(program, name, role, direction, bytes_, dtype)


def test_the_mask_matches_program_and_name():
    from tpudiag.analysis.host_transfers import host_copy_mask

    events = _events([(TPU0, 0, 7, "copy-start.1", 0, 10, 10, 0), (TPU0, 0, 8, "copy-start.1", 10, 10, 10, 0),
                      (TPU0, 0, 7, "fusion.1", 20, 10, 10, 0), (TPU0, 0, 7, "copy-done.1", 30, 10, 10, 0)])
    copies = dict([_copy("copy-start.1", "start"), _copy("copy-done.1", "done")])
    # program 8's copy-start.1 is another program's op of the same name
    assert host_copy_mask(events, copies).tolist() == [True, False, False, True]
    assert host_copy_mask(events, {}).tolist() == [False] * 4
    assert host_copy_mask(events.iloc[:0], copies).tolist() == []
    assert host_copy_mask(events, dict([_copy("copy-done.7", "done")])).tolist() == [False] * 4


def test_one_row_per_done_its_window_from_its_start_and_the_time_in_both():
    from tpudiag.analysis.host_transfers import transfer_table

    events = _events([
        # core 1 listed first: the table is by core, then time
        (TPU1, 1, 7, "copy-done.1", 500, 40, 25, 1),
        (TPU1, 1, 7, "copy-start.1", 300, 10, 10, 1),
        # core 0: an offload copy-start.1 [100, 110) self 10 ... copy-done.1 [200, 230) self 30, in step 0
        (TPU0, 0, 7, "copy-start.1", 100, 10, 10, 0),
        (TPU0, 0, 7, "fusion.1", 110, 90, 90, 0),
        (TPU0, 0, 7, "copy-done.1", 200, 30, 30, 0),
        # a prefetch done whose start is not in the capture: its own window and time, outside every step
        (TPU0, 0, 7, "copy-done.2", 900, 20, 15, -1),
    ])
    copies = dict([_copy("copy-start.1", "start"), _copy("copy-done.1", "done"),
                   _copy("copy-done.2", "done", Direction.TO_DEVICE, 2048, "bf16")])
    table = transfer_table(events, copies, "host9")
    assert list(table.columns) == schemas.HOST_TRANSFERS.names
    rows = [tuple(r) for r in table.astype({"host": str, "device": str, "name": str, "direction": str,
                                              "dtype": str}).itertuples(index=False)]
    assert rows == [
        ("host9", TPU0, 0, 0, "copy-done.1", "HBM to host", "f32", F32_4x128, 100, 230, 10 + 30),
        ("host9", TPU0, 0, -1, "copy-done.2", "host to HBM", "bf16", 2048, 900, 920, 15),
        ("host9", TPU1, 1, 1, "copy-done.1", "HBM to host", "f32", F32_4x128, 300, 540, 10 + 25)]
    # only starts: no transfer yet; no copies at all: the empty table
    assert transfer_table(events[events["name"] == "copy-start.1"], copies, "host9").empty
    assert list(transfer_table(events, {}, "host9").columns) == schemas.HOST_TRANSFERS.names


def _rows(rows: list[tuple]) -> pd.DataFrame:
    """HOST_TRANSFERS from (host, core, step, name, direction, dtype, bytes, start_ps, end_ps, wait_ps) rows."""
    host, core, step, name, direction, dtype, bytes_, start, end, wait = zip(*rows)
    return schemas.HOST_TRANSFERS.frame({
        "host": list(host), "device": [f"/device:TPU:{c}" for c in core], "core": list(core), "step": list(step),
        "name": list(name), "direction": [d.value for d in direction], "dtype": list(dtype), "bytes": list(bytes_),
        "start_ps": list(start), "end_ps": list(end), "wait_ps": list(wait)})


def _step_rows(keys: list[tuple[str, int, int]]) -> pd.DataFrame:
    """STEPS with one row per (host, core, step); only those keys matter to the rates."""
    n = len(keys)
    zeros = np.zeros(n, dtype=np.int64)
    return schemas.STEPS.frame({
        "host": [h for h, _, _ in keys], "device": [f"/device:TPU:{c}" for _, c, _ in keys],
        "core": [c for _, c, _ in keys], "step": [s for _, _, s in keys], "start_ps": zeros, "dur_ps": zeros,
        "busy_ps": zeros, "compute_ps": zeros, "collective_ps": zeros, "io_ps": zeros, "host_transfer_ps": zeros,
        "idle_ps": zeros})


def test_rates_per_step_and_core_and_over_the_union_of_each_cores_windows():
    MS = 10**9  # ps
    TO_HOST, TO_DEVICE = Direction.TO_HOST, Direction.TO_DEVICE
    transfers = _rows([
        # host a, core 0, two steps: offloads of 1 MB [0, 10) ms and 2 MB [5, 20) ms overlap: a window
        # of 20 ms for 3 MB; a third offload of 1 MB outside every step [100, 110) ms: 10 ms more.
        ("a", 0, 0, "copy-done.1", TO_HOST, "f32", 10**6, 0, 10 * MS, 4 * MS),
        ("a", 0, 1, "copy-done.2", TO_HOST, "bf16", 2 * 10**6, 5 * MS, 20 * MS, 8 * MS),
        ("a", 0, -1, "copy-done.1", TO_HOST, "f32", 10**6, 100 * MS, 110 * MS, 2 * MS),
        # host b, core 0, two steps: one offload of 3 MB in [0, 10) ms
        ("b", 0, 1, "copy-done.1", TO_HOST, "f32", 3 * 10**6, 0, 10 * MS, 6 * MS),
        # a prefetch on host a, core 0 whose window is empty: no rate
        ("a", 0, 0, "copy-done.5", TO_DEVICE, "s32", 4096, 7 * MS, 7 * MS, 0),
    ])
    steps = _step_rows([("a", 0, 0), ("a", 0, 1), ("b", 0, 0), ("b", 0, 1)])
    prefetch, offload = transfer_rates(transfers, steps, 32e9)  # in `Direction`'s order
    assert prefetch.direction == "host to HBM" and offload.direction == "HBM to host"
    # per step and core, inside steps only: a/0 2 copies, 3 MB, 12 ms over 2 steps; b/0 1, 3 MB, 6 ms over 2
    assert offload.transfers_per_step == (2 / 2 + 1 / 2) / 2
    assert offload.bytes_per_step == (3e6 / 2 + 3e6 / 2) / 2
    assert offload.wait_ps == (12 * MS / 2 + 6 * MS / 2) / 2
    # rate per core over every transfer: a/0 4 MB over 30 ms, b/0 3 MB over 10 ms; their mean
    assert offload.achieved_bytes_per_s == pytest.approx((4e6 / 30e-3 + 3e6 / 10e-3) / 2)
    assert offload.link_bytes_per_s == 32e9 and not offload.above_link
    # ops by their total wait, most first: copy-done.1 12 ms, copy-done.2 8 ms; dtypes sorted
    assert offload.ops == ("copy-done.1", "copy-done.2") and offload.dtypes == ("bf16", "f32")
    assert prefetch.achieved_bytes_per_s is None and prefetch.transfers_per_step == 1 / 2
    assert prefetch.ops == ("copy-done.5",) and prefetch.dtypes == ("s32",)


def test_a_core_without_steps_counts_no_transfers_per_step_but_has_a_rate():
    transfers = _rows([("a", 3, -1, "copy-done.1", Direction.TO_HOST, "f32", 10**6, 0, 10**7, 10**6)])
    (rate,) = transfer_rates(transfers, _step_rows([("a", 0, 0)]), None)
    assert (rate.transfers_per_step, rate.bytes_per_step, rate.wait_ps) == (0.0, 0.0, 0.0)
    assert rate.achieved_bytes_per_s == 1e6 / 1e-5  # 1 MB in 10 us
    assert transfer_rates(schemas.HOST_TRANSFERS.empty(), _step_rows([("a", 0, 0)]), None) == ()


def test_without_steps_the_capture_is_one_step_per_core():
    transfers = _rows([("a", 0, -1, "copy-done.1", Direction.TO_HOST, "f32", 10**6, 0, 10**7, 10**6),
                       ("a", 0, -1, "copy-done.2", Direction.TO_HOST, "f32", 10**6, 10**7, 2 * 10**7, 3 * 10**6),
                       ("a", 1, -1, "copy-done.1", Direction.TO_HOST, "f32", 10**6, 0, 10**7, 10**6)])
    (rate,) = transfer_rates(transfers, schemas.STEPS.empty(), None)
    # core 0: 2 copies, 2 MB, 4 us waited in its one step; core 1: 1, 1 MB, 1 us
    assert (rate.transfers_per_step, rate.bytes_per_step, rate.wait_ps) == (1.5, 1.5e6, 2.5 * 10**6)
    assert rate.ops == ("copy-done.2", "copy-done.1")  # 3 us, then 1 + 1 us


def test_a_window_of_no_time_has_no_rate_and_one_of_a_picosecond_has_one():
    instant = _rows([("a", 0, 0, "copy-done.1", Direction.TO_HOST, "f32", 4096, 500, 500, 0)])
    (rate,) = transfer_rates(instant, _step_rows([("a", 0, 0)]), None)
    assert rate.achieved_bytes_per_s is None and not rate.above_link
    one_ps = _rows([("a", 0, 0, "copy-done.1", Direction.TO_HOST, "f32", 1, 500, 501, 1)])
    (rate,) = transfer_rates(one_ps, _step_rows([("a", 0, 0)]), None)
    assert rate.achieved_bytes_per_s == 1e12  # 1 byte in 1 ps


def test_a_rate_exactly_at_the_nominal_link_is_shown():
    # 32 MB in 1 ms: exactly the 32 GB/s link, not above it
    (rate,) = transfer_rates(_transfers(32 * 10**6, 0, 10**9), schemas.STEPS.empty(), 32e9)
    assert rate.achieved_bytes_per_s == 32e9 and not rate.above_link and rate.link_share == 1.0


def test_a_renamed_copy_is_known_by_its_category():
    # names that say nothing: the categories make them a start and a done (paired by the HLO operand)
    copies = host_copies(_meta([
        ("offload.7", "copy-start", OFFLOAD, ""),
        ("wait.8", "Copy-Done", HOST, f"%wait.8 = {HOST} copy-done(({HOST}, {HBM}, {CTX}) %offload.7)"),
    ]))
    assert {k[1]: c.role for k, c in copies.items()} == {"offload.7": "start", "wait.8": "done"}


def test_an_event_without_a_name_is_no_host_copy():
    from tpudiag.analysis.host_transfers import host_copy_mask

    events = _events([(TPU0, 0, 7, "add.1", 0, 10, 10, 0), (TPU0, 0, 7, "copy-done.1", 30, 10, 10, 0)])
    assert events["name"].cat.categories[-1] == "copy-done.1"
    events.loc[0, "name"] = None  # its code is -1, which must not read as the last category, copy-done.1
    copies = dict([_copy("copy-done.1", "done")])
    assert host_copy_mask(events, copies).tolist() == [False, True]


def test_a_copy_start_with_a_missing_shape_reads_its_hlo_text_and_its_done_is_a_whole_record():
    from tpudiag.analysis.host_transfers import HostCopy

    meta = _meta([("copy-start.8", "copy-start", "", f"%copy-start.8 = {PREFETCH} copy-start({HOST} %p)"),
                  ("copy-done.8", "copy-done", HBM, "")])
    meta["shape_with_layout"] = meta["shape_with_layout"].astype("string")
    meta.loc[0, "shape_with_layout"] = pd.NA  # not written at all, rather than empty
    copies = host_copies(meta)
    assert copies[(7, "copy-done.8")] == HostCopy(7, "copy-done.8", "done", Direction.TO_DEVICE, F32_4x128, "f32")
    assert copies[(7, "copy-start.8")] == HostCopy(7, "copy-start.8", "start", Direction.TO_DEVICE, F32_4x128, "f32")
