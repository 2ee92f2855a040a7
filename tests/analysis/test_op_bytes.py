"""Bytes by memory space from an op's layouts, and the bytes async copies bring it (issue 27 §1-2)."""

from __future__ import annotations

import pandas as pd
import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.analysis.op_bytes import op_bytes

DECODE = REPO / "examples" / "models" / "captures" / "llm_decode_v5e"


def _meta(texts: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame({"program_id": [1] * len(texts), "name": list(texts), "hlo_text": list(texts.values())})


PREFETCH = {
    "copy-start": "%copy-start = (bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}, bf16[8192,1024]{1,0:T(8,128)(2,1)}, "
                  "u32[]{:S(2)}) copy-start(bf16[8192,1024]{1,0:T(8,128)(2,1)} %param.1)",
    "copy-done": "%copy-done = bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} copy-done((bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}, "
                 "bf16[8192,1024]{1,0:T(8,128)(2,1)}, u32[]{:S(2)}) %copy-start)",
    "fusion.18": "%fusion.18 = (f32[4]{0:T(128)S(1)}, bf16[4,1024]{1,0:T(4,128)(2,1)S(1)}) fusion(bf16[4,8192]"
                 "{1,0:T(4,128)(2,1)} %param, bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} %copy-done)",
    "fusion.9": "%fusion.9 = bf16[4,1024]{1,0:T(4,128)(2,1)S(1)} fusion(bf16[4,1024]{1,0:T(4,128)(2,1)S(1)} %fusion.18)",
}
WEIGHTS = 8192 * 1024 * 2


def test_bytes_by_space_and_what_the_prefetch_brought():
    got = op_bytes(_meta(PREFETCH)).set_index("name")
    start, done, matmul = got.loc["copy-start"], got.loc["copy-done"], got.loc["fusion.18"]
    assert start["moves"] == "hbm->vmem"
    assert (start["hbm_read_bytes"], start["vmem_write_bytes"]) == (WEIGHTS, WEIGHTS)
    assert done[["hbm_read_bytes", "vmem_write_bytes", "copied_hbm_bytes"]].sum() == 0  # the pair counts once
    assert matmul["hbm_read_bytes"] == 4 * 8192 * 2 and matmul["vmem_read_bytes"] == WEIGHTS
    assert matmul["vmem_write_bytes"] == 4 * 4 + 4 * 1024 * 2
    assert matmul["copied_hbm_bytes"] == WEIGHTS  # the weights its copy brought from HBM
    assert got.loc["fusion.9", "copied_hbm_bytes"] == 0  # VMEM made on chip, no copy


def test_host_offload_copies_say_where_they_move():
    texts = {"copy-start.2": "%copy-start.2 = (f32[1024]{0:T(1024)}, f32[1024]{0:T(1024)S(5)}, u32[]{:S(2)}) "
                             "copy-start(f32[1024]{0:T(1024)S(5)} %param.3)"}
    got = op_bytes(_meta(texts)).set_index("name").loc["copy-start.2"]
    assert got["moves"] == "host->hbm" and got["host_read_bytes"] == 4096 and got["hbm_write_bytes"] == 4096
    # and back: a copy of an HBM array to host memory (S(5)) reads HBM and writes the host
    texts = {"copy-start.4": "%copy-start.4 = (f32[1024]{0:T(1024)S(5)}, f32[1024]{0:T(1024)}, u32[]{:S(2)}) "
                             "copy-start(f32[1024]{0:T(1024)} %fusion.3)"}
    got = op_bytes(_meta(texts)).set_index("name").loc["copy-start.4"]
    assert got["moves"] == "hbm->host" and got["hbm_read_bytes"] == 4096 and got["host_write_bytes"] == 4096
    assert got["host_read_bytes"] == 0 and got["hbm_write_bytes"] == 0


@pytest.fixture(scope="module")
def decode():
    return tpudiag.diagnose(DECODE)


@pytest.mark.parametrize("name", ["fusion.18", "add_reduce_fusion"])
def test_decode_matmuls_are_hbm_bound_counting_their_weights(decode, name):
    """M = 4 matmuls over weights their copies (`copy-done`, slices joined by a custom call) bring into
    VMEM: XLA's cost analysis gives them 0.8 MB and 6 KB of HBM bytes (1,024 and 65,536 FLOP/B);
    counting the weights, about 4 FLOP/B, far left of v5e's ridge (241): HBM-bound."""
    op = decode.analysis.ops.set_index("name").loc[name]
    assert op["copied_hbm_bytes"] > 1e8 and op["hbm_intensity"] <= 10
    assert (op["bound_by"], op["bound_basis"]) == ("HBM", "intensity with copied bytes")


def test_no_decode_op_is_bound_by_unknown(decode):
    assert "Unknown" not in set(decode.analysis.ops["bound_by"].astype(str))


def test_decode_step_is_given_against_its_hbm_floor(decode):
    """The decode step reads its 64.1 MiB of entry parameters (weights and KV cache, the compiled
    program's arguments in HBM: 67,194,884 bytes) once: 82.0 µs at v5e's 819 GB/s, against a
    90.8 µs modelled step, 3 FLOP per byte: bandwidth-bound near its floor."""
    (f,) = [f for f in decode.findings if f.rule == "memory-bound" and "HBM floor" in f.message]
    q = {q.name: q.value for q in f.quantities}
    assert q["bytes read once"] == 67_194_884
    assert q["HBM floor ps"] == pytest.approx(67_194_884 / 819e9 * 1e12)
    assert 0.85 < q["HBM bandwidth utilization"] < 0.95
    assert "batch more requests" in f.fix and "quantise" in f.fix and "lax.fori_loop" in f.fix
    assert f.saving.ps == pytest.approx(q["HBM floor ps"] / 2, abs=1)


def test_a_compute_bound_training_step_gets_no_floor_finding():
    d = tpudiag.diagnose()  # the bundled transformer training step with its dumps
    assert not [f for f in d.findings if "HBM floor" in f.message]


@pytest.mark.parametrize("model", sorted(p.name for p in (REPO / "examples" / "models" / "captures").iterdir()))
def test_modelled_hbm_bytes_hold_against_the_layouts(model):
    """Issue 27 §6: the simulator's per-op HBM bytes are what the compiled program's layouts put in
    HBM: never below the logical bytes of the op's operands and results in HBM (above them only by
    tile padding), none for an op whose data is all in VMEM. Async pairs and collectives are left out
    (their bytes are the transfer's)."""
    ops = tpudiag.diagnose(REPO / "examples" / "models" / "captures" / model).analysis.ops
    ops = ops[(ops["family"] == "") & (ops["moves"] == "") & ~ops["name"].astype(str).str.contains("-done|-start")]
    trace = ops["hbm_bytes"] / ops["occurrences"]
    layouts = (ops["hbm_read_bytes"] + ops["hbm_write_bytes"]) / ops["occurrences"]
    assert len(ops) and (trace >= layouts - 1).all()
    assert ((layouts > 0) == (trace > 0)).all()


KV_CACHE = 4 * 1024 * 4 * 128 * 2  # one layer's K (or V) cache per core: bf16[4,1024,4,128], 4 MiB


@pytest.mark.parametrize("name", ["multiply_reduce_fusion", "multiply_reduce_fusion.1", "fusion.2", "fusion.3"])
def test_decode_attention_reads_the_kv_cache_its_copies_brought(decode, name):
    """The attention fusions (q·K `multiply_reduce_fusion`, probs·V `fusion.2`/`.3`; 9 % of the step
    each) read the KV cache in VMEM through a `get-tuple-element` of the tuple fusion that updates
    it in place (`dynamic-slice_bitcast_fusion`, over `copy-done.3`/`.5` from `param.5`/`.6` in HBM,
    or over `custom-call.5`/`.6` for the other layer: compiled.hlo.txt of the example's dumps). XLA
    counts no FLOPs and no HBM bytes for them (`bundle_analysis_data` flops 0); counting the 4 MiB
    of cache their copy brought, each reaches 63-67 % of v5e's HBM bandwidth in its 8 µs: HBM-bound,
    not latency."""
    op = decode.analysis.ops.set_index("name").loc[name]
    assert op["flops"] == 0 and op["hbm_bytes"] == 0
    assert op["copied_hbm_bytes"] == KV_CACHE * op["occurrences"]
    assert op["vmem_read_bytes"] >= KV_CACHE * op["occurrences"]
    assert (op["bound_by"], op["bound_basis"]) == ("HBM", "intensity with copied bytes")
    assert KV_CACHE / (op["total_time_ps"] / op["occurrences"] / 1e12) / 819e9 == pytest.approx(0.65, abs=0.03)


def test_a_tuple_element_is_brought_only_where_its_shape_matches_copied_operands():
    texts = dict(PREFETCH)
    texts["tuple_fusion"] = ("%tuple_fusion = (bf16[4,1024]{1,0:T(4,128)(2,1)S(1)}, bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}) "
                             "fusion(bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} %copy-done, s32[]{:T(128)} %i)")
    texts["reader"] = ("%reader = bf16[4,1024]{1,0:T(4,128)(2,1)S(1)} fusion(bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} "
                       "%get-tuple-element.1, bf16[4,1024]{1,0:T(4,128)(2,1)S(1)} %get-tuple-element.0)")
    elements = {"get-tuple-element.0": ("tuple_fusion", 0), "get-tuple-element.1": ("tuple_fusion", 1)}
    got = op_bytes(_meta(texts), lambda pid: elements).set_index("name")
    assert got.loc["reader", "copied_hbm_bytes"] == WEIGHTS  # element 1 is the copied operand's; element 0 is new
    assert op_bytes(_meta(texts)).set_index("name").loc["reader", "copied_hbm_bytes"] == 0  # no elements known


TRANSFORMER = REPO / "examples" / "models" / "captures" / "transformer_train_v5e"


def test_transformer_conv_fusions_at_1024_flop_per_byte_are_its_token_count():
    """Issue 27 §6: the bundled transformer's convolution fusions sat at exactly 1,024 FLOP/B. That is
    M, not a default: `fusion.150` (compiled.hlo.txt of the example's dumps) multiplies the 8 x 128
    tokens (`all-gather.44`, pred[8,128,512] in VMEM) by `param.2`, bf16[512,256] in HBM, into a
    VMEM result: 2 x 1,024 x 512 x 256 FLOPs over the weight's 262,144 HBM bytes. Ops whose HBM
    traffic is otherwise (copies' bytes, results written to HBM) sit elsewhere."""
    ops = tpudiag.diagnose(TRANSFORMER).analysis.ops.set_index("name")
    op = ops.loc["fusion.150"]
    per = op["occurrences"]
    assert op["flops"] / per == 2 * 1024 * 512 * 256
    assert op["hbm_read_bytes"] / per == 512 * 256 * 2 and op["hbm_write_bytes"] == 0 and op["copied_hbm_bytes"] == 0
    assert op["hbm_bytes"] / per == 512 * 256 * 2  # the simulator wrote what the layouts put in HBM
    assert op["hbm_intensity"] == 1024
    convs = ops[ops["category"].astype(str) == "convolution fusion"]["hbm_intensity"].dropna()
    assert len(set(convs.round(1))) > 1  # not all at one value


# A slice brought into VMEM by a generic async pair (`slice-start` printed `async-start(...)`), read by
# a fusion: f32[8,128] is 8 x 128 x 4 = 4,096 B, the whole operand f32[1024,128] 512 KiB.
SLICE = {
    "slice-start": "%slice-start = ((f32[1024,128]{1,0:T(8,128)}), f32[8,128]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) "
                   "async-start(f32[1024,128]{1,0:T(8,128)} %p), calls=%c",
    "slice-done": "%slice-done = f32[8,128]{1,0:T(8,128)S(1)} async-done(((f32[1024,128]{1,0:T(8,128)}), "
                  "f32[8,128]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) %slice-start)",
    "use": "%use = f32[8,128]{1,0:T(8,128)} fusion(f32[8,128]{1,0:T(8,128)S(1)} %slice-done), kind=kLoop",
}


def test_a_slice_pair_moves_its_slice_once_and_its_reader_counts_it_copied():
    got = op_bytes(_meta(SLICE)).set_index("name")
    start, done, use = got.loc["slice-start"], got.loc["slice-done"], got.loc["use"]
    # the destination is the array after the operands' tuple; it reads its slice, not the 512 KiB operand
    assert start["moves"] == "hbm->vmem"
    assert start[["hbm_read_bytes", "hbm_write_bytes", "vmem_read_bytes", "vmem_write_bytes"]].tolist() == [
        4096, 0, 0, 4096]
    assert done[list(got.columns[1:-1])].sum() == 0 and done["moves"] == ""
    assert use[["hbm_write_bytes", "vmem_read_bytes", "copied_hbm_bytes"]].tolist() == [4096, 4096, 4096]
    assert use["moves"] == "" and use["hbm_read_bytes"] == 0


def test_other_async_starts_and_plain_ops_move_nothing():
    texts = {
        "all-gather-start": "%all-gather-start = (f32[8]{0}, f32[32]{0}) all-gather-start(f32[8]{0} %x)",
        # a generic async pair around something other than a copy or slice
        "call-start": "%call-start = ((f32[8]{0}), f32[8]{0:S(1)}) async-start(f32[8]{0} %x), calls=%c",
        "bc": "%bc = f32[8,128]{1,0} bitcast(f32[1024]{0} %x)",
        "noeq": "not an instruction",
    }
    got = op_bytes(_meta(texts)).set_index("name")
    assert (got["moves"] == "").all()
    # all-gather: reads its 32 B shard, writes its tuple (8 + 32 floats: 160 B)
    assert got.loc["all-gather-start", ["hbm_read_bytes", "hbm_write_bytes"]].tolist() == [32, 160]
    # as an op, not a move: reads 32 B in HBM, writes its tuple's arrays (32 B in HBM, 32 B in VMEM)
    assert got.loc["call-start", ["hbm_read_bytes", "hbm_write_bytes", "vmem_write_bytes"]].tolist() == [32, 32, 32]
    assert got.loc["bc", ["hbm_read_bytes", "hbm_write_bytes"]].tolist() == [4096, 4096]
    assert got.loc["noeq", list(got.columns[1:-1])].sum() == 0


def test_vmem_brought_otherwise_than_by_a_copy_from_hbm_is_not_counted():
    texts = dict(PREFETCH)
    # a copy from VMEM to VMEM, a constant made in VMEM, and a chain longer than 3 recorded ops
    texts["copy-start.1"] = ("%copy-start.1 = (f32[256]{0:S(1)}, f32[256]{0:S(1)}, u32[]{:S(2)}) "
                             "copy-start(f32[256]{0:S(1)} %v)")
    texts["copy-done.1"] = ("%copy-done.1 = f32[256]{0:S(1)} copy-done((f32[256]{0:S(1)}, f32[256]{0:S(1)}, "
                            "u32[]{:S(2)}) %copy-start.1)")
    texts["on-chip"] = "%on-chip = f32[256]{0:S(1)} fusion(f32[256]{0:S(1)} %copy-done.1)"
    texts["made"] = "%made = f32[256]{0:S(1)} constant({...})"
    texts["from-made"] = "%from-made = f32[256]{0} fusion(f32[256]{0:S(1)} %made)"
    chain = "bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}"
    previous = "copy-done"
    for i in range(1, 6):
        texts[f"c{i}"] = f"%c{i} = {chain} copy({chain} %{previous})"
        previous = f"c{i}"
    got = op_bytes(_meta(texts)).set_index("name")["copied_hbm_bytes"]
    assert got["on-chip"] == 0 and got["from-made"] == 0
    # c1 reads the copy-done itself; c2..c4 reach it through 1..3 recorded ops; c5 through 4: too deep
    assert got[["c1", "c2", "c3", "c4", "c5"]].tolist() == [WEIGHTS, WEIGHTS, WEIGHTS, WEIGHTS, 0]


def test_tuple_elements_are_asked_per_program_once_and_only_when_needed():
    asked = []

    def elements(pid):
        asked.append(pid)
        return {"gte": ("tuple_fusion", 1)}  # the producer has one result: index 1 is past it

    texts = dict(PREFETCH)
    texts["tuple_fusion"] = ("%tuple_fusion = (bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}) "
                             "fusion(bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} %copy-done)")
    texts["reader"] = "%reader = f32[4]{0} fusion(bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)} %gte, f32[4]{0:S(1)} %gone)"
    meta = pd.concat([_meta(texts), _meta(PREFETCH).assign(program_id=7)], ignore_index=True)
    got = op_bytes(meta, elements)
    # each program asked once with its own id, though it lacks several names (`gte`, `gone`, `param`)
    assert asked == [1, 7]
    assert got.set_index(["program_id", "name"]).loc[(1, "reader"), "copied_hbm_bytes"] == 0
    assert got.set_index(["program_id", "name"]).loc[(7, "fusion.18"), "copied_hbm_bytes"] == WEIGHTS
    assert len(got) == len(texts) + len(PREFETCH)


def test_no_metadata_gives_the_columns_empty():
    got = op_bytes(_meta({}))
    assert list(got.columns) == ["program_id", "name", "hbm_read_bytes", "hbm_write_bytes", "vmem_read_bytes",
                                 "vmem_write_bytes", "host_read_bytes", "host_write_bytes", "copied_hbm_bytes", "moves"]
    assert got.empty and str(got["hbm_read_bytes"].dtype) == "float64" and got["moves"].dtype == object


def test_generic_async_pairs_are_named_by_the_copy_or_slice_they_wrap():
    row = "f32[8,128]{1,0:T(8,128)}"
    texts = {name: f"%{name} = (({row}), {row[:-1]}S(1)}}, s32[]{{:S(2)}}) async-start({row} %p), calls=%c"
             for name in ("copy-start.5", "dynamic-slice-start.2", "wrapped.3")}
    got = op_bytes(_meta(texts)).set_index("name")["moves"]
    assert got["copy-start.5"] == got["dynamic-slice-start.2"] == "hbm->vmem"
    assert got["wrapped.3"] == ""  # a name that says no copy or slice: an op, not a move


def test_what_a_copy_done_names_decides_what_it_brought():
    done = "bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}"
    texts = dict(PREFETCH)
    # the done's metadata comes after its operand: the start is the operand, not an attribute
    texts["copy-done"] = texts["copy-done"] + ', metadata={op_name="jit(f)/x"}'
    # a done whose start the trace did not record, and one whose operand is printed without a name
    texts["copy-done.7"] = f"%copy-done.7 = {done} copy-done(({done}, u32[]) %copy-start.7)"
    texts["copy-done.8"] = f"%copy-done.8 = {done} copy-done(({done}, u32[]) copy-start.8)"
    for n in ("", ".7", ".8"):
        texts[f"r{n}"] = f"%r{n} = f32[4]{{0}} fusion({done} %copy-done{n})"
    texts["no-text"] = None
    got = op_bytes(_meta(texts)).set_index("name")
    assert got["copied_hbm_bytes"][["r", "r.7", "r.8"]].tolist() == [WEIGHTS, 0, 0]
    assert got.loc["no-text", list(got.columns[1:-1])].sum() == 0  # an op the trace gave no text


def test_a_tuple_element_counts_its_producers_operands_up_to_the_depth_limit():
    chain = "bf16[8192,1024]{1,0:T(8,128)(2,1)S(1)}"
    texts = dict(PREFETCH)
    previous = "copy-done"
    for i in range(1, 4):
        texts[f"c{i}"] = f"%c{i} = {chain} copy({chain} %{previous})"
        previous = f"c{i}"
    for i in (2, 3):
        texts[f"tf{i}"] = f"%tf{i} = ({chain}) fusion({chain} %c{i})"
        texts[f"r{i}"] = f"%r{i} = f32[4]{{0}} fusion({chain} %gte{i})"
    texts["r9"] = f"%r9 = f32[4]{{0}} fusion({chain} %gte9)"
    elements = {"gte2": ("tf2", 0), "gte3": ("tf3", 0), "gte9": ("tf3", 1)}  # tf3 has one result: 1 is past it
    got = op_bytes(_meta(texts), lambda pid: elements).set_index("name")["copied_hbm_bytes"]
    # gte2 -> c2 -> c1 -> copy-done: the done at depth 3, within the limit; gte3 adds one more copy: depth 4
    assert got[["r2", "r3", "r9"]].tolist() == [WEIGHTS, 0, 0]
