"""One way out for every command (`tpudiag.cli.outputs.emit`): `-o FILE`, `-o -`, formats a
command has not and the stderr note behave the same for `report`, `diff`, `check` and `memory`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpudiag.cli.app import main
from tpudiag.cli.outputs import emit
from tpudiag.errors import UsageError


def run_cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def commands(capture: Path) -> dict[str, list]:
    return {"report": ["report", capture], "diff": ["diff", capture, capture],
            "check": ["check", capture, "--fail-on", "high"], "memory": ["memory"]}


@pytest.mark.parametrize("command", ["report", "diff", "check", "memory"])
def test_every_command_writes_json_to_o_file_and_names_it_on_stderr(capsys, small_capture, tmp_path, command):
    target = tmp_path / "sub" / f"{command}.json"
    code, out, err = run_cli(capsys, *commands(small_capture)[command], "-f", "json", "-o", target)
    assert out == "" and f"wrote `{target}`" in err
    doc = json.loads(target.read_text())
    assert code == (doc["exit_code"] if command == "check" else 0), err  # check: 1 when the gate fails


@pytest.mark.parametrize("command", ["report", "diff", "check", "memory"])
def test_o_dash_is_stdout_for_every_command(capsys, small_capture, tmp_path, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    code, out, err = run_cli(capsys, *commands(small_capture)[command], "-f", "json", "-o", "-")
    doc = json.loads(out)
    assert code == (doc["exit_code"] if command == "check" else 0), err
    assert "wrote" not in err and not (tmp_path / "-").exists()


@pytest.mark.parametrize("command", ["check", "memory"])
def test_a_format_a_command_has_not_is_a_usage_error(capsys, small_capture, command):
    code, out, err = run_cli(capsys, *commands(small_capture)[command], "-f", "md")
    assert code == 2 and out == "" and "'md' is not one of" in err and "'terminal', 'json'" in " ".join(err.split())


def test_emit_refuses_a_format_its_result_has_no_writer_for(small_capture):
    from tpudiag.gate import judge
    from tpudiag.model.findings import Severity
    from tpudiag.pipeline import diagnose

    verdict = judge(diagnose(small_capture, jobs=1), None, Severity.HIGH)
    with pytest.raises(UsageError, match="no md output") as info:
        emit(verdict, "md", None)
    assert info.value.hint == "use `terminal` or `json`"
