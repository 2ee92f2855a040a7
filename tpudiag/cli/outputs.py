"""Every command's one way out: `emit(result, fmt, output)`.

`report`, `diff`, `check`, `memory`, `compile`, `whatif` and `rules` hand their result here, so
`-o FILE`, `-o -` (stdout), a format a result has no writer for, and the messages on stderr behave
the same for all of them. The file itself is written by `tpudiag.writers.files` (never an input or inside
one, atomic, a special file written in place); a file written is named on stderr (`wrote ...`).

Markdown figures (PNG) are written beside the `-o` file as `<stem>-<figure>.png` and linked by
relative path, so the report and its pictures move together. When markdown goes to stdout, the
figures go to a fresh temporary directory (`tpudiag-figures-*` under the system temp dir), linked
by absolute path and named on stderr and in the report's Methods section.
"""

from __future__ import annotations

import itertools
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from tpudiag.cli.options import Format
from tpudiag.errors import UsageError
from tpudiag.model.report import Mode, Report
from tpudiag.model.text import one_line
from tpudiag.render.console import SafeConsole
from tpudiag.writers.files import atomic_open, is_special, write_output

if TYPE_CHECKING:
    from tpudiag.cli.memory_runtime import MeasuredMemory
    from tpudiag.model.memory import MemoryReport

TERMINAL_FILE_WIDTH = 140


@dataclass(frozen=True)
class MemoryView:
    """What `tpudiag memory` shows: the compiled programs' memory and what was measured."""

    compiled: MemoryReport | None  # None: `--pprof` alone, no compiled program asked for
    measured: MeasuredMemory


@dataclass(frozen=True)
class RuleCatalog:
    """What `tpudiag rules` lists: the registry's rules, in its order."""

    rules: tuple  # `tpudiag.rules.registry.RULES`


@dataclass(frozen=True)
class Markdown:
    body: str
    note: str = ""  # a line for stderr after the file (figures)


@dataclass(frozen=True)
class Writer:
    """How one kind of result is written in each format it has; None: not in that format."""

    terminal: Callable[[Any, Console, int], None] | None = None
    # The document without its final newline: a text, or a text in pieces (a pod's report, written
    # as it is made: `render.json_format.json_pieces`)
    json: Callable[[Any], str | Iterator[str]] | None = None
    markdown: Callable[[Any, Path | None, int], Markdown] | None = None

    def formats(self) -> tuple[Format, ...]:
        return tuple(f for f in Format if getattr(self, "markdown" if f is Format.md else f.value) is not None)


def emit(result: object, fmt: Format | str, output: Path | None, top: int = 15) -> None:
    """`result` as `fmt` to `output` (already checked by `writers.files.resolve_output`), or stdout when None."""
    fmt = Format(fmt)
    writer = _writer(result)
    if fmt not in writer.formats():
        offered = " or ".join(f"`{f.value}`" for f in writer.formats())
        raise UsageError(f"no {fmt.value} output for this command", hint=f"use {offered}")
    if output is not None and output.is_dir():
        raise UsageError("the output is a directory", path=output, hint="give a file name, e.g. `-o report.md`")
    note = ""
    if fmt is Format.md:
        doc = writer.markdown(result, output, top)
        write_output(output, doc.body)
        note = doc.note
    elif fmt is Format.json:
        body = writer.json(result)
        write_output(output, body + "\n" if isinstance(body, str) else itertools.chain(body, ("\n",)))
    elif output is None:
        from tpudiag.cli.console import stdout_console

        writer.terminal(result, stdout_console(), top)
    else:
        with atomic_open(output) as fh:
            writer.terminal(result, SafeConsole(file=fh, width=TERMINAL_FILE_WIDTH, no_color=True, soft_wrap=False),
                            top)
    if output is not None:
        sys.stderr.write(f"wrote `{one_line(output)}`" + (f" {note}" if note else "") + "\n")
    elif note:
        sys.stderr.write(note + "\n")


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


# --- the writers, one per kind of result -------------------------------------------------------


def _report_terminal(report: Report, console: Console, top: int) -> None:
    from tpudiag.render.terminal import render_terminal

    render_terminal(report, console, top=top)


def _report_json(report: Report) -> Iterator[str]:
    from tpudiag.render.json_format import json_pieces

    return json_pieces(report)


def _report_markdown(report: Report, output: Path | None, top: int) -> Markdown:
    body, fig_dir, n_figures = markdown_with_figures(report, output, top)
    if output is not None:
        return Markdown(body, f"and {n_figures} figures beside it" if n_figures else "")
    return Markdown(body, f"figures written to `{one_line(fig_dir.as_posix())}`" if n_figures
                    else "no figures: nothing to draw")


