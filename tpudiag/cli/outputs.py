"""Where `tpudiag report` output goes: stdout, or a file given with `-o`, and the markdown figures.

Markdown figures (PNG) are written beside the `-o` file as `<stem>-<figure>.png` and linked by
relative path, so the report and its pictures move together. When markdown goes to stdout, the
figures go to a fresh temporary directory (`tpudiag-figures-*` under the system temp dir), linked
by absolute path and named on stderr and in the report's Methods section. Nothing is ever written
into an input's directory: `-o` there is refused (`tpudiag.writers.files`), and `-o -` is stdout.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import UsageError
from tpudiag.model.report import Mode, Report
from tpudiag.model.text import one_line
from tpudiag.render.console import SafeConsole
from tpudiag.writers.files import atomic_open, is_special, write_output, write_text

if TYPE_CHECKING:
    from tpudiag.pipeline import Diagnosis

TERMINAL_FILE_WIDTH = 140


def emit(result: Diagnosis, output_format: str, output: Path | None, top: int = 15) -> None:
    """A diagnosis as `output_format` (terminal, json, md) to `output`, or stdout when None: the
    report of a capture or of a modelled timeline; the static report of compiler dumps alone, except
    in markdown, which needs the modelled timeline."""
    if result.mode == Mode.STATIC and not (output_format == "md" and result.analysis is not None):
        _write_static(result, output_format, output, top)
    else:
        write_report(result.report, output_format, output, top=top)


def markdown_with_figures(report: Report, output: Path | None, top: int) -> tuple[str, Path, int]:
    """The markdown text, the directory holding its figures and how many there are."""
    from tpudiag.render.figures import write_figures
    from tpudiag.render.markdown import render_markdown

    if output is not None and not is_special(output):  # `/dev/stdout` has no "beside it"
        fig_dir, stem = output.parent, output.stem
        figures = write_figures(report, fig_dir, stem)
        links = {k: (f.path.name, f.alt) for k, f in figures.items()}
        note = "PNG files beside this report, drawn with matplotlib" if figures else "none (no data to draw)"
    else:
        fig_dir = Path(tempfile.mkdtemp(prefix="tpudiag-figures-"))
        figures = write_figures(report, fig_dir, "report")
        links = {k: (f.path.as_posix(), f.alt) for k, f in figures.items()}
        note = f"PNG files in the temporary directory `{fig_dir.as_posix()}`"
        if not figures:
            fig_dir.rmdir()
            note = "none (no data to draw)"
    return render_markdown(report, links, figures_note=note, top=top), fig_dir, len(figures)


def write_report(report: Report, output_format: str, output: Path | None, top: int = 15) -> None:
    """Render `report` as `output_format` (terminal, json, md) to `output`, or stdout when None."""
    if output is not None and output.is_dir():
        raise UsageError("the output is a directory", path=output, hint="give a file name, e.g. `-o report.md`")
    if output_format == "md":
        body, fig_dir, n_figures = markdown_with_figures(report, output, top)
        if output is None:
            sys.stdout.write(body)
            sys.stderr.write(f"figures written to `{one_line(fig_dir.as_posix())}`\n" if n_figures
                             else "no figures: nothing to draw\n")
        else:
            write_text(output, body)
            sys.stderr.write(f"wrote `{one_line(output)}`" + (f" and {n_figures} figures beside it\n" if n_figures else "\n"))
        return
    if output_format == "json":
        from tpudiag.render.json_format import render_json

        body = render_json(report) + "\n"
        write_output(output, body)
        return
    from tpudiag.render.terminal import render_terminal

    if output is None:
        from tpudiag.cli.console import stdout_console

        render_terminal(report, stdout_console(), top=top)
        return
    with atomic_open(output) as fh:
        render_terminal(report, SafeConsole(file=fh, width=TERMINAL_FILE_WIDTH, no_color=True, soft_wrap=False),
                        top=top)


def _write_static(result: Diagnosis, output_format: str, output: Path | None, top: int) -> None:
    """Print (or write to `output`) the static report of compiler dumps with the rules' findings."""
    from tpudiag.cli.console import stderr_console, stdout_console
    from tpudiag.render.static_report import render_static_diagnosis_json, render_static_diagnosis_terminal

    if output_format not in ("terminal", "json"):
        raise UsageError("no markdown report: no timeline could be modelled from these dumps", path=Path(
            result.input_path), hint="--format terminal says why (an LLO dump without its HLO, or an unknown "
                                     "generation: pass --chip); it and --format json work")
    if output is not None:
        with atomic_open(output) as f:
            if output_format == "json":
                f.write(render_static_diagnosis_json(result.report, result.static) + "\n")
            else:
                render_static_diagnosis_terminal(result.report, result.static,
                                                 SafeConsole(file=f, width=TERMINAL_FILE_WIDTH, color_system=None), top=top)
        stderr_console().print(f"wrote `{output}`", markup=False, highlight=False)
    elif output_format == "json":
        sys.stdout.write(render_static_diagnosis_json(result.report, result.static) + "\n")
    else:
        render_static_diagnosis_terminal(result.report, result.static, stdout_console(), top=top)
