"""Screens pushed over the main views: op detail, device memory, help, export and loading."""

from __future__ import annotations

from pathlib import Path

from rich.console import Group
from rich.table import Table
from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.screen import ModalScreen, Screen
from textual.widgets import Footer, Header, Input, Label, ProgressBar, Static

from tpudiag.analysis.drilldown import OpDetail
from tpudiag.model.memory import MemoryReport
from tpudiag.model.text import printable
from tpudiag.model.units import fmt_bandwidth, fmt_flops, fmt_pct, fmt_time
from tpudiag.render.memory import memory_renderables
from tpudiag.tui import export, keys
from tpudiag.tui.session import STAGES


class OpDetailScreen(Screen):
    """One op: its HLO instruction, source, measured stats, LLO stats and the findings citing it."""

    def __init__(self, detail: OpDetail) -> None:
        super().__init__()
        self.detail = detail

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="detail"):
            yield Static(self._body(), id="detail-body")
        yield Footer()

    def _body(self) -> Table:
        d, op = self.detail, self.detail.op
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold", no_wrap=True)
        grid.add_column()
        grid.add_row("Op", Text(printable(f"{op.name}  ({op.category})"), style="bold cyan"))
        # Text, not a str: a str cell is parsed as rich markup, and a host named `[/x]` would not parse.
        grid.add_row("Host · program", Text(printable(f"{op.host} · {op.program} ({op.program_id})")))
        grid.add_row("HLO", Text(printable(d.hlo_text, keep_newlines=True) if d.hlo_text else "n/a (the trace does not carry the instruction text)"))
        grid.add_row("Shape", Text(printable(op.shape_with_layout or "n/a")))
        grid.add_row("Source", Text(printable(op.source or "n/a")))
        grid.add_row("Name stack", Text(printable(d.tf_op or "n/a")))
        grid.add_row("", "")
        grid.add_row("Self time", f"{fmt_time(op.self_time_ps)}  ({fmt_pct(op.time_share)} of core time)  ·  "
                                  f"total {fmt_time(op.total_time_ps)}  ·  {op.occurrences} occurrences")
        grid.add_row("FLOPs", f"{op.flops:.4g}  ·  {fmt_flops(op.flop_rate)}  ·  "
                              f"{fmt_pct(op.flop_utilization)} of peak")
        grid.add_row("HBM", f"{op.hbm_bytes:.4g} B  ·  {fmt_bandwidth(op.hbm_bw)}  ·  "
                            f"{fmt_pct(op.hbm_utilization)} of peak")
        grid.add_row("Spaces", Text(printable(export.spaces_line(op))))
        if op.family:
            grid.add_row("ICI", Text(printable(export.ici_line(op))))
        # Per memory level, as the roofline judges it (HBM counting what copies brought), not XLA's bytes.
        levels = [f"{x:.4g} FLOP/B at {level}" for level, x in (("HBM", op.hbm_intensity), ("VMEM", op.vmem_intensity))
                  if x is not None]
        intensity = ", ".join(levels) or "n/a"
        grid.add_row("Intensity", Text(f"{intensity}  ·  bound by {printable(op.bound_by)}"))
        grid.add_row("Padding", Text(printable(fmt_pct(d.padding) + export.bytes_note(op))))
        grid.add_row("LLO", Text(printable(export.llo_line(d))))
        if d.kernel is not None:
            grid.add_row("Pallas kernel", Text(printable("\n".join(d.kernel.lines()), keep_newlines=True)))
        if d.per_core:
            grid.add_row("", "")
            grid.add_row("Per core", Text(printable("  ".join(f"{c.device.removeprefix('/device:')}: {c.occurrences}× "
                                               f"{fmt_time(c.self_time_ps)}" for c in d.per_core))))
        grid.add_row("", "")
        if d.findings:
            for f in d.findings:
                grid.add_row(f"Finding {f.code}", Text(printable(f"[{f.severity.label()}] {f.rule}: {f.message}")))
        else:
            grid.add_row("Findings", "none cite this op")
        grid.add_row("", Text("esc back", style="dim"))
        return grid

    def markdown(self) -> str:
        return export.op_detail_md(self.detail)


