"""Spills of a real Pallas kernel reach the op that runs it (issue 20, item 5).

The fixture `tests/fixtures/llo/v5e_pallas_scan` is a real deviceless v5e compile
(`tests/fixtures/llo/make_fixtures.py v5e_pallas_scan`): a model step whose layers run in a
`jax.lax.scan`, each layer a matmul + tanh and a Pallas kernel keeping 128 vregs live across a
`fori_loop`. The kernel's custom call `closed_call.4` is an instruction of the `while` body; its
LLO program, named after it, holds 691 spill stores and 800 fills in `final_bundles`. Before, the
static report showed `-` under spills for every op (the `while` runs the kernel) and the spill
finding said "not in the trace"; a trace listing only entry ops got no spills joined at all.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import tpudiag
from tests.conftest import US
from tpudiag.parsers.llo import load_llo_dump
from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "llo" / "v5e_pallas_scan"
KERNEL = "closed_call.4"


def _counted_in_bundles() -> tuple[int, int]:
    [bundles] = FIXTURE.glob(f"*-{KERNEL}-*-final_bundles.txt")
    text = bundles.read_text()
    return (len(re.findall(r"= vst[^\[;]*\[vmem:\[#allocation\d+_spill", text)),
            len(re.findall(r"= vld[^\[;]*\[vmem:\[#allocation\d+_spill", text)))


def test_fixture_kernel_spills_are_attributed_to_its_custom_call():
    stores, fills = _counted_in_bundles()
    assert (stores, fills) == (691, 800)
    spills = load_llo_dump(FIXTURE).spill_instructions
    mine = spills[spills["program"] == KERNEL]
    assert len(mine) == stores + fills
    assert set(mine["hlo"].astype(str)) == {KERNEL}  # never None or '': the op of the program


def test_static_report_puts_the_kernel_spills_on_the_op_that_runs_it():
    d = tpudiag.diagnose(FIXTURE)
    assert d.mode == "static"
    table = d.static.ops.set_index("name")
    assert (table.loc["while", "spill_stores"], table.loc["while", "spill_fills"]) == (691, 800)
    row = next(o for o in d.report.ops if o.name == "while")
    assert (row.spill_stores, row.spill_fills) == (691, 800)
    assert d.join.runs_inside[KERNEL] == "while"  # the one roll-up the spill rule times the kernel by
    [spill] = [f for f in d.findings if f.rule == "spill"]
    assert spill.ops == (KERNEL, "while")
    assert spill.message.startswith(f"`{KERNEL}` (at `make_fixtures.py:")
    assert "spills 691 vector registers and fills 800 (inside `while`" in spill.message
    assert "not in the trace" not in spill.message and spill.saving.ps > 0


def _trace(tmp_path: Path, nested: bool, program_id: int = 99) -> Path:
    """A v5e capture of the fixture's module: the `while` of 3 layers, with (nested) or without the
    loop body's ops on the XLA Ops line, as captures of either kind show them."""
    body = (OpDef("convolution_tanh_fusion.2", "convolution fusion", flops=2.0 * 2048 * 128 * 128,
                  bytes_accessed=3.0e6),
            OpDef(KERNEL, "custom-call", bytes_accessed=2.0e6))
    entry = (OpDef("while", "while"), OpDef("reduce_sum.7", "reduce", bytes_accessed=1.0e6))

    def schedule(chip: int, step: int):
        placed = [Placed("while", 0, 300 * US)]
        if nested:
            for layer in range(3):
                placed += [Placed("convolution_tanh_fusion.2", layer * 100 * US, 20 * US),
                           Placed(KERNEL, layer * 100 * US + 20 * US, 80 * US)]
        return placed + [Placed("reduce_sum.7", 300 * US, 10 * US)]

    design = CaptureDesign(hostname="host0", device_type="TPU v5 lite", peak_tflops=197.0, peak_hbm_gbs=819.0,
                           module="jit_step", program_id=program_id, ops=entry + (body if nested else ()), n_chips=1,
                           n_steps=3, step_ps=400 * US, schedule=schedule)
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(design, run)
    return run


def test_joined_to_a_trace_with_the_kernel_the_kernel_row_has_its_spills(tmp_path):
    d = tpudiag.diagnose(_trace(tmp_path, nested=True), dumps=[FIXTURE])
    rows = {o.name: o for o in d.report.ops}
    assert (rows[KERNEL].spill_stores, rows[KERNEL].spill_fills) == (691, 800)
    assert rows["while"].spill_stores is None  # the kernel's spills are counted once, on the kernel
    [spill] = [f for f in d.findings if f.rule == "spill"]
    assert spill.ops == (KERNEL,)
    # 3 x 80 µs of kernel per step; (691 + 800) spill instructions over its 982 bundles caps at all of it.
    assert "(240.0 µs per step in the trace)" in spill.message
    assert spill.saving.ps == 240 * US


