"""The report's Pallas kernels (`analysis.kernels`) on the committed pallas_matmul dumps and capture.

Figures established by hand from the committed files: `llo/*-hlo-static-bundle-profile.txt`, block
`HLO: %shard_map.19`: v5e `VMEM_SPILL_COUNT: (87/2741)` (2,741 bundles), `VMEM_FILL_COUNT: (257/2741)`,
`MXU_0 matmul_packed: (128/172)` and the same on MXU_1..3 (so 74 %); v6e `VMEM_SPILL_COUNT: (0/1175)`;
`used_scoped_memory_configs` size 4550656 (v5e) and 4194304 (v6e) in `compiled.hlo.txt`.
"""

from __future__ import annotations

import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.render.markdown import render_markdown

pytest.importorskip("jaxlib.mlir.ir", reason="reading a Mosaic body needs jaxlib's MLIR bindings (tpu extra)")

MODELS = REPO / "examples" / "models"


def _kernel(path):
    (view,) = tpudiag.diagnose(path).report.kernels
    return view


def test_v5e_dump_kernel_bundles_units_spills_and_vmem():
    k = _kernel(MODELS / "dumps" / "pallas_matmul_v5e")
    assert (k.op, k.kernel.grid, k.kernel.matmul_blocks) == ("shard_map.19", (4, 4, 4), (512, 512, 512))
    assert k.bundles == 2741 and (k.spill_stores, k.spill_fills) == (87, 257)
    units = {u.unit: u.fraction for u in k.units}
    assert units["MXU matmul"] == pytest.approx(128 / 172) and units["XLU"] == 0.0
    assert units["VECTOR_STORE"] == pytest.approx(727 / 2741)
    assert k.vmem_used_bytes == 4550656 and k.vmem_limit_bytes == 16 << 20
    assert k.call_site == "pallas_matmul.py:42" and k.estimated_cycles == 158496


def test_v6e_dump_kernel():
    k = _kernel(MODELS / "dumps" / "pallas_matmul_v6e")
    assert k.bundles == 1175 and (k.spill_stores, k.spill_fills) == (0, 0)
    assert k.vmem_used_bytes == 4194304 and k.vmem_limit_bytes == 32 << 20
    assert "VECTOR_STORE" in {u.unit for u in k.units}  # v6e names it VECTOR_STORE_AND_MISC


def test_the_capture_has_the_kernel_and_its_vmem_but_no_llo():
    k = _kernel(MODELS / "captures" / "pallas_matmul_v5e")
    assert k.kernel.grid == (4, 4, 4) and k.vmem_used_bytes == 4550656
    assert k.bundles is None and k.units == () and k.spill_stores is None


def test_every_renderer_shows_the_kernel():
    report = tpudiag.diagnose(MODELS / "dumps" / "pallas_matmul_v5e").report
    md = render_markdown(report)
    assert "## Pallas kernels" in md and "grid (4,4,4)" in md and "2,741 static bundles" in md
    assert "scoped VMEM 4.34 MiB of the 16 MiB scoped limit" in md


def test_the_op_detail_carries_the_kernel():
    """The TUI's op detail (and its markdown export) shows the kernel of the op it opens."""
    from tpudiag.analysis.drilldown import find_op, op_detail
    from tpudiag.tui.export import op_detail_md

    d = tpudiag.diagnose(MODELS / "captures" / "pallas_matmul_v5e")
    detail = op_detail(d.analysis, d.report, find_op(d.report, "shard_map.19"))
    assert detail.kernel is not None and detail.kernel.kernel.grid == (4, 4, 4)
    md = op_detail_md(detail)
    assert "- Pallas kernel:" in md and "grid (4,4,4)" in md and "scoped VMEM 4.34 MiB" in md


def test_dma_bundles_are_counted_outside_comments():
    from tpudiag.parsers.llo.spills import count_dma

    text = "\n".join([
        "= control target key start",  # not a bundle
        "  0x1   : > { %1 = dma.hbm_to_vmem [thread:$0] /*hbm=*/%s1 } /* Start region 2 */",
        "  0x2   : > { %2 = vadd.f32 %v1, %v2 /* BoundsCheck 8 for %667 = dma.vmem_to_hbm */ }",  # only a comment
        "  0x3   : > { %3 = dma.done.wait (%p1), [#allocation7], 8192 ;; %4 = dma.general %s1 }",
        "  0x4 LB: > { %5 = vmul.f32 %v1, %v2 }",
    ])
    d = count_dma(text, "fusion.7")
    assert (d.bundles, d.issue_bundles, d.wait_bundles) == (4, 2, 1)


def test_the_dma_share_comes_from_the_kernels_final_bundles():
    # v5e_pallas_scan: `closed_call.4`'s final_bundles has 982 bundle lines and no `dma.` at all
    # (`grep -c dma`: 0; its operands come in as `inlined_call_operand.vmem`). No dump here has a
    # critical path for a kernel: nothing is shown for one.
    view = _kernel(REPO / "tests" / "fixtures" / "llo" / "v5e_pallas_scan")
    assert (view.final_bundles, view.dma_issue_bundles, view.dma_wait_bundles) == (982, 0, 0)
    assert "DMA started in 0 of 982 final bundles (0.0%), waited on in 0 (LLO final_bundles)" in view.lines()
    # the committed example keeps the static profile (DMA type) but no final_bundles
    example = _kernel(MODELS / "dumps" / "pallas_matmul_v5e")
    assert example.final_bundles is None and example.dma_instruction_type == "LOCAL"


def test_the_mlp_fixtures_fusion_dmas_are_counted():
    # fusion.7 of v5e_mlp (hand-counted): 4,076 bundle lines (`0` then `0x1`..; the reference doc's
    # 4,076 static bundles); two `dma.hbm_to_vmem` (0xf, 0x18) and
    # two `dma.done.wait` (0x1e, 0x22), each in its own bundle
    from tpudiag.parsers.llo import load_llo_dump

    d = load_llo_dump(REPO / "tests" / "fixtures" / "llo" / "v5e_mlp").dma_for("fusion.7")
    assert (d.bundles, d.issue_bundles, d.wait_bundles) == (4076, 2, 2)
