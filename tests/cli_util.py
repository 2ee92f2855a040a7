"""`tpudiag ARGS` run in the test's own process, answered as `subprocess.run` answers.

A subprocess costs about a second of CPU importing tpudiag and its libraries before it does
anything; over the suite's many CLI calls that was minutes of the README's test command. In-process,
the call goes through the same `tpudiag.cli.app.main` that `python -m tpudiag` runs (its one-line
errors and exit codes included), with stdin, stdout and stderr swapped for buffers that are not a
terminal (so output is 140 columns, as when piped) and the environment and working directory set
(overrides of this process's) for the call only. Tests of what only a real process shows (startup imports, signals, terminals,
bytes on stdin under another locale, `python -m tpudiag` itself) keep their subprocess.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from click.testing import CliRunner

def run_tpudiag(*args: str | Path, stdin: str | None = None, env: Mapping[str, str] | None = None,
                cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    """`tpudiag *args` in this process: returncode, stdout and stderr as text, as `subprocess.run` gives."""
    from tpudiag.cli.app import main

    argv = [str(a) for a in args]
    code = 0
    before = Path.cwd()
    with CliRunner().isolation(input=stdin, env=dict(env or {})) as (out, err, _mixed):
        try:
            if cwd is not None:
                os.chdir(cwd)
            main(argv)
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        finally:
            os.chdir(before)
            sys.stdout.flush()  # the isolated streams are buffered text wrappers over `out` and `err`
            sys.stderr.flush()
        stdout, stderr = out.getvalue().decode("utf-8"), err.getvalue().decode("utf-8")
    return subprocess.CompletedProcess(["tpudiag", *argv], code, stdout, stderr)