def test_joined_to_a_trace_of_entry_ops_the_loop_gets_the_kernel_spills(tmp_path):
    d = tpudiag.diagnose(_trace(tmp_path, nested=False), dumps=[FIXTURE])
    rows = {o.name: o for o in d.report.ops}
    assert (rows["while"].spill_stores, rows["while"].spill_fills) == (691, 800)
    [spill] = [f for f in d.findings if f.rule == "spill"]
    assert spill.ops == (KERNEL, "while")
    assert "(inside `while`" in spill.message and ", which takes 300.0 µs per step in the trace)" in spill.message


def test_regression_a_program_id_above_int64_joins_the_dump(tmp_path):
    # Issue 35: an id >= 2^63 (jit_f's in the real v6e capture) was read as 0, the ops lost their
    # module name and the dump matched none of them.
    d = tpudiag.diagnose(_trace(tmp_path, nested=True, program_id=12190760917235803885), dumps=[FIXTURE])
    rows = {o.name: o for o in d.report.ops}
    assert rows[KERNEL].program == "jit_step" and rows[KERNEL].program_id == 12190760917235803885
    assert (rows[KERNEL].spill_stores, rows[KERNEL].spill_fills) == (691, 800)
    assert not any("matched none" in w for w in d.warnings), d.warnings


@pytest.mark.parametrize("nested", [True, False])
def test_spills_are_never_counted_twice(tmp_path, nested):
    d = tpudiag.diagnose(_trace(tmp_path, nested=nested), dumps=[FIXTURE])
    assert sum(o.spill_stores or 0 for o in d.report.ops) == 691


def _with_a_newer_compile(tmp_path: Path) -> Path:
    """The fixture with a later compile of another module (`jit_f`, the 64-row Pallas reduction)
    in the same LLO directory, as a script that compiles a helper after its step leaves it, and an
    XLA dump restricted to the step (`--xla_dump_hlo_module_re`)."""
    import shutil

    root = tmp_path / "dump"
    shutil.copytree(FIXTURE, root)
    helper = FIXTURE.parent / "v5e_pallas_r64"
    for f in helper.glob("*.txt"):
        stamp, rest = f.name.split("-", 1)
        newer = int(stamp) - 1795992125525773570 + 1796999999000000000  # after every file of the step
        shutil.copy(f, root / f"{newer}-{rest}")
    return root


def test_the_llo_compile_of_the_xla_dumps_module_is_read_not_the_newest(tmp_path):
    """Regression (issue 20): the newest LLO compile was read whatever module the XLA dump held, so
    the step's kernel spills were lost: `-` under spills and no spill finding."""
    root = _with_a_newer_compile(tmp_path)
    d = tpudiag.diagnose(root)
    assert d.static.ops.set_index("name").loc["while", "spill_stores"] == 691
    assert [f.ops for f in d.findings if f.rule == "spill"] == [(KERNEL, "while")]
    trace = tpudiag.diagnose(_trace(tmp_path, nested=True), dumps=[root])
    assert {o.name: o.spill_stores for o in trace.report.ops}[KERNEL] == 691


def test_a_pallas_kernel_s_spill_finding_names_its_blocks_and_what_halving_one_frees():
    """The committed v5e dump: 87 spills, 257 fills in `shard_map.19`, a 512x512x512 bf16 matmul kernel.
    One step's vector tiles: A 512x512 bf16 (0.5 MiB), B 512x512 bf16 (0.5 MiB), the f32 product (1 MiB)."""
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    import tpudiag
    from tests.conftest import REPO

    report = tpudiag.diagnose(REPO / "examples" / "models" / "dumps" / "pallas_matmul_v5e").report
    (finding,) = [f for f in report.findings if f.rule == "spill"]
    assert "spills 87 vector registers and fills 257 (" in finding.message
    # (87 + 257) / 2741 bundles = 12.6 %, then the blocks.
    assert finding.message.endswith("; 12.6% of its 2741 bundles; Pallas `_kernel` blocks bm x bk x bn 512x512x512")
    assert "kernel" in dict(finding.evidence[0].values)
    assert finding.fix.startswith("smaller blocks: block_n 512 -> 256 halves B 512x512 bf16 and the f32 product")
    assert "(1.50 -> 0.75 MiB of the step's 2.00 MiB" in finding.fix and "--param bn=256,512" in finding.fix


def test_halving_only_where_half_stays_lane_aligned_and_the_kernel_is_a_matmul():
    from tpudiag.model.kernels import KernelBlock, MosaicKernel, halving

    def kernel(bm, bk, bn, matmuls=1):
        blocks = (KernelBlock("input", 0, (bm, bk), "bf16", "vmem", True),
                  KernelBlock("input", 1, (bk, bn), "bf16", "vmem", True),
                  KernelBlock("output", 0, (bm, bn), "bf16", "vmem", True))
        return MosaicKernel("k", (1, 1, 1), ("parallel",) * 3, blocks, matmul_ops=matmuls)

    assert halving(kernel(128, 128, 128)) is None  # 64 is not a multiple of the 128 lanes
    assert halving(kernel(512, 512, 512, matmuls=0)) is None  # no MXU matmul in the body: not a matmul kernel
    half = halving(kernel(128, 2048, 128))  # only block_k halves to a multiple of 128
    assert (half.dim, half.before, half.after) == ("block_k", 2048, 1024)
    assert half.tiles_bytes == 2 * 128 * 2048 * 2 and half.step_bytes == 2 * 128 * 2048 * 2 + 128 * 128 * 4


