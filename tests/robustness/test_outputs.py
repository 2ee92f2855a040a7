"""`-o` safety (issue 13): never into an input, `-` is stdout, a missing directory is made, a failed
write leaves nothing partial, and every refusal is one line with exit 2."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpudiag.cli.app import main
from tpudiag.errors import UsageError
from tpudiag.writers.files import atomic_open, check_new_logdir, resolve_output, write_text


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2, err
    lines = err.strip().splitlines()
    assert lines[0].startswith("error: ") and len(lines) <= 2 and "Traceback" not in err, err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def files_under(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def run_dir(small_capture) -> Path:
    return next((small_capture / "plugins" / "profile").iterdir())


# --- refusing the input ------------------------------------------------------------------------


def test_report_refuses_to_overwrite_the_trace_file(capsys, run_dir):
    trace = next(run_dir.glob("*.xplane.pb"))
    before = trace.read_bytes()
    code, out, err = run_cli(capsys, "report", trace, "-f", "json", "-o", trace)
    assert_one_line_error(code, err, "refusing to overwrite the input")
    assert trace.read_bytes() == before and out == ""


@pytest.mark.parametrize("fmt", ["terminal", "json", "md"])
def test_report_refuses_an_output_inside_the_logdir_or_run(capsys, small_capture, run_dir, fmt):
    before = files_under(small_capture)
    for target in (run_dir / "report.out", small_capture / "report.out", run_dir / "new" / "r.out"):
        code, _, err = run_cli(capsys, "report", small_capture, "-f", fmt, "-o", target)
        assert_one_line_error(code, err, "refusing to write the output inside the input directory")
    assert files_under(small_capture) == before  # no report, no PNGs, no directory


def test_a_symlink_into_the_run_is_resolved_and_refused(capsys, small_capture, run_dir, tmp_path):
    link = tmp_path / "elsewhere"
    link.symlink_to(run_dir, target_is_directory=True)
    code, _, err = run_cli(capsys, "report", small_capture, "-o", link / "r.md", "-f", "md")
    assert_one_line_error(code, err, "inside the input directory")
    out_link = tmp_path / "out.json"
    out_link.symlink_to(next(run_dir.glob("*.xplane.pb")))
    code, _, err = run_cli(capsys, "report", run_dir, "-f", "json", "-o", out_link)
    assert_one_line_error(code, err, "refusing to write the output inside the input directory")
    code, _, err = run_cli(capsys, "report", next(run_dir.glob("*.xplane.pb")), "-f", "json", "-o", out_link)
    assert_one_line_error(code, err, "refusing to overwrite the input")


def test_diff_refuses_an_output_inside_either_input(capsys, small_capture, run_dir, tmp_path):
    code, _, err = run_cli(capsys, "diff", tmp_path / "nothing-needed", run_dir, "-o", run_dir / "d.md")
    assert_one_line_error(code, err, "inside the input directory")


def test_lab_extract_refuses_a_directory_inside_the_trace(capsys, run_dir):
    code, _, err = run_cli(capsys, "lab", "extract", run_dir, "--op", "fusion.1", "-o", run_dir / "lab")
    assert_one_line_error(code, err, "refusing to write the reproduction inside the input directory")
    assert not (run_dir / "lab").exists()


# --- stdout, missing directories, failures ----------------------------------------------------


@pytest.mark.parametrize("fmt, start", [("json", "{"), ("md", "# Performance report")])
def test_dash_means_stdout(capsys, small_capture, fmt, start, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, out, _ = run_cli(capsys, "report", small_capture, "-f", fmt, "-o", "-")
    assert code == 0 and out.startswith(start)
    assert not (tmp_path / "-").exists()


def test_diff_into_a_missing_directory_creates_it(capsys, small_capture, tmp_path):
    target = tmp_path / "new" / "deeper" / "diff.md"
    code, _, err = run_cli(capsys, "diff", small_capture, small_capture, "-f", "md", "-o", target)
    assert code == 0, err
    assert target.read_text().startswith("# Diff")


def test_report_markdown_into_a_missing_directory_puts_figures_beside_it(capsys, small_capture, tmp_path):
    pytest.importorskip("matplotlib")
    target = tmp_path / "reports" / "r.md"
    code, _, err = run_cli(capsys, "report", small_capture, "-f", "md", "-o", target)
    assert code == 0, err
    assert target.exists() and list(target.parent.glob("r-*.png"))
    assert not [p for p in target.parent.iterdir() if p.name.endswith(".tmp")]


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
@pytest.mark.parametrize("fmt", ["terminal", "json", "md"])
def test_dev_full_is_a_one_line_error(capsys, small_capture, fmt):
    before = sorted(os.listdir("/dev"))
    code, _, err = run_cli(capsys, "report", small_capture, "-f", fmt, "-o", "/dev/full")
    assert_one_line_error(code, err, "`/dev/full`", "No space left on device")
    assert sorted(os.listdir("/dev")) == before  # no figures or temp files beside a device
    assert os.path.exists("/dev/full") and not Path("/dev/full").is_file()  # never renamed over


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full (Linux)")
def test_diff_to_dev_full_is_a_one_line_error(capsys, small_capture):
    code, _, err = run_cli(capsys, "diff", small_capture, small_capture, "-o", "/dev/full")
    assert_one_line_error(code, err, "No space left on device")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(tmp_path):
    target = tmp_path / "report.md"
    target.write_text("old report\n")
    with pytest.raises(RuntimeError):
        with atomic_open(target) as fh:
            fh.write("half a new rep")
            raise RuntimeError("the renderer failed half way")
    assert target.read_text() == "old report\n"
    assert [p.name for p in tmp_path.iterdir()] == ["report.md"]


def test_an_atomic_write_replaces_a_symlink_instead_of_following_it(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    link = tmp_path / "out.txt"
    link.symlink_to(victim)
    write_text(link, "report\n")
    assert victim.read_text() == "keep me\n" and not link.is_symlink() and link.read_text() == "report\n"


def test_a_new_file_gets_ordinary_permissions(tmp_path):
    write_text(tmp_path / "r.txt", "x")
    umask = os.umask(0)
    os.umask(umask)
    assert (tmp_path / "r.txt").stat().st_mode & 0o777 == 0o666 & ~umask


def test_resolve_output(tmp_path):
    assert resolve_output(None, []) is None and resolve_output(Path("-"), []) is None
    with pytest.raises(UsageError, match="is a directory"):
        resolve_output(tmp_path, [])


# --- simulate -o -----------------------------------------------------------------------------


def test_simulate_refuses_a_logdir_with_real_runs_and_a_file(capsys, small_capture, tmp_path):
    dumps = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps" / "transformer_train_v5e"
    code, _, err = run_cli(capsys, "simulate", dumps, "-o", small_capture)
    assert_one_line_error(code, err, "already holds runs", "shadow")
    a_file = tmp_path / "f"
    a_file.write_text("x")
    code, _, err = run_cli(capsys, "simulate", dumps, "-o", a_file)
    assert_one_line_error(code, err, "not a directory")
    assert a_file.read_text() == "x"


def test_simulate_may_rewrite_its_own_modelled_run(tmp_path):
    (tmp_path / "plugins" / "profile" / "modelled").mkdir(parents=True)
    check_new_logdir(tmp_path, "modelled")  # no error
    check_new_logdir(tmp_path / "missing", "modelled")
