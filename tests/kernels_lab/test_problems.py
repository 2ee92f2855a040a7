"""Typed kernel problems: each family's Problem, the KernelFamily protocol, spec.json across versions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpudiag.errors import InputError
from tpudiag.kernels_lab.problems import (
    KERNEL_FAMILIES, PROBLEMS, collective, datamove, matmul, multi_output, problem_fields, problem_from_fields, reduction)
from tpudiag.kernels_lab.spec import OpSpec, cpu_problem

FIXTURES = Path(__file__).parent / "fixtures"


def test_every_family_module_is_a_kernel_family_with_its_typed_problem():
    pytest.importorskip("jax", reason="the family modules need jax (the tpu extra)")
    from tpudiag.kernels_lab.family import KernelFamily, family_module

    for name in KERNEL_FAMILIES:
        fam = family_module(name)
        assert isinstance(fam, KernelFamily), name
        assert fam.FAMILY == name and fam.Problem is PROBLEMS[name]
    assert set(PROBLEMS) - set(KERNEL_FAMILIES) == {"pallas"}  # the user's own kernel: no module of ours


@pytest.mark.parametrize("name", ["collective", "datamove"])
def test_a_spec_json_written_before_typed_problems_still_loads(name):
    """Written by the previous version (problems as dicts, fields at their defaults left out)."""
    path = FIXTURES / f"spec_v0_{name}.json"
    old = json.loads(path.read_text())
    spec = OpSpec.from_json(path)
    assert type(spec.problem) is PROBLEMS[name] and type(spec.run_problem) is PROBLEMS[name]
    assert {k: v for k, v in problem_fields(spec.problem).items() if k in old["problem"]} == old["problem"]
    # written again, the format is the same object with every field present
    again = json.loads(spec.to_json())
    added_since_v0 = {"captured_basis"}  # written at its default ("measured") for an old spec
    assert set(again) == set(old) | added_since_v0 and again["problem"] == problem_fields(spec.problem)
    assert again["captured_basis"] == "measured"


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(data))
    return path


def test_spec_json_round_trips(tmp_path):
    spec = OpSpec.from_json(FIXTURES / "spec_v0_collective.json")
    assert OpSpec.from_json(_write(tmp_path, json.loads(spec.to_json()))) == spec


@pytest.mark.parametrize(("change", "cause"), [
    (dict(family="fft"), "unknown kernel family 'fft'"),
    (dict(problem={"kind": "all-gather", "devices": 2, "rows": 8, "cols": 128, "shards": 3}),
     "the collective problem has no field shards"),
    (dict(problem={"kind": "all-to-all", "devices": 2, "rows": 8, "cols": 128}), "kind must be one of"),
    (dict(run_problem=[1, 2]), "`run_problem` is not an object"),
])
def test_a_spec_json_this_version_cannot_read_is_one_clear_error(tmp_path, change, cause):
    data = dict(json.loads((FIXTURES / "spec_v0_collective.json").read_text()), **change)
    path = _write(tmp_path, data)
    with pytest.raises(InputError) as exc:
        OpSpec.from_json(path)
    line = exc.value.one_line()
    assert "spec.json does not match this tpudiag version" in line and cause in line and "\n" not in line
    assert str(path) in line and "tpudiag lab extract" in exc.value.hint


def test_problem_from_fields_refuses_what_the_problem_refuses():
    with pytest.raises(ValueError, match="the datamove problem: dynamic_slice: window"):
        problem_from_fields("datamove", dict(op="dynamic_slice", in_dims=[8, 128], out_dims=[16, 128]))
    with pytest.raises(ValueError, match="missing 1 required positional argument: 'n'"):
        problem_from_fields("matmul", dict(m=8, k=128))


def test_scaled_keeps_each_family_valid_and_describe_reads_as_before():
    mm = matmul.Problem(8192, 4096, 50257, bias=True, activation="gelu")
    assert mm.describe() == "bf16 8192x4096 @ 4096x50257 -> bf16 (+bias, gelu)"
    assert (mm.scaled(16).m, mm.scaled(16).n) == (512, 3142)
    red = reduction.Problem(rows=4, cols=512, op="colsum", dtype="float32", out_dtype="float32", outer=256)
    assert red.describe() == "colsum f32[256,4,512] over dim 1 -> f32[256,512]" and red.scaled(4).outer == 128
    pad = datamove.Problem("pad", (8, 100), (8, 128), pad_low=(0, 0), pad_high=(0, 28))
    assert pad.describe() == "pad bf16[8, 100] -> [8, 128] low [0, 0] high [0, 28]"
    assert pad.scaled(4) == datamove.Problem("pad", (8, 25), (8, 53), pad_low=(0, 0), pad_high=(0, 28))
    mo = multi_output.Problem("matmul", 512, 256, 1024, extras=((6144, 128, "bfloat16", "carried"),))
    assert mo.describe() == "bf16 512x1024 @ 1024x256 -> bf16 + 0 computed, 1 carried outputs"
    ring = collective.Problem("all-gather", 4, 1024, 12288, "bfloat16", group=(0, 1, 2, 3), mesh_axis="x")
    assert ring.describe() == "all-gather bf16[1024,12288] per device, ring of 4 [0, 1, 2, 3] on mesh axis 'x'"
    # the CPU run of a ring is capped (32 KiB buffers) and says so
    small, notes = cpu_problem(ring, 1)
    assert small.rows * small.cols * 4 * 4 <= 32 << 10 and notes
