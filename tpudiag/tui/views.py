"""The five main views. Each renders objects from the session and computes nothing itself."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.widget import Widget
from textual.widgets import DataTable, Input, ListItem, ListView, Label, Select, Static

from tpudiag.analysis.drilldown import (SORT_COLUMNS, OpFilter, facets, filter_ops, find_op, sort_column,
                                        sort_ops)
from tpudiag.analysis.stragglers import host_step_matrix
from tpudiag.analysis.timeline import (COLLECTIVE, COMPUTE, IDLE, IO, OpPlace, StepTimeline, find_on_timeline,
                                       name_labels, rasterize, rasterize_in_flight, span_cells, step_timeline)
from tpudiag.errors import TpudiagError
from tpudiag.model.findings import Finding, saving_amount
from tpudiag.model.report import OpRow, Report
from tpudiag.model.text import one_line, printable
from tpudiag.model.units import fmt_bandwidth, fmt_bytes, fmt_flops, fmt_pct, fmt_time
from tpudiag.render.console import markup as escape
from tpudiag.tui import export, keys
from tpudiag.tui.session import Session, rule_explanation

GLYPH = {COMPUTE: ("█", "green"), COLLECTIVE: ("▓", "bold red"), IO: ("▒", "yellow"), IDLE: ("·", "bright_black"),
         "": (" ", "")}
IN_FLIGHT = ("─", "magenta")
MAX_OP_ROWS = 2000  # rows the ops table shows; filter to narrow a bigger capture


def _bindings(table: tuple[keys.Key, ...]) -> list[Binding]:
    return [Binding(k.keys, k.action, k.footer, key_display=k.shown) for k in table]


def _legend() -> Text:
    t = Text()
    for kind, label in ((COMPUTE, "compute"), (COLLECTIVE, "exposed collective"), (IO, "infeed/outfeed"),
                        (IDLE, "idle")):
        glyph, style = GLYPH[kind]
        t.append(glyph * 2, style=style)
        t.append(f" {label}   ")
    t.append(IN_FLIGHT[0] * 2, style=IN_FLIGHT[1])
    t.append(" async collective in flight")
    return t


# -- overview ---------------------------------------------------------------------------------------

def breakdown_bar(report: Report, width: int) -> Text:
    """The mean step as one stacked bar, `width` cells: each kind gets cells by its share."""
    b = report.summary.breakdown
    t = Text()
    if b is None or not b.step_ps:
        return t
    # Host transfers draw as I/O, as the timeline draws them; the line above the bar names them apart.
    parts = ((COMPUTE, b.compute_ps), (COLLECTIVE, b.collective_ps), (IO, b.io_ps + b.host_transfer_ps),
             (IDLE, b.idle_ps))
    used = 0
    for i, (kind, ps) in enumerate(parts):
        cells = width - used if i == len(parts) - 1 else round(ps / b.step_ps * width)
        cells = max(0, min(cells, width - used))
        glyph, style = GLYPH[kind]
        t.append(glyph * cells, style=style)
        used += cells
    return t


class OverviewView(VerticalScroll):
    can_focus = True

    def __init__(self, session: Session, **kw) -> None:
        super().__init__(**kw)
        self.session = session

    def compose(self) -> ComposeResult:
        yield Static(self._summary(), id="overview-summary")
        yield Static(id="overview-bar")
        yield Static(self._rest(), id="overview-rest")

    def on_resize(self) -> None:
        self._draw_bar()

    def on_mount(self) -> None:
        self._draw_bar()

    def _draw_bar(self) -> None:
        width = max(20, min(100, self.size.width - 4))
        b = self.session.report.summary.breakdown
        t = Text("Mean step\n", style="bold")
        if b is None:
            t.append("no steps in this capture: no breakdown")
        else:
            t.append_text(breakdown_bar(self.session.report, width))
            t.append("\n")
            t.append_text(_legend())
        self.query_one("#overview-bar", Static).update(t)

    def _summary(self) -> Text:
        s = self.session.report.summary
        t = Text()
        t.append("Capture ", style="bold")
        t.append(f"{one_line(s.input_path)}  (run {one_line(s.run)})\n")
        if s.modelled:
            t.append("MODELLED capture: times are estimates, not measurements\n", style="bold yellow")
        t.append(f"Device {one_line(s.device_type or s.platform)} · {len(s.hosts)} host{'s' * (len(s.hosts) != 1)} · "
                 + s.devices_text(cores=True))
        if s.peak_flops_per_s:
            t.append(f" · peaks per {s.platform.core_word} {fmt_flops(s.peak_flops_per_s)}, HBM {fmt_bandwidth(s.hbm_bytes_per_s)}")
        t.append("\n")
        if s.step_time:
            st = s.step_time
            source = one_line(s.step_program) if s.step_program else f"from {one_line(s.step_source)}"
            t.append(f"Steps {st.count} ({source}) · mean {fmt_time(st.mean_ps)} · "
                     f"p50 {fmt_time(st.p50_ps)} · p90 {fmt_time(st.p90_ps)}")
            if len(s.hosts) > 1:
                t.append(f" · host spread {fmt_time(s.host_spread_ps)}")
                if s.host_spread_ps > 0:
                    t.append(f" (slowest {one_line(s.slowest_host)})")
        else:
            t.append("Steps: none found")
        b = s.breakdown
        if b is not None:
            t.append("\nDuty cycle ", style="bold")
            t.append(fmt_pct(b.duty_cycle), style="bold")
            t.append(f"  (compute {fmt_time(b.compute_ps)} · collectives {fmt_time(b.collective_ps)} · "
                     f"infeed/outfeed {fmt_time(b.io_ps)} · "
                     + (f"host transfers {fmt_time(b.host_transfer_ps)} · " if b.host_transfer_ps else "")
                     + f"idle {fmt_time(b.idle_ps)} of {fmt_time(b.step_ps)}"
                     + (f" per {s.platform.core_word}; the step time is the slowest {s.platform.core_word}'s"
                        if b.step_differs(s.step_time) else "") + ")")
        t.append("\n")
        return t

    def _rest(self) -> Table | Text:
        report = self.session.report
        grid = Table.grid(padding=(0, 2))
        grid.add_column()
        verdict = Text("Verdict  ", style="bold")
        verdict.append(one_line(export.verdict(report)))
        grid.add_row(verdict)
        if report.categories:
            cats = Table(title="Time by category", title_justify="left", show_edge=False, box=None)
            for col, just in (("category", "left"), ("ops", "right"), ("self time", "right"), ("share", "right"),
                              ("", "left")):
                cats.add_column(col, justify=just, no_wrap=True)
            for c in report.categories[:8]:
                cells = round(c.time_share * 30)
                cats.add_row(escape(c.category), str(c.n_ops), fmt_time(c.self_time_ps), fmt_pct(c.time_share),
                             "█" * cells + "·" * (30 - cells))
            grid.add_row(Text(""))
            grid.add_row(cats)
        if report.warnings or report.failures:
            grid.add_row(Text(""))
            grid.add_row(Text("Warnings", style="bold"))
            for w in report.failures + report.warnings:
                grid.add_row(Text(f"  {one_line(w)}"))
        return grid

    def markdown(self) -> str:
        return export.overview_md(self.session.report)


# -- findings ---------------------------------------------------------------------------------------

class FindingsView(Horizontal):
    BINDINGS = _bindings(keys.FINDINGS)

    class OpenOp(Message):
        def __init__(self, name: str, host: str) -> None:
            super().__init__()
            self.name, self.host = name, host

    class ShowOnTimeline(Message):
        def __init__(self, ops: tuple[str, ...], host: str) -> None:
            super().__init__()
            self.ops, self.host = ops, host

    def __init__(self, session: Session, **kw) -> None:
        super().__init__(**kw)
        self.session = session
        self.selected: Finding | None = session.report.findings[0] if session.report.findings else None

    def compose(self) -> ComposeResult:
        report = self.session.report
        if not report.findings:
            yield Static(Text(printable(export.verdict(report) + self._skips(), keep_newlines=True)), id="findings-empty")
            return
        items = []
        for i, f in enumerate(report.findings, start=1):
            label = Text(f"{i:>2}. ")
            label.append(f"{f.severity.label():<6} ", style="bold")
            label.append(one_line(f.rule), style="cyan")
            label.append(f" ≤{fmt_bytes(f.saving.bytes) if f.saving.bytes and not f.saving.ps else fmt_time(f.saving.ps)}")
            items.append(ListItem(Label(label)))
        with Vertical(id="findings-left"):
            yield Label(Text(f"Findings ({len(report.findings)}), ranked by estimated saving", style="bold"))
            yield ListView(*items, id="findings-list")
        with VerticalScroll(id="findings-detail"):
            yield Static(id="finding-text")

    def _skips(self) -> str:
        return "".join(f"\nskipped {s.rule}: {s.reason}" for s in self.session.report.rules_skipped)

    def on_mount(self) -> None:
        self._show()

    def focus_main(self) -> None:
        lists = self.query(ListView)
        if lists:
            lists.first().focus()

    @on(ListView.Highlighted, "#findings-list")
    def _highlighted(self, event: ListView.Highlighted) -> None:
        lv = event.list_view
        if lv.index is not None:
            self.selected = self.session.report.findings[lv.index]
            self._show()

    @on(ListView.Selected, "#findings-list")
    def _selected(self, event: ListView.Selected) -> None:
        self.action_open_cited()

    def action_show_on_timeline(self) -> None:
        f = self.selected
        if f is None or not f.ops:
            self.app.notify("this finding cites no op", severity="warning")
            return
        self.post_message(self.ShowOnTimeline(f.ops, f.host))

    def action_open_cited(self) -> None:
        f = self.selected
        if f is None or not f.ops:
            self.app.notify("this finding cites no op", severity="warning")
            return
        # The first cited op the ops table lists (a spill in a loop body cites the kernel, then the loop).
        name = next((op for op in f.ops if find_op(self.session.report, op, f.host) is not None), f.ops[0])
        self.post_message(self.OpenOp(name, f.host))

    def _show(self) -> None:
        f = self.selected
        if f is None or not self.query("#finding-text"):
            return
        t = Text()
        t.append(one_line(f"{f.code} {f.rule}"), style="bold cyan")
        t.append(f"  [{f.severity.label()}]" + (f"  host {one_line(f.host)}" if f.host else "") + "\n\n")
        t.append(one_line(f.message) + "\n\n")
        t.append("Fix ", style="bold")
        t.append(one_line(f.fix) + "\n\n")
        t.append("Saving ", style="bold")
        bound = "≤ " if f.saving.ps or f.saving.bytes else ""
        t.append(f"{bound}{saving_amount(f.saving)} ({f.saving.basis}): {one_line(f.saving.explanation)}\n\n")
        if f.evidence:
            t.append("Evidence\n", style="bold")
            for ev in f.evidence:
                t.append(f"  {one_line(ev.subject)}: ", style="bold")
                t.append(one_line(", ".join(f"{k} {v}" for k, v in ev.values)) + "\n")
        if f.ops:
            t.append("\nCites ", style="bold")
            t.append(one_line(", ".join(f.ops)))
            t.append("  (enter opens the first)\n", style="dim")
        explanation = rule_explanation(f.rule)
        if explanation:
            t.append("\nAbout this rule\n", style="bold")
            t.append(explanation + "\n")
        self.query_one("#finding-text", Static).update(t)

    def markdown(self) -> str:
        f = self.selected
        return export.findings_md(self.session.report, f, rule_explanation(f.rule) if f else "")


# -- ops --------------------------------------------------------------------------------------------

class OpsView(Vertical):
    BINDINGS = _bindings(keys.OPS[:3])  # enter is the table's own row selection

    class OpenOp(Message):
        def __init__(self, op: OpRow) -> None:
            super().__init__()
            self.op = op

    def __init__(self, session: Session, **kw) -> None:
        super().__init__(**kw)
        self.session = session
        self.filter = OpFilter()
        self.sort_key = "self_time"
        self.descending = True
        self.shown: tuple[OpRow, ...] = ()
        self.columns: list[int] = []  # indexes into export.OP_HEADER of the columns shown
        self._facets = facets(session.report.ops)

    def compose(self) -> ComposeResult:
        f = self._facets

        def options(values):
            return [(Text(one_line(v)) if v else "(none)", v) for v in values]

        with Horizontal(id="ops-filters"):
            yield Input(placeholder="/ search name, source, shape", id="ops-search")
            yield Select(options(f.categories), prompt="category: all", id="ops-category")
            yield Select(options(f.hosts), prompt="host: all", id="ops-host")
            yield Select(options(f.programs), prompt="program: all", id="ops-program")
        yield Static(id="ops-status")
        yield DataTable(id="ops-table", cursor_type="row", zebra_stripes=True)

    def on_mount(self) -> None:
        self.query_one("#ops-search", Input).cursor_blink = getattr(self.app, "cursor_blink", True)
        self.refresh_table()

    def focus_main(self) -> None:
        self.query_one("#ops-table", DataTable).focus()

    def focus_search(self) -> None:
        self.query_one("#ops-search", Input).focus()

    @on(Input.Changed, "#ops-search")
    def _search(self, event: Input.Changed) -> None:
        self.filter = OpFilter(event.value, self.filter.category, self.filter.host, self.filter.program)
        self.refresh_table()

    @on(Input.Submitted, "#ops-search")
    def _search_done(self) -> None:
        self.focus_main()

    @on(Select.Changed)
    def _select(self, event: Select.Changed) -> None:
        value = "" if event.value in (Select.NULL, Select.BLANK) else str(event.value)
        f = self.filter
        field = (event.select.id or "").removeprefix("ops-")
        self.filter = OpFilter(f.text, value if field == "category" else f.category,
                               value if field == "host" else f.host, value if field == "program" else f.program)
        self.refresh_table()

    @on(DataTable.HeaderSelected, "#ops-table")
    def _header(self, event: DataTable.HeaderSelected) -> None:
        label = export.OP_HEADER[self.columns[event.column_index]]
        for col in SORT_COLUMNS:
            if col.label == label:
                if col.key == self.sort_key:
                    self.descending = not self.descending
                else:
                    self.sort_key, self.descending = col.key, True
                self.refresh_table()
                return
        self.app.notify(f"the ops table does not sort by {label}", severity="warning")

    @on(DataTable.RowSelected, "#ops-table")
    def _row(self, event: DataTable.RowSelected) -> None:
        if 0 <= event.cursor_row < len(self.shown):
            self.post_message(self.OpenOp(self.shown[event.cursor_row]))

    def selected_op(self) -> OpRow | None:
        """The op under the table's cursor, if any."""
        row = self.query_one("#ops-table", DataTable).cursor_row
        return self.shown[row] if 0 <= row < len(self.shown) else None

    def action_cycle_sort(self) -> None:
        i = [c.key for c in SORT_COLUMNS].index(self.sort_key)
        self.sort_key = SORT_COLUMNS[(i + 1) % len(SORT_COLUMNS)].key
        self.descending = True
        self.refresh_table()

    def action_reverse_sort(self) -> None:
        self.descending = not self.descending
        self.refresh_table()

    def action_clear_filters(self) -> None:
        self.query_one("#ops-search", Input).value = ""
        for sel in self.query(Select):
            sel.clear()
        self.filter = OpFilter()
        self.refresh_table()

    def refresh_table(self) -> None:
        ops = sort_ops(filter_ops(self.session.report.ops, self.filter), self.sort_key, self.descending)
        self.shown = ops[:MAX_OP_ROWS]
        table = self.query_one("#ops-table", DataTable)
        sort_label = sort_column(self.sort_key).label
        arrow = " ▼" if self.descending else " ▲"
        if not self.columns:
            # A column with one value for every op (one host, one program) says nothing: leave it out.
            hidden = {"host"} if len(self._facets.hosts) < 2 else set()
            hidden |= {"program"} if len(self._facets.programs) < 2 else set()
            self.columns = [i for i, label in enumerate(export.OP_HEADER) if label not in hidden]
            for i in self.columns:
                # Two spaces of room for the sort arrow: a column keeps its first width.
                table.add_column(export.OP_HEADER[i] + "  ", key=export.OP_HEADER[i])
        for i in self.columns:
            label = export.OP_HEADER[i]
            table.columns[label].label = Text(label + (arrow if label == sort_label else ""))
        table.clear()
        for n, op in enumerate(self.shown):
            cells = export.op_cells(op)
            table.add_row(*(escape(cells[i]) for i in self.columns), key=str(n))
        table.refresh()
        total = len(self.session.report.ops)
        order = "descending" if self.descending else "ascending"
        status = f"{len(ops)} of {total} ops · sorted by {sort_label} {order}"
        if len(ops) > len(self.shown):
            status += f" · showing the first {len(self.shown)}: filter to narrow"
        status += " · s sort · r reverse · c clear · enter detail"
        self.query_one("#ops-status", Static).update(Text(one_line(status), style="dim"))

    def markdown(self) -> str:
        return export.ops_md(self.shown, self.filter, sort_column(self.sort_key).label, self.descending)


