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


@pytest.mark.libtpu
def test_pallas_kernel_in_a_scan_compiled_now_spills_onto_its_custom_call(tmp_path):
    """Regenerates the `v5e_pallas_scan` fixture's compile and checks what its tests rely on: the
    kernel's LLO program is named after its custom call in the XLA dump's `while` body, and its
    spills reach that op and the `while` running it (issue 20, item 5)."""
    _require_libtpu()
    import tpudiag

    out = tmp_path / "dump"
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1",
               LIBTPU_INIT_ARGS=f"--xla_jf_dump_to={out} --xla_jf_dump_llo_text=true "
                                "--xla_jf_dump_to_filter=pass=^final_bundles$",
               XLA_FLAGS=f"--xla_dump_to={out / 'xla'}")
    proc = subprocess.run([sys.executable, str(MAKE_FIXTURES), "--child", "v5e:2x2", "pallas_scan", ""],
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"deviceless compile failed (rc {proc.returncode}):\n{proc.stderr[-2000:]}"

    [hlo] = (out / "xla").glob("*jit_step*.after_optimizations.txt")
    kernels = re.findall(r"%(\S+) = \S+ custom-call\(.*custom_call_target=\"tpu_custom_call\"", hlo.read_text())
    assert len(kernels) == 1
    [kernel] = kernels
    [bundles_file] = out.glob(f"*-{kernel}-*-final_bundles.txt")  # the LLO program bears the op's name
    text = bundles_file.read_text()
    vst = len(re.findall(r"= vst[^\[;]*\[vmem:\[#allocation\d+_spill", text))
    vld = len(re.findall(r"= vld[^\[;]*\[vmem:\[#allocation\d+_spill", text))
    assert vst > 0 and vld > 0

    dump = load_llo_dump(out)
    mine = dump.spill_instructions[dump.spill_instructions["program"] == kernel]
    assert len(mine) == vst + vld and set(mine["hlo"].astype(str)) == {kernel}
    d = tpudiag.diagnose(out)
    row = d.static.ops.set_index("name").loc["while"]
    assert (row["spill_stores"], row["spill_fills"]) == (vst, vld)
    [spill] = [f for f in d.findings if f.rule == "spill"]
    assert spill.ops == (kernel, "while")
    # With the pinned libtpu (0.0.42.1) the fixture's numbers hold exactly.
    assert (kernel, vst, vld) == ("closed_call.4", 691, 800)
