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
class VmemBandwidth:
    """Peak VMEM bandwidth of one TensorCore, bytes/s per direction, and where the figure comes from.

    No Google document gives it. A trace's own `peak_vmem_rd_bw_gigabytes_per_second` and
    `peak_vmem_wr_bw_gigabytes_per_second` plane stats (what libtpu's profiler stamps, and XProf's
    roofline draws) take precedence; the table below holds what a source outside the trace says.
    """

    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str  # how reports cite it

    def describe(self, fmt) -> str:
        """`VMEM 18 TB/s (approximate: ...)` for report headers; `fmt` formats a bandwidth."""
        same = self.read_bytes_per_s == self.write_bytes_per_s
        rates = (fmt(self.read_bytes_per_s) if same else
                 f"{fmt(self.read_bytes_per_s)} read, {fmt(self.write_bytes_per_s)} write")
        return f"VMEM {rates} ({self.source})"


# v5e: jax-ml/scaling-book, "How to Think About TPUs" (tpus.md): VMEM "has much higher bandwidth to
# the MXU", about 22x HBM's on v5e; one approximate figure, applied to reads and to writes alike.
# v6e: what libtpu's profiler stamped on the device plane of a real v6e capture
# (`shared/data/real-captures/tpu-v6e-hostoffload-inference`: `peak_vmem_rd_bw_gigabytes_per_second`
# 23296.0, `peak_vmem_wr_bw_gigabytes_per_second` 16128.0, beside HBM 1638.0). Other generations: none
# known, so no VMEM roof is drawn for them unless their trace records one.
V5E_VMEM = VmemBandwidth(22 * 819e9, 22 * 819e9, "approximate: about 22x HBM (jax-ml/scaling-book)")
V6E_VMEM = VmemBandwidth(23296e9, 16128e9, "as libtpu's profiler records it on v6e")


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
    vmem_bandwidth: VmemBandwidth | None = None  # per TensorCore; None where no source gives it

    @property
    def ridge_flops_per_byte(self) -> float:
        return self.peak_bf16_flops_per_s / self.hbm_bytes_per_s

    @property
    def ici_bytes_per_s(self) -> float:
        """ICI peak of one chip: every link's one-way bandwidth together, the most a chip can send
        (a ring over one torus axis uses two of its links, both ways)."""
        return self.ici_bytes_per_s_per_link * self.ici_links


GIB = 1 << 30
MIB = 1 << 20

