"""`tpudiag tui`: from the verdict to the evidence, keyboard first.

The app loads the capture in a worker thread (the UI stays live and shows the stage), then shows
five views in tabs: overview, findings, ops, step timeline, hosts. Enter on an op or a finding
opens the op's detail; esc goes back through screens and views. Every number comes from the
session's Report and Analysis via `tpudiag.analysis`; nothing is computed here.
"""

from __future__ import annotations

from pathlib import Path

from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Container
from textual.widgets import Footer, Header, Input, TabbedContent, TabPane
from textual.worker import get_current_worker

from tpudiag.analysis.drilldown import find_op, op_detail
from tpudiag.errors import TpudiagError
from tpudiag.model.memory import MemoryReport
from tpudiag.render.console import markup
from tpudiag.writers.files import write_text
from tpudiag.tui import keys
from tpudiag.tui.export import export_target
from tpudiag.tui.screens import ExportScreen, HelpScreen, LoadingPanel, MemoryScreen, OpDetailScreen
from tpudiag.tui.session import Session, load_session, start_process_helpers
from tpudiag.tui.views import FindingsView, HostsView, OpsView, OverviewView, TimelineView

VIEWS = (("overview", "Overview", OverviewView), ("findings", "Findings", FindingsView), ("ops", "Ops", OpsView),
         ("timeline", "Timeline", TimelineView), ("hosts", "Hosts", HostsView))


class MainViews(Container):
    """The five views in tabs. A view is built the first time it is shown, so start-up stays quick."""

    def __init__(self, session: Session) -> None:
        super().__init__(id="main")
        self.session = session

    def compose(self) -> ComposeResult:
        with TabbedContent(initial="overview", id="tabs"):
            for view_id, title, cls in VIEWS:
                with TabPane(title, id=view_id):
                    if view_id == "overview":
                        yield cls(self.session, id=f"view-{view_id}")

    async def ensure(self, view_id: str):
        found = self.query(f"#view-{view_id}")
        if found:
            return found.first()
        cls = next(c for v, _, c in VIEWS if v == view_id)
        widget = cls(self.session, id=f"view-{view_id}")
        await self.query_one(f"TabPane#{view_id}").mount(widget)
        return widget


