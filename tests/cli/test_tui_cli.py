"""`tpudiag tui`: registered, lazy about Textual, and clean when Textual or the input is missing."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import REPO
from tpudiag.cli.app import main
from tpudiag.examples_data import bundled_capture

EXAMPLE_CAPTURE = bundled_capture()


def test_report_does_not_import_textual():
    # `tpudiag report` must start without loading the optional TUI stack.
    code = ("import sys\n"
            "from tpudiag.cli.app import main\n"
            "try:\n    main(['report', '--format', 'json'])\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
            "loaded = sorted(m for m in sys.modules if m == 'textual' or m.startswith(('textual.', 'tpudiag.tui')))\n"
            "sys.stderr.write(repr(loaded))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"


def test_tui_is_listed_in_help(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    assert "tui" in capsys.readouterr().out


def test_missing_textual_is_a_one_line_error_with_the_install_hint(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "textual", None)  # `import textual` now raises ImportError
    with pytest.raises(SystemExit) as exc:
        main(["tui"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["error: the terminal UI needs the `textual` package, which is not installed",
                   "hint: install it with `pip install 'tpudiag[tui]'`"]


def test_a_wrong_path_fails_before_the_screen_is_taken(tmp_path, monkeypatch, capsys):
    pytest.importorskip("textual")
    from tpudiag.tui.app import TpudiagApp

    monkeypatch.setattr(TpudiagApp, "run", lambda self: pytest.fail("the app must not start"))
    with pytest.raises(SystemExit) as exc:
        main(["tui", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: `{tmp_path / 'nope'}`: no such file or directory")


def test_default_path_is_the_bundled_example(monkeypatch):
    pytest.importorskip("textual")
    from tpudiag.tui.app import TpudiagApp

    started = []
    monkeypatch.setattr(TpudiagApp, "run", lambda self: started.append(self.path))
    monkeypatch.setattr("tpudiag.cli.tui_cmd._is_terminal", lambda: True)
    with pytest.raises(SystemExit) as exc:
        main(["tui"])
    assert exc.value.code == 0
    assert started == [EXAMPLE_CAPTURE]


def test_dumps_must_be_a_directory(tmp_path, monkeypatch, capsys):
    pytest.importorskip("textual")
    from tpudiag.tui.app import TpudiagApp

    monkeypatch.setattr(TpudiagApp, "run", lambda self: pytest.fail("the app must not start"))
    with pytest.raises(SystemExit) as exc:
        main(["tui", str(EXAMPLE_CAPTURE), "--dumps", str(tmp_path / "nope")])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines() == [f"error: `{tmp_path / 'nope'}`: --dumps: not a directory"]


def test_domain_and_plain_tui_modules_do_not_import_textual():
    # Only the modules that draw import Textual; the queries behind the views stay plain Python.
    modules = ["tpudiag.analysis.timeline", "tpudiag.analysis.drilldown", "tpudiag.analysis.stragglers",
               "tpudiag.tui.session", "tpudiag.tui.export", "tpudiag.tui.keys", "tpudiag.cli.tui_cmd"]
    code = ("import importlib, sys\n"
            f"for m in {modules!r}:\n    importlib.import_module(m)\n"
            "sys.stderr.write(repr(sorted(m for m in sys.modules if m.split('.')[0] == 'textual')))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "[]"


def test_without_a_terminal_it_is_a_one_line_error(monkeypatch, capsys):
    """Piped or redirected, the app would wait for keys that never come: refuse before starting it."""
    pytest.importorskip("textual")
    from tpudiag.tui.app import TpudiagApp

    monkeypatch.setattr(TpudiagApp, "run", lambda self: pytest.fail("the app must not start"))
    monkeypatch.setattr("tpudiag.cli.tui_cmd._is_terminal", lambda: False)
    with pytest.raises(SystemExit) as exc:
        main(["tui"])
    assert exc.value.code == 2
    assert capsys.readouterr().err.splitlines()[0] == (
        "error: the terminal UI needs a terminal (stdin or stdout is not one)")
