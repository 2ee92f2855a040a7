"""Every key binding of the TUI, in one table: the app's bindings and its help screen both come
from here, and the tests press each one. No Textual here.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Key:
    keys: str  # Textual key names, comma-separated
    shown: str  # how the help screen and footer show it
    action: str  # Textual action string
    description: str
    scope: str  # "global" or the view it works in
    short: str = ""  # footer label; the description when empty

    @property
    def footer(self) -> str:
        return self.short or self.description


GLOBAL: tuple[Key, ...] = (
    Key("o", "o", "view('overview')", "Overview", "global"),
    Key("f", "f", "view('findings')", "Findings", "global"),
    Key("p", "p", "view('ops')", "Ops table", "global", "Ops"),
    Key("t", "t", "view('timeline')", "Step timeline", "global", "Timeline"),
    Key("h", "h", "view('hosts')", "Hosts", "global"),
    Key("m", "m", "memory", "Device memory", "global", "Memory"),
    Key("slash", "/", "search", "Search ops", "global", "Search"),
    Key("e", "e", "export", "Export view as markdown", "global", "Export"),
    Key("question_mark", "?", "help", "Help", "global"),
    Key("escape", "esc", "back", "Back", "global"),
    Key("k", "k", "kernels_lab", "Kernels lab: the command for the selected op", "global", "Lab"),
    Key("q", "q", "quit", "Quit", "global"),
)

OPS: tuple[Key, ...] = (
    Key("s", "s", "cycle_sort", "Next sort column", "ops", "Sort"),
    Key("r", "r", "reverse_sort", "Reverse sort", "ops", "Reverse"),
    Key("c", "c", "clear_filters", "Clear filters", "ops", "Clear"),
    Key("enter", "enter", "open_op", "Op detail", "ops"),
)

FINDINGS: tuple[Key, ...] = (
    Key("enter", "enter", "open_cited", "Open the cited op", "findings", "Cited op"),
    Key("l", "l", "show_on_timeline", "Show its ops on the timeline", "findings", "On timeline"),
)

TIMELINE: tuple[Key, ...] = (
    Key("left_square_bracket,left", "[ ←", "step(-1)", "Previous step", "timeline", "Prev step"),
    Key("right_square_bracket,right", "] →", "step(1)", "Next step", "timeline"),
    Key("d", "d", "select_op(1)", "Select the next op on the lane", "timeline", "Next op"),
    Key("a", "a", "select_op(-1)", "Select the previous op on the lane", "timeline", "Prev op"),
    Key("s", "s", "select_lane(1)", "Select the lane below", "timeline", "Lane down"),
    Key("w", "w", "select_lane(-1)", "Select the lane above", "timeline", "Lane up"),
    Key("enter", "enter", "open_selected", "Op detail of the selected op", "timeline", "Op detail"),
)

HOSTS: tuple[Key, ...] = (
    Key("enter", "enter", "open_host_step", "Timeline of the host's slowest step", "hosts", "Slowest step"),
)

DETAIL: tuple[Key, ...] = (
    Key("escape", "esc", "back", "Back to where you came from", "op detail"),
)

ALL: tuple[Key, ...] = GLOBAL + OPS + FINDINGS + TIMELINE + HOSTS + DETAIL

def kernels_lab_hint(capture: str, op: str | None) -> str:
    """The lab command for the selected op (a Pallas reproduction of it, checked against XLA, then
    tuned); with no op selected, the command with NAME to fill in."""
    target = f"lab/{op}" if op else "lab/NAME"
    return (f"`tpudiag lab extract {capture} --op {op or 'NAME'} -o {target}`, then "
            f"`tpudiag lab check {target}` and `tpudiag lab tune {target}`")
