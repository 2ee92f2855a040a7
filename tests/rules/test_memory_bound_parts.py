"""memory-bound (TPD106): its modelled levers, batch note and step-floor finding called directly.

Expectations are worked by hand from the shapes (bytes = elements x dtype size) and the options'
documented thresholds; no capture is built, so each test runs in milliseconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from tpudiag.model.findings import Severity
from tpudiag.model.hardware import chip_for
from tpudiag.model.hlo_shapes import parse_shapes
from tpudiag.rules.memory_bound import Lever, Options, StepFloor, _floor_finding, batch_note, levers

MS = 1_000_000_000  # ps per ms
GIB = 2**30


def _shapes(*texts):
    return [s for t in texts for s in parse_shapes(t)]


# -- levers ---------------------------------------------------------------------------------------

def test_a_matmul_reading_bf16_weights_gains_half_their_bytes():
    # Weights bf16[4096,4096] = 33,554,432 bytes; int8 saves half: 16,777,216 of the op's 40,000,000.
    (lever,) = levers("fusion.1", "convolution fusion", 40_000_000, _shapes("bf16[8,4096]{1,0}"),
                      _shapes("bf16[8,4096]{1,0}", "bf16[4096,4096]{1,0}"))
    assert lever == Lever("int8/fp8 weights (bf16[4096,4096] → 1 byte/element)", 16_777_216 / 40_000_000)


def test_f32_weights_gain_three_quarters_and_the_share_is_capped_at_one():
    # f32[1024,1024] = 4 MiB; int8 saves 3 MiB: more than the 1 MiB the op is said to move.
    (lever,) = levers("dot.3", "", 2**20, [], _shapes("f32[1024,1024]{1,0}"))
    assert lever.fraction == 1.0
    (lever,) = levers("dot.3", "", 2**23, [], _shapes("f32[1024,1024]{1,0}"))
    assert lever.fraction == 3 * 2**20 / 2**23


def test_one_byte_weights_have_no_quantisation_lever():
    assert levers("fusion.1", "convolution fusion", 1e6, [], _shapes("s8[1024,1024]{1,0}")) == []


def test_an_elementwise_op_can_keep_its_output_out_of_hbm():
    # The result f32[1024,256] = 1 MiB of the 3 MiB the op moves.
    (lever,) = levers("fusion.7", "loop fusion", 3 * 2**20, _shapes("f32[1024,256]{1,0}"), [])
    assert lever == Lever("fuse with producer or consumer (output stays out of HBM)", 1 / 3)
    # An op that moves only its output (a broadcast into HBM) gains nothing by fusing.
    assert levers("fusion.7", "loop fusion", 2**20, _shapes("f32[1024,256]{1,0}"), []) == []
    assert levers("fusion.7", "loop fusion", 3 * 2**20, [], []) == []


def test_an_op_that_is_not_a_matmul_gets_the_fusion_lever_even_with_operands():
    # A loop fusion reading f32[1024,256] twice and writing it once: 3 MiB, 1 MiB of it its output. Its
    # operands are no weights: no quantisation lever, only the fusion one.
    operands = _shapes("f32[1024,256]{1,0}", "f32[1024,256]{1,0}")
    assert levers("fusion.7", "loop fusion", 3 * 2**20, _shapes("f32[1024,256]{1,0}"), operands) == [
        Lever("fuse with producer or consumer (output stays out of HBM)", 1 / 3)]


def test_an_empty_output_has_no_fusion_lever():
    # f32[0] writes nothing: keeping it out of HBM saves nothing.
    assert levers("fusion.7", "loop fusion", 2**20, _shapes("f32[0]{0}"), []) == []


def test_no_bytes_no_lever():
    assert levers("fusion.1", "convolution fusion", 0, [], _shapes("bf16[4096,4096]{1,0}")) == []


# -- batch note -----------------------------------------------------------------------------------

def test_doubling_the_rows_reads_the_weights_once():
    # Weights 1,000 bytes (bf16[500]) of 2,000 per call: twice the rows move 1,000 + 2 x 1,000 = 3,000
    # bytes for twice the rows, 0.75 of the time per row. Rows: every dim but the last, 2 x 3 = 6.
    note = batch_note(_shapes("f32[2,3,100]{2,1,0}"), _shapes("bf16[500]{0}", "bf16[10]{0}"), 2000)
    assert note == "12 rows instead of 6: time per row x0.75 (modelled)"


def test_no_batch_note_without_rows_or_operands():
    assert batch_note(_shapes("f32[100]{0}"), _shapes("bf16[500]{0}"), 2000) == ""
    assert batch_note(_shapes("f32[4,100]{1,0}"), [], 2000) == ""
    assert batch_note([], _shapes("bf16[500]{0}"), 2000) == ""


# -- the step against its HBM floor ---------------------------------------------------------------

def _floor(step_ms: float, floor_ms: float, flops_per_byte: float = 2.0, copied: float = 0.0) -> StepFloor:
    # 1 GiB read once at 1 GiB per ms: the floor in ms is the GiB read.
    read = int(floor_ms * GIB)
    return StepFloor("jit_decode", step_ms * MS, floor_ms * MS, read, flops_per_byte * read, copied, GIB * 1e3)


def _ctx(chip=None):
    return SimpleNamespace(chip=chip, analysis=SimpleNamespace(profile=SimpleNamespace(hosts=[SimpleNamespace(host="h0")])))


def test_step_floor_message_and_quantities():
    floor = _floor(8, 2, flops_per_byte=100.0)
    assert floor.share == 0.25
    assert floor.message() == (
        "each step of `jit_decode` is bandwidth-bound: it takes 8.00 ms against its HBM floor of 2.00 ms (2 GiB "
        "of parameters and state read once at 1.07 TB/s): it uses 25.0% of HBM bandwidth over the step (model "
        "bandwidth utilisation), at 100.0 FLOP per byte read")
    assert [(q.subject, q.name, q.value) for q in floor.quantities()] == [
        ("jit_decode", "step time ps", 8 * MS), ("jit_decode", "HBM floor ps", 2 * MS),
        ("jit_decode", "bytes read once", 2.0 * GIB), ("jit_decode", "HBM bandwidth utilization", 0.25)]


def test_far_from_the_floor_the_saving_is_the_step_minus_its_floor():
    f = _floor_finding(_ctx(), Options(), _floor(8, 2), ridge=560.0)
    assert f.saving.ps == 6 * MS and f.saving.basis == "modelled"
    assert f.saving.explanation == "the step at its HBM floor: its parameters in HBM read once at peak bandwidth"
    assert f.fix == ("batch more requests per step (the weights are read once per step whatever the batch); "
                     "quantise the weights or the KV cache (int8/fp8: half the bytes of bf16); "
                     "fuse ops whose intermediates round-trip through HBM")
    assert f.severity is Severity.HIGH  # 6 of 8 ms: above 15 %
    assert f.host == "h0" and f.rule == "memory-bound"
    assert dict(f.evidence[0].values) == {"step": "8.00 ms", "HBM floor": "2.00 ms", "read once": "2 GiB",
                                          "bandwidth used": "25.0%", "FLOP per byte read": "2.0",
                                          "copied into VMEM/step": "0 B"}


def test_the_floor_finding_states_the_step_and_its_floor():
    # The 8 ms step against a 2 ms floor at 100 FLOP/B (the message of test_step_floor_message_and_quantities).
    f = _floor_finding(_ctx(), Options(), _floor(8, 2, flops_per_byte=100.0), ridge=560.0)
    assert f.code == "TPD106" and f.ops == ()
    assert f.message == (
        "each step of `jit_decode` is bandwidth-bound: it takes 8.00 ms against its HBM floor of 2.00 ms (2 GiB "
        "of parameters and state read once at 1.07 TB/s): it uses 25.0% of HBM bandwidth over the step (model "
        "bandwidth utilisation), at 100.0 FLOP per byte read")
    assert [e.subject for e in f.evidence] == ["jit_decode"]
    assert [(q.subject, q.name, q.value) for q in f.quantities] == [
        ("jit_decode", "step time ps", 8 * MS), ("jit_decode", "HBM floor ps", 2 * MS),
        ("jit_decode", "bytes read once", 2.0 * GIB), ("jit_decode", "HBM bandwidth utilization", 0.25)]
    # Several hosts: the finding is the whole capture's, no single host's.
    two_hosts = SimpleNamespace(chip=None, analysis=SimpleNamespace(profile=SimpleNamespace(
        hosts=[SimpleNamespace(host="h0"), SimpleNamespace(host="h1")])))
    assert _floor_finding(two_hosts, Options(), _floor(8, 2), ridge=560.0).host == ""


def test_near_the_floor_only_fewer_bytes_help():
    # 5 of 10 ms: at `floor_share` (0.5) exactly, the step is near its floor; int8 halves the floor.
    f = _floor_finding(_ctx(), Options(), _floor(10, 5), ridge=560.0)
    assert f.saving.ps == round(2.5 * MS)
    assert f.saving.explanation == "int8/fp8 weights and cache: half the floor's bf16 bytes read once per step"
    assert "fuse ops" not in f.fix
    # 2.5 of 10 ms is 25 %: high; with high_share above it, medium.
    assert f.severity is Severity.HIGH
    assert _floor_finding(_ctx(), Options(high_share=0.3), _floor(10, 5), ridge=560.0).severity is Severity.MEDIUM
    assert _floor_finding(_ctx(), Options(high_share=0.3, medium_share=0.26), _floor(10, 5),
                          ridge=560.0).severity is Severity.LOW
    # A step exactly at its floor (share 1) is still judged; faster than its floor is not.
    assert _floor_finding(_ctx(), Options(), _floor(4, 4), ridge=560.0) is not None
    assert _floor_finding(_ctx(), Options(), _floor(4, 4.5), ridge=560.0) is None


@pytest.mark.parametrize(("floor", "ridge", "judged"), [
    (_floor(10, 1), 560.0, True),  # 10 %: at `min_floor_share` exactly
    (_floor(10, 0.9), 560.0, False),  # 9 %: under it
    (_floor(10, 2, flops_per_byte=559.0), 560.0, True),  # below the ridge: bandwidth-bound
    (_floor(10, 2, flops_per_byte=560.0), 560.0, False),  # at the ridge: not bandwidth-bound
    (_floor(10, 2), None, False),  # no ridge known
])
def test_the_floor_is_judged_only_for_bandwidth_bound_steps_that_read_enough(floor, ridge, judged):
    assert (_floor_finding(_ctx(), Options(), floor, ridge) is not None) == judged


def test_weights_that_fit_in_vmem_can_stay_resident():
    v6e = chip_for("v6e")  # 128 MiB of VMEM
    small = StepFloor("jit_decode", 10 * MS, 2 * MS, 64 * 2**20, 2.0 * 64 * 2**20, 32 * 2**20, 64 * 2**20 * 5e2)
    f = _floor_finding(_ctx(v6e), Options(), small, ridge=560.0)
    assert f.fix.endswith(
        "; keep the weights resident: run several steps in one program (a `lax.fori_loop`), so what it copies into "
        "VMEM (32 MiB per step; its 64 MiB of parameters fit in 128 MiB) crosses HBM once for all of them, not "
        "once per step (VMEM holds nothing between program runs)")
    # Not without a copy into VMEM, nor without a known chip, nor when the parameters exceed VMEM.
    assert "resident" not in _floor_finding(_ctx(v6e), Options(), _floor(10, 2), ridge=560.0).fix
    assert "resident" not in _floor_finding(_ctx(None), Options(), small, ridge=560.0).fix
    big = StepFloor("jit_decode", 10 * MS, 2 * MS, 129 * 2**20, 2.0 * 129 * 2**20, 32 * 2**20, 129 * 2**20 * 5e2)
    assert "resident" not in _floor_finding(_ctx(v6e), Options(), big, ridge=560.0).fix
    # Parameters that fit but nothing copied into VMEM: nothing to keep resident.
    no_copy = StepFloor("jit_decode", 10 * MS, 2 * MS, 64 * 2**20, 2.0 * 64 * 2**20, 0.0, 64 * 2**20 * 5e2)
    assert "resident" not in _floor_finding(_ctx(v6e), Options(), no_copy, ridge=560.0).fix
    exact = StepFloor("jit_decode", 10 * MS, 2 * MS, 128 * 2**20, 2.0 * 128 * 2**20, 32 * 2**20, 128 * 2**20 * 5e2)
    assert "resident" in _floor_finding(_ctx(v6e), Options(), exact, ridge=560.0).fix


# -- step_floor: the step against its parameters read once -------------------------------------------

def test_step_floor_of_the_decode_step(tmp_path):
    from tests.rules import scenarios as sc
    from tpudiag.model.compiled import ArrayShape, Layout
    from tpudiag.rules.base import step_basis
    from tpudiag.rules.memory_bound import step_floor

    def param(dims, space=0):
        n = 2 * dims[0] * dims[1]  # bf16
        return SimpleNamespace(shape=ArrayShape("bf16", dims, Layout((1, 0), memory_space=space), n, n))

    # The decode program's parameters: seven bf16[8192,8192] weights and x bf16[32,8192] in HBM; one
    # in VMEM (S(1)) and one without a shape, neither read from HBM.
    params = [param((8192, 8192)) for _ in range(7)] + [param((32, 8192)), param((8, 128), space=1),
                                                         SimpleNamespace(shape=None)]
    program = SimpleNamespace(module="jit_decode_step", entry_parameters=lambda: params)
    other = SimpleNamespace(module="jit_other", entry_parameters=lambda: [])
    a = sc.analyse(sc.decode_v6e(), tmp_path)
    basis = step_basis(a)
    floor = step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=(other, program))), basis)
    read = 7 * 8192 * 8192 * 2 + 32 * 8192 * 2
    assert floor.module == "jit_decode_step" and floor.bytes_read == read
    assert floor.floor_ps == pytest.approx(read / 1640e9 * 1e12)  # at v6e's 1,640 GB/s
    assert floor.step_ps == basis.step_ps and floor.peak_bw == 1640e9
    assert floor.flops == pytest.approx(7 * sc.DECODE_FLOPS)  # per step and core: seven matmuls
    assert floor.copied_bytes == 0.0  # no async copy into VMEM
    # No compiled program, none named like the steps' module among several, nothing read from HBM: no floor.
    assert step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=())), basis) is None
    assert step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=(other, other))), basis) is None
    vmem_only = SimpleNamespace(module="jit_decode_step", entry_parameters=lambda: [param((8, 128), space=1)])
    assert step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=(vmem_only,))), basis) is None
    # The only program is taken even when its name differs.
    alone = SimpleNamespace(module="jit_renamed", entry_parameters=lambda: params)
    assert step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=(alone,))), basis).bytes_read == read
    # What async copies brought into VMEM, per step and core: 1,000 B on each of the 7 ops' rows, over 10
    # steps on 2 cores.
    from dataclasses import replace

    copying = replace(a, ops=a.ops.assign(copied_hbm_bytes=1000.0))
    assert len(a.ops) == 7
    assert step_floor(SimpleNamespace(analysis=copying, compiled=SimpleNamespace(programs=(program,))),
                      basis).copied_bytes == 7 * 1000 / 20
    # A capture without steps (no Steps line, no module executions) has no step to put against a floor;
    # nor does a chip whose HBM bandwidth is unknown.
    whole = sc.analyse(sc.decode_v6e(modules_line=False), tmp_path / "whole")
    assert step_floor(SimpleNamespace(analysis=whole, compiled=SimpleNamespace(programs=(program,))),
                      step_basis(whole)) is None
    unknown = sc.analyse(sc.decode_v6e(device_type="", peak_hbm_gbs=None), tmp_path / "unknown")
    assert step_floor(SimpleNamespace(analysis=unknown, compiled=SimpleNamespace(programs=(program,))),
                      step_basis(unknown)) is None
    # Among several programs none named like the steps' module, none is taken, the first included.
    assert step_floor(SimpleNamespace(analysis=a, compiled=SimpleNamespace(programs=(alone, other))), basis) is None
