"""`CompileOutput.target_chip`: the generation a compile's `result.json` names, else its device kind;
an unknown one is an `InputError` naming the output and both facts."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from tpudiag.errors import InputError
from tpudiag.model.compile_output import CompileOutput
from tpudiag.model.compiled import CompiledProgram


PROGRAM = CompiledProgram(module="m", path="", source="hlo_text", entry="main", is_scheduled=True, computations={},
                          instructions={})


def _output(**facts) -> CompileOutput:
    return CompileOutput(path=Path("/runs/out"), facts=facts, program=PROGRAM, spills=pd.DataFrame(),
                         group_sizes={}, matmul_flops={}, hlo_proto=None)


def test_the_generation_is_read_first_then_the_device_kind():
    assert _output(generation="v6e", device_kind="TPU v5 lite").target_chip().generation == "v6e"
    assert _output(device_kind="TPU v5 lite").target_chip().generation == "v5e"
    assert _output(generation="v9z", device_kind="TPU v4").target_chip().generation == "v4"
    assert _output(generation=None, device_kind="TPU v5p").target_chip().generation == "v5p"


@pytest.mark.parametrize("facts, text", [
    ({"generation": "v9z", "device_kind": "TPU v9z"}, "generation 'v9z', device kind 'TPU v9z'"),
    ({}, "generation None, device kind None"),
])
def test_an_unknown_chip_names_the_output_and_both_facts(facts, text):
    with pytest.raises(InputError) as info:
        _output(**facts).target_chip()
    assert info.value.message == f"unknown TPU generation in the compile output ({text})"
    assert info.value.path == "/runs/out"
