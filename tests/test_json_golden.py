"""The JSON report of every input the project bundles or designs, against a golden file.

Issue 22 restructures how inputs are read and decided; this pins what the user sees while that
happens: `tpudiag report --format json` on every bundled example (as a capture, a capture with its
dumps, and the dumps alone), every test scenario, the LLO and XLA dump fixtures, and
`tpudiag memory --format json` on every compiled example. A refactor leaves every file unchanged;
a deliberate fix rewrites them with `UPDATE_SNAPSHOTS=1` and the git diff shows what it changed.

Through the CLI in-process, so the whole path (arguments, pipeline, emit) is what is pinned.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.snapshot_util import assert_snapshot, normalise
from tests.variants import REPO, SHARED, captures
from tpudiag.cli.app import app

MODELS = REPO / "examples" / "models"
FIXTURES = REPO / "tests" / "fixtures"

CAPTURES = {c.name: c for c in captures()}
MODEL_NAMES = sorted(p.name for p in (MODELS / "dumps").iterdir() if p.is_dir())
# Dumps alone (static mode): the compiled examples, as a compile output and as each dump kind
# alone, and the dump fixtures (several generations; `chip` where the files do not name it).
STATIC = {
    **{f"static:{m}": ([str(MODELS / "dumps" / m)]) for m in MODEL_NAMES},
    **{f"static-xla:{m}": ([str(MODELS / "dumps" / m / "xla")]) for m in MODEL_NAMES},
    **{f"static-llo:{m}": ([str(MODELS / "dumps" / m / "llo")]) for m in MODEL_NAMES},
    **{f"static:dumps/{d.name}": [str(d)] for d in sorted((FIXTURES / "dumps").iterdir()) if d.is_dir()},
    **{f"static:llo/{d.name}": [str(d)] for d in sorted((FIXTURES / "llo").iterdir())
       if d.is_dir() and d.name != "vmem_oom"},  # error texts, not a dump
    "static:llo/v5e_mlp+chip": [str(FIXTURES / "llo" / "v5e_mlp"), "--chip", "v5e"],
    "static:llo/v5e_mlp+contradicting-chip": [str(FIXTURES / "llo" / "v5e_mlp"), "--chip", "v6e"],
    "static:dumps/v5e_mlp_train+vmem-error": [str(FIXTURES / "dumps" / "v5e_mlp_train"), "--error",
                                              str(FIXTURES / "llo" / "vmem_oom" / "scoped_v5e.txt")],
}


def _file_name(case: str) -> str:
    return "json/" + case.replace(":", "__").replace("/", "_").replace("+", "_") + ".json"


def _run(args: list[str], replacements: dict[str, str]) -> str:
    result = CliRunner().invoke(app, args, catch_exceptions=False)
    assert result.exit_code in (0, 1), f"{args}: exit {result.exit_code}\n{result.output}"
    # Stable key order and indent, so the golden diff shows the change and nothing else.
    text = json.dumps(json.loads(result.stdout), indent=1, sort_keys=True) + "\n"
    return normalise(text, replacements)


def _places(*dirs: Path) -> dict[str, str]:
    # Only the inputs' own paths: the compiled examples' source paths are data (where they were
    # compiled) and must not be rewritten when the checkout happens to sit at the same place.
    return {str(d): f"<{i}>" for i, d in enumerate(dirs)}


@pytest.mark.parametrize("case", sorted(CAPTURES))
def test_capture_report_json_is_unchanged(case, tmp_path):
    capture = CAPTURES[case]
    run = capture.write(tmp_path)
    if not run.exists():
        pytest.skip(f"{run} is absent ({SHARED} holds the real captures; it sits beside a checkout)")
    text = _run(["report", "--format", "json", "-o", "-", "--jobs", "1", str(run)], _places(run, tmp_path))
    assert_snapshot(text, _file_name(f"capture:{case}"))


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_capture_with_dumps_report_json_is_unchanged(model):
    run = next((MODELS / "captures" / model).glob("plugins/profile/*"))
    dumps = MODELS / "dumps" / model
    text = _run(["report", "--format", "json", "-o", "-", "--jobs", "1", "--dumps", str(dumps), str(run)],
                _places(run, dumps))
    assert_snapshot(text, _file_name(f"capture+dumps:{model}"))


@pytest.mark.parametrize("case", sorted(STATIC))
def test_static_report_json_is_unchanged(case):
    path, *options = STATIC[case]
    text = _run(["report", "--format", "json", "-o", "-", *options, path], _places(Path(path)))
    assert_snapshot(text, _file_name(case))


@pytest.mark.parametrize("model", MODEL_NAMES)
def test_memory_json_is_unchanged(model):
    dumps = MODELS / "dumps" / model
    text = _run(["memory", "--format", "json", "-o", "-", str(dumps)], _places(dumps))
    assert_snapshot(text, _file_name(f"memory:{model}"))
