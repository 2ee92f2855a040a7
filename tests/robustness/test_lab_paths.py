"""`lab extract` with an op name that attacks paths and generated code (issue 13).

Before: the default directory was `lab-<op>` unsanitised (`../../x` landed outside the working
directory) and the name was spliced into repro.py's docstring (a `\"\"\"` in it broke the file;
`lab check` and `lab tune` execute it).
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.cli_util import run_tpudiag
from tests.conftest import REPO, US, small_design
from tests.robustness.hostile import assert_inert
from tpudiag.cli.lab_cmd import default_lab_dir
from tpudiag.writers.tpu_design import OpDef, Placed, write_capture

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

# Traversal, a docstring terminator with code after it, and a terminal title change.
EVIL = '../../evil"""; import os; os.system("touch PWNED"); """\x1b]0;t\x07\r\n# x'


@pytest.mark.parametrize("op", ["../../x", "/etc/passwd", "..", "a/../../b", EVIL])
def test_default_directory_stays_inside_the_base(op, tmp_path):
    out = default_lab_dir(op, tmp_path)
    assert out.parent == tmp_path and out.name.startswith("lab-") and out.resolve().parent == tmp_path.resolve()


def test_default_directory_keeps_an_ordinary_name(tmp_path):
    assert default_lab_dir("fusion.2", tmp_path) == tmp_path / "lab-fusion.2"


@pytest.fixture(scope="module")
def evil_capture(tmp_path_factory) -> Path:
    # One layout-changing copy (a 2-D transpose the lab reproduces) whose name is the attack.
    ops = (OpDef(EVIL, "copy", bytes_accessed=8e6, shape="f32[1024,2048]{0,1}",
                 hlo_text="%x = f32[1024,2048]{0,1} copy(f32[1024,2048]{1,0} %p)"),)
    run = tmp_path_factory.mktemp("evil") / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(ops=ops, n_chips=1, schedule=lambda chip, step: [Placed(EVIL, 0, 100 * US)]), run)
    return run


def test_extract_writes_inside_the_working_directory_and_repro_holds_the_name_as_a_literal(evil_capture,
                                                                                          tmp_path):
    work = tmp_path / "work" / "deep"
    work.mkdir(parents=True)
    env = {"NO_COLOR": "1", "JAX_PLATFORMS": "cpu"}
    # `lab extract` and `lab check` in this process (what they write and print is the point, not the
    # entry point); repro.py runs as the plain script a user runs.
    proc = run_tpudiag("lab", "extract", evil_capture, "--op", EVIL, "--scale-down", "8", env=env, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    made = [p for p in work.iterdir()]
    assert len(made) == 1 and made[0].name.startswith("lab-")  # nothing outside `work`
    assert not (tmp_path / "evil").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    source = (made[0] / "repro.py").read_text(encoding="utf-8")
    tree = ast.parse(source)  # still valid Python
    assert EVIL not in (ast.get_docstring(tree) or "")
    literals = [n.value.value for n in tree.body if isinstance(n, ast.Assign) and n.targets[0].id == "OP_NAME"]
    assert literals == [EVIL]
    assert_inert(source)
    # Running it executes nothing from the name, and prints the name escaped.
    ran = subprocess.run([sys.executable, "repro.py", "--interpret"], capture_output=True, text=True,
                         env={**os.environ, "PYTHONPATH": str(REPO), **env}, cwd=made[0], timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert not (made[0] / "PWNED").exists() and not (work / "PWNED").exists()
    assert_inert(ran.stdout)
    # `lab check` runs it and prints the op name it reports: escaped too, in both formats.
    for fmt in ("terminal", "json"):
        checked = run_tpudiag("lab", "check", made[0], "-f", fmt, env=env, cwd=work)
        assert checked.returncode == 0 and "Traceback" not in checked.stderr, checked.stderr
        assert_inert(checked.stdout + checked.stderr)
        assert not (made[0] / "PWNED").exists() and not (work / "PWNED").exists()


def test_extract_of_an_op_whose_trace_numbers_fit_no_blocks_is_one_line(tmp_path):
    """A matmul-like fusion whose FLOPs imply K = 476,837 (1e12 FLOPs on a 1024x1024 output): no
    block sizes fit VMEM. Was a BlockSizeError traceback; now exit 2 naming the capture, nothing written."""
    ops = (OpDef("fusion.1", "convolution fusion", flops=1.0e12, bytes_accessed=1.0e9,
                 shape="bf16[1024,1024]{1,0}"),)
    run = tmp_path / "logdir" / "plugins" / "profile" / "run"
    write_capture(small_design(ops=ops, n_chips=1, schedule=lambda chip, step: [Placed("fusion.1", 0, 3000 * US)]),
                  run)
    work = tmp_path / "work"
    work.mkdir()
    proc = run_tpudiag("lab", "extract", run, "--op", "fusion.1", env={"NO_COLOR": "1"}, cwd=work)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    first = proc.stderr.splitlines()[0]
    assert first.startswith(f"error: `{run}`") and "no block sizes of the matmul family fit `fusion.1`" in first
    assert list(work.iterdir()) == []