class TpudiagApp(App):
    TITLE = "tpudiag"
    CSS = """
    #body { height: 1fr; }
    #ops-filters { height: 3; }
    #ops-search { width: 2fr; }
    #ops-filters Select { width: 1fr; }
    #ops-table { height: 1fr; }
    #findings-left { width: 50; }
    #findings-list { height: 1fr; }
    #findings-detail { width: 1fr; padding: 0 1; }
    #timeline-lanes { height: auto; margin-top: 1; }
    #hosts-table { height: auto; max-height: 24; }
    OverviewView > Static { margin-bottom: 1; }
    """
    ENABLE_COMMAND_PALETTE = False
    BINDINGS = [Binding(k.keys, k.action, k.footer, key_display=k.shown,
                        show=k.action not in ("back", "memory")) for k in keys.GLOBAL]

    def __init__(self, path: Path | None = None, session: Session | None = None, cursor_blink: bool = True,
                 cwd: Path | None = None, dumps: tuple[Path, ...] = ()) -> None:
        super().__init__()
        if path is None and session is None:
            raise ValueError("give a capture path or a loaded session")
        self.path = Path(path) if path is not None else session.path
        if session is None:
            start_process_helpers()  # before Textual captures stderr (see the function)
        self.session = session
        self.cursor_blink = cursor_blink
        self.dumps = dumps
        self.cwd = cwd
        self.history: list[str] = []
        self._last_tab = ""
        self.exported: Path | None = None  # the last file written, for tests and the notification

    # -- layout and loading ----------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield Header()
        yield Container(id="body")
        yield Footer()

    def on_mount(self) -> None:
        self.theme = "textual-dark"
        self.sub_title = str(self.path)
        if self.session is not None:
            self._show_session()
        else:
            self.query_one("#body").mount(LoadingPanel(self.path, id="loading"))
            self._load()

    @work(thread=True, exclusive=True)
    def _load(self) -> None:
        worker = get_current_worker()

        def progress(index: int, text: str) -> None:
            if not worker.is_cancelled:
                self.call_from_thread(self._stage, index, text)

        try:
            session = load_session(self.path, progress, dumps=self.dumps)
        except TpudiagError as exc:
            self.call_from_thread(self._failed, exc)
            return
        if not worker.is_cancelled:
            self.call_from_thread(self._loaded, session)

    def _stage(self, index: int, text: str) -> None:
        for panel in self.query(LoadingPanel):
            panel.stage(index, text)

    def _failed(self, exc: TpudiagError) -> None:
        for panel in self.query(LoadingPanel):
            panel.failed(exc.one_line(), exc.hint)

    def _loaded(self, session: Session) -> None:
        self.session = session
        for panel in self.query(LoadingPanel):
            panel.remove()
        self._show_session()

    def _show_session(self) -> None:
        session = self.session
        self.query_one("#body").mount(MainViews(session))
        self._last_tab = "overview"
        self.call_after_refresh(self._focus_view)

    # -- navigation -----------------------------------------------------------------------------------

    @property
    def current_view(self) -> str:
        tabs = self.query("#tabs")
        return tabs.first(TabbedContent).active if tabs else ""

    def _view_widget(self, view_id: str | None = None):
        return self.query_one(f"#view-{view_id or self.current_view}")

    def _focus_view(self) -> None:
        if self.session is None or not self.current_view:
            return
        widget = self._view_widget()
        focus = getattr(widget, "focus_main", None)
        if focus:
            focus()
        else:
            widget.focus()

    def _has_session(self) -> bool:
        if self.session is None or not self.query("#tabs"):
            self.notify("still loading the capture", severity="warning")
            return False
        return True

    def _pop_to_main(self) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()

    async def action_view(self, view_id: str, remember: bool = True) -> None:
        if not self._has_session():
            return
        self._pop_to_main()
        current = self.current_view
        if remember and current and current != view_id:
            self.history.append(current)
        await self._activate(view_id)

    async def _activate(self, view_id: str) -> None:
        await self.query_one(MainViews).ensure(view_id)
        self._last_tab = view_id  # set first: the TabActivated that follows is ours, not a click
        self.query_one("#tabs", TabbedContent).active = view_id
        self.call_after_refresh(self._focus_view)

    async def on_tabbed_content_tab_activated(self, event: TabbedContent.TabActivated) -> None:
        new = event.pane.id
        if new == self._last_tab:
            return
        # A mouse click on a tab: remember where we came from and build the view if needed.
        if self._last_tab:
            self.history.append(self._last_tab)
        self._last_tab = new
        await self.query_one(MainViews).ensure(new)
        self.call_after_refresh(self._focus_view)

    async def action_back(self) -> None:
        focused = self.focused
        if isinstance(focused, Input) and len(self.screen_stack) == 1:
            self._focus_view()
            return
        if len(self.screen_stack) > 1:
            self.pop_screen()
            return
        if self.history:
            await self._activate(self.history.pop())
        else:
            self.notify("nothing to go back to", timeout=2)

    async def action_search(self) -> None:
        if not self._has_session():
            return
        await self.action_view("ops")
        self.call_after_refresh(lambda: self._view_widget("ops").focus_search())

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
        else:
            self.push_screen(HelpScreen())

    def action_memory(self) -> None:
        if not self._has_session():
            return
        if isinstance(self.screen, MemoryScreen):
            self.pop_screen()
            return
        d = self.session.diagnosis
        report = (d.memory() if d is not None
                  else MemoryReport(input_path=str(self.session.path), programs=self.session.report.memory))
        self.push_screen(MemoryScreen(report))

    def action_kernels_lab(self) -> None:
        op = self._selected_op()
        what = f"for `{op}`" if op else "(select an op in the ops table first)"
        self.notify(markup(f"kernels lab {what}: {keys.kernels_lab_hint(str(self.path), op)}"),
                    title="kernels lab", severity="information" if op else "warning", timeout=30)

    def _selected_op(self) -> str | None:
        """The op the user is on: the op detail screen's, or the ops table's cursor row."""
        if isinstance(self.screen, OpDetailScreen):
            return self.screen.detail.op.name
        if self.session is not None and self.current_view == "ops":
            row = self._view_widget("ops").selected_op()
            return row.name if row is not None else None
        return None

    def on_ops_view_open_op(self, message: OpsView.OpenOp) -> None:
        self.push_screen(OpDetailScreen(op_detail(self.session.analysis, self.session.report, message.op)))

    async def on_findings_view_show_on_timeline(self, message: FindingsView.ShowOnTimeline) -> None:
        await self.action_view("timeline")
        self._view_widget("timeline").show_ops(message.ops, message.host)

    def on_timeline_view_open_op(self, message: TimelineView.OpenOp) -> None:
        self.on_findings_view_open_op(message)

    def on_findings_view_open_op(self, message: FindingsView.OpenOp | TimelineView.OpenOp) -> None:
        op = find_op(self.session.report, message.name, message.host)
        if op is None:
            self.notify(f"`{markup(message.name)}` is not in the ops table", severity="warning")
            return
        self.push_screen(OpDetailScreen(op_detail(self.session.analysis, self.session.report, op)))

    async def on_hosts_view_open_step(self, message: HostsView.OpenStep) -> None:
        await self.action_view("timeline")
        self._view_widget("timeline").show_step(message.step)

    # -- export ---------------------------------------------------------------------------------------

    def _current_markdown(self) -> tuple[str, str]:
        if isinstance(self.screen, OpDetailScreen):
            return "op", self.screen.markdown()
        if isinstance(self.screen, MemoryScreen):
            return "memory", self.screen.markdown()
        view = self.current_view
        return view, self._view_widget(view).markdown()

    def action_export(self) -> None:
        if not self._has_session():
            return
        if isinstance(self.screen, (HelpScreen, ExportScreen)):
            return
        view, text = self._current_markdown()
        cwd = self.cwd or Path.cwd()

        def write(answer: str | None) -> None:
            if answer is None:
                return
            try:
                target = export_target(answer, view, self.session.trace_dir, cwd, self.session.dumps)
                write_text(target, text)  # atomic: a failed write leaves no partial file
            except TpudiagError as exc:
                self.notify(markup(exc.one_line()) + (f"\nhint: {markup(exc.hint)}" if exc.hint else ""), severity="error")
                return
            except OSError as exc:
                self.notify(f"could not write: {markup(exc.strerror or exc)}", severity="error")
                return
            self.exported = target
            self.notify(f"wrote {markup(target)}", title="export")

        self.push_screen(ExportScreen(view, cwd, self.cursor_blink), write)
