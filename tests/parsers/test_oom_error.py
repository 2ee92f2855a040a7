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
    e = parse_oom_error(text)
    assert e is None or e.required_bytes >= 0
