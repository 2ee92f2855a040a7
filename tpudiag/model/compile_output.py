"""A compile's output as tpudiag reads it: the files a `tpudiag compile` directory holds, and
`CompileOutput`, what the readers (`parsers.compile_output`, `parsers.dump_dir`) make of it or of a
bare XLA/LLO dump, for the static report, the simulator and the memory model (`compiler`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from tpudiag.model.compiled import CompiledProgram
from tpudiag.errors import InputError
from tpudiag.model.hardware import ChipChoice, ChipSpec, chip_for

# A `tpudiag compile` output directory (`compiler.driver` writes it, `compiler.worker` the files).
XLA_DIR, LLO_DIR, PROFILE_DIR = "xla", "llo", "static_profile"  # --xla_dump_to, --xla_jf_dump_to, static LLO profile
RESULT_FILE = "result.json"
HLO_TEXT_FILE = "compiled.hlo.txt"  # `compiled.as_text()`: carries bundle_analysis_data cycles
HLO_PROTO_FILE = "module.pb"  # the optimised HloModuleProto


@dataclass
class CompileOutput:
    """What one `tpudiag compile` run left behind, parsed."""

    path: Path
    facts: dict  # result.json
    program: CompiledProgram
    spills: pd.DataFrame  # columns: hlo, spill_stores, spill_fills (empty without an LLO dump)
    group_sizes: dict[str, int]  # instruction name -> replica group size, where the text states one
    matmul_flops: dict[tuple[str, str], float]  # (computation, instruction) -> dot/convolution/custom-call FLOPs
    hlo_proto: bytes | None
    warnings: list[str] = field(default_factory=list)
    chip: ChipChoice | None = None  # the generation and where it came from (`model.hardware.decide_chip`)
    bare: bool = False  # a bare XLA/LLO dump, no `result.json`: its facts stand in (`parsers.dump_dir`)

    def target_chip(self) -> ChipSpec:
        """The chip the program was compiled for, from its facts (`generation`, else `device_kind`).

        An unknown one is the file's fault, so an `InputError` naming the output, on every path
        (static report, simulate, memory) alike."""
        chip = chip_for(self.facts.get("generation")) or chip_for(self.facts.get("device_kind"))
        if chip is None:
            raise InputError(f"unknown TPU generation in the compile output (generation "
                             f"{self.facts.get('generation')!r}, device kind {self.facts.get('device_kind')!r})",
                             path=self.path)
        return chip
