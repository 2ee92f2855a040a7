"""Read a `tpudiag compile` output directory through the project's HLO and LLO parsers.

This is the one place that knows which parser reads which file, so the static report and the
simulator stay independent of the parsers' entry points:

- HLO: `compiled.hlo.txt` (`compiled.as_text()`, which carries the static profile's
  `bundle_analysis_data` cycles) via `tpudiag.parsers.hlo_text.parse_hlo_text`; the XLA dump's
  buffer assignment and memory report via `load_hlo_dump` when the text is absent.
- LLO: `tpudiag.parsers.llo.load_llo_dump` on `llo/` (+ `static_profile/`): per-op spills.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pandas as pd

from tpudiag.errors import InputError
from tpudiag.parsers.input_files import read_input_bytes, read_input_text
from tpudiag.model.compile_output import (HLO_PROTO_FILE, HLO_TEXT_FILE, LLO_DIR, PROFILE_DIR, RESULT_FILE, XLA_DIR,
                                          CompileOutput)
from tpudiag.model.collectives import replica_group_size
from tpudiag.model.compiled import CompiledDump, CompiledProgram
from tpudiag.model.llo import LloDump
from tpudiag.model.matmuls import cost_estimate, instruction_matmul



def matmul_flops(program: CompiledProgram) -> dict[tuple[str, str], float]:
    """(computation, instruction) -> FLOPs of each dot, convolution and custom call, from the op math
    model (`model.matmuls`: 2 x batch x M x N x K, only window taps that land on real input counted).
    A custom call (a Pallas kernel) counts its declared `cost_estimate`, else its matmul-shaped
    operands, in the order the analysis derives a trace's custom-call FLOPs (`analysis.custom_calls`)."""
    flops: dict[tuple[str, str], float] = {}
    for (computation, _), inst in program.instructions.items():
        if inst.opcode not in ("dot", "convolution", "custom-call"):
            continue
        declared = cost_estimate(inst.backend_config) if inst.opcode == "custom-call" else None
        if declared is not None and declared[0] > 0:
            flops[(computation, inst.name)] = declared[0]
            continue
        mm = instruction_matmul(program, inst)
        if mm is not None:
            flops[(computation, inst.name)] = float(mm.flops)
    return flops


def replica_group_sizes(program: CompiledProgram) -> dict[str, int]:
    """Instruction (and computation) name -> participants per replica group, where stated.

    A computation's entry is the size of the first collective inside it, so an async wrapper
    fusion can find the size of the collective it calls.
    """
    sizes: dict[str, int] = {}
    for (computation, _), inst in program.instructions.items():
        size = replica_group_size(inst.attributes_text()) if inst.attributes else None
        if size:
            sizes[inst.name] = size
            sizes.setdefault(f"computation:{computation}", size)
    return sizes


def llo_spills(llo: LloDump | None) -> pd.DataFrame:
    """Per-op VMEM spill stores and fills of an LLO dump (bundle profile); empty without one."""
    if llo is None or llo.ops.empty:
        return pd.DataFrame({"hlo": pd.Series(dtype="string"), "spill_stores": pd.Series(dtype="Int64"),
                             "spill_fills": pd.Series(dtype="Int64")})
    ops = llo.ops
    return pd.DataFrame({"hlo": ops["name"].astype("string"), "spill_stores": ops["spill_stores"].astype("Int64"),
                         "spill_fills": ops["spill_fills"].astype("Int64")})


def _read_llo(out: Path) -> LloDump | None:
    """The LLO dump of a compile output (`llo/` + `static_profile/`), None when it has none."""
    from tpudiag.parsers.llo import load_llo_dump

    llo = out / LLO_DIR
    if not llo.is_dir() or not any(llo.iterdir()):
        return None
    profile_dir = out / PROFILE_DIR
    return load_llo_dump(llo, static_profile_dir=profile_dir if profile_dir.is_dir() else None)


def load_compile_output(path: Path) -> CompileOutput:
    """Parse a directory written by `tpudiag compile`; InputError when it is not one."""
    from tpudiag.parsers.hlo_text import load_hlo_dump

    facts = compile_facts(path)  # not a compile output, or a failed compile: said before its dumps are read
    dump = load_hlo_dump(path / XLA_DIR) if (path / XLA_DIR).is_dir() else None
    return compile_output_of(path, facts, dump, _read_llo(path))


