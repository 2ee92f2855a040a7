"""An unknown chip in a compile output is the file's fault: an `InputError` naming the output, alike
from the static report and the simulator (one was a `UsageError` before; issue 32 §2)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from tpudiag.compiler.simulate import simulate_in_memory
from tpudiag.compiler.static_report import build_static_report
from tpudiag.errors import InputError
from tpudiag.parsers.compile_output import load_compile_output

DUMPS = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps" / "transformer_train_v5e"


@pytest.fixture(scope="module")
def unknown_chip():
    output = load_compile_output(DUMPS)
    return dataclasses.replace(output, facts={**output.facts, "generation": "v9z", "device_kind": "TPU v9z"})


def test_the_known_chip_is_read():
    assert load_compile_output(DUMPS).target_chip().generation == "v5e"


@pytest.mark.parametrize("reader", [build_static_report, simulate_in_memory], ids=["static-report", "simulate"])
def test_an_unknown_chip_is_an_input_error_naming_the_output(unknown_chip, reader):
    with pytest.raises(InputError, match="unknown TPU generation.*'v9z'") as info:
        reader(unknown_chip)
    assert Path(info.value.path) == DUMPS
