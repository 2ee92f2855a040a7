"""`model.kernels` on hand-built kernels: a Pallas matmul's blocks, the block dim whose halving frees
most, the `lab tune` line and the MXU fix, and the lines and JSON a kernel shows in a report. Every
byte count is worked by hand in the comments (bf16 2 bytes, f32 4, s4 half a byte)."""

from __future__ import annotations

import dataclasses

from tpudiag.model.kernels import (BlockHalving, KernelBlock, KernelView, MosaicKernel, UnitShare, halving,
                                   mxu_block_fix, tune_command)


def _matmul(bm: int = 512, bk: int = 256, bn: int = 512, **kw) -> MosaicKernel:
    """A Pallas matmul as `pl.pallas_call` writes it: A and B windows in VMEM, one output window, an
    f32 accumulator in scratch (the whole buffer, no window)."""
    blocks = (KernelBlock("input", 0, (bm, bk), "bf16", "vmem", True, ("g0", "g2")),
              KernelBlock("input", 1, (bk, bn), "bf16", "vmem", True, ("g2", "g1")),
              KernelBlock("output", 0, (bm, bn), "bf16", "vmem", True, ("g0", "g1")),
              KernelBlock("scratch", 0, (bm, bn), "f32", "vmem", False))
    return MosaicKernel(**({"name": "_kernel", "grid": (4, 4, 8), "blocks": blocks, "matmul_ops": 1,
                            "dimension_semantics": ("parallel", "parallel", "arbitrary")} | kw))


def test_a_blocks_bytes_and_shape():
    assert KernelBlock("input", 0, (512, 256), "bf16", "vmem", True).nbytes == 512 * 256 * 2  # 262,144
    assert KernelBlock("input", 0, (3, 5), "f32", "vmem", True).nbytes == 60
    assert KernelBlock("input", 0, (5,), "s4", "vmem", True).nbytes == 2  # 2.5 bytes, whole bytes counted
    assert KernelBlock("scratch", 0, (2,), "semaphore", "semaphore_mem", False).nbytes is None
    assert KernelBlock("input", 0, (8, 128), "f32", "vmem", True).shape_text == "8x128"
    assert KernelBlock("input", 0, (), "s32", "smem", False).shape_text == "scalar"


def test_a_matmul_kernels_blocks_grid_and_description():
    k = _matmul()
    assert k.matmul_blocks == (512, 256, 512)  # (bm, bk, bn)
    assert [b.index for b in k.of("input")] == [0, 1] and [b.role for b in k.of("scratch")] == ["scratch"]
    assert k.grid_text == "(4,4,8)" and k.steps == 128
    assert k.semantics_text() == "parallel,parallel,arbitrary"
    assert k.blocks_text() == "in 512x256 bf16, 256x512 bf16; out 512x512 bf16; scratch 512x512 f32 vmem"
    assert k.describe() == ("`_kernel` grid (4,4,8) parallel,parallel,arbitrary; blocks bm x bk x bn 512x256x512; "
                            "in 512x256 bf16, 256x512 bf16; out 512x512 bf16; scratch 512x512 f32 vmem")


def test_a_kernel_that_is_no_matmul_is_described_without_blocks():
    whole = (KernelBlock("input", 0, (1024, 128), "f32", "any", False),
             KernelBlock("output", 0, (8, 128), "f32", "vmem", True))
    k = MosaicKernel("copy", (4,), (), whole)
    assert k.matmul_blocks is None and k.steps == 4
    # An input without a window is copied whole; no semantics, no `blocks` part
    assert k.describe() == "`copy` grid (4); in 1024x128 f32 whole; out 8x128 f32"
    assert MosaicKernel("none", (), (), ()).blocks_text() == "" and MosaicKernel("none", (), (), ()).steps == 1


def test_blocks_compose_as_a_matmul_only_when_they_do():
    assert _matmul(matmul_ops=0).matmul_blocks is None  # no MXU matmul in the body
    k = _matmul()
    a, b, out, acc = k.blocks
    def with_blocks(*blocks):
        return dataclasses.replace(k, blocks=blocks).matmul_blocks
    assert with_blocks(a, b, out) == (512, 256, 512)
    assert with_blocks(a, b, a, out) is None  # three inputs
    assert with_blocks(a, b, out, dataclasses.replace(out, index=1)) is None  # two outputs
    assert with_blocks(a, out) is None  # one input
    assert with_blocks(a, b, dataclasses.replace(out, shape=(4, 512, 512))) is None  # a 3-D output
    assert with_blocks(dataclasses.replace(a, shape=(512, 128)), b, out) is None  # A's K 128, B's 256
    assert with_blocks(a, b, dataclasses.replace(out, shape=(512, 256))) is None  # out's N is not B's
    assert with_blocks(a, b, dataclasses.replace(out, shape=(256, 512))) is None  # out's M is not A's
    assert _matmul(matmul_ops=3).matmul_blocks == (512, 256, 512)


