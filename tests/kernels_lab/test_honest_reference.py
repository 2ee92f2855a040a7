"""`lab tune` is honest about its reference (issue 30 §3): the op's captured time is labelled
modelled on a modelled capture, what the reproduction leaves out is listed, and a standalone
reference more than 1.5x away from the captured op gives a warning naming the likely cause."""

from __future__ import annotations

import io

from rich.console import Console

from tpudiag.kernels_lab.render import render_sweep
from tpudiag.kernels_lab.sweep import REFERENCE_GAP, SweepResult, XlaBaseline

LEFT_OUT = ("outputs [1] alias operands (output_to_operand_aliasing): carried in HBM, untouched on one chip",)


def result(measured_s: float, reference_s: float, basis: str = "modelled", left_out=LEFT_OUT) -> SweepResult:
    xla = XlaBaseline(measured_s=measured_s, est_cycles=int(reference_s * 1.5e9), est_s=reference_s,
                      hbm_floor_s=1e-6, status="ok", reason="", captured_basis=basis)
    return SweepResult("fusion.198", "matmul", {}, 1, "v5e:2x2", "v5e", "TPU v5 lite", 1.5e9, "estimate+floor",
                       "basis", (), xla, "tune.jsonl", left_out=left_out)


def rendered(r: SweepResult) -> str:
    out = io.StringIO()
    render_sweep(r, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def test_a_reference_2_7x_the_modelled_op_is_warned_with_what_the_repro_leaves_out():
    r = result(measured_s=6.7e-6, reference_s=18.3e-6)  # the fusion.198: 18.3 us against 6.7 us
    assert r.reference_warning is not None
    assert "2.7x the op modelled in the capture" in r.reference_warning
    assert "untouched on one chip" in r.reference_warning
    text = rendered(r)
    assert "XLA op modelled in the capture: 6.7 us" in text
    assert "measured in the capture" not in text
    assert "warning: the standalone XLA reference" in text and "leaves out" in text


def test_a_reference_close_to_the_op_gives_no_warning():
    assert result(measured_s=10e-6, reference_s=10e-6 * REFERENCE_GAP * 0.99).reference_warning is None
    assert result(measured_s=10e-6, reference_s=10e-6 / REFERENCE_GAP * 1.01).reference_warning is None


def test_a_reference_far_faster_than_the_op_is_warned_too():
    warning = result(measured_s=30e-6, reference_s=10e-6, basis="measured", left_out=()).reference_warning
    assert warning is not None and "0.3x the op measured in the capture" in warning
    assert "not the op as it ran" in warning


def test_a_real_capture_says_measured():
    assert "XLA op measured in the capture" in rendered(result(10e-6, 10e-6, basis="measured"))


def test_a_spec_from_the_modelled_example_says_modelled_and_what_it_leaves_out():
    import tpudiag
    from tpudiag.kernels_lab.spec import spec_from_diagnosis

    spec = spec_from_diagnosis(tpudiag.diagnose(), "fusion.198")
    assert spec.captured_basis == "modelled"  # the bundled example is a `simulate` capture
    assert spec.left_out, spec.basis  # fusion.198 carries a fused all-gather's output untouched


def test_regression_the_repro_header_of_a_modelled_capture_does_not_say_measured():
    # repro.py's header said "measured in the capture" for the bundled (modelled) example's ops
    import tpudiag
    from tpudiag.kernels_lab.reproduce import _header
    from tpudiag.kernels_lab.spec import spec_from_diagnosis

    text = " ".join(_header(spec_from_diagnosis(tpudiag.diagnose(), "fusion.198")).replace("#", " ").split())
    assert "modelled in the capture on" in text and "measured" not in text
