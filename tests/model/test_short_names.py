"""Long GPU kernel names shortened for table cells: literal cases, and the real V100 capture's table."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpudiag.model.text import short_kernel_name, short_names

PHILOX = ("void tensorflow::functor::FillPhiloxRandomKernelLaunch<tensorflow::random::UniformDistribution<"
          "tensorflow::random::PhiloxRandom, Eigen::half> >(unsigned long long const*, unsigned long long const*, "
          "tensorflow::random::PhiloxRandom, Eigen::half*, long long)")


@pytest.mark.parametrize(("name", "short"), [
    ("fusion.12", "fusion.12"),  # short names stay as they are
    ("void k<int>(float)", "void k<int>(float)"),  # under the limit: untouched, return type included
    (PHILOX, "tensorflow::functor::FillPhiloxRandomKernelLaunch<…>(…)"),
    ("void ns::outer<a<b>, c>(x(y), z)", "ns::outer<…>(…)"),  # nesting collapses at the top level only
])
def test_short_kernel_name(name, short):
    assert short_kernel_name(name, limit=18 if name.startswith("void ns::") else 60) == short


def test_what_is_still_too_long_is_cut_with_an_ellipsis():
    name = "a" * 100
    assert short_kernel_name(name, limit=20) == "a" * 19 + "…"


def test_alike_short_names_are_told_apart_in_order():
    a, b = "void E::K<int, " + "x" * 80 + ">(long)", "void E::K<float, " + "y" * 80 + ">(long)"
    assert short_names([a, "fusion.1", b, a]) == ["E::K<…>(…)", "fusion.1", "E::K<…>(…) [2]", "E::K<…>(…) [3]"]


TF_V100 = Path(__file__).resolve().parents[3] / "shared" / "data" / "real-captures" / "tf-gpu-v100-multiworker-bert" / "trace"


def test_the_v100_capture_table_shows_one_line_names_and_json_keeps_them_whole():
    """Its 11 kernels are C++ template signatures of 150-900 characters (read from the capture's
    event metadata); the terminal table showed one over 14 lines."""
    if not TF_V100.exists():
        pytest.skip(f"the real TensorFlow V100 capture is in ../shared, absent here ({TF_V100})")
    import json

    from typer.testing import CliRunner

    from tpudiag.cli.app import app

    runner = CliRunner()
    out = runner.invoke(app, ["report", str(TF_V100)]).output  # (its cells may wrap: check absence only)
    assert "Eigen::MakePointer" not in out and "UniformDistribution" not in out
    md = runner.invoke(app, ["report", str(TF_V100), "--format", "md"]).output
    assert "`tensorflow::functor::FillPhiloxRandomKernelLaunch<…>(…)`" in md and "Eigen::MakePointer" not in md
    assert "`Eigen::internal::EigenMetaKernel<…>(…) [2]`" in md and "Long kernel names are shortened" in md
    doc = json.loads(runner.invoke(app, ["report", str(TF_V100), "--format", "json"]).output)
    assert any(o["name"].startswith("void tensorflow::functor::FillPhiloxRandomKernelLaunch<") for o in doc["ops"])