def test_a_kernels_source_lines():
    k = _matmul(source_file="/src/ops/pallas_matmul.py", first_line=27, last_line=35)
    assert k.source_text == "/src/ops/pallas_matmul.py:27-35" and k.source_name == "pallas_matmul.py:27-35"
    assert _matmul(source_file="k.py", first_line=27, last_line=27).source_text == "k.py:27"
    assert _matmul(source_file="k.py", first_line=27).source_text == "k.py:27"  # last line unknown
    assert _matmul(first_line=27, last_line=35).source_text == "" and _matmul().source_name == ""


def test_halving_the_block_that_frees_most():
    # bm 512, bk 256, bn 512, bf16: A 512x256x2 = 256 KiB, B 256 KiB, the f32 product 512x512x4 = 1 MiB.
    # block_n halves B and the product (1.25 MiB), as does block_m (A and the product): the tie goes to
    # block_n; block_k halves A and B (0.5 MiB). The step holds 1.5 MiB.
    half = halving(_matmul())
    assert half == BlockHalving("block_n", 512, 256, ("B 256x512 bf16", "the f32 product 512x512"),
                                1_310_720, 1_572_864)
    assert half.text() == ("block_n 512 -> 256 halves B 256x512 bf16 and the f32 product 512x512 "
                           "(1.25 -> 0.62 MiB of the step's 1.50 MiB of vector values)")
    # bn 384 stays a multiple of 128 only undivided (192 is not): block_m (A 256 KiB + product 768 KiB)
    # frees more than block_k (A + B 448 KiB)
    assert halving(_matmul(bn=384)) == BlockHalving("block_m", 512, 256, ("A 512x256 bf16", "the f32 product 512x384"),
                                                    262_144 + 786_432, 262_144 + 196_608 + 786_432)
    # Only block_k halves to a multiple of 128: A 128x512 (128 KiB) and B 512x128 (128 KiB)
    assert halving(_matmul(bm=128, bk=512, bn=128)) == BlockHalving(
        "block_k", 512, 256, ("A 128x512 bf16", "B 512x128 bf16"), 262_144, 262_144 + 65_536)
    # block_k frees most when it is the long dim: A 256x2048 (1 MiB) + B 2048x256 (1 MiB) against
    # block_n's or block_m's 1 MiB + the product 256x256 f32 (256 KiB)
    assert halving(_matmul(bm=256, bk=2048, bn=256)).dim == "block_k"
    assert halving(_matmul(bm=128, bk=128, bn=128)) is None  # every half is 64
    assert halving(_matmul(matmul_ops=0)) is None
    odd = _matmul()
    odd = dataclasses.replace(odd, blocks=tuple(dataclasses.replace(b, dtype="c64x") if b.role == "input" else b
                                               for b in odd.blocks))
    assert halving(odd) is None  # an input dtype of no known size
    assert halving(MosaicKernel("none", (), (), ())) is None  # no blocks at all


def test_halving_counts_each_input_in_its_own_dtype():
    # Regression: B's tile was named and counted in A's dtype. bf16 A 512x256 (256 KiB) times int8
    # weights B 256x512 (128 KiB), f32 product 512x512 (1 MiB): block_n frees B + the product
    # (1.125 MiB), block_m A + the product (1.25 MiB): block_m wins; the step holds 1.375 MiB.
    k = _matmul()
    mixed = dataclasses.replace(k, blocks=(k.blocks[0], dataclasses.replace(k.blocks[1], dtype="s8"), *k.blocks[2:]))
    assert halving(mixed) == BlockHalving("block_m", 512, 256, ("A 512x256 bf16", "the f32 product 512x512"),
                                          262_144 + 1_048_576, 262_144 + 131_072 + 1_048_576)
    assert halving(mixed).text() == ("block_m 512 -> 256 halves A 512x256 bf16 and the f32 product 512x512 "
                                     "(1.25 -> 0.62 MiB of the step's 1.38 MiB of vector values)")
    only_b = dataclasses.replace(k, blocks=(k.blocks[0], dataclasses.replace(k.blocks[1], dtype="c64x"), *k.blocks[2:]))
    assert halving(only_b) is None  # B's dtype of no known size


