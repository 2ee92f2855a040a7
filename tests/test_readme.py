"""Every `tpudiag ...` command line in the README's code blocks runs as written, from the checkout,
with the project's venv first on PATH (as a user who activated it has): it exits 0, or 1 where the
command is a gate that found something, and prints no traceback."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.S | re.M)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip().startswith("tpudiag ")]


def test_the_readme_shows_the_loop():
    verbs = {shlex.split(c, comments=True)[1] for c in readme_commands()}
    assert {"report", "run", "whatif", "diff", "check"} <= verbs


@pytest.mark.parametrize("command", readme_commands(), ids=lambda c: " ".join(shlex.split(c, comments=True)[1:3]))
def test_a_readme_command_runs_as_written(command, tmp_path):
    args = shlex.split(command, comments=True)
    if args[1] in ("whatif", "compile"):
        pytest.importorskip("jax", reason="whatif and compile need the tpu extra (jax with libtpu)")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
           "NO_COLOR": "1", "COLUMNS": "120"}
    proc = subprocess.run([sys.executable, "-m", "tpudiag", *args[1:]], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    allowed = {0, 1} if args[1] == "check" else {0}
    assert proc.returncode in allowed, f"{command}\nstdout: {proc.stdout[-2000:]}\nstderr: {proc.stderr[-2000:]}"
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert proc.stdout.strip() or proc.stderr.strip()
