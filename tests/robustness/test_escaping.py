"""Trace text with terminal escapes, bidi overrides, rich markup and markdown through every output.

Regression tests for issue 13 ("terminal escape injection"; the TUI's `[/x]` MarkupError; the TUI
export writing raw HTML). The captures are written with the project's writers; the CLI runs as a
user runs it, with NO_COLOR set, since the injection happened with colour off as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.robustness.hostile import HOST, MARKUP, OP, OP2, assert_inert, write_hostile
from tpudiag.model.text import has_unsafe, one_line, path_component, printable


def cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True, env=env,
                          timeout=300, cwd=cwd, errors="surrogateescape")


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    return write_hostile(tmp_path_factory.mktemp("hostile"))


# --- the helper --------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, shown", [("\x1b[2J", "\\x1b[2J"), ("a\x07b", "a\\x07b"), ("\x9b", "\\x9b"),
                                        ("\u202e", "\\u202e"), ("\x7f", "\\x7f"), ("\udc80", "\\udc80"),
                                        ("plain fusion.1 µs ≤", "plain fusion.1 µs ≤")])
def test_printable_shows_controls_as_escapes(raw, shown):
    assert printable(raw) == shown


def test_printable_is_idempotent_and_keeps_newlines_only_when_asked():
    once = printable(OP + "\n" + OP2)
    assert printable(once) == once and not has_unsafe(once) and "\\x0a" in once
    assert printable("a\nb", keep_newlines=True) == "a\nb"
    assert one_line("a\n\tb\x1b") == "a b\\x1b"


@pytest.mark.parametrize("name", ["../../x", "/etc/passwd", "..", ".", "", "a/b\x1b]0;t\x07", "fusion.2"])
def test_path_component_never_leaves_its_directory(name):
    part = path_component(name)
    assert part and "/" not in part and part not in (".", "..") and not part.startswith(".")
    assert not has_unsafe(part)


def test_path_component_keeps_ordinary_op_names():
    assert path_component("fusion.2") == "fusion.2" and path_component("all-reduce_3") == "all-reduce_3"


# --- the CLI -----------------------------------------------------------------------------------


def test_terminal_report_shows_hostile_names_escaped(hostile_run):
    proc = cli("report", str(hostile_run))
    assert proc.returncode == 0, proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    assert "fusion.1\\x1b]0;pwned\\x07" in proc.stdout  # shown, not dropped
    # Findings name the op's source line and JAX op name (issue 20): escaped like the op's name.
    assert "`model.py:3 \\x1b]0;pwned\\x07`, `jit(step)/<img" in proc.stdout


def test_terminal_report_to_a_file_is_inert(hostile_run, tmp_path):
    out = tmp_path / "r.txt"
    assert cli("report", str(hostile_run), "-o", str(out)).returncode == 0
    assert_inert(out.read_text(encoding="utf-8", errors="surrogateescape"))


def test_markdown_on_stdout_is_inert_and_has_no_html_or_links(hostile_run):
    from tests.render.test_markdown import gfm_html

    proc = cli("report", str(hostile_run), "-f", "md")
    assert proc.returncode == 0, proc.stderr
    assert_inert(proc.stdout + proc.stderr)
    html = gfm_html(proc.stdout)
    assert '<img src="x"' not in html and 'href="http://evil' not in html and 'src="http://evil' not in html


def test_json_keeps_the_names_exactly(hostile_run):
    proc = cli("report", str(hostile_run), "-f", "json")
    assert proc.returncode == 0, proc.stderr
    assert "\x1b" not in proc.stdout  # JSON escapes by itself
    doc = json.loads(proc.stdout)
    assert {op["name"] for op in doc["ops"]} >= {OP, OP2} and doc["summary"]["hosts"] == [HOST]


def test_error_lines_quote_file_names_escaped(tmp_path):
    missing = tmp_path / "run\x1b]0;pwned\x07" / "h\u202e.xplane.pb"
    proc = cli("report", str(missing))
    assert proc.returncode == 2
    assert_inert(proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert lines[0].startswith("error: ") and "run\\x1b]0;pwned\\x07" in lines[0]
    assert "Traceback" not in proc.stderr


def test_diff_in_every_format_is_inert(hostile_run):
    from tests.render.test_markdown import gfm_html

    for fmt in ("terminal", "md", "json"):
        proc = cli("diff", str(hostile_run), str(hostile_run), "-f", fmt)
        assert proc.returncode == 0, proc.stderr
        assert_inert(proc.stdout + proc.stderr)
        if fmt == "md":
            assert "<img" not in gfm_html(proc.stdout) and "http://evil\"" not in gfm_html(proc.stdout)


def test_check_output_is_inert(hostile_run):
    proc = cli("check", str(hostile_run), "--fail-on", "info")
    assert proc.returncode in (0, 1), proc.stderr
    assert_inert(proc.stdout + proc.stderr)


def test_lab_ops_is_inert(hostile_run):
    proc = cli("lab", "ops", str(hostile_run))
    assert proc.returncode == 0, proc.stderr
    assert_inert(proc.stdout + proc.stderr)


# --- the renderers in process: a console without the CLI's net ---------------------------------


def test_safe_console_escapes_text_that_reached_it_raw():
    import io

    from rich.text import Text

    from tpudiag.render.console import SafeConsole, markup

    buf = io.StringIO()
    console = SafeConsole(file=buf, width=200, color_system="truecolor", force_terminal=True, highlight=False)
    console.print(Text(OP, style="bold red"))
    console.print(markup(OP))  # markup-parsed strings: `[/x]` does not raise MarkupError
    out = buf.getvalue()
    assert "\x1b[" in out  # rich's own styles still go out
    assert "\x1b]0;" not in out and "\x07" not in out and "\x1b[2J" not in out
    assert out.count("\\x1b]0;pwned") == 2 and out.count(MARKUP) == 2  # rich itself drops the BEL


def test_the_static_report_shows_hostile_dump_names_escaped():
    """The static report (`tpudiag compile`, `report DUMPDIR`) prints names from the dumps through rich
    markup: a module or op named `[/x]` must not raise MarkupError, and escapes must not reach the terminal."""
    import dataclasses
    import io

    from tpudiag.parsers.compile_output import load_compile_output
    from tpudiag.compiler.static_report import build_static_report
    from tpudiag.render.console import SafeConsole
    from tpudiag.render.static_report import render_static_terminal

    report = build_static_report(load_compile_output(REPO / "tests" / "compiler" / "fixtures" / "v5e_mlp_compile"))
    ops = report.ops.copy()
    ops.loc[ops.index[0], "name"] = OP
    report = dataclasses.replace(report, module=f"jit{MARKUP}\x1b]0;t\x07", ops=ops,
                                 warnings=(f"odd op {OP}",))
    buf = io.StringIO()
    render_static_terminal(report, SafeConsole(file=buf, width=200, color_system=None))
    out = buf.getvalue()
    assert_inert(out)
    assert f"jit{MARKUP}\\x1b]0;t" in out and MARKUP in out
