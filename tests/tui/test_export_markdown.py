"""The TUI's markdown export writes its tables with the report's markdown writer (`render.markdown`)."""

from __future__ import annotations

from tpudiag.analysis.stragglers import HostRow, HostStepMatrix
from tpudiag.render.markdown import table
from tpudiag.tui.export import hosts_md


def test_an_exported_table_is_the_reports_table_with_hostile_names_inert():
    hostile = "evil|host <b>x</b> [l](http://e.com)"
    matrix = HostStepMatrix(steps=(1,), rows=(HostRow(hostile, (2_000_000,), 2e6, 0.0, (1,), 1),), stragglers=())
    lines = hosts_md(matrix).splitlines()
    header = ["host", "mean", "behind fastest", "straggler on", "step 1"]
    start = lines.index(table(header, [])[0])
    assert lines[start + 1] == table(header, [])[1]  # the report's separator row, not a second writer's
    row = lines[start + 2]
    assert row.count(" | ") == len(header) - 1  # the pipe in the name is escaped, not a new cell
    assert "<b>" not in row and "://" not in row and "evil\\|host" in row