class MemoryScreen(Screen):
    """Device memory of the compiled programs: the same tables as `tpudiag memory`."""

    def __init__(self, report: MemoryReport) -> None:
        super().__init__()
        self.report = report

    def compose(self) -> ComposeResult:
        yield Header()
        with VerticalScroll(id="memory"):
            items = memory_renderables(self.report) if self.report.programs else [Text(
                "No compiled program with a buffer assignment: open the capture with --dumps DIR of an XLA dump "
                "(XLA_FLAGS=--xla_dump_to=DIR) or a `tpudiag compile` output to see device memory")]
            yield Static(Group(*items, Text("esc back", style="dim")), id="memory-body")
        yield Footer()

    def markdown(self) -> str:
        return export.memory_md(self.report)


class HelpScreen(ModalScreen):
    """Every binding, from the one table in `tpudiag.tui.keys`."""

    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    #help { width: 76; height: auto; max-height: 90%; border: round $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [("escape,question_mark", "app.pop_screen", "Close")]

    def compose(self) -> ComposeResult:
        table = Table(box=None, show_header=True, padding=(0, 2))
        table.add_column("key", style="bold", no_wrap=True)
        table.add_column("does")
        table.add_column("where", style="dim")
        for k in keys.ALL:
            table.add_row(k.shown, k.description, k.scope)
        with VerticalScroll(id="help"):
            yield Label(Text("tpudiag keys", style="bold"))
            yield Static(table)
            yield Label(Text("Mouse: click tabs, rows and column headers (sort). esc closes.", style="dim"))


class ExportScreen(ModalScreen[str | None]):
    """Ask where to write the markdown; an empty answer means the current directory."""

    DEFAULT_CSS = """
    ExportScreen { align: center middle; }
    #export { width: 80; height: auto; border: round $accent; background: $surface; padding: 0 1; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, view: str, cwd: Path, cursor_blink: bool = True) -> None:
        super().__init__()
        self.view, self.cwd, self.cursor_blink = view, cwd, cursor_blink

    def compose(self) -> ComposeResult:
        with Vertical(id="export"):
            yield Label(Text(f"Export the {self.view} view as markdown", style="bold"))
            yield Label(Text(f"file (empty: tpudiag-{self.view}.md in {printable(self.cwd)})"))
            inp = Input(placeholder=f"tpudiag-{self.view}.md", id="export-path")
            inp.cursor_blink = self.cursor_blink
            yield inp
            yield Label(Text("enter write · esc cancel · never written into the trace directory", style="dim"))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class LoadingPanel(Vertical):
    """Shown while the capture loads in a worker: the stage and a progress bar."""

    DEFAULT_CSS = """
    LoadingPanel { align: center middle; }
    LoadingPanel > * { width: 70; }
    """

    def __init__(self, path: Path, **kw) -> None:
        super().__init__(**kw)
        self.path = path

    def compose(self) -> ComposeResult:
        yield Label(Text(f"Loading {printable(self.path)}", style="bold"))
        yield Label("starting", id="loading-stage")
        yield ProgressBar(total=len(STAGES), show_eta=False, id="loading-bar")

    def stage(self, index: int, text: str) -> None:
        self.query_one("#loading-stage", Label).update(Text(printable(f"{index + 1}/{len(STAGES)} {text}")))
        self.query_one("#loading-bar", ProgressBar).update(progress=index)

    def failed(self, message: str, hint: str | None) -> None:
        self.query_one("#loading-stage", Label).update(
            Text(f"error: {printable(message)}" + (f"\nhint: {printable(hint)}" if hint else "") + "\npress q to quit", style="bold red"))