def compile_output_of(path: Path, facts: dict, dump: CompiledDump | None, llo: LloDump | None) -> CompileOutput:
    """The `CompileOutput` of the compile output directory `path`, from its `result.json` (`facts`,
    `compile_facts`) and its XLA dump (`xla/`) and LLO dump (`llo/`), already read (None where it
    has none): only its own `compiled.hlo.txt` and `module.pb` are read here."""
    from tpudiag.parsers.hlo_text import parse_hlo_text

    warnings: list[str] = []
    text_file = path / HLO_TEXT_FILE
    if text_file.is_file():
        program = parse_hlo_text(read_input_text(text_file), text_file)
        if dump is not None and dump.programs:  # buffers and memory report come from the XLA dump
            base = dump.programs[-1]
            program.allocations = base.allocations
            program.total_bytes_used = base.total_bytes_used
            program.memory_spaces = base.memory_spaces
            program.target = base.target
            program = with_kernel_bodies(program, base)
    elif dump is not None and dump.programs:
        program = dump.programs[-1]
    else:
        raise InputError(f"no `{HLO_TEXT_FILE}` and no XLA dump here", path=path)
    warnings.extend(program.warnings)
    if llo is not None:
        warnings.extend(llo.warnings)
    proto_file = path / HLO_PROTO_FILE
    proto = read_input_bytes(proto_file) if proto_file.is_file() else None
    return CompileOutput(path=path, facts=facts, program=program, spills=llo_spills(llo),
                         group_sizes=replica_group_sizes(program), matmul_flops=matmul_flops(program),
                         hlo_proto=proto, warnings=warnings)


def with_kernel_bodies(program: CompiledProgram, dumped: CompiledProgram) -> CompiledProgram:
    """`program` (`compiled.as_text()`, whose Pallas custom calls lost their kernel body in the
    backend) with each such call's body taken from the same call in the XLA dump (`dumped`, written
    before the backend ran): its backend_config merged (`parsers.mosaic.merged_config`) and its kernel
    read. The program is changed in place and returned."""
    from tpudiag.parsers import mosaic
    from tpudiag.parsers.hlo_program import read_kernels

    changed = False
    for key, inst in program.instructions.items():
        if inst.custom_call_target != mosaic.KERNEL_TARGET or mosaic.body_of(inst.backend_config) is not None:
            continue
        before = dumped.find(inst.name)
        if before is None or before.custom_call_target != mosaic.KERNEL_TARGET:
            continue
        merged = mosaic.merged_config(inst.backend_config, before.backend_config)
        if merged != inst.backend_config:
            program.instructions[key] = dataclasses.replace(inst, backend_config=merged)
            changed = True
    if changed:
        program.kernels = read_kernels(program)
    return program


def compiled_text_beside(xla_dump: Path) -> CompiledProgram | None:
    """The `compiled.hlo.txt` beside the XLA dump `xla_dump` (a `tpudiag compile` output's `xla/`),
    parsed; None when absent or unreadable."""
    from tpudiag.parsers.hlo_text import load_hlo_text

    path = Path(xla_dump).parent / HLO_TEXT_FILE
    try:
        return load_hlo_text(path) if path.is_file() else None
    except InputError:
        return None


def result_beside(xla_dump: Path) -> dict:
    """The `result.json` beside the XLA dump `xla_dump` (a `tpudiag compile` output's), whatever its
    status; {} when absent or unreadable."""
    path = Path(xla_dump).parent / RESULT_FILE
    try:
        facts = json.loads(read_input_text(path)) if path.is_file() else {}
    except (InputError, ValueError, RecursionError):
        return {}
    return facts if isinstance(facts, dict) else {}


def compile_facts(path: Path) -> dict:
    """The `result.json` of a successful `tpudiag compile`; InputError otherwise."""
    if not path.is_dir():
        raise InputError("no such directory (expected the output of `tpudiag compile`)", path=path)
    result = path / RESULT_FILE
    if not result.is_file():
        raise InputError(f"no `{RESULT_FILE}` here: not a `tpudiag compile` output directory", path=path,
                         hint="run `tpudiag compile MODULE:FUNCTION --topology v5e:2x2 -o DIR` first")
    try:
        facts = json.loads(read_input_text(result))
    except (ValueError, RecursionError) as exc:
        raise InputError(f"unreadable `{RESULT_FILE}`: {exc}", path=path) from exc
    if facts.get("status") != "ok":
        raise InputError(f"the compile recorded here did not succeed ({facts.get('message', 'no message')})",
                         path=path)
    return facts