def test_the_tune_command_fills_in_what_it_knows():
    unknown = _matmul()
    assert tune_command(unknown, "block_k") == (
        "`tpudiag lab tune MODULE:FN --param NAME=V1,V2` (MODULE:FN: the file and the function that call "
        "`pallas_call`; NAME: that function's keyword argument for block_k)")
    known = _matmul(caller="ops/matmul.py:matmul", caller_params=("x", "y", "block_k", "bk"), caller_example_args=True)
    # `bk` comes first among the spellings of block_k, whatever the function's order
    assert tune_command(known, "block_k", (256, 512)) == "`tpudiag lab tune ops/matmul.py:matmul --param bk=256,512`"
    assert tune_command(known, "block_n", (512,)) == (
        "`tpudiag lab tune ops/matmul.py:matmul --param NAME=512` (NAME: its keyword argument for block_n)")
    assert tune_command(known, "block_z", (1, 2)).startswith("`tpudiag lab tune ops/matmul.py:matmul --param NAME=1,2`")
    spaced = _matmul(caller="my ops/m.py:f", caller_params=("tile_n",))
    assert tune_command(spaced, "block_n", (128, 256)) == (
        "`tpudiag lab tune 'my ops/m.py:f' --param tile_n=128,256` (the module needs `example_args(mesh)`, the "
        "arguments it is compiled on)")


def test_the_mxu_fix_takes_the_first_cause():
    assert mxu_block_fix(_matmul(matmul_ops=0), 128, 0) is None
    # block_k 200 is off the 128 multiple (and block_n 300 too: block_k is named first); up to 256
    assert mxu_block_fix(_matmul(bk=200, bn=300), 128, 99) == (
        "block_k 200 -> 256: the MXU's weight tile is 128x128, and a block off its multiple leaves MXU columns idle; "
        "compare deviceless with `tpudiag lab tune MODULE:FN --param NAME=200,256` (MODULE:FN: the file and the "
        "function that call `pallas_call`; NAME: that function's keyword argument for block_k)")
    # On a 256 MXU block_n 384 rounds up to 512; block_m 100 is not judged (rows stream)
    assert mxu_block_fix(_matmul(bm=100, bk=512, bn=384), 256, 0).startswith("block_n 384 -> 512: the MXU's weight "
                                                                           "tile is 256x256,")
    assert mxu_block_fix(_matmul(bn=256 * 3), 256, 0).startswith("a larger block_k")  # 768 is a multiple
    # Blocks on the multiple that spill: halve the one that frees most (block_n, above)
    assert mxu_block_fix(_matmul(), 128, 1) == (
        "smaller blocks, as the kernel spills: block_n 512 -> 256 halves B 256x512 bf16 and the f32 product 512x512 "
        "(1.25 -> 0.62 MiB of the step's 1.50 MiB of vector values); compare deviceless with `tpudiag lab tune "
        "MODULE:FN --param NAME=256,512` (MODULE:FN: the file and the function that call `pallas_call`; NAME: that "
        "function's keyword argument for block_n)")
    larger = ("a larger block_k: 256 -> 512 halves the grid's k steps and the f32 accumulator's (512x512) loads and "
              "stores per MXU pass, where the double-buffered blocks still fit the scoped VMEM; compare deviceless "
              "with `tpudiag lab tune MODULE:FN --param NAME=256,512` (MODULE:FN: the file and the function that "
              "call `pallas_call`; NAME: that function's keyword argument for block_k)")
    assert mxu_block_fix(_matmul(), 128, 0) == larger  # no spills
    # Spilling blocks none of which halves to a multiple of 128: the larger block_k still
    assert mxu_block_fix(_matmul(bm=128, bk=128, bn=128), 128, 5).startswith("a larger block_k: 128 -> 256 ")


def test_a_kernels_json():
    k = MosaicKernel("_k", (2, 3), ("parallel", "arbitrary"),
                     (KernelBlock("input", 0, (8, 16), "f32", "vmem", True, ("g0", "0")),
                      KernelBlock("input", 1, (16, 4), "f32", "vmem", True, None, "computed index"),
                      KernelBlock("output", 0, (8, 4), "f32", "vmem", True, ("g0", "g1")),
                      KernelBlock("scratch", 0, (2,), "semaphore", "semaphore_mem", False)),
                     scalar_prefetch=1, source_file="k.py", first_line=3, last_line=9, matmul_ops=2,
                     caller="k.py:f", caller_params=("bm",), caller_example_args=True)
    assert k.to_json() == {
        "name": "_k", "grid": [2, 3], "dimension_semantics": ["parallel", "arbitrary"], "scalar_prefetch": 1,
        "source_file": "k.py", "first_line": 3, "last_line": 9, "matmul_ops": 2, "caller": "k.py:f",
        "caller_params": ["bm"], "caller_example_args": True, "matmul_blocks": [8, 16, 4],
        "blocks": [
            {"role": "input", "index": 0, "shape": [8, 16], "dtype": "f32", "memory_space": "vmem", "windowed": True,
             "bytes": 512, "index_map": ["g0", "0"], "index_map_note": ""},
            {"role": "input", "index": 1, "shape": [16, 4], "dtype": "f32", "memory_space": "vmem", "windowed": True,
             "bytes": 256, "index_map": None, "index_map_note": "computed index"},
            {"role": "output", "index": 0, "shape": [8, 4], "dtype": "f32", "memory_space": "vmem", "windowed": True,
             "bytes": 128, "index_map": ["g0", "g1"], "index_map_note": ""},
            {"role": "scratch", "index": 0, "shape": [2], "dtype": "semaphore", "memory_space": "semaphore_mem",
             "windowed": False, "bytes": None, "index_map": None, "index_map_note": ""}]}
    assert _matmul(matmul_ops=0).to_json()["matmul_blocks"] is None


