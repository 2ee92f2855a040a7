"""The first screen an engineer reads (issue 27 §5): per step and core, collectives apart with their
ICI figures, a legend for every compound cell, no sentence without its figure, no saving of 0."""

from __future__ import annotations

import io

from rich.console import Console

import tpudiag
from tests.conftest import REPO
from tpudiag.model.findings import Finding, Saving, Severity
from tpudiag.model.report import Breakdown
from tpudiag.render.markdown import _breakdown_sentence, finding_section
from tpudiag.render.terminal import render_terminal

EXAMPLE = REPO / "examples" / "models" / "captures" / "transformer_train_v5e"


def _terminal(report) -> str:
    out = io.StringIO()
    render_terminal(report, Console(file=out, width=200, no_color=True, color_system=None))
    return out.getvalue()


def test_no_per_step_value_is_larger_than_the_step():
    """`all-gather.45` summed 338.6 µs over cores in a 277.7 µs step; per step and core it cannot."""
    d = tpudiag.diagnose()  # the bundled example with its dumps
    steps = {h.host: h.step_time.mean_ps for h in d.report.hosts}
    assert all(op.step_self_time_ps is not None for op in d.report.ops)
    assert all(op.step_self_time_ps <= steps[op.host] for op in d.report.ops)
    screen = _terminal(d.report)
    assert "mean per step and core" in screen and "totals in --format json" in screen


def test_collectives_have_their_own_table_with_bytes_and_ici_share():
    report = tpudiag.diagnose(EXAMPLE).report
    screen = _terminal(report)
    compute, _, collectives = screen.partition("Collectives, mean per step and core")
    assert collectives, "no collectives table"
    names = [op.name for op in report.ops if op.family]
    assert names and not any(f"│ {n} " in compute for n in names)  # not in the compute table
    for op in report.ops:
        if op.family:
            assert op.ici_bytes > 0 and op.ici_utilization is not None and 0 < op.ici_utilization <= 1, op.name
    assert "bytes/device" in collectives and "of ICI peak" in collectives


def test_the_padded_column_has_a_legend():
    screen = _terminal(tpudiag.diagnose().report)
    assert "×" in screen and "×N: times the logical bytes" in screen


def test_idle_is_explained_only_when_there_is_idle():
    busy = Breakdown(step_ps=100.0, compute_ps=100.0, collective_ps=0.0, io_ps=0.0, idle_ps=0.0)
    idle = Breakdown(step_ps=100.0, compute_ps=80.0, collective_ps=0.0, io_ps=0.0, idle_ps=20.0)
    assert "Idle time usually" not in _breakdown_sentence(busy)
    assert "Idle time usually" in _breakdown_sentence(idle)
    # What prints as 0.0 % is not explained (the real v6e capture idles 15.6 µs of a 784 ms step).
    trace = Breakdown(step_ps=784e9, compute_ps=784e9 - 15.6e6, collective_ps=0.0, io_ps=0.0, idle_ps=15.6e6)
    assert "0.0% idle." in _breakdown_sentence(trace) and "Idle time usually" not in _breakdown_sentence(trace)


def test_infeed_is_not_called_host_transfers_beside_async_host_copies():
    plain = Breakdown(step_ps=100.0, compute_ps=90.0, collective_ps=0.0, io_ps=10.0, idle_ps=0.0)
    offload = Breakdown(step_ps=100.0, compute_ps=10.0, collective_ps=0.0, io_ps=0.0, idle_ps=0.0,
                        host_transfer_ps=90.0)
    assert "10.0% on transfers to and from the host" in _breakdown_sentence(plain)
    said = _breakdown_sentence(offload)
    assert "0.0% on infeed and outfeed, 90.0% waiting for async copies to or from host memory" in said


def test_a_saving_not_estimated_never_renders_as_zero():
    f = Finding("spill", "TPD104", Severity.LOW, "`fusion.1` spills", Saving(0, "modelled", "no cycle count"), "retile")
    text = "\n".join(finding_section(f))
    assert "Saving: not estimated" in text and "0 ps" not in text and "up to" not in text


