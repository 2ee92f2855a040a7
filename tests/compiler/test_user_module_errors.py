"""A user's MODULE:FUNCTION that cannot be compiled gives one clean error line and exit status 2.

These go through the real CLI and the worker subprocess, but every failure here happens before
jax is imported, so they need no libtpu.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tpudiag.cli.app import main

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as info:
        main(list(args))
    out, err = capsys.readouterr()
    return info.value.code, out, err


def write(tmp_path: Path, name: str, source: str) -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(source))
    return path


def assert_clean(err: str) -> list[str]:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert lines and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    assert not lines[0].endswith(".")
    return lines


def test_missing_function_names_the_functions_that_exist(tmp_path, capsys):
    path = write(tmp_path, "model.py", """
        def step(x):
            return x
        def example_args(mesh):
            return ()
    """)
    code, _, err = run_cli(capsys, "compile", f"{path}:train", "--topology", "v5e:2x2", "-o", str(tmp_path / "out"))
    lines = assert_clean(err)
    assert code == 2
    assert "has no function `train`" in lines[0]
    assert lines[1].startswith("hint: ") and "example_args" in lines[1] and "step" in lines[1]


def test_missing_example_args(tmp_path, capsys):
    path = write(tmp_path, "model.py", """
        def step(x):
            return x
    """)
    code, _, err = run_cli(capsys, "compile", f"{path}:step", "-t", "v5e:2x2", "-o", str(tmp_path / "out"))
    lines = assert_clean(err)
    assert code == 2
    assert "defines no `example_args(mesh)`" in lines[0]


def test_syntax_error_gives_the_line(tmp_path, capsys):
    path = write(tmp_path, "broken.py", """
        def step(x):
            return x +
    """)
    code, _, err = run_cli(capsys, "compile", f"{path}:step", "-t", "v5e:2x2", "-o", str(tmp_path / "out"))
    lines = assert_clean(err)
    assert code == 2
    assert "syntax error in" in lines[0] and "line 3" in lines[0]


def test_import_time_exception_is_quoted_with_its_line(tmp_path, capsys):
    path = write(tmp_path, "raises.py", """
        import os
        VALUE = int("not a number")
    """)
    code, _, err = run_cli(capsys, "compile", f"{path}:step", "-t", "v5e:2x2", "-o", str(tmp_path / "out"))
    lines = assert_clean(err)
    assert code == 2
    assert "raises.py:3" in lines[0] and "ValueError" in lines[0]


def test_missing_file_and_missing_module(tmp_path, capsys):
    code, _, err = run_cli(capsys, "compile", f"{tmp_path}/nope.py:step", "-t", "v5e:2x2", "-o", str(tmp_path / "o"))
    assert code == 2 and "no such file" in assert_clean(err)[0]
    code, _, err = run_cli(capsys, "compile", "no_such_pkg_xyz.model:step", "-t", "v5e:2x2", "-o", str(tmp_path / "o"))
    assert code == 2 and "no module named `no_such_pkg_xyz.model`" in assert_clean(err)[0]


def test_target_without_function_and_bad_topology_fail_before_any_process(tmp_path, capsys):
    code, _, err = run_cli(capsys, "compile", "model.py", "-t", "v5e:2x2")
    assert code == 2 and "is not MODULE:FUNCTION" in assert_clean(err)[0]
    code, _, err = run_cli(capsys, "compile", "model.py:step", "-t", "v5e-8")
    line = assert_clean(err)[0]
    assert code == 2 and "bad topology name 'v5e-8'" in line and "[=\\_:]" not in line and "[=_:]" in line


def test_simulate_on_a_directory_that_is_not_a_compile_output(tmp_path, capsys):
    code, _, err = run_cli(capsys, "simulate", str(tmp_path), "-o", str(tmp_path / "logdir"))
    lines = assert_clean(err)
    assert code == 2 and "not a `tpudiag compile` output directory" in lines[0]