CHIPS: tuple[ChipSpec, ...] = (
    ChipSpec("v4", 275e12, 1200e9, 32 * GIB, 2, 4, 128, 16 * MIB, 1.05e9, 45e9, 6, ("tpu v4",),
             host_link_bytes_per_s=16e9),
    ChipSpec("v5e", 197e12, 819e9, 16 * GIB, 1, 4, 128, 128 * MIB, 1.5e9, 45e9, 4,
             ("tpu v5 lite", "tpu v5e", "tpu v5litepod"), host_link_bytes_per_s=15e9, vmem_bandwidth=V5E_VMEM),
    ChipSpec("v5p", 459e12, 2765e9, 95 * GIB, 1, 4, 128, 64 * MIB, 1.75e9, 90e9, 6, ("tpu v5p", "tpu v5"),
             host_link_bytes_per_s=15e9),
    ChipSpec("v6e", 918e12, 1640e9, 32 * GIB, 1, 2, 256, 128 * MIB, None, 90e9, 4,
             ("tpu v6 lite", "tpu v6e", "trillium"), host_link_bytes_per_s=32e9, vmem_bandwidth=V6E_VMEM),
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


# -- GPUs -----------------------------------------------------------------------------------------
#
# A GPU plane (`/device:GPU:N`) records its capabilities as stats (`device_vendor`, `compute_cap_major`
# and `_minor`, `core_count` SMs or CUs, `clock_rate` in kHz, `memory_bandwidth` in B/s,
# `memory_size` in bytes; `xprof/utils/device_caps_utils.cc`), but no peak FLOP/s. The peak is
# per SM (CU) per cycle times SMs times clock, with the per-cycle figure per generation below: the
# dense matrix (tensor core / MFMA) rate for bf16 or fp16, FMA counted as two FLOPs. HBM bandwidth
# is the plane's own `memory_bandwidth`, as XProf takes it, except on the AMD parts below: ROCm's
# profiler (XLA's `rocm_collector`) writes 2 x the agent's maximum memory clock x bus width / 8,
# which counts HBM3 and HBM3E at two transfers per reported clock where they make four: an MI300X
# plane says 2.66 TB/s (1,300 MHz x 8,192 bits), AMD's datasheet 5.3 TB/s; an MI355X plane
# 4.10 TB/s, the datasheet 8 TB/s. Ops on the real captures run above the plane's figure (a
# convolution at 3.65 TB/s on the MI300X, reductions at 6.6-7.1 TB/s on the MI355X), never above
# the datasheet's. NVIDIA planes are right (a V100's 898 GB/s is its datasheet's 900 GB/s).
#
# Sources: NVIDIA's V100, A100, H100 and B200 whitepapers and datasheets (dense fp16/bf16 tensor
# TFLOP/s divided by SMs x boost clock: V100 125 TF / (80 x 1.53 GHz) = 1024; A100 312 TF /
# (108 x 1.41 GHz) = 2048; H100 SXM 989 TF / (132 x 1.83 GHz) = 4096); AMD's CDNA 3 and CDNA 4
# whitepapers (MI300X 1307 TF / (304 CU x 2.1 GHz) = 2048; MI355X 2517 TF / (256 CU x 2.4 GHz) =
# 4096), which XProf's `GetAmdFlopCapsPerCuPerCycle` also holds. Generations not listed get no
# peak FLOP/s: utilizations and the roofline are then not shown, never guessed.


@dataclass(frozen=True)
class GpuGeneration:
    vendor: str  # "NVIDIA" or "AMD"
    compute_capability: tuple[int, int]  # NVIDIA's; AMD's gfx major.minor as ROCm reports it
    arch: str  # Volta, Ampere, ...; gfx942, gfx950
    model: str  # the data-centre part of that generation, as people name it
    matrix_flops_per_core_per_cycle: int  # dense bf16/fp16 tensor-core (MFMA) FLOPs per SM (CU)
    matrix_dtype: str = "bf16"  # the type that rate is for: Volta's and Turing's tensor cores have no bf16


GPU_GENERATIONS: tuple[GpuGeneration, ...] = (
    GpuGeneration("NVIDIA", (7, 0), "Volta", "V100", 1024, "fp16"),
    GpuGeneration("NVIDIA", (7, 5), "Turing", "T4", 1024, "fp16"),
    GpuGeneration("NVIDIA", (8, 0), "Ampere", "A100", 2048),
    GpuGeneration("NVIDIA", (8, 6), "Ampere", "A10/A40", 1024),
    GpuGeneration("NVIDIA", (8, 9), "Ada", "L4/L40", 1024),
    GpuGeneration("NVIDIA", (9, 0), "Hopper", "H100/H200", 4096),
    GpuGeneration("NVIDIA", (10, 0), "Blackwell", "B200", 8192),
    GpuGeneration("AMD", (9, 4), "gfx942", "Instinct MI300", 2048),
    GpuGeneration("AMD", (9, 5), "gfx950", "Instinct MI350", 4096),
)


@dataclass(frozen=True)
class AmdHbmPeak:
    """AMD's datasheet HBM bandwidth of the parts of one gfx generation with one memory size."""

    arch: str  # gfx942, gfx950
    memory_gib: int  # the plane's `memory_size`, in GiB
    models: str  # the parts this size and generation name
    bytes_per_s: float


# AMD Instinct datasheets: MI300X and MI308X 192 GB HBM3 at 5.3 TB/s, MI325X 256 GB HBM3E at 6 TB/s
# (gfx942); MI350X and MI355X 288 GB HBM3E at 8 TB/s (gfx950). A size not listed keeps the plane's.
AMD_HBM_PEAKS: tuple[AmdHbmPeak, ...] = (
    AmdHbmPeak("gfx942", 192, "MI300X", 5.3e12),
    AmdHbmPeak("gfx942", 256, "MI325X", 6.0e12),
    AmdHbmPeak("gfx950", 288, "MI350X/MI355X", 8.0e12),
)


def amd_hbm_peak(generation: GpuGeneration | None, memory_bytes: int) -> AmdHbmPeak | None:
    """The datasheet HBM peak of an AMD part, found by generation and memory size; None when not listed."""
    if generation is None or generation.vendor != "AMD" or not memory_bytes:
        return None
    gib = round(memory_bytes / GIB)
    return next((p for p in AMD_HBM_PEAKS if p.arch == generation.arch and p.memory_gib == gib), None)


@dataclass(frozen=True)
class GpuDevice:
    """One GPU as its plane's stats describe it, with the generation's peak where it is known."""

    vendor: str  # "NVIDIA", "AMD" or "" when the plane does not say
    compute_capability: tuple[int, int] | None
    cores: int  # SMs (NVIDIA) or CUs (AMD); 0 when not recorded
    clock_hz: float  # 0 when not recorded
    hbm_bytes_per_s: float  # the peak: AMD's datasheet where `amd_hbm_peak` knows the part, else the plane's
    memory_bytes: int
    generation: GpuGeneration | None
    name_in_trace: str = ""  # `gpu_device_name` when the plane records it
    plane_hbm_bytes_per_s: float = 0.0  # the plane's own `memory_bandwidth`; 0 when not recorded

    @property
    def peak_flops_per_s(self) -> float | None:
        """Dense bf16/fp16 matrix peak of this GPU; None when its generation or clock is unknown."""
        g = self.generation
        if g is None or not self.cores or not self.clock_hz:
            return None
        return g.matrix_flops_per_core_per_cycle * self.cores * self.clock_hz

    def peaks_source(self) -> str:
        """Where the peaks come from, for the report's methods."""
        from tpudiag.model.units import fmt_bandwidth

        datasheet = amd_hbm_peak(self.generation, self.memory_bytes)
        hbm = (f"HBM from AMD's {datasheet.models} datasheet (the plane records "
               f"{fmt_bandwidth(self.plane_hbm_bytes_per_s)}, counting HBM3 at two transfers per clock)"
               if datasheet is not None and self.plane_hbm_bytes_per_s != self.hbm_bytes_per_s
               else "HBM: the plane's memory_bandwidth stat")
        dtype = self.generation.matrix_dtype if self.generation is not None else "bf16"
        return (f"FLOP/s: the generation's dense {dtype} matrix rate x {'CUs' if self.vendor == 'AMD' else 'SMs'} "
                f"x clock; {hbm}")

    def describe(self) -> str:
        """`AMD Instinct MI300 (gfx942), 304 CUs at 2.10 GHz, 192 GiB` for the report's header."""
        core_word = "CUs" if self.vendor == "AMD" else "SMs"
        if self.name_in_trace:
            head = self.name_in_trace
        elif self.generation is not None:
            g = self.generation
            head = (f"AMD {g.model} ({g.arch})" if g.vendor == "AMD" else
                    f"NVIDIA {g.model} ({g.arch}, compute capability {g.compute_capability[0]}.{g.compute_capability[1]})")
        elif self.compute_capability is not None:
            kind = "gfx" if self.vendor == "AMD" else "compute capability "
            major, minor = self.compute_capability
            head = f"{self.vendor or 'GPU'} {kind}{major}{'' if self.vendor == 'AMD' else '.'}{minor}".strip()
        else:
            head = f"{self.vendor} GPU".strip()
        parts = [head]
        if self.cores:
            parts.append(f"{self.cores} {core_word}" + (f" at {self.clock_hz / 1e9:.2f} GHz" if self.clock_hz else ""))
        if self.memory_bytes:
            parts.append(f"{self.memory_bytes / GIB:.0f} GiB")
        return ", ".join(parts)


def _stat_int(stats, key: str) -> int:
    value = stats.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value == value or value < 0:
        return 0
    return int(value)


def gpu_device(stats) -> GpuDevice:
    """The GPU a `/device:GPU:N` plane's stats (name -> value) describe; absent stats read as 0."""
    vendor = str(stats.get("device_vendor", "") or "")
    vendor = {"nvidia": "NVIDIA", "amd": "AMD"}.get(vendor.lower(), vendor)
    if "compute_cap_major" in stats:
        cc: tuple[int, int] | None = (_stat_int(stats, "compute_cap_major"), _stat_int(stats, "compute_cap_minor"))
    else:
        cc = None
    if not vendor and cc is not None:
        vendor = "NVIDIA"  # older CUPTI captures record no vendor; ROCm's always say AMD
    generation = next((g for g in GPU_GENERATIONS if g.vendor == vendor and g.compute_capability == cc), None)
    plane_hbm = float(_stat_int(stats, "memory_bandwidth"))
    memory = _stat_int(stats, "memory_size")
    datasheet = amd_hbm_peak(generation, memory)
    return GpuDevice(vendor=vendor, compute_capability=cc, cores=_stat_int(stats, "core_count"),
                     clock_hz=_stat_int(stats, "clock_rate") * 1e3,
                     hbm_bytes_per_s=datasheet.bytes_per_s if datasheet is not None else plane_hbm,
                     memory_bytes=memory, generation=generation,
                     name_in_trace=str(stats.get("gpu_device_name", "") or ""), plane_hbm_bytes_per_s=plane_hbm)