def test_a_kernel_views_lines():
    k = _matmul(source_file="/src/ops/pallas_matmul.py", first_line=27, last_line=35)
    bare = KernelView("custom-call.3", "jit_step", _matmul())
    assert bare.lines() == [_matmul().describe()]
    full = KernelView("custom-call.3", "jit_step", k, call_site="model.py:42", vmem_used_bytes=13_107_200,
                      vmem_limit_bytes=16 * 2**20, vmem_limit_source="default for v5e, measured",
                      bundles=12_345, units=(UnitShare("MXU matmul", 0.5), UnitShare("XLU", 0.25)), spill_stores=3,
                      spill_fills=4, final_bundles=1000, dma_issue_bundles=25, dma_wait_bundles=1040,
                      dma_instruction_type="LOCAL")
    # 13,107,200 B = 12.5 MiB of 16 MiB: 78 %; 25 of 1,000 bundles: 2.5 %
    assert full.lines() == [
        k.describe(),
        "body pallas_matmul.py:27-35, called at model.py:42",
        "scoped VMEM 12.50 MiB of the 16 MiB scoped limit (default for v5e, measured; 78%) (compiler)",
        "12,345 static bundles; slots used: MXU matmul 50%, XLU 25%; spills 3, fills 4 (LLO static profile)",
        "DMA started in 25 of 1,000 final bundles (2.5%), waited on in 1,040 (LLO final_bundles); "
        "DMA type LOCAL (static profile)"]


def test_each_part_of_a_kernel_views_lines_alone():
    k = _matmul()
    head = k.describe()
    def lines(**kw):
        return KernelView("op", "p", k, **kw).lines()
    assert lines(call_site="m.py:1") == [head, "called at m.py:1"]
    assert KernelView("op", "p", _matmul(source_file="a/k.py", first_line=5)).lines()[1:] == ["body k.py:5"]
    assert lines(vmem_used_bytes=2**20) == [head, "scoped VMEM 1.00 MiB (compiler)"]  # no limit known
    assert lines(vmem_used_bytes=0, vmem_limit_bytes=2**20, vmem_limit_source="compiler error") == [
        head, "scoped VMEM 0.00 MiB of the 1 MiB scoped limit (compiler error; 0%) (compiler)"]
    assert lines(bundles=0) == [head, "0 static bundles (LLO static profile)"]
    assert lines(units=(UnitShare("VECTOR_ALU", 0.031),)) == [head, "slots used: VECTOR_ALU 3% (LLO static profile)"]
    assert lines(spill_stores=0, spill_fills=0) == [head, "spills 0, fills 0 (LLO static profile)"]
    assert lines(final_bundles=0, dma_issue_bundles=0, dma_wait_bundles=0) == [head]  # no final bundles
    assert lines(final_bundles=300, dma_issue_bundles=1, dma_wait_bundles=2) == [
        head, "DMA started in 1 of 300 final bundles (0.3%), waited on in 2 (LLO final_bundles)"]
    assert lines(dma_instruction_type="NONE") == [head, "DMA type NONE (static profile)"]


def test_a_kernel_views_json():
    view = KernelView("custom-call.3", "jit_step", _matmul(), call_site="model.py:42", vmem_used_bytes=100,
                      vmem_limit_bytes=200, vmem_limit_source="compiler error", estimated_cycles=7, bundles=8,
                      units=(UnitShare("XLU", 0.25),), spill_stores=1, spill_fills=2, final_bundles=3,
                      dma_issue_bundles=4, dma_wait_bundles=5, dma_instruction_type="LOCAL")
    assert view.to_json() == {
        "op": "custom-call.3", "program": "jit_step", "kernel": _matmul().to_json(), "call_site": "model.py:42",
        "vmem_used_bytes": 100, "vmem_limit_bytes": 200, "vmem_limit_source": "compiler error",
        "estimated_cycles": 7, "bundles": 8, "units": [{"unit": "XLU", "fraction": 0.25}], "spill_stores": 1,
        "spill_fills": 2, "final_bundles": 3, "dma_issue_bundles": 4, "dma_wait_bundles": 5,
        "dma_instruction_type": "LOCAL"}
