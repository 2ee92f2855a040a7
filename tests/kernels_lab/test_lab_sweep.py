"""Block-size sweep: compiler-error parsing and resume without libtpu; a real deviceless sweep with it.

The live sweep compiles a 2048^3 bf16 matmul for v5e:2x2 (one device), as measured in
`shared/reference/tpu-compiler-dumps.md` §8.2: 512,2048,512 -> 141,831 estimated cycles,
256,256,256 -> 496,516, 1024^3 -> CompileTimeScopedVmemOom (18.36M > 16.00M). Each compile runs in
a libtpu subprocess with the static LLO profile on (~2 s each, ~15 s in all on 2 cores).
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os

import pytest

from tpudiag.kernels_lab.problems import matmul as matmul_problem
from tpudiag.kernels_lab.spec import OpSpec
from tpudiag.kernels_lab.sweep import _load_done, compile_error_reason, jsonl_path

SCOPED_OOM = ("JaxRuntimeError: RESOURCE_EXHAUSTED: E1001: CompileTimeScopedVmemOom: Ran out of memory in memory "
              "space vmem while allocating on stack for %_lambda_.1 = f32[4096,4096]{1,0:T(8,128)} "
              "custom-call(…) … "
              "Scoped allocation with size 28.00M and limit 16.00M exceeded scoped vmem limit by 12.00M.")
PHYSICAL_OOM = ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
                "Used 449.80M of 128.00M vmem. Exceeded vmem capacity by 321.80M.")


def test_compile_errors_become_one_line_reasons():
    assert compile_error_reason(SCOPED_OOM) == ("scoped VMEM OOM (CompileTimeScopedVmemOom): 28.00 MiB needed, "
                                                "limit 16.00 MiB")
    assert compile_error_reason(PHYSICAL_OOM) == ("VMEM OOM (over physical VMEM): 449.80 MiB needed, "
                                                  "limit 128.00 MiB")
    assert compile_error_reason("\nLoweringException: bad block\nmore") == "LoweringException: bad block"


def test_resume_ignores_other_keys_and_a_line_cut_by_an_interrupt(tmp_path):
    path = tmp_path / "tune-v5e_2x2.jsonl"
    key = {"topology": "v5e:2x2", "problem": {"m": 8}, "measure": False}
    path.write_text(json.dumps({"key": key, "label": "a", "status": "ok"}) + "\n"
                    + json.dumps({"key": dict(key, topology="v6e:2x2"), "label": "b", "status": "ok"}) + "\n"
                    + '{"key": {"topology": "v5e:2x2", "probl')  # interrupted mid-write
    assert list(_load_done(path, key)) == ["a"]


def matmul_spec(capture: str = "in-code") -> OpSpec:
    """A 2048^3 bf16 matmul as if profiled on v5e (no capture time: the XLA column is the compiler's)."""
    problem = matmul_problem.Problem(m=2048, k=2048, n=2048, in_dtype="bfloat16", out_dtype="bfloat16")
    return OpSpec(op_name="fusion.7", category="convolution fusion", program="jit_f", family="matmul",
                  problem=problem, run_problem=dataclasses.replace(problem, m=256, k=256, n=256), scale_down=8,
                  shape_with_layout="bf16[2048,2048]{1,0:T(8,128)(2,1)}", operands=(), hlo_text="", tf_op="",
                  source="", basis=("built in the test",), device_type="TPU v5 lite", generation="v5e",
                  topology="v5e:2x2", vmem_bytes=128 << 20, hbm_bytes_per_s=819e9, clock_hz=1.5e9, occurrences=1,
                  measured_time_ps=None, flops=2.0 * 2048**3, bytes_accessed=3.0 * 2048 * 2048 * 2, capture=capture)


@pytest.fixture
def need_libtpu():
    if importlib.util.find_spec("libtpu") is None:
        if os.environ.get("TPUDIAG_ALLOW_NO_LIBTPU") == "1":
            pytest.skip("libtpu is not installed (TPUDIAG_ALLOW_NO_LIBTPU=1)")
        pytest.fail("libtpu is not installed: install the tpu extra (`pip install -e .[tpu]`) or set "
                    "TPUDIAG_ALLOW_NO_LIBTPU=1 to skip")


@pytest.mark.libtpu
def test_deviceless_sweep_ranks_by_the_compiler_estimates(need_libtpu, tmp_path, capsys):
    from rich.console import Console

    from tpudiag.cli.app import main
    from tpudiag.kernels_lab import matmul
    from tpudiag.kernels_lab.render import render_sweep
    from tpudiag.kernels_lab.reproduce import write_repro
    from tpudiag.kernels_lab.sweep import run_sweep

    out = tmp_path / "repro"
    write_repro(matmul_spec(), out)
    # The family's first three candidates for 2048^3: 512,2048,512 / 1024^3 (too big for v5e's
    # 16 MiB scoped VMEM) / 1024,512,1024.
    with pytest.raises(SystemExit) as exc:
        main(["lab", "tune", str(out), "--no-measure", "--max-candidates", "3", "--format", "json", "--write"])
    assert exc.value.code in (0, None)
    stdout, stderr = capsys.readouterr()
    result = json.loads(stdout)
    assert "[3/3] bm=1024 bk=512 bn=1024:" in stderr  # progress on stderr

    by_label = {r["label"]: r for r in result["results"]}
    oom = by_label["bm=1024 bk=1024 bn=1024"]
    assert oom["status"] == "rejected"
    assert oom["reason"] == "scoped VMEM OOM (CompileTimeScopedVmemOom): 18.36 MiB needed, limit 16.00 MiB"
    ok = [r for r in result["results"] if r["status"] == "ok"]
    assert [r["label"] for r in ok] == ["bm=512 bk=2048 bn=512", "bm=1024 bk=512 bn=1024"]
    # the ranking agrees with the estimates the worker read, as kept in the JSONL
    records = [json.loads(line) for line in jsonl_path(out, "v5e:2x2").read_text().splitlines()]
    cycles = {r["label"]: r["est_cycles"] for r in records}
    assert cycles[ok[0]["label"]] < cycles[ok[1]["label"]]
    assert ok[0]["est_cycles"] == pytest.approx(141_831, rel=0.05)  # reference §8.2, libtpu 0.0.42.1
    assert ok[1]["est_cycles"] == pytest.approx(150_095, rel=0.05)
    assert result["basis"] == "estimate+floor"
    assert ok[0]["bounded_s"] == max(ok[0]["est_s"], ok[0]["hbm_floor_s"])
    assert ok[0]["est_s"] == pytest.approx(ok[0]["est_cycles"] / 1.5e9)
    assert result["xla"]["est_cycles"] == pytest.approx(138_056, rel=0.05)  # XLA's own dot, compiled alike
    # the best configuration is written into the reproduction
    assert "BLOCKS = BlockSizes(block_m=512, block_k=2048, block_n=512)" in (out / "repro.py").read_text()

    # A re-run resumes from the JSONL: nothing is compiled again.
    progress: list[str] = []
    blocks = [matmul.BlockSizes(512, 2048, 512), matmul.BlockSizes(1024, 1024, 1024),
              matmul.BlockSizes(1024, 512, 1024)]
    again = run_sweep(out, blocks=blocks, measure=False, progress=progress.append)
    assert progress == []
    assert [r.label for r in again.results] == [r["label"] for r in result["results"]]

    console = Console(width=220, record=True)
    render_sweep(again, console)
    table = console.export_text()
    assert f"{ok[0]['est_cycles']:,}" in table and "rejected [1]" in table
    assert "[1] scoped VMEM OOM (CompileTimeScopedVmemOom): 18.36 MiB" in table
    assert "(compiler estimate)" in table


@pytest.mark.libtpu
def test_interrupted_sweep_keeps_results_and_resumes(need_libtpu, tmp_path):
    """Ctrl-C after the first candidate: the JSONL keeps it, a re-run compiles only the rest."""
    from tpudiag.kernels_lab import matmul
    from tpudiag.kernels_lab.reproduce import write_repro
    from tpudiag.kernels_lab.sweep import run_sweep

    out = tmp_path / "repro"
    spec = matmul_spec()
    small = dataclasses.replace(spec.problem, m=512, k=512, n=512)  # compiles in about a second
    write_repro(OpSpec(**{**spec.__dict__, "problem": small}), out)
    blocks = [matmul.BlockSizes(256, 512, 256), matmul.BlockSizes(128, 128, 128)]

    def interrupt_after_first(line: str) -> None:
        if line.startswith("[1/2] bm=256"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_sweep(out, topology="v5e:2x2", blocks=blocks, measure=False, progress=interrupt_after_first)
    kept = [json.loads(line)["label"] for line in jsonl_path(out, "v5e:2x2").read_text().splitlines()]
    assert kept == ["xla", "bm=256 bk=512 bn=256"]

    progress: list[str] = []
    result = run_sweep(out, topology="v5e:2x2", blocks=blocks, measure=False, progress=progress.append)
    assert progress[0] == "compiling 1 configuration(s) of `fusion.7` for v5e:2x2 (1 already done)"
    assert [line for line in progress if line.startswith("[1/1] bm=128 bk=128 bn=128:")]
    assert {r.label for r in result.results if r.status == "ok"} == {"bm=256 bk=512 bn=256", "bm=128 bk=128 bn=128"}
    assert result.best.label == "bm=256 bk=512 bn=256"  # fewer, bigger grid steps win
