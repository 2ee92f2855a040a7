"""Findings: what a rule reports, with its evidence, estimated saving and fix."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum, StrEnum


class Severity(IntEnum):
    INFO = 0
    LOW = 1
    MEDIUM = 2
    HIGH = 3

    @classmethod
    def parse(cls, text: str) -> "Severity":
        try:
            return cls[text.strip().upper()]
        except KeyError as exc:
            raise ValueError(f"unknown severity {text!r}; expected one of "
                             f"{', '.join(s.name.lower() for s in cls)}") from exc

    def label(self) -> str:
        return self.name.lower()


class Basis(StrEnum):
    """How a saving was obtained; the value is what reports and the JSON print."""

    MEASURED = "measured"  # from the capture's own times
    MODELLED = "modelled"  # from a model over measured or compiled facts
    COMPILER_ESTIMATE = "compiler estimate"  # from the compiler's cycle estimate (compiler dumps alone)


@dataclass(frozen=True)
class Saving:
    """An upper bound on the time a fix could save per step, with how it was obtained."""

    ps: int
    basis: Basis  # a `Basis` value given as a string is converted; any other string is a ValueError
    explanation: str
    bytes: int = 0  # memory findings: device memory a fix could free (an upper bound), not time
    per: str = "step"  # what `ps` is per: "step", or "capture" where the capture has no steps

    def __post_init__(self) -> None:
        object.__setattr__(self, "basis", Basis(self.basis))
        if self.per not in ("step", "capture"):
            raise ValueError(f"Saving.per must be 'step' or 'capture', got {self.per!r}")


@dataclass(frozen=True)
class Evidence:
    """One row of evidence: the op (or step, or array) and the numbers that implicate it."""

    subject: str
    values: tuple[tuple[str, str], ...]  # (label, formatted value)


@dataclass(frozen=True)
class OpSite:
    """Where an op comes from in the user's program: its HLO metadata, as the trace or dump gives it."""

    op: str  # HLO instruction name
    source: str  # `file.py:LINE`; '' when unknown
    tf_op: str  # JAX op name (the name stack, e.g. `jit(train_step)/transpose(jvp())/dot_general`); '' when unknown

    def label(self) -> str:
        return ", ".join(part for part in (self.source, self.tf_op) if part)


@dataclass(frozen=True)
class Quantity:
    """One quantity a finding states, typed, so it can be checked against the input it came from.

    `subject` is the op the finding names; `instruction` the HLO instruction the value belongs to
    when that is not the op itself (the matmul inside a fusion). Names in use: `M`, `N`, `K`,
    `batch` (a matmul's dims), `lhs dtype`, `rhs dtype`, `result dtype` (its operands' and
    accumulation types), `FLOP utilization`, `HBM bandwidth utilization` (fractions of the core's
    peak), `FLOP/s`, `HBM bytes/s`, `time share` (of device time), `HBM bytes per step`.
    """

    subject: str
    name: str
    value: int | float | str
    instruction: str = ""


@dataclass(frozen=True)
class Finding:
    rule: str  # kebab-case rule name
    code: str  # stable code, e.g. TPD101
    severity: Severity
    message: str  # one line, numbers inline
    saving: Saving
    fix: str  # one line
    evidence: tuple[Evidence, ...] = field(default_factory=tuple)
    host: str = ""
    ops: tuple[str, ...] = ()  # op names the finding cites; several ops of one shape when grouped
    blocking: bool = False  # the program cannot run as compiled (out of memory): ranked before any saving
    sites: tuple[OpSite, ...] = ()  # source line and JAX op name of each cited op that has them
    quantities: tuple[Quantity, ...] = ()  # what the message and evidence state, typed (see Quantity)


def saving_amount(s: Saving) -> str:
    """`1.20 ms per step`, `6.25 GiB of device memory` for a memory finding, or `not estimated`."""
    from tpudiag.model.units import fmt_bytes, fmt_time

    if s.bytes and not s.ps:
        return f"{fmt_bytes(s.bytes)} of device memory"
    if not s.ps:
        return "not estimated"  # never "0 ps": a saving not estimated is not a saving of nothing
    return f"{fmt_time(s.ps)} {'per step' if s.per == 'step' else 'over the capture'}"


def rank_key(f: Finding) -> tuple:
    """How findings are ranked: what stops the program first, then by saving, then by severity."""
    return (not f.blocking, -f.saving.ps, -int(f.severity), f.code, f.message)
