"""What the CLI imports, pinned: `tpudiag --version` loads no numeric stack, and `tpudiag report` on
a capture loads pandas, numpy and protobuf but never jax, matplotlib, textual, dask or fsspec,
which only the commands that use them load (issue 34 §2), nor tpudiag's own modules of other
commands (`diff`'s analysis, `whatif`, the compiler, the kernels lab, the TUI). A module outside the
pinned set fails here: add it only on purpose, with the command that needs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The CLI's own stack (typer, rich and what they load), then the report's (pandas, numpy, protobuf).
CLI_STACK = {"typer", "click", "rich", "shellingham", "annotated_doc", "markdown_it", "mdurl", "pygments"}
TYPER_ADAPTERS = {"pydantic", "pydantic_core", "annotated_types", "typing_inspection", "typing_extensions"}
REPORT_STACK = {"numpy", "pandas", "dateutil", "pytz", "tzdata", "six", "google", "cython_runtime"}
NEVER_AT_REPORT = {"jax", "jaxlib", "libtpu", "matplotlib", "textual", "dask", "distributed", "fsspec", "gcsfs",
                   "scipy", "torch", "xprof", "tensorboard_plugin_profile"}

_PROBE = """
import json, sys
from tpudiag.cli.app import main
sys.argv = ["tpudiag", *json.loads(sys.argv[1])]
try:
    main()
except SystemExit:
    pass
loaded = {m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names)
loaded |= {m for m in sys.modules if m.startswith("tpudiag.")}
sys.stderr.write("\\nIMPORTED " + json.dumps(sorted(m for m in loaded if not m.startswith("_"))))
"""
# tpudiag's own modules that only other commands use: `report` loads none of them.
NOT_FOR_REPORT = {"tpudiag.analysis.diff", "tpudiag.whatif", "tpudiag.compiler", "tpudiag.kernels_lab", "tpudiag.tui",
                  "tpudiag.profiling"}


def imported_by(*args: str) -> set[str]:
    proc = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(list(args))], capture_output=True, text=True,
                          cwd=REPO, timeout=300)
    line = proc.stderr.rstrip().rsplit("\n", 1)[-1]
    assert line.startswith("IMPORTED "), proc.stderr[-2000:]
    return set(json.loads(line.removeprefix("IMPORTED "))) - {"tpudiag"}


def third_party(loaded: set[str]) -> set[str]:
    return {m for m in loaded if not m.startswith("tpudiag.")}


def test_version_loads_the_cli_stack_alone():
    extra = third_party(imported_by("--version")) - CLI_STACK - TYPER_ADAPTERS
    assert not extra, f"`tpudiag --version` now imports {sorted(extra)}"


@pytest.mark.parametrize("fmt", ["terminal", "json"])
def test_report_loads_no_heavy_stack_it_does_not_use(fmt, tmp_path):
    everything = imported_by("report", "examples/captures/train_v6e_4chip", "--format", fmt, "-o", str(tmp_path / "out"))
    ours = {m for m in everything if any(m == n or m.startswith(n + ".") for n in NOT_FOR_REPORT)}
    assert not ours, f"`tpudiag report` imported {sorted(ours)}, which only other commands use"
    loaded = third_party(everything)
    assert not loaded & NEVER_AT_REPORT, f"`tpudiag report` imported {sorted(loaded & NEVER_AT_REPORT)}"
    extra = loaded - CLI_STACK - TYPER_ADAPTERS - REPORT_STACK
    assert not extra, f"`tpudiag report` now imports {sorted(extra)}"
    assert {"pandas", "numpy", "google"} <= loaded  # the probe saw the report's own work
