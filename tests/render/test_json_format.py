"""`render_json`: the indented document with one op row per line must read back as exactly the
report's dict, whatever the op names hold."""

from __future__ import annotations

import dataclasses
import json
import math

from tpudiag import diagnose
from tpudiag.render.json_format import report_to_dict, render_json


def _hostile(report):
    # Names from a trace are untrusted: quotes, newlines, brackets, a marker-like text, non-ASCII.
    names = ['all-reduce"]\n  ]', "tpudiag-ops-0123", "ré\u2028sum", "{\"x\": [1,"]
    ops = tuple(dataclasses.replace(o, name=names[i % len(names)] + o.name, flop_utilization=math.nan)
                for i, o in enumerate(report.ops))
    return dataclasses.replace(report, ops=ops)


def test_render_json_reads_back_as_the_report_dict():
    report = _hostile(diagnose().report)  # the bundled example
    text = render_json(report)
    assert json.loads(text) == report_to_dict(report)
    assert json.loads(text)["ops"][0]["flop_utilization"] is None  # non-finite floats are null


def test_each_op_row_is_one_line_and_the_rest_is_indented():
    report = diagnose().report
    lines = render_json(report).splitlines()
    start = lines.index('  "ops": [')
    rows = lines[start + 1:start + 1 + len(report.ops)]
    assert all(r.startswith('    {"host": ') for r in rows)
    assert [json.loads(r.rstrip(","))["name"] for r in rows] == [o.name for o in report.ops]
    assert lines[start + 1 + len(report.ops)] == "  ],"
    assert lines[:2] == ["{", '  "tool": {']


def test_no_ops_is_an_empty_list():
    report = dataclasses.replace(diagnose().report, ops=())
    assert '"ops": []' in render_json(report)
    assert json.loads(render_json(report))["ops"] == []


def test_the_json_pieces_are_the_document_one_op_row_each():
    # A pod's report is written as it is made (`cli.outputs.emit`): the document's head, then one
    # piece per op row, never the rows all held at once.
    from tpudiag.render.json_format import json_pieces, render_json

    report = diagnose().report  # the bundled example
    pieces = list(json_pieces(report))
    assert "".join(pieces) == render_json(report)
    assert len(pieces) >= len(report.ops) > 1
    assert json.loads(render_json(report))["ops"][0]["name"] == report.ops[0].name
