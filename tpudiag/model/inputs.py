"""The compiled inputs of one diagnosis: LLO dumps and HLO programs, each with where it came from.

Built by `tpudiag.diagnose` from `--dumps` directories, a compiler dump given as PATH and the
HloProtos a capture embeds; read by the join (`tpudiag.analysis.join`) and by rules through
`RuleContext.compiled`. Typed fields only: nothing here is keyed by strings or probed for.
"""

from __future__ import annotations

from dataclasses import dataclass

from tpudiag.model.compiled import CompiledProgram
from tpudiag.model.hardware import ChipSpec
from tpudiag.model.llo import LloDump
from tpudiag.model.memory import OomError

CAPTURE_ORIGIN = "capture"  # HloInput.origin of the HloProtos a capture embeds


@dataclass(frozen=True)
class HloInput:
    """One compiled HLO program and where it came from."""

    program: CompiledProgram
    origin: str  # the XLA dump directory, or `capture` for the HloProto a capture embeds
    generation: str = ""  # the TPU generation its `target_arguments.txt` names; '' when unknown


@dataclass(frozen=True)
class CompiledInputs:
    """Everything compiled that one diagnosis has; empty tuples where an input is absent."""

    llo: tuple[LloDump, ...] = ()  # `--xla_jf_dump_to` dumps; each knows its own `path`
    hlo: tuple[HloInput, ...] = ()  # from XLA dumps (`--xla_dump_to`), in the order given
    embedded: tuple[HloInput, ...] = ()  # the HloProtos the capture embeds (origin `capture`)
    labels: tuple[str, ...] = ()  # one per dump directory: `DIR (LLO + XLA)`, as reports print it
    chip: ChipSpec | None = None  # from `--chip`, the dump's target or the trace; None when unknown
    warnings: tuple[str, ...] = ()  # what reading the dumps set aside (skipped files, damaged instructions)
    oom_errors: tuple[OomError, ...] = ()  # `--error`: the RESOURCE_EXHAUSTED messages of this compile or run
    # Whether `oom_errors` may join these programs: off for the bundled example, nobody's program.
    oom_errors_joinable: bool = True

    @property
    def programs(self) -> tuple[CompiledProgram, ...]:
        """The programs rules read: the dumps' when given, else the capture's own."""
        return tuple(h.program for h in (self.hlo or self.embedded))

    @property
    def empty(self) -> bool:
        return not (self.llo or self.hlo or self.embedded)
