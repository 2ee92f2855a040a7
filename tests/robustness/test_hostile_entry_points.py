"""The public entry points refuse what they cannot use with one `UsageError` naming it (issue 33):
`whatif`'s timeout, and every argument of `diagnose`, `compare`, `profile` and `gate`."""

from __future__ import annotations

import os
import subprocess
import sys

from tests.conftest import REPO
from tpudiag.compiler.driver import MAX_WAIT_S, wait_limit_s


def test_a_timeout_past_the_platforms_timers_waits_without_limit(tmp_path):
    # Regression (issue 33): `whatif --timeout-s 1e308` was an OverflowError in subprocess's wait.
    assert wait_limit_s(1e308) == MAX_WAIT_S and wait_limit_s(float("inf")) == MAX_WAIT_S and wait_limit_s(5) == 5
    subprocess.run([sys.executable, "-c", "pass"], capture_output=True, text=True, timeout=wait_limit_s(1e308),
                   check=True)
    # A target without `example_args` fails inside the compile worker, after its wait has started.
    (tmp_path / "m.py").write_text("def f():\n    return 1\n")
    proc = subprocess.run([sys.executable, "-m", "tpudiag", "whatif", "m:f", "--topology", "v5e:1x1",
                           "--timeout-s", "1e308", "--xla-flag", "xla_foo=1", "-o", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env={**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"})
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "example_args" in proc.stderr
