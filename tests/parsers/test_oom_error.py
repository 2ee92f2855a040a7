"""RESOURCE_EXHAUSTED texts from JAX -> OomError: the HBM forms, the VMEM forms (via the VMEM
parser), and near misses that are not out-of-memory errors."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tpudiag.parsers.oom_error import parse_oom_error

GiB, MiB = 1 << 30, 1 << 20
VMEM = Path(__file__).resolve().parent.parent / "fixtures" / "llo" / "vmem_oom"


def test_hbm_temporaries_form_measured_on_v5e():
    text = ("Traceback (most recent call last):\n  ...\njax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of "
            "memory on HBM, the total memory required for HLO temporaries (17.00G) exceeds available HBM (15.75G).\n")
    e = parse_oom_error(text)
    assert (e.space, e.kind) == ("hbm", "hbm-temporaries")
    assert (e.required_bytes, e.available_bytes) == (17 * GiB, int(15.75 * GiB))
    assert e.over_by_bytes == int(1.25 * GiB)
    assert e.message.startswith("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM")


def test_hbm_capacity_and_runtime_allocation_forms():
    e = parse_oom_error("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space hbm. "
                        "Used 20.00G of 15.48G hbm. Exceeded hbm capacity by 4.52G.")
    assert (e.kind, e.required_bytes, e.exceeded_by_bytes) == ("hbm-capacity", 20 * GiB, round(4.52 * GiB))
    e = parse_oom_error("RESOURCE_EXHAUSTED: Error allocating device buffer: Attempting to allocate 1.00G. "
                        "That was not possible. There are 512.00M free.; (0x0x0_HBM0)")
    assert (e.kind, e.required_bytes, e.available_bytes) == ("hbm-allocation", GiB, 512 * MiB)


def test_vmem_forms_come_from_the_vmem_parser():
    e = parse_oom_error((VMEM / "scoped_v5e.txt").read_text())
    assert (e.space, e.kind, e.hlo) == ("vmem", "scoped", "f.1")
    assert (e.required_bytes, e.available_bytes, e.over_by_bytes) == (28 * MiB, 16 * MiB, 12 * MiB)
    e = parse_oom_error((VMEM / "window_capacity_v5e.txt").read_text())
    assert (e.space, e.kind, e.available_bytes) == ("vmem", "capacity", 128 * MiB)


def test_near_misses_are_not_oom_errors():
    assert parse_oom_error("") is None
    assert parse_oom_error("INVALID_ARGUMENT: shapes do not match") is None
    assert parse_oom_error("RESOURCE_EXHAUSTED: Ran out of memory on HBM") is None  # no figures


@given(st.text(max_size=300))
def test_any_text_parses_or_gives_none(text):
    from tpudiag.parsers.oom_error import OomSizeError

    try:
        e = parse_oom_error(text)
    except OomSizeError:
        return
    assert e is None or e.required_bytes >= 0


# Texts written after real public reports (`tests/fixtures/oom/`): the TensorFlow TPU runtime's
# report of a v3 OOM (a one-hot padded 12.6x), libtpu's report under JAX (the same one-hot in a
# JAX program `seg_step`, figures changed), libtpu's report of a 64 GB attention program, and the
# runtime allocator reserving program memory.
OOM = Path(__file__).resolve().parent.parent / "fixtures" / "oom"


def test_tensorflow_report_gives_overrun_breakdown_and_the_padded_allocation():
    e = parse_oom_error((OOM / "tf_tpu_v3_onehot.txt").read_text())
    assert (e.form, e.kind) == ("tf-tpu-compile", "hbm-capacity")
    assert e.over_by_bytes == round(1.6 * GiB) and e.available_bytes == 16 * GiB
    assert [(p.name, p.size_bytes) for p in e.requirement] == [
        ("reserved", 12 * 1024), ("global", 980 * 1024), ("scoped", round(5.41 * MiB)), ("HLO temp", round(17.08 * GiB))]
    assert e.part("arguments").size_bytes is None  # `arguments unknown size`
    top = e.allocations[0]
    assert (top.size_bytes, top.unpadded_bytes, top.padding_bytes) == (512 * MiB, round(40.5 * MiB), round(471.5 * MiB))
    assert top.expansion == 12.6 and (top.op_type, top.op_name, top.instruction) == ("OneHot", "one_hot", "fusion.1668")
    assert top.shape == "f32[4,128,128,9,18]{4,3,0,2,1:T(8,128)}" and top.allocation_type == "HLO temp"
    assert e.programs == ()  # TensorFlow's op names name no jit program


def test_libtpu_report_names_its_program_and_its_outputs():
    e = parse_oom_error((OOM / "libtpu_jax_onehot.txt").read_text())
    assert e.form == "libtpu-compile" and e.programs == ("jit_seg_step",)
    assert (e.output_bytes, e.output_shared_bytes) == (720 * MiB, 0)
    assert e.allocations[0].source_file == "/home/user/seg.py" and e.allocations[0].source_line == 41
    big = parse_oom_error((OOM / "libtpu_jax_train_step.txt").read_text())
    assert big.over_by_bytes == round(33.05 * GiB) and big.programs == ("jit_train_step",)


def test_runtime_reserve_form():
    e = parse_oom_error((OOM / "tpu_runtime_reserve.txt").read_text())
    assert (e.form, e.kind, e.required_bytes, e.available_bytes) == (
        "tpu-runtime-reserve", "hbm-allocation", round(3.95 * GiB), round(1.92 * GiB))
    assert [p.name for p in e.persistent] == ["arguments", "output"]


def test_a_size_past_any_device_is_an_error_not_an_overflow():
    import pytest

    from tpudiag.parsers.oom_error import OomSizeError

    for text in (f"Ran out of memory in memory space hbm. Used 1{'0' * 309}G of 16.00G hbm.",
                 f"Ran out of memory in memory space hbm. Used 1{'0' * 30}G of 16.00G hbm.",
                 f"Allocation (size={'9' * 400}) would exceed memory (size=134217728) :: f.1"):
        try:
            parse_oom_error(text)
        except OomSizeError as exc:
            assert "past any device's memory" in str(exc)
        except OverflowError:  # the regression: float('1e309') -> inf -> int()
            pytest.fail("OverflowError")