# -- timeline ---------------------------------------------------------------------------------------

LABEL_WIDTH = 18


class LaneChart(Widget):
    """Per-core lanes of one step at the widget's width: op kinds, the names of the ops that fit,
    and async collectives in flight; the selected op (`selected`: lane and span) in reverse video."""

    DEFAULT_CSS = "LaneChart { height: auto; }"

    def __init__(self, timeline: StepTimeline, **kw) -> None:
        super().__init__(**kw)
        self.timeline = timeline
        self.selected: tuple[int, int] | None = None  # (lane, span)

    def get_content_height(self, container, viewport, width: int) -> int:
        return 2 + 3 * len(self.timeline.lanes)

    def render(self) -> Text:
        t = self.timeline
        width = max(10, self.size.width - LABEL_WIDTH - 1)
        out = Text()
        scale = f"0{' ' * (width - len(fmt_time(t.span_ps)) - 1)}{fmt_time(t.span_ps)}"
        out.append(" " * LABEL_WIDTH + " " + scale + "\n", style="dim")
        for li, lane in enumerate(t.lanes):
            out.append(printable(lane.label)[:LABEL_WIDTH].ljust(LABEL_WIDTH) + " ")
            chosen = (span_cells(lane.spans[self.selected[1]], width, t.span_ps)
                      if self.selected is not None and self.selected[0] == li else (0, 0))
            for cell, kind in enumerate(rasterize(lane, width, t.span_ps)):
                glyph, style = GLYPH[kind]
                out.append(glyph, style=f"{style} reverse" if chosen[0] <= cell < chosen[1] else style)
            out.append("\n")
            names = [" "] * width
            for label in name_labels(lane, width, t.span_ps, printable):
                names[label.cell:label.cell + len(label.text)] = list(label.text)
            out.append(" " * (LABEL_WIDTH + 1) + "".join(names) + "\n", style="cyan")
            flight = rasterize_in_flight(lane, width, t.span_ps)
            out.append("  async".ljust(LABEL_WIDTH) + " ", style="dim")
            out.append("".join(IN_FLIGHT[0] if f else " " for f in flight), style=IN_FLIGHT[1])
            out.append("\n")
        out.append_text(_legend())
        return out