def test_the_spill_fix_names_the_users_function_and_keyword_when_its_source_is_here():
    """`pallas_matmul.py:42` (the `pallas_call`) lies in `tiled_matmul(a, b, bm=BM, bk=BK, bn=BN)`, and the
    module has `example_args`: the command is the one `lab tune` runs, no placeholder left."""
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    from tests.conftest import REPO

    report = tpudiag.diagnose(REPO / "examples" / "models" / "dumps" / "pallas_matmul_v5e").report
    (finding,) = [f for f in report.findings if f.rule == "spill"]
    assert "`tpudiag lab tune examples/models/pallas_matmul.py:tiled_matmul --param bn=256,512`" in finding.fix
    assert "MODULE:FN" not in finding.fix and "NAME" not in finding.fix


def test_without_the_source_the_command_says_what_to_substitute():
    from tpudiag.model.kernels import KernelBlock, MosaicKernel, tune_command

    blocks = (KernelBlock("input", 0, (512, 512), "bf16", "vmem", True),
              KernelBlock("input", 1, (512, 512), "bf16", "vmem", True),
              KernelBlock("output", 0, (512, 512), "bf16", "vmem", True))
    k = MosaicKernel("k", (4, 4, 4), ("parallel",) * 3, blocks, matmul_ops=1)
    assert tune_command(k, "block_n", (256, 512)) == (
        "`tpudiag lab tune MODULE:FN --param NAME=256,512` (MODULE:FN: the file and the function that call "
        "`pallas_call`; NAME: that function's keyword argument for block_n)")
    from dataclasses import replace

    mine = replace(k, caller="my dir/k.py:run", caller_params=("x", "tile_n"))  # no example_args in the module
    assert tune_command(mine, "block_n", (256, 512)) == (
        "`tpudiag lab tune 'my dir/k.py:run' --param tile_n=256,512` (the module needs `example_args(mesh)`, "
        "the arguments it is compiled on)")


def test_low_mxu_utilization_on_a_pallas_kernel_names_its_blocks_and_a_fix_from_them():
    """The committed capture runs the kernel at 82.5 % of peak: judged against a 90 % bar and a 95 % target it is slow.
    It spills 87/257 (the LLO dump), so the fix halves the block that frees most vector state."""
    pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")
    from tests.conftest import REPO
    from tpudiag.rules import RulesConfig

    models = REPO / "examples" / "models"
    config = RulesConfig(select=("low-mxu-utilization",), options={"low-mxu-utilization": {"low_utilization": 0.9,
                                                                           "target_utilization": 0.95}})
    d = tpudiag.diagnose(next((models / "captures" / "pallas_matmul_v5e").glob("plugins/profile/*")),
                         dumps=[models / "dumps" / "pallas_matmul_v5e"], config=config)
    (finding,) = [f for f in d.findings if f.rule == "low-mxu-utilization"]
    assert "Pallas `_kernel` blocks bm x bk x bn 512x512x512" in finding.message
    assert finding.fix.startswith("smaller blocks, as the kernel spills: block_n 512 -> 256 halves B 512x512 bf16")
    assert "--param bn=256,512" in finding.fix


def test_the_mxu_block_fix_follows_from_the_blocks():
    from tpudiag.model.kernels import KernelBlock, MosaicKernel, mxu_block_fix

    def kernel(bm, bk, bn):
        blocks = (KernelBlock("input", 0, (bm, bk), "bf16", "vmem", True),
                  KernelBlock("input", 1, (bk, bn), "bf16", "vmem", True),
                  KernelBlock("output", 0, (bm, bn), "bf16", "vmem", True))
        return MosaicKernel("k", (1, 1, 1), ("parallel",) * 3, blocks, matmul_ops=1, caller="k.py:f",
                            caller_params=("bm", "bk", "bn"), caller_example_args=True)

    # v6e's 256-wide MXU: block_n 128 leaves half its columns idle (block_m streams: not judged)
    assert mxu_block_fix(kernel(64, 256, 128), 256, 0).startswith("block_n 128 -> 256: the MXU's weight tile is 256x256")
    # aligned, no spills: a larger block_k, with the command comparing both
    fix = mxu_block_fix(kernel(256, 256, 256), 128, 0)
    assert fix.startswith("a larger block_k: 256 -> 512") and "`tpudiag lab tune k.py:f --param bk=256,512`" in fix
    assert mxu_block_fix(kernel(256, 256, 256), 128, 12).startswith("smaller blocks, as the kernel spills")
    not_matmul = MosaicKernel("k", (1,), ("parallel",), (KernelBlock("input", 0, (8, 128), "f32", "vmem", True),))
    assert mxu_block_fix(not_matmul, 128, 0) is None
