"""Scoped VMEM per op from real LLO VMEM reports (`tests/fixtures/llo`, v5e compiles): the SCOPED
block of each HLO op, never the program's own `<top-inlining-caller>` entry."""

from __future__ import annotations

from pathlib import Path

from tpudiag.analysis.device_memory import vmem_from_llo
from tpudiag.parsers.llo.load import load_llo_dump

LLO = Path(__file__).resolve().parents[1] / "fixtures" / "llo"


def test_pallas_kernel_and_mlp_fusion_scoped_vmem():
    [kernel] = vmem_from_llo(None, [load_llo_dump(LLO / "v5e_pallas_r512")])
    assert (kernel.op, kernel.scoped_bytes, kernel.source) == ("f.1", 1_122_304, "LLO VMEM report")
    mlp = {v.op: v.scoped_bytes for v in vmem_from_llo(None, [load_llo_dump(LLO / "v5e_mlp")])}
    assert mlp == {"fusion.7": 5_320_704, "all-reduce": 786_432}
