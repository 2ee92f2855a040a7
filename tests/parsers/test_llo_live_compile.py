"""Compile live with libtpu (no TPU needed) and parse the fresh dump.

Needs the `tpu` extra (jax with libtpu), which CI installs. Without it this test fails with a
message saying so, rather than skipping: a silently skipped check would hide a broken install.
The compile runs in a subprocess, because libtpu reads its flags once per process and a failing
static profile aborts the process.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tpudiag.parsers.llo import load_llo_dump

MAKE_FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llo" / "make_fixtures.py"
PASSES = ("hlo-static-bundle-profile", "register-pressure", "schedule-analysis_final_bundles",
          "final_hlo-static-per-bundle-utilization", "final_bundles", "post-ra")


def _require_libtpu() -> None:
    missing = [m for m in ("jax", "libtpu") if importlib.util.find_spec(m) is None]
    if missing:
        pytest.fail(f"{' and '.join(missing)} not installed: this test compiles for TPU with libtpu; "
                    "install the tpu extra (`pip install -e '.[tpu]'`) or deselect with `-m 'not libtpu'`")


@pytest.mark.libtpu
def test_pallas_reduction_compiled_now_spills_as_the_fixture_says(tmp_path):
    _require_libtpu()
    out = tmp_path / "dump"
    flags = [f"--xla_jf_dump_to={out}", "--xla_jf_dump_llo_text=true",
             f"--xla_jf_dump_to_filter=pass=^({'|'.join(PASSES)})$",
             f"--xla_jf_dump_static_llo_profile_to={out / 'static'}"]
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               LIBTPU_INIT_ARGS=" ".join(flags))
    proc = subprocess.run([sys.executable, str(MAKE_FIXTURES), "--child", "v5e:2x2", "pallas_r512", ""],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"deviceless compile failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}"

    dump = load_llo_dump(out)
    assert dump.warnings == []
    kernel = dump.ops.set_index("name").loc["f.1"]
    [bundles_file] = out.glob("*-f.1-*-final_bundles.txt")
    text = bundles_file.read_text()
    vst = len(re.findall(r"= vst[^\[]*\[vmem:\[#allocation\d+_spill", text))
    vld = len(re.findall(r"= vld[^\[]*\[vmem:\[#allocation\d+_spill", text))
    util = dump.utilization_for("f.1")
    # Invariants of any libtpu: the three spill sources agree.
    assert kernel["spill_stores"] == vst == util.vstore_spill
    assert kernel["spill_fills"] == vld == util.vload_fill
    # With the pinned libtpu (0.0.42.1) the fixture's numbers hold exactly.
    assert (vst, vld, kernel["spill_slots"], kernel["register_pressure"]) == (18, 18, 18, 71)
    assert kernel["cycles_status"] == "estimate"
    assert kernel["estimated_cycles"] == pytest.approx(3172, rel=0.05)
