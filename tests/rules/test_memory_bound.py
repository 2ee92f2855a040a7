"""memory-bound (TPD106): ops on the HBM roof with their byte levers; the near miss and healthy stay quiet."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tests.rules.conftest import render_findings
from tests.rules.scenarios import run_rules
from tpudiag.model.findings import Severity
from tpudiag.model.units import fmt_bandwidth, fmt_bytes
from tpudiag.rules import RulesConfig
from tpudiag.rules.memory_bound import Options


def _run(analysis, *rules, **options):
    rules = rules or ("memory-bound",)
    findings, _ = run_rules(analysis, RulesConfig(select=rules, options={"memory-bound": options}))
    return findings


def test_decode_weight_matmuls_are_on_the_hbm_roof(tmp_path: Path, snapshot):
    a = sc.analyse(sc.decode_v6e(), tmp_path)
    (f,) = _run(a)
    # Designed: 7 x 135.3 MB per execution at 85 % of 1,640 GB/s, OI 31.7 FLOP/B against a 560 ridge.
    assert f"{fmt_bytes(7 * sc.DECODE_BYTES)} per step" in f.message
    assert f"at {fmt_bandwidth(0.85 * sc.HBM)} (85.0% of {fmt_bandwidth(sc.HBM)})" in f.message
    assert "operational intensity 32 FLOP/B vs ridge 560" in f.message
    assert set(f.ops) == {op.name for op in sc.DECODE_OPS}
    # int8 weights: the bf16[8192,8192] weights (134.2 of 135.3 MB) shrink by half.
    weight = 8192 * 8192 * 2
    expected = 7 * sc.DECODE_MM_PS * (weight / 2) / sc.DECODE_BYTES
    assert f.saving.ps == pytest.approx(expected, rel=0.01) and f.saving.basis == "modelled"
    assert f.severity == Severity.HIGH and "int8/fp8" in f.fix
    assert "64 rows instead of 32" in dict(f.evidence[0].values)["larger batch"]
    snapshot("memory-bound", render_findings([f]))


def test_low_mxu_refers_the_hbm_bound_matmuls_instead_of_dropping_them(tmp_path: Path):
    findings = _run(sc.analyse(sc.decode_v6e(), tmp_path), "low-mxu-utilization")
    (f,) = findings
    assert f.severity == Severity.INFO and f.saving.ps == 0
    assert "4.8% of peak FLOP/s" in f.message and "see `memory-bound`" in f.message
    assert len(f.ops) == 7


def test_unfused_elementwise_gets_the_fusion_lever(tmp_path: Path):
    (f,) = _run(sc.analyse(sc.elementwise_bound(), tmp_path))
    assert f.ops == ("fusion.50",) and "fuse" in f.fix
    # Its output (one third of its bytes) would stay out of HBM.
    assert f.saving.ps == pytest.approx(sc.ELEMENTWISE_PS / 3, rel=0.01)
    # 45.5 µs of the 1.13 ms step (fusion.13's 998 µs and fusion.50's 136 µs): 4.0 %, medium (3 to 15 %).
    assert f.saving.ps / (sc.ALIGNED_PS + sc.ELEMENTWISE_PS) == pytest.approx(0.040, abs=0.001)
    assert f.severity is Severity.MEDIUM and f.host == "host0"


def test_near_miss_below_the_roof_and_healthy(tmp_path: Path):
    near = sc.analyse(sc.decode_near_roof(0.65), tmp_path / "near")  # 65 % < the 70 % roof
    assert _run(near) == []
    assert len(_run(near, near_roof=0.6)) == 1
    findings, _ = run_rules(sc.analyse(sc.healthy(), tmp_path / "healthy"))
    assert [f for f in findings if f.severity >= Severity.LOW] == []


def test_options_validate():
    with pytest.raises(ValueError, match="near_roof"):
        Options(near_roof=0)


# -- ops timed above the peak and copies waiting on their DMA ---------------------------------------

COPY_BYTES = 1.0e8


def _copy(name: str) -> sc.OpDef:
    return sc.OpDef(name, "copy", bytes_accessed=COPY_BYTES)  # no shape: no lever of its own


def _at(share: float) -> int:
    """The time that moves the copy's bytes at `share` of v6e's 1,640 GB/s."""
    return round(COPY_BYTES / (share * sc.HBM) * 1e12)


def _back_to_back(ops: list[tuple[str, int]], **overrides) -> sc.CaptureDesign:
    defs = {"fusion.50": sc.ELEMENTWISE}

    def schedule(chip, step):
        t, out = 0, []
        for name, dur in ops:
            out.append(sc.Placed(name, t, dur))
            t += dur
        return out

    return sc.design(tuple(defs.get(n) or _copy(n) for n, _ in ops), schedule,
                     **{"step_ps": sum(d for _, d in ops), **overrides})


def test_roof_ops_above_the_peak_get_no_rate_and_waiting_copies_the_dma_fix(tmp_path: Path):
    # The elementwise fusion at 90 % of the peak, four copies' done ops at 72 to 120 % of it: copy-done.3,
    # timed above the peak, is on the roof with no rate stated.
    d = _back_to_back([("fusion.50", sc.ELEMENTWISE_PS), ("copy-done.3", _at(1.2)), ("copy-done.4", _at(0.8)),
                       ("copy-done.5", _at(0.75)), ("copy-done.6", _at(0.72))])
    (f,) = _run(sc.analyse(d, tmp_path))
    # Largest self time first: the slower a copy, the longer it runs.
    assert f.ops == ("fusion.50", "copy-done.6", "copy-done.5", "copy-done.4", "copy-done.3")
    assert f.message.startswith("5 ops on the HBM roof hold ")
    assert ("(timed alone, 1 of them run above the 1.64 TB/s peak, which no core reaches: the warnings name the "
            "likely cause; no rate is stated), operational intensity 0 FLOP/B vs ridge 560") in f.message
    assert f.fix == ("fuse the op with its producer or consumer so its output stays out of HBM; `copy-done.6`, "
                     "`copy-done.5`, `copy-done.4` and more wait for a DMA no work hides: start the copy earlier "
                     "(more independent work between its start and done) or copy fewer bytes (a narrower dtype)")
    # Only the fusion has a lever: a third of its time (its output) per step.
    assert f.saving.ps == pytest.approx(sc.ELEMENTWISE_PS / 3, rel=1e-6)
    rows = {e.subject: dict(e.values) for e in f.evidence}
    assert rows["copy-done.3"]["bandwidth"] == "above the peak as timed (see the warnings)"
    assert rows["copy-done.4"]["bandwidth"] == f"{fmt_bandwidth(0.8 * sc.HBM)} (80.0%)"
    assert rows["fusion.50"]["fuse with producer or consumer (output stays out of HBM)"].startswith("-33.3% (")
    assert rows["copy-done.4"]["HBM bytes/step"] == fmt_bytes(COPY_BYTES)  # once per step on each core
    # Typed: the group's time share (no rate: one op is above the peak), then per op its share and, when
    # physical, its rate and utilisation.
    q = [(x.subject, x.name) for x in f.quantities]
    assert q[0] == ("5 ops", "time share") and ("5 ops", "HBM bandwidth utilization") not in q
    assert ("copy-done.3", "time share") in q and ("copy-done.3", "HBM bytes/s") not in q
    values = {(x.subject, x.name): x.value for x in f.quantities}
    assert values[("copy-done.4", "HBM bandwidth utilization")] == pytest.approx(0.8, rel=1e-6)
    assert values[("fusion.50", "HBM bytes/s")] == pytest.approx(0.9 * sc.HBM, rel=1e-6)
    shares = [values[(op, "time share")] for op in f.ops]
    assert values[("5 ops", "time share")] == pytest.approx(sum(shares))
    assert shares == sorted(shares, reverse=True)
    (capped,) = _run(sc.analyse(d, tmp_path / "again"), max_ops_shown=2)
    assert [e.subject for e in capped.evidence] == ["fusion.50", "copy-done.6"] and len(capped.ops) == 5


def test_all_ops_above_the_peak_and_one_waiting_copy(tmp_path: Path):
    both = _back_to_back([("copy-done.3", _at(1.2)), ("copy-done.7", _at(1.3))])
    (f,) = _run(sc.analyse(both, tmp_path / "both"))
    assert f.message.startswith("2 ops on the HBM roof hold 100.0% of device time: ")
    assert "(timed alone, they run above the 1.64 TB/s peak" in f.message
    # The totals' subject is the group; then copy-done.3 first, the longer (120 % of the peak, not 130 %).
    assert [(q.subject, q.name) for q in f.quantities][:2] == [("2 ops", "time share"), ("copy-done.3", "time share")]
    assert f.fix.startswith("`copy-done.3`, `copy-done.7` wait for a DMA no work hides")
    assert f.saving.ps == 0
    # Three copies waiting: all named, no "and more".
    three = _back_to_back([("copy-done.3", _at(1.2)), ("copy-done.7", _at(1.3)), ("copy-done.8", _at(1.4))])
    (f,) = _run(sc.analyse(three, tmp_path / "three"))
    assert f.fix.startswith("`copy-done.3`, `copy-done.7`, `copy-done.8` wait for a DMA no work hides: ")
    # One op, above the peak, in a capture without steps: its name, "it runs", bytes per core over the capture.
    one = _back_to_back([("copy-done.3", _at(1.2))], steps_line=False, modules_line=False)
    (f,) = _run(sc.analyse(one, tmp_path / "one"))
    assert f.message.startswith("`copy-done.3` on the HBM roof holds 100.0% of device time: ")  # one op: "holds"
    # Three executions on each of the two cores: 3 x 100 MB per core.
    assert f"{fmt_bytes(3 * COPY_BYTES)} per core over the capture (timed alone, it runs above" in f.message
    assert f.fix.startswith("`copy-done.3` waits for a DMA no work hides")
    assert [x for x, _ in f.evidence[0].values][:2] == ["time share", "HBM bytes"]


# -- the step's HBM floor, through the rule --------------------------------------------------------

def _decode_program() -> str:
    """`jit_decode_step` as compiled: x bf16[32,8192] and the seven bf16[8192,8192] weights, in HBM."""
    params = ", ".join(["x: bf16[32,8192]"] + [f"w{i}: bf16[8192,8192]" for i in range(7)])
    lines = ["  %x = bf16[32,8192]{1,0} parameter(0)"]
    lines += [f"  %w{i} = bf16[8192,8192]{{1,0}} parameter({i + 1})" for i in range(7)]
    return (f"HloModule jit_decode_step, is_scheduled=true\n\nENTRY %main ({params}) -> bf16[32,8192] {{\n"
            + "\n".join(lines) + "\n  ROOT %copy.1 = bf16[32,8192]{1,0} copy(bf16[32,8192]{1,0} %x)\n}\n")


def test_the_decode_step_near_its_hbm_floor(tmp_path: Path):
    from tpudiag.model.inputs import CompiledInputs, HloInput
    from tpudiag.parsers.hlo_text import parse_hlo_text

    # Read once: 7 x 8192 x 8192 x 2 + 32 x 8192 x 2 = 940,048,384 B (896.5 MiB); at 1,640 GB/s, 573.2 µs.
    # Each execution is a step: the seven 97.03 µs matmuls back to back, 679.2 µs. The floor is 84.4 % of
    # the step (near: at least `floor_share`), at 7 x 2 x 32 x 8192^2 / 940,048,384 = 32.0 FLOP per byte
    # read, far below the 560 ridge. Near its floor, the saving is half the floor: 286.6 µs, 42 % of the step.
    read = 7 * 8192 * 8192 * 2 + 32 * 8192 * 2
    floor_ps = read / sc.HBM * 1e12
    compiled = CompiledInputs(hlo=(HloInput(parse_hlo_text(_decode_program()), "xla-dump"),))
    findings, _ = run_rules(sc.analyse(sc.decode_v6e(), tmp_path), RulesConfig(select=("memory-bound",)), compiled)
    (f,) = [f for f in findings if f.message.startswith("each step")]
    assert f.message == (
        "each step of `jit_decode_step` is bandwidth-bound: it takes 679.2 µs against its HBM floor of 573.2 µs "
        "(896 MiB of parameters and state read once at 1.64 TB/s): it uses 84.4% of HBM bandwidth over the step "
        "(model bandwidth utilisation), at 32.0 FLOP per byte read")
    assert f.saving.ps == pytest.approx(floor_ps / 2, abs=1)
    assert f.severity is Severity.HIGH and f.host == "host0"
    assert [(q.name, q.value) for q in f.quantities] == [
        ("step time ps", sc.DECODE_BUSY), ("HBM floor ps", pytest.approx(floor_ps)), ("bytes read once", read),
        ("HBM bandwidth utilization", pytest.approx(floor_ps / sc.DECODE_BUSY))]
    # The roof finding stays beside it.
    assert any(f.message.startswith("7 ops on the HBM roof hold") for f in findings)


def test_without_a_peak_bandwidth_nothing_is_on_the_roof(tmp_path: Path):
    # A TPU the hardware table does not know, whose trace gives no HBM peak: no roof to be near.
    assert _run(sc.analyse(sc.decode_v6e(device_type="", peak_hbm_gbs=None), tmp_path)) == []


# -- which ops are on the roof: bandwidth against FLOPs, and the share edges --------------------------

# fusion.61: a matmul fusion moving bytes at 80 % of the HBM peak while its FLOPs run at 90 % of the FLOP
# peak: it uses more of the MXUs than of HBM, so it is compute-bound, not on the roof.
BUSY_PS = 100 * sc.US
COMPUTE_BOUND = sc.OpDef("fusion.61", "convolution fusion", flops=0.9 * sc.PEAK * BUSY_PS / 1e12,
                         bytes_accessed=0.8 * sc.HBM * BUSY_PS / 1e12)


def compute_bound_schedule(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.50", 0, sc.ELEMENTWISE_PS), sc.Placed("fusion.61", sc.ELEMENTWISE_PS, BUSY_PS)]


def test_an_op_using_more_of_the_flop_peak_than_of_hbm_is_not_on_the_roof(tmp_path: Path):
    d = sc.design((sc.ELEMENTWISE, COMPUTE_BOUND), compute_bound_schedule, step_ps=sc.ELEMENTWISE_PS + BUSY_PS)
    (f,) = _run(sc.analyse(d, tmp_path))
    assert f.ops == ("fusion.50",)


# fusion.70: a loop fusion far below the roof, as long as fusion.50: each core's time is the two ops back to
# back, so fusion.50 holds exactly half of it.
FILLER = sc.OpDef("fusion.70", "loop fusion", bytes_accessed=1.0e6)


def half_schedule(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.50", 0, sc.ELEMENTWISE_PS), sc.Placed("fusion.70", sc.ELEMENTWISE_PS, sc.ELEMENTWISE_PS)]


def test_the_share_thresholds_are_inclusive(tmp_path: Path):
    a = sc.analyse(sc.design((sc.ELEMENTWISE, FILLER), half_schedule, step_ps=2 * sc.ELEMENTWISE_PS), tmp_path)
    (f,) = _run(a, min_op_share=0.5, min_time_share=0.5)  # the op and the roof at exactly half
    assert f.ops == ("fusion.50",) and f.message.startswith("`fusion.50` on the HBM roof holds 50.0% of device time")
    # One op: the totals are its own, at 90 % of the peak.
    assert [(q.subject, q.name, q.value) for q in f.quantities[:2]] == [
        ("fusion.50", "time share", 0.5), ("fusion.50", "HBM bandwidth utilization", pytest.approx(0.9, rel=1e-6))]
    assert _run(a, min_op_share=0.51) == [] and _run(a, min_time_share=0.51) == []


def test_roof_ops_under_the_time_share_give_no_finding(tmp_path: Path):
    # The decode matmuls on the roof hold 72.2 % of device time (each core: 10 executions of 7 matmul times,
    # 9 gaps of 3 between them: 70 / 97): under 80 %.
    assert _run(sc.analyse(sc.decode_v6e(), tmp_path), min_time_share=0.8) == []


# fusion.52: a loop fusion of four bf16[4096,8192] operands into one (5 x 64 MiB), timed at 120 % of the
# HBM peak: 335.5 MB in 170.5 µs.
FOUR_IN = sc.OpDef("fusion.52", "loop fusion", bytes_accessed=5 * 2 * 4096 * 8192.0,
                   shape="bf16[4096,8192]{1,0:T(8,128)(2,1)}",
                   hlo_text=("%fusion.52 = bf16[4096,8192]{1,0} fusion(bf16[4096,8192]{1,0} %a, bf16[4096,8192]{1,0} %b, "
                             "bf16[4096,8192]{1,0} %c, bf16[4096,8192]{1,0} %d), kind=kLoop, calls=%fused_computation.52"))
FAST_PS = round(FOUR_IN.bytes_accessed / (1.2 * sc.HBM) * 1e12)


def fast_elementwise_schedule(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.52", 0, FAST_PS)]


def test_no_saving_is_built_on_an_op_timed_above_the_peak(tmp_path: Path):
    # fusion.52 has a lever of its own (its output, a fifth of its bytes), but its rate is not physical:
    # it is on the roof with no rate stated, and no saving (the rule's documented limit).
    (f,) = _run(sc.analyse(sc.design((FOUR_IN,), fast_elementwise_schedule, step_ps=FAST_PS), tmp_path))
    assert f.ops == ("fusion.52",) and "it runs above the 1.64 TB/s peak" in f.message
    assert f.saving.ps == 0
    # Its first three operands; no lever row, and no batch note (not a matmul).
    assert f.evidence[0].values[2:] == (("bandwidth", "above the peak as timed (see the warnings)"),
                                        ("op. intensity", "0.0 FLOP/B"),
                                        ("operands", ", ".join(["bf16[4096,8192]"] * 3)))


# fusion.53: a loop fusion at 80 % of the HBM peak whose shapes the trace does not give: no lever to model.
SHAPELESS = sc.OpDef("fusion.53", "loop fusion", bytes_accessed=1.0e8)
SHAPELESS_PS = round(SHAPELESS.bytes_accessed / (0.8 * sc.HBM) * 1e12)


def shapeless_schedule(chip: int, step: int) -> list[sc.Placed]:
    return [sc.Placed("fusion.53", 0, SHAPELESS_PS)]


def test_a_roof_op_without_a_lever_gets_the_general_fix(tmp_path: Path):
    (f,) = _run(sc.analyse(sc.design((SHAPELESS,), shapeless_schedule, step_ps=SHAPELESS_PS), tmp_path))
    assert f.fix == "move fewer bytes: narrower dtypes, fused producers and consumers, larger batches"
    assert f.saving.ps == 0 and f.severity is Severity.LOW


def test_on_several_hosts_the_finding_names_none(tmp_path: Path):
    designs = [sc.design((SHAPELESS,), shapeless_schedule, step_ps=SHAPELESS_PS, hostname=h, first_chip=2 * i)
               for i, h in enumerate(("host0", "host1"))]
    (f,) = _run(sc.analyse_hosts(designs, tmp_path))
    assert f.ops == ("fusion.53",) and f.host == ""