def _diagnosis_terminal(result, console: Console, top: int) -> None:
    """A diagnosis: the report of a capture or of a modelled timeline; the static report of
    compiler dumps (its per-op estimates, then the findings)."""
    if result.mode is not Mode.STATIC:
        return _report_terminal(result.report, console, top)
    from tpudiag.render.static_report import render_static_diagnosis_terminal

    render_static_diagnosis_terminal(result.report, result.static, console, top=top)


def _diagnosis_json(result) -> str | Iterator[str]:
    if result.mode is not Mode.STATIC:
        return _report_json(result.report)
    from tpudiag.render.static_report import render_static_diagnosis_json

    return render_static_diagnosis_json(result.report, result.static)


def _diagnosis_markdown(result, output: Path | None, top: int) -> Markdown:
    if result.analysis is None:  # static mode without a modelled timeline: nothing to draw or list
        raise UsageError("no markdown report: no timeline could be modelled from these dumps",
                         path=Path(result.input_path),
                         hint="--format terminal says why (an LLO dump without its HLO, or an unknown generation: "
                              "pass --chip); it and --format json work")
    return _report_markdown(result.report, output, top)


DIAGNOSIS = Writer(_diagnosis_terminal, _diagnosis_json, _diagnosis_markdown)


def _diff_terminal(diff, console: Console, top: int) -> None:
    from tpudiag.render.diff_terminal import render_diff_terminal

    render_diff_terminal(diff, console, top=top)


def _diff_json(diff) -> str:
    from tpudiag.render.diff_json import render_diff_json

    return render_diff_json(diff)


def _diff_markdown(diff, output: Path | None, top: int) -> Markdown:
    from tpudiag.render.diff_markdown import render_diff_markdown

    return Markdown(render_diff_markdown(diff, top=top))


DIFF = Writer(_diff_terminal, _diff_json, _diff_markdown)


def _verdict_terminal(verdict, console: Console, top: int) -> None:
    from tpudiag.render.verdict import render_verdict_terminal

    render_verdict_terminal(verdict, console)


def _verdict_json(verdict) -> str:
    from tpudiag.render.verdict import render_verdict_json

    return render_verdict_json(verdict)


VERDICT = Writer(_verdict_terminal, _verdict_json)


def _memory_terminal(view: MemoryView, console: Console, top: int) -> None:
    from tpudiag.cli.memory_runtime import render_measured_terminal
    from tpudiag.render.memory import render_memory_terminal

    if view.compiled is not None:
        render_memory_terminal(view.compiled, console, top=top)
    render_measured_terminal(view.measured, console, top)


def _memory_json(view: MemoryView) -> str:
    import json

    from tpudiag.cli.memory_runtime import measured_json
    from tpudiag.render.memory import memory_json

    body = (memory_json(view.compiled) if view.compiled is not None
            else {"input": None, "programs": [], "errors": [], "warnings": []})
    return json.dumps({**body, **measured_json(view.measured)}, indent=1)


MEMORY = Writer(_memory_terminal, _memory_json)


def _whatif_terminal(result, console: Console, top: int) -> None:
    from tpudiag.render.whatif import render_whatif_terminal

    render_whatif_terminal(result, console)


def _whatif_json(result) -> str:
    import json

    from tpudiag.render.whatif import whatif_json

    return json.dumps(whatif_json(result), indent=1)


WHATIF = Writer(_whatif_terminal, _whatif_json)


def _catalog_terminal(catalog: RuleCatalog, console: Console, top: int) -> None:
    from tpudiag.render.rules_catalog import render_rules_terminal

    render_rules_terminal(catalog.rules, console)


def _catalog_json(catalog: RuleCatalog) -> str:
    from tpudiag.render.rules_catalog import render_rules_json

    return render_rules_json(catalog.rules)


CATALOG = Writer(_catalog_terminal, _catalog_json)


def _writer(result: object) -> Writer:
    """The writer of `result`'s kind. Imports are lazy: `tpudiag --help` loads none of the pipeline,
    and `tpudiag report` none of `diff`, `check` and `whatif` (a diagnosis is asked about first)."""
    from tpudiag.pipeline import Diagnosis

    if isinstance(result, Diagnosis):
        return DIAGNOSIS
    from tpudiag.analysis.diff import Diff as AnalysisDiff
    from tpudiag.gate import Verdict
    from tpudiag.whatif import WhatIf

    for kind, writer in ((Diagnosis, DIAGNOSIS), (AnalysisDiff, DIFF), (Verdict, VERDICT),
                         (MemoryView, MEMORY), (WhatIf, WHATIF), (RuleCatalog, CATALOG)):
        if isinstance(result, kind):
            return writer
    raise TypeError(f"no writer for {type(result).__name__}")  # a programming error, not the user's