def test_roofline_labels_never_overlap_and_the_title_says_what_is_drawn():
    """The bundled transformer's roofline numbered `subtract_convert_fusion.1` over `fusion.198`;
    numbers now sit where no other label is, and the key lists every numbered op."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from tpudiag.render.figures import roofline_figure, roofline_points

    report = tpudiag.diagnose().report
    fig, labels = roofline_figure(report, Figure, lambda f: FigureCanvasAgg(f).get_renderer())
    renderer = FigureCanvasAgg(fig).get_renderer()
    boxes = [t.get_window_extent(renderer) for t in labels]
    assert len(boxes) >= 3
    assert not any(a.overlaps(b) for i, a in enumerate(boxes) for b in boxes[i + 1:])
    title = fig.axes[0].get_title()
    drawn = {p.bound_by for p in roofline_points(report)}
    assert all(b in title for b in drawn) and "HBM, VMEM and compute roofs" in title
    # Each roof the title names is drawn: a line per memory level, labelled in the legend.
    lines = [line.get_label() for line in fig.axes[0].get_lines()]
    assert any(x.startswith("HBM roof") for x in lines) and any(x.startswith("compute roof") for x in lines)
    assert any(x.startswith("VMEM roof (approximate") for x in lines)  # v5e: the scaling book's figure, so labelled
    # No point sits at the 786,432 FLOP/B XLA's HBM bytes give fusion.210 (its data is in VMEM): it is
    # drawn at FLOPs per VMEM byte too (4,831,838,208 FLOPs over 51,904,512 VMEM bytes read, the
    # direction that takes longer at v5e's one VMEM figure: 93.1), and at its HBM level with the bytes
    # its copies brought (1,023).
    points = {p.name: p for p in roofline_points(report)}
    assert all(x < 1e5 for p in points.values() for x in (p.intensity, *(i for _, i in p.others)))
    f210 = points["fusion.210"]
    levels = {f210.level: f210.intensity, **dict(f210.others)}
    assert abs(levels["VMEM"] - 4831838208 / 51904512) < 0.01 and 1000 < levels["HBM"] < 1030


def test_decode_roofline_says_why_its_matmuls_sit_above_the_hbm_roof():
    """`fusion.18` of `llm_decode_v5e` reaches 10 TFLOP/s at 4 FLOP/B counting the weights its copy
    brought, above the HBM roof there (3.3 TFLOP/s): the copy moved them in its own time. The title
    says so, since no point may read as a rate above a peak."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from tpudiag.render.figures import roofline_figure, roofline_points

    report = tpudiag.diagnose(REPO / "examples" / "models" / "captures" / "llm_decode_v5e").report
    point = {p.name: p for p in roofline_points(report)}["fusion.18"]
    assert point.level == "HBM" and point.flop_rate > point.intensity * report.summary.hbm_bytes_per_s
    fig, _ = roofline_figure(report, Figure, lambda f: FigureCanvasAgg(f).get_renderer())
    assert "above the HBM roof counts bytes its copies brought" in fig.axes[0].get_title()
    train, _ = roofline_figure(tpudiag.diagnose().report, Figure, lambda f: FigureCanvasAgg(f).get_renderer())
    assert "above the HBM roof" not in train.axes[0].get_title()  # no such point there: no such words


def test_the_breakdown_names_the_platform_s_own_devices():
    from tpudiag.model.profile import Platform

    b = Breakdown(step_ps=100.0, compute_ps=80.0, collective_ps=0.0, io_ps=0.0, idle_ps=20.0)
    gpu = _breakdown_sentence(b, Platform.GPU)
    assert gpu.startswith("The GPUs spend 80.0%") and "between GPUs" in gpu and "chips" not in gpu
    cpu = _breakdown_sentence(b, Platform.CPU)
    # On a CPU the host is the device: its idle time is not "waiting for the host".
    assert cpu.startswith("XLA's CPU threads spend") and "waiting for the host" not in cpu and "chips" not in cpu
    assert _breakdown_sentence(b).startswith("The chips spend")
