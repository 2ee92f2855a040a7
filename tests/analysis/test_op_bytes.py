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
