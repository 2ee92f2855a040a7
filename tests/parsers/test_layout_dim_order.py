"""A layout whose `minor_to_major` is not a permutation of the shape's dims is refused alike from
HLO text and from an HloProto, embedded in a capture or not: a warning naming the instruction,
never a traceback, never padded bytes counted from the wrong dims.

Regression: the proto path built its `Layout` without the check the text path had, so `{5,0}`
on a rank-2 array raised IndexError inside `parsers/layout.py` and `{0,0}` or `{-1,0}` gave the
padded bytes of a different array (one dim counted twice).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.rules import scenarios as sc
from tpudiag.model.compiled import Layout
from tpudiag.parsers.hlo_proto import parse_hlo_proto
from tpudiag.parsers.hlo_text import load_hlo_dump
from tpudiag.parsers.layout import ShapeSyntaxError, array_shape, padded_bytes, parse_shape
from tpudiag.pipeline import diagnose
from tpudiag.proto import HloModuleProto
from tpudiag.writers.tpu_design import write_capture

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "dumps" / "v5e_mlp_train"
BAD_ORDERS = [(5, 0), (0, 0), (-1, 0), (1,), (2, 1, 0)]
IDS = ["out-of-range", "repeated", "negative", "too-short", "too-long"]


@pytest.mark.parametrize("order", BAD_ORDERS, ids=IDS)
def test_text_and_layout_objects_are_checked_alike(order):
    text = f"bf16[1024,512]{{{','.join(map(str, order))}:T(8,128)(2,1)}}"
    with pytest.raises(ShapeSyntaxError, match="not a permutation of the 2 dims of bf16\\[1024,512\\]"):
        parse_shape(text)
    layout = Layout(minor_to_major=order, tiles=((8, 128), (2, 1)))
    for build in (array_shape, padded_bytes):
        with pytest.raises(ShapeSyntaxError, match="not a permutation"):
            build("bf16", (1024, 512), layout)


def test_good_orders_and_no_order_still_count_the_right_dims():
    # Near misses: the transposed order is legal, and an empty order keeps the written order.
    assert parse_shape("f32[3,200]{0,1:T(8,128)}").padded_bytes == 200 * 128 * 4  # memory order [200, 3]
    assert parse_shape("f32[3,200]{1,0:T(8,128)}").padded_bytes == 8 * 256 * 4
    assert parse_shape("f32[3,200]{:T(8,128)}").padded_bytes == 8 * 256 * 4
    assert parse_shape("f32[]{:T(256)}").padded_bytes == 256 * 4


def _proto_with_order(order) -> tuple[bytes, str]:
    """The fixture's real module with one rank-2 instruction's layout replaced by `order`."""
    module = HloModuleProto()
    module.ParseFromString((FIXTURE / "module.pb").read_bytes())
    inst = next(i for c in module.computations for i in c.instructions
                if len(i.shape.dimensions) == 2 and i.shape.HasField("layout"))
    del inst.shape.layout.minor_to_major[:]
    inst.shape.layout.minor_to_major.extend(order)
    return module.SerializeToString(), inst.name


@pytest.mark.parametrize("order", BAD_ORDERS, ids=IDS)
def test_proto_refuses_the_instruction_shape_with_a_warning(order):
    data, name = _proto_with_order(order)
    program = parse_hlo_proto(data, "m.pb")
    [inst] = [i for i in program.instructions.values() if i.name == name and i.shape is None]
    assert [w for w in program.warnings if "not a permutation" in w] == [
        w for w in program.warnings if f"`{name}`" in w]
    assert any(f"`{name}`" in w and "not a permutation of the 2 dims" in w for w in program.warnings)
    good = parse_hlo_proto((FIXTURE / "module.pb").read_bytes(), "m.pb")
    assert len(program.instructions) == len(good.instructions)  # only that shape is set aside
    assert inst.shape_text == ""


@pytest.mark.parametrize("order", [(5, 0), (0, 0)], ids=["out-of-range", "repeated"])
def test_text_dump_skips_the_instruction_with_a_warning(tmp_path: Path, order):
    dump = tmp_path / "xla"
    shutil.copytree(FIXTURE, dump)
    good = "bf16[128,1024]{1,0:T(8,128)(2,1)}"
    [f] = dump.glob("*after_optimizations.txt")
    lines = f.read_text().splitlines(keepends=True)
    i = next(i for i, line in enumerate(lines) if " = " + good in line)  # an instruction's result shape
    lines[i] = lines[i].replace(good, good.replace("{1,0", "{" + ",".join(map(str, order))), 1)
    f.write_text("".join(lines))
    [program] = load_hlo_dump(dump).programs
    assert any("not a permutation of the 2 dims" in w and "instruction skipped" in w for w in program.warnings)


def test_capture_embedding_a_bad_layout_reports_with_a_warning(tmp_path: Path):
    data, name = _proto_with_order((5, 0))
    design = sc.design((sc.COMPUTE,), lambda chip, step: [sc.Placed("fusion.1", 0, 1000 * sc.US)],
                       device_type="TPU v5 lite", peak_tflops=197.0, peak_hbm_gbs=819.0, hlo_proto=data)
    write_capture(design, tmp_path / "run")
    d = diagnose(tmp_path / "run", jobs=1)
    assert d.report.ops
    assert any(f"`{name}`" in w and "layout {5,0} is not a permutation" in w for w in d.warnings), d.warnings