class TimelineView(VerticalScroll):
    BINDINGS = _bindings(keys.TIMELINE)
    can_focus = True

    class OpenOp(Message):
        def __init__(self, name: str, host: str) -> None:
            super().__init__()
            self.name, self.host = name, host

    def __init__(self, session: Session, **kw) -> None:
        super().__init__(**kw)
        self.session = session
        self.error = ""
        self.timeline = self._timeline(None)

    def _timeline(self, step: int | None):
        """The step's timeline; None with `self.error` set when a host's file cannot be read again
        (a multi-host capture keeps no events: the timeline re-reads the hosts it draws)."""
        try:
            return step_timeline(self.session.analysis, step)
        except TpudiagError as exc:
            self.error = exc.one_line()
            return None

    def compose(self) -> ComposeResult:
        yield Static(id="timeline-title")
        if self.timeline is None:
            return
        yield LaneChart(self.timeline, id="timeline-chart")
        yield Static(id="timeline-selected")
        yield DataTable(id="timeline-lanes", cursor_type="row", show_cursor=False)

    def on_mount(self) -> None:
        self._draw()

    def focus_main(self) -> None:
        self.focus()

    def action_step(self, delta: int) -> None:
        if self.timeline is None:
            return
        step = self.timeline.neighbour(delta)
        if step is None:
            self.app.notify("no step " + ("before" if delta < 0 else "after") + f" step {self.timeline.step}")
            return
        self.show_step(step)

    def show_step(self, step: int, select: tuple[int, int] | None = None) -> None:
        timeline = self._timeline(step)
        if timeline is None:
            self.app.notify(escape(self.error), severity="error")
            return
        self.timeline = timeline
        chart = self.query_one(LaneChart)
        chart.timeline, chart.selected = self.timeline, select
        chart.refresh(layout=True)
        self._draw()

    def show_place(self, place: OpPlace) -> None:
        """Open the step of `place` with its op selected (a finding's op, `FindingsView`)."""
        self.show_step(place.step, (place.lane, place.span))

    def show_ops(self, ops: tuple[str, ...], host: str) -> None:
        place = find_on_timeline(self.session.analysis, ops, host)
        if place is None:
            self.app.notify(f"`{escape(', '.join(ops))}` does not run in the first steps' top-level ops",
                            severity="warning")
            return
        self.show_place(place)

    def _selected(self):
        chart = self.query(LaneChart)
        if not chart or chart.first().selected is None or self.timeline is None:
            return None
        li, si = chart.first().selected
        return self.timeline.lanes[li], self.timeline.lanes[li].spans[si]

    def action_select_op(self, delta: int) -> None:
        if self.timeline is None or not self.query(LaneChart):
            return
        chart = self.query_one(LaneChart)
        li, si = chart.selected if chart.selected is not None else (0, -1 if delta > 0 else 0)
        spans = self.timeline.lanes[li].spans
        if not spans:
            return
        chart.selected = (li, min(max(si + delta, 0), len(spans) - 1))
        chart.refresh()
        self._draw_selected()

    def action_select_lane(self, delta: int) -> None:
        if self.timeline is None or not self.query(LaneChart):
            return
        chart = self.query_one(LaneChart)
        lanes = self.timeline.lanes
        if chart.selected is None:
            chart.selected = (0, 0) if lanes and lanes[0].spans else None
        else:
            li = min(max(chart.selected[0] + delta, 0), len(lanes) - 1)
            old = self.timeline.lanes[chart.selected[0]].spans[chart.selected[1]]
            spans = lanes[li].spans
            # the op on the new lane running at the same offset, else the nearest before it
            si = max((i for i, s in enumerate(spans) if s.offset_ps <= old.offset_ps), default=0)
            chart.selected = (li, si) if spans else chart.selected
        chart.refresh()
        self._draw_selected()

    def action_open_selected(self) -> None:
        chosen = self._selected()
        if chosen is None:
            self.app.notify("select an op first: a / d along a lane, w / s between lanes", severity="warning")
            return
        lane, span = chosen
        self.post_message(self.OpenOp(span.name, lane.host))

    def _draw_selected(self) -> None:
        line = self.query("#timeline-selected")
        if not line:
            return
        chosen = self._selected()
        if chosen is None:
            line.first().update(Text("a / d: select an op along a lane, w / s: between lanes, enter: its detail",
                                     style="dim"))
            return
        lane, span = chosen
        line.first().update(Text.assemble(("selected ", "dim"), (printable(span.name), "bold cyan"),
                                           f" on {printable(lane.label)}: {span.kind}, +{fmt_time(span.offset_ps)} "
                                           f"for {fmt_time(span.dur_ps)}  ·  enter: op detail"))

    def _draw(self) -> None:
        title = self.query_one("#timeline-title", Static)
        t = self.timeline
        if t is None:
            title.update(Text(f"error: {printable(self.error)}", style="bold red") if self.error
                         else "no steps in this capture: nothing to draw")
            return
        self._draw_selected()
        pos = t.steps.index(t.step) + 1
        title.update(Text.assemble(("Step ", "bold"), (str(t.step), "bold"),
                                   f"  ({pos} of {len(t.steps)}: [ previous, ] next)  ·  "
                                   f"lanes aligned at each core's step start, scale {fmt_time(t.span_ps)}"))
        table = self.query_one("#timeline-lanes", DataTable)
        table.clear(columns=True)
        for col in ("lane", "step", "compute", "exposed coll.", "async in flight", "idle", "longest idle gap",
                    "gaps"):
            table.add_column(col, key=col)
        for lane in t.lanes:
            gap = lane.gaps[0] if lane.gaps else None
            table.add_row(escape(lane.label), fmt_time(lane.dur_ps), fmt_time(lane.compute_ps), fmt_time(lane.collective_ps),
                          fmt_time(lane.in_flight_ps), fmt_time(lane.idle_ps),
                          f"{fmt_time(gap.dur_ps)} at +{fmt_time(gap.offset_ps)}" if gap else "none",
                          str(len(lane.gaps)))

    def markdown(self) -> str:
        if self.timeline is None:
            return "# tpudiag step timeline\n\nno steps in this capture\n"
        return export.timeline_md(self.timeline)


