"""Public hardware figures for TPU generations, in one frozen table.

Figures are per chip from public Google Cloud TPU documentation and jax-ml/scaling-book; a trace's
own plane stats (peak FLOP/s, HBM bandwidth) take precedence when present. `clock_hz` is None
where it is not public: v6e's clock cannot be derived consistently from public peaks
(see `shared/reference/tpu-compiler-dumps.md` §8.2).
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


@dataclass(frozen=True)
class ChipSpec:
    generation: str  # canonical name: v4, v5e, v5p, v6e, TPU7x
    peak_bf16_flops_per_s: float  # per chip
    hbm_bytes_per_s: float  # per chip
    hbm_capacity_bytes: int
    tensorcores_per_chip: int
    mxu_per_core: int
    mxu_dim: int  # systolic array side: 128 or 256
    vmem_bytes: int  # per TensorCore
    clock_hz: float | None
    ici_bytes_per_s_per_link: float  # one direction
    ici_links: int
    trace_names: tuple[str, ...]  # lower-case substrings seen in device_type_string / device_kind
    # The host link (PCIe), nominal bytes/s per chip and direction; None where no public figure
    # gives it. jax-ml/scaling-book, "How to Think About TPUs" (tpus.md): "PCIe bandwidth for TPU v4
    # is 16GB / second each way"; "typically around 1.5e10 bytes / second per chip" (v5e, v5p);
    # "Trillium (TPU v6e) has 32GB/s, about 2x higher than v5". Nominal: what a transfer achieves is
    # lower, and reports say "nominal" beside it.
    host_link_bytes_per_s: float | None = None

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.peak_bf16_flops_per_s / self.hbm_bytes_per_s


GIB = 1 << 30
MIB = 1 << 20

CHIPS: tuple[ChipSpec, ...] = (
    ChipSpec("v4", 275e12, 1200e9, 32 * GIB, 2, 4, 128, 16 * MIB, 1.05e9, 45e9, 6, ("tpu v4",),
             host_link_bytes_per_s=16e9),
    ChipSpec("v5e", 197e12, 819e9, 16 * GIB, 1, 4, 128, 128 * MIB, 1.5e9, 45e9, 4,
             ("tpu v5 lite", "tpu v5e", "tpu v5litepod"), host_link_bytes_per_s=15e9),
    ChipSpec("v5p", 459e12, 2765e9, 95 * GIB, 1, 4, 128, 64 * MIB, 1.75e9, 90e9, 6, ("tpu v5p", "tpu v5"),
             host_link_bytes_per_s=15e9),
    ChipSpec("v6e", 918e12, 1640e9, 32 * GIB, 1, 2, 256, 128 * MIB, None, 90e9, 4,
             ("tpu v6 lite", "tpu v6e", "trillium"), host_link_bytes_per_s=32e9),
    ChipSpec("TPU7x", 2307e12, 7370e9, 192 * GIB, 2, 2, 256, 64 * MIB, None, 200e9, 6,
             ("tpu7x", "tpu v7x", "tpu v7", "ironwood")),
)

_BY_GENERATION = {c.generation.lower(): c for c in CHIPS}

# The names `--chip` and `chip=` accept (lower case), in the table's order: the one list of them.
CHIP_NAMES: tuple[str, ...] = tuple(_BY_GENERATION)


def chip_for(name: str | None) -> ChipSpec | None:
    """The spec for a generation name (`v6e`) or a device type string (`TPU v6 Lite`), else None.

    Matching is case-insensitive and by substring, longest pattern first, because trace strings
    (`TPU v6 Lite`) and JAX's device_kind (`TPU v6 lite`) differ and `tpu v5` is a prefix of
    `tpu v5 lite`.
    """
    if not name:
        return None
    key = name.strip().lower()
    if key in _BY_GENERATION:
        return _BY_GENERATION[key]
    patterns = sorted(((p, c) for c in CHIPS for p in c.trace_names), key=lambda pc: -len(pc[0]))
    for pattern, chip in patterns:
        if pattern in key:
            return chip
    return None


def smallest_topology(chip: ChipSpec) -> str:
    """The smallest single-host libtpu topology of a generation: a 2x2 of a 2D torus (4 ICI links
    per chip: v5e, v6e), a 2x2x1 of a 3D one (6 links: v4, v5p, TPU7x)."""
    return f"{chip.generation}:{'2x2' if chip.ici_links == 4 else '2x2x1'}"


class ChipSource(str, Enum):
    """Where a diagnosis's chip came from, most trusted first; the value is how reports say it."""

    TRACE = "from the capture"  # the device plane names it: what the program ran on
    DUMP = "from the dump's target"  # `target_arguments.txt` (or a `tpudiag compile` output) names it
    LLO = "inferred from the LLO dump"  # MXUs per core and VMEM capacity match exactly one chip
    USER = "from --chip"  # the caller said it, and no file does
    UNKNOWN = "unknown"  # nothing says it: no chip


@dataclass(frozen=True)
class ChipChoice:
    """The one chip a diagnosis uses (None when unknown), where it came from, and what to warn."""

    spec: ChipSpec | None
    source: ChipSource
    warnings: tuple[str, ...] = ()


def decide_chip(*, trace: ChipSpec | None = None, target: str = "", llo: str = "",
                user: ChipSpec | None = None, what: str = "dump") -> ChipChoice:
    """The chip a diagnosis uses, decided once: the capture's device, else the generation the
    dump's target names (`target`), else the one its LLO dump implies (`llo`), else `--chip`
    (`user`). Files win over `--chip`, which only fills in what they do not say; a `--chip` that
    disagrees with them is ignored with a warning. `what` names the input for the warnings
    (`dump`, `capture`).
    """
    warnings: list[str] = []
    spec, source = trace, ChipSource.TRACE
    if spec is None:
        spec, source = chip_for(target), ChipSource.DUMP
    if spec is None:
        spec, source = chip_for(llo), ChipSource.LLO
        if spec is not None:
            warnings.append(f"TPU generation {spec.generation} inferred from the LLO dump (MXUs per core and VMEM "
                            "capacity): no `target_arguments.txt` here")
    if spec is not None and user is not None and user.generation != spec.generation:
        ran = "ran on" if source is ChipSource.TRACE else "was compiled for"
        warnings.append(f"--chip {user.generation} ignored: the {what} {ran} {spec.generation}")
    elif spec is None and user is not None:
        spec, source = user, ChipSource.USER
        warnings.append(f"TPU generation {spec.generation} from --chip: the {what} does not name it")
    return ChipChoice(spec, source if spec is not None else ChipSource.UNKNOWN, tuple(warnings))


# HBM the TPU compiler lets one program use, as its out-of-memory message reports it ("exceeds
# available HBM (15.75G)"): measured on v5e (16 GiB) with libtpu 0.0.42.1. Other generations keep
# some HBM back too, by amounts not measured here; their public capacity is then the bound.
COMPILER_USABLE_HBM_BYTES: dict[str, int] = {"v5e": 16128 * MIB}

# The scoped VMEM limit a kernel or fusion gets unless it sets its own (Pallas:
# `pltpu.CompilerParams(vmem_limit_bytes=...)`), as libtpu 0.0.42.1 printed it in its
# `CompileTimeScopedVmemOom` message for each generation (measured deviceless, `<gen>:1x1`).
DEFAULT_SCOPED_VMEM_BYTES: dict[str, int] = {"v5e": 16 * MIB, "v5p": 16 * MIB, "v6e": 32 * MIB, "TPU7x": 32 * MIB}
