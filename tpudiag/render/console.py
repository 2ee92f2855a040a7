"""A rich Console that never lets trace text carry a control sequence, and rich-markup escaping.

Renderers escape names where they build cells (`markup`, `tpudiag.model.text.printable`), which keeps
table widths right. `SafeConsole` is the net under them: every text segment it writes goes through
`printable` after layout, so a name that reached a renderer unescaped still prints inert. Rich's own
styles and cursor controls travel outside the segment text and are untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

from rich.console import Console, ConsoleOptions, RenderableType
from rich.markup import escape as _markup_escape
from rich.segment import Segment

from tpudiag.model.text import printable


def markup(value: object) -> str:
    """Trace text for a place that parses rich markup (TUI cells, `console.print` strings): inert and printable."""
    return _markup_escape(printable(value))


class SafeConsole(Console):
    """`rich.console.Console` whose printed text is always `printable` (newlines kept)."""

    def render(self, renderable: RenderableType, options: ConsoleOptions | None = None) -> Iterable[Segment]:
        for seg in super().render(renderable, options):
            if seg.control or not seg.text:
                yield seg
            else:
                safe = printable(seg.text, keep_newlines=True)
                yield seg if safe is seg.text or safe == seg.text else Segment(safe, seg.style, seg.control)