# -- hosts ------------------------------------------------------------------------------------------

MAX_STEP_COLUMNS = 12


class HostsView(Vertical):
    class OpenStep(Message):
        def __init__(self, step: int) -> None:
            super().__init__()
            self.step = step

    def __init__(self, session: Session, **kw) -> None:
        super().__init__(**kw)
        self.session = session
        self.matrix = host_step_matrix(session.report.hosts)

    def compose(self) -> ComposeResult:
        m = self.matrix
        n = len(m.rows)
        if n < 2:
            note = "single-host capture: no other host to compare step times with"
        elif m.stragglers:
            worst = max(m.stragglers, key=lambda s: s.lag_ps)
            note = (f"{len(m.stragglers)} of {len(m.steps)} steps have a straggler; worst: {worst.host} on step "
                    f"{worst.step}, {fmt_time(worst.lag_ps)} behind the median host")
        else:
            note = f"no stragglers: on every step the slowest of {n} hosts is within 1% of the median"
        if len(m.steps) > MAX_STEP_COLUMNS:
            note += (f" · step columns: the first {MAX_STEP_COLUMNS} of {len(m.steps)} "
                     "(stragglers listed for every step)")
        yield Static(Text(one_line(note)), id="hosts-note")
        yield DataTable(id="hosts-table", cursor_type="row", zebra_stripes=True)
        yield Static(Text("* marks the step's straggler (slowest host, ≥1% behind the median host) · "
                          "enter: timeline of the host's slowest step", style="dim"))

    def on_mount(self) -> None:
        m = self.matrix
        table = self.query_one("#hosts-table", DataTable)
        steps = m.steps[:MAX_STEP_COLUMNS]
        summaries = {h.host: h for h in self.session.report.hosts}
        for col in ("host", "chips", "mean", "behind fastest", "duty cycle", "slowest core", "straggler on"):
            table.add_column(col, key=col)
        for s in steps:
            table.add_column(f"step {s}", key=f"step {s}")
        for r in m.rows:
            h = summaries[r.host]
            cells = [escape(r.host), str(h.n_chips), fmt_time(r.mean_ps),
                     "" if r.behind_fastest_ps is None else f"+{fmt_time(r.behind_fastest_ps)}",
                     fmt_pct(h.breakdown.duty_cycle) if h.breakdown else "n/a", escape(h.slowest_core.removeprefix("/device:")),
                     ", ".join(map(str, r.straggler_steps)) or "-"]
            for s, ps in zip(steps, r.times_ps):
                mark = "*" if m.straggler_on(s) == r.host else ""
                cells.append(fmt_time(ps) + mark)
            table.add_row(*cells, key=r.host)

    def focus_main(self) -> None:
        self.query_one("#hosts-table", DataTable).focus()

    @on(DataTable.RowSelected, "#hosts-table")
    def _row(self, event: DataTable.RowSelected) -> None:
        row = self.matrix.rows[event.cursor_row]
        if row.slowest_step is None:
            self.app.notify(f"{escape(row.host)} has no steps", severity="warning")
            return
        self.post_message(self.OpenStep(row.slowest_step))

    def markdown(self) -> str:
        return export.hosts_md(self.matrix)
