"""The markdown report: golden file on the bundled example, escaping of hostile names, PNG figures."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from tests.analysis.diff_designs import design, write
from tests.cli_util import run_tpudiag
from tests.conftest import REPO, US
from tests.snapshot_util import assert_snapshot, normalise
from tests.rules.scenarios import run_rules
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.model.findings import Evidence, Finding, Saving, Severity
from tpudiag.model.report import RuleSkip
from tpudiag.parsers.capture import load_capture
from tpudiag.render.markdown import code, prose, render_markdown, table, text
from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

EXAMPLE = REPO / "examples" / "captures" / "train_v6e_4chip"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
HOSTILE = "x|y](http://evil)<script>alert(1)</script>"


def report_for(path: Path, rules: bool = True):
    analysis = analyze(load_capture(path))
    findings, skipped = run_rules(analysis) if rules else ([], [])
    return build_report(analysis, tuple(findings), rules_skipped=tuple(skipped))


def gfm_html(markdown: str) -> str:
    """Rendered as GitHub would: CommonMark + tables + autolinked URLs."""
    md = MarkdownIt("commonmark", {"linkify": True, "html": True}).enable(["table", "linkify"])
    return md.render(markdown)


def assert_png(path: Path) -> None:
    data = path.read_bytes()
    assert len(data) > 1000 and data.startswith(PNG_MAGIC), path


# ---------------------------------------------------------------------------------------------
# Snapshot


# Findings fixed here, not taken from the live rules, so the snapshot checks the renderer alone:
# rule wording evolves on its own schedule (the rules have their own snapshots).
FIXED_FINDINGS = (
    Finding(rule="low-mxu-utilization", code="TPD102", severity=Severity.MEDIUM,
            message="`fusion.8` (convolution fusion) runs at 49.4% of peak FLOP/s for 28.6% of device time",
            saving=Saving(2_280 * US, "modelled", "self time per step x (1 - 49.4% / 70.0% attainable)"),
            fix="pad the vocabulary to a multiple of 256 (50257 -> 50432)",
            evidence=(Evidence("fusion.8", (("FLOP util", "49.4%"), ("result", "bf16[8192,50257]"))),),
            host="host0", ops=("fusion.8",)),
    Finding(rule="exposed-collective", code="TPD101", severity=Severity.MEDIUM,
            message="synchronous collectives leave 1.03 ms per step exposed: `all-reduce.3` 620.0 µs",
            saving=Saving(1_030 * US, "measured", "largest exposed collective time on any core per step"),
            fix="make them asynchronous: set `--xla_tpu_enable_async_collective_fusion=true` in LIBTPU_INIT_ARGS",
            evidence=(Evidence("all-reduce.3", (("exposed/step", "620.0 µs"),)),
                      Evidence("step 10", (("exposed (worst core)", "1.03 ms"),))),
            host="host0", ops=("all-reduce.3",)),
    Finding(rule="padding-waste", code="TPD103", severity=Severity.LOW,
            message="`fusion.9` pads 50257 to 50304 in its tiled layout",
            saving=Saving(30 * US, "modelled", "padded bytes over bandwidth"), fix="pad to 50304 yourself",
            host="host0", ops=("fusion.9",)),
    Finding(rule="padding-waste", code="TPD103", severity=Severity.INFO, message="a fourth, smaller finding",
            saving=Saving(1 * US, "modelled", "tiny"), fix="nothing urgent", host="host0"),
)


def test_markdown_report_of_the_bundled_example_matches_its_snapshot():
    analysis = analyze(load_capture(EXAMPLE))
    report = build_report(analysis, FIXED_FINDINGS,
                          rules_skipped=(RuleSkip("spill", "needs LLO dumps (`--dumps DIR`)"),))
    figures = {k: (f"report-{k}.png", f"{k} figure") for k in ("step-breakdown", "roofline", "categories")}
    body = render_markdown(report, figures, figures_note="PNG files beside this report")
    assert_snapshot(normalise(body, {str(REPO): "<repo>"}), "report_train_v6e_4chip.md")


def test_plain_language_summary_comes_first_and_names_the_top_problems():
    body = render_markdown(report_for(EXAMPLE))
    sections = re.findall(r"^## (.+)$", body, flags=re.M)
    assert sections[0] == "Summary" and sections[-1] == "Methods"
    summary = body.split("## Where the step time goes")[0]
    assert "Each step takes **26.00 ms**" in summary
    assert summary.count("Could save up to") == 3
    assert "upper bounds" in summary and "do not add the savings up" in summary


def test_methods_say_what_was_measured_and_which_peaks_were_used():
    methods = render_markdown(report_for(EXAMPLE)).split("## Methods")[1]
    assert "**Measured:**" in methods and "**Estimated:**" in methods
    assert "Hardware peaks per core (trace): 918 TFLOP/s, HBM 1.64 TB/s; roofline ridge at 560 FLOP/byte" in methods
    assert "tpudiag 0." in methods


def test_without_findings_the_report_says_so():
    body = render_markdown(report_for(EXAMPLE, rules=False))
    assert "The rules found no problem worth reporting" in body and "No findings." in body


# ---------------------------------------------------------------------------------------------
# Escaping


@pytest.mark.parametrize("value", [HOSTILE, "a`b``c", "`lead", "*bold* _it_ # h ![i](x)", "www.evil.com/x",
                                   "a\\|b", "a\\\\|b|c", "x\nline two"])
def test_code_and_text_stay_inert(value):
    for rendered in (code(value), text(value)):
        html = gfm_html("\n".join(table(["a", "b"], [[rendered, "z"]])))
        assert "<script" not in html and "<a " not in html and "<img" not in html and "<em>" not in html
        assert len(re.findall(r"<td[ >]", html)) == 2  # the hostile cell did not split the row


def test_prose_renders_backticked_names_as_code():
    assert prose("op `fusion.1` is slow") == "op `fusion.1` is slow"
    assert "<script" not in gfm_html(prose(f"op `{HOSTILE}` and {HOSTILE}"))


@pytest.fixture
def hostile_capture(tmp_path: Path) -> Path:
    # One op whose name, category and source line try to break tables and inject a link and HTML.
    ops = (OpDef(HOSTILE, "convolution fusion|<b>x</b>", flops=1e12, bytes_accessed=1e9,
                 shape="f32[8]{0}", source="evil.py:1 [x](http://evil) <img src=x>"),
           OpDef("fusion.2", "loop fusion", bytes_accessed=1e9))
    d = CaptureDesign(hostname="host<0>", device_type="TPU v6 Lite", peak_tflops=918.0, peak_hbm_gbs=1640.0,
                      module="jit_step", program_id=7, ops=ops, n_chips=1, n_steps=3, step_ps=5000 * US,
                      schedule=lambda chip, step: [Placed(HOSTILE, 0, 3000 * US), Placed("fusion.2", 3000 * US,
                                                                                            1000 * US)])
    write_capture(d, tmp_path / "run|<x>")
    return tmp_path / "run|<x>"


def test_a_crafted_op_name_breaks_no_table_and_injects_no_link_or_html(hostile_capture):
    body = render_markdown(report_for(hostile_capture))
    html = gfm_html(body)
    assert "<script" not in html and "<img" not in html and "<b>" not in html
    assert 'href="http://evil' not in html
    assert HOSTILE.replace("|", "\\|") in body  # shown, as code
    # Every table row has as many cells as its header.
    for table in re.findall(r"<table>.*?</table>", html, flags=re.S):
        header = len(re.findall(r"<th[ >]", table.split("</thead>")[0]))
        for row in re.findall(r"<tr>(.*?)</tr>", table.split("</thead>")[1], flags=re.S):
            assert len(re.findall(r"<td[ >]", row)) == header


# ---------------------------------------------------------------------------------------------
# Figures and the CLI


def test_figures_are_valid_pngs(tmp_path):
    pytest.importorskip("matplotlib")
    from tpudiag.render.figures import write_figures

    figures = write_figures(report_for(EXAMPLE, rules=False), tmp_path, "r")
    assert set(figures) == {"step-breakdown", "roofline", "categories"}  # one host: no per-host figure
    for f in figures.values():
        assert f.path.parent == tmp_path and f.path.name == f"r-{f.key}.png"
        assert_png(f.path)


def test_multi_host_capture_gets_a_per_host_step_figure(tmp_path):
    pytest.importorskip("matplotlib")
    from tpudiag.render.figures import write_figures

    run_dir = write(tmp_path, "logdir", design(seed=1, hostname="host0"))
    write(tmp_path, "logdir", design(seed=2, hostname="host1"))
    report = report_for(run_dir, rules=False)
    assert len(report.hosts) == 2 and all(len(h.step_times_ps) == 10 for h in report.hosts)
    figures = write_figures(report, tmp_path / "out", "r")
    assert "host-steps" in figures
    assert_png(figures["host-steps"].path)
    body = render_markdown(report, {k: (f.path.name, f.alt) for k, f in figures.items()})
    assert "## Hosts" in body and "(r-host-steps.png)" in body


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return run_tpudiag(*args, env={"NO_COLOR": "1"})


def test_report_md_to_a_file_writes_pngs_beside_it_and_nothing_in_the_capture(tmp_path):
    pytest.importorskip("matplotlib")
    before = sorted(p.name for p in EXAMPLE.rglob("*"))
    out = tmp_path / "notes" / "report.md"
    out.parent.mkdir()
    proc = run_cli("report", str(EXAMPLE), "--format", "md", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    body = out.read_text()
    links = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", body)
    assert sorted(links) == ["report-categories.png", "report-roofline.png", "report-step-breakdown.png"]
    for link in links:
        assert_png(out.parent / link)
    assert sorted(p.name for p in EXAMPLE.rglob("*")) == before


def test_report_md_to_stdout_puts_figures_in_a_temp_dir_named_on_stderr(tmp_path):
    pytest.importorskip("matplotlib")
    proc = run_cli("report", str(EXAMPLE), "--format", "md")
    assert proc.returncode == 0, proc.stderr
    fig_dir = Path(re.search(r"figures written to `([^`]+)`", proc.stderr).group(1))
    try:
        assert f"`{fig_dir.as_posix()}`" in proc.stdout  # the Methods section names it too
        assert_png(fig_dir / "report-roofline.png")
    finally:
        for p in fig_dir.glob("*.png"):
            p.unlink()
        fig_dir.rmdir()


def test_output_file_works_for_json_too(tmp_path):
    out = tmp_path / "r.json"
    proc = run_cli("report", str(EXAMPLE), "--format", "json", "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and out.read_text().lstrip().startswith("{")
    assert not list(tmp_path.glob("*.png"))


def test_output_file_works_for_the_terminal_format_without_colour(tmp_path):
    out = tmp_path / "r.txt"
    proc = run_cli("report", str(EXAMPLE), "-o", str(out))
    assert proc.returncode == 0, proc.stderr
    body = out.read_text()
    assert "Top ops by self time" in body and "\x1b[" not in body


def test_output_into_a_missing_directory_creates_it(tmp_path):
    # Issue 13: `-o` creates a missing parent directory (it used to be an error).
    proc = run_cli("report", str(EXAMPLE), "--format", "md", "-o", str(tmp_path / "nope" / "r.md"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "nope" / "r.md").read_text().startswith("# Performance report")


def test_a_host_only_capture_gets_a_plain_explanation_and_no_figures(tmp_path):
    from tests.conftest import host_only_capture

    proc = run_cli("report", str(host_only_capture(tmp_path)), "-f", "md", "-o", str(tmp_path / "r.md"))
    assert proc.returncode == 0, proc.stderr
    assert "This is a host-only capture" in (tmp_path / "r.md").read_text()
    assert not list(tmp_path.glob("*.png"))



@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab|`\\[]()<>!*_#:/.w &;\n")) | st.characters(), max_size=40))
@example("\U00018cd6.AL")  # an unassigned code point ends a domain label for linkify, though not `\w`
@example("\u200b.AL")
def test_any_string_stays_in_its_cell_without_markup(value):
    for rendered in (code(value), text(value), prose(value)):
        html = gfm_html("\n".join(table(["a", "b"], [[rendered, "z"]])))
        assert len(re.findall(r"<td[ >]", html)) == 2
        # The only tags in the cell are the ones the escaping itself introduces (code spans).
        tags = set(re.findall(r"<(/?[a-z]+)", html))
        assert tags <= {"table", "/table", "thead", "/thead", "tbody", "/tbody", "tr", "/tr", "th", "/th", "td",
                        "/td", "code", "/code"}, (value, rendered, html)


def test_figures_draw_hostile_names_literally(tmp_path):
    # `$...$` would start matplotlib mathtext; the label must be drawn as typed, without an error.
    pytest.importorskip("matplotlib")
    from tpudiag.render.figures import write_figures

    name = "fusion.$x^{2}$_\\frac"
    ops = (OpDef(name, "convolution fusion $a$", flops=1e12, bytes_accessed=1e9),)
    d = CaptureDesign(hostname="h$0$", device_type="TPU v6 Lite", peak_tflops=918.0, peak_hbm_gbs=1640.0,
                      module="m", program_id=1, ops=ops, n_chips=1, n_steps=2, step_ps=4000 * US,
                      schedule=lambda chip, step: [Placed(name, 0, 3000 * US)])
    write_capture(d, tmp_path / "run")
    figures = write_figures(report_for(tmp_path / "run", rules=False), tmp_path / "out", "r")
    assert {"roofline", "categories"} <= set(figures)
    for f in figures.values():
        assert_png(f.path)
