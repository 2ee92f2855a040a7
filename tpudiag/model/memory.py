"""Device memory of a compiled program: what the compiler reserved, what is live at the peak, and
why a program does not fit.

Built by `tpudiag.analysis.device_memory` from a program's buffer assignment (`*-buffer-assignment.txt`)
and live ranges (`*-live-range.txt`), joined to a `RESOURCE_EXHAUSTED` message when one is given
(`tpudiag.parsers.oom_error`). Read by the `hbm-pressure` rule, `tpudiag memory`, the markdown
report and the TUI.

Accounting (checked on real v5e compiles, shared/reference/tpu-compiler-dumps.md §11): the
allocations of one memory space are disjoint, and their sum is the space's `Total bytes` in the
compiler's memory-usage report and, for HBM, `memory_analysis().peak_memory_in_bytes` to within
0.01 %. Arguments and outputs are reserved for the whole program; temporaries share one heap
whose size is the largest set of temporaries live at once (plus fragmentation). So
`peak_bytes = argument_bytes + output_bytes + temp_bytes + constant_bytes`, where an output that
reuses a donated argument's buffer is counted once, in `argument_bytes`, and shown in
`alias_bytes`. `memory_analysis()` counts such an output in both its output and alias figures.
"""

from __future__ import annotations

from dataclasses import dataclass, field

BUFFER_KINDS = ("argument", "output", "temporary", "constant")


@dataclass(frozen=True)
class MemoryBuffer:
    """One buffer live at the peak: an argument, an output, a constant or a temporary value."""

    name: str  # HLO value: instruction name, with `{i}` when it is a tuple element
    instruction: str  # the defining instruction
    kind: str  # one of BUFFER_KINDS
    size_bytes: int  # as laid out (tiled, padded): what it occupies
    logical_bytes: int | None  # elements x element size; None when the shape could not be read
    shape: str  # HLO shape text, layout included
    op_name: str  # JAX name stack (`jit(step)/jvp()/dot_general`), or the argument path (`params[0]`)
    source_file: str
    source_line: int  # 0 when unknown
    parameter_number: int | None = None  # entry parameter held (arguments)
    aliased: bool = False  # an argument buffer the program also returns (donated)
    live_from: int | None = None  # program position of its definition (live-range file)
    live_to: int | None = None  # program position of its last use

    @property
    def padding_bytes(self) -> int | None:
        return None if self.logical_bytes is None else max(0, self.size_bytes - self.logical_bytes)


@dataclass(frozen=True)
class MemoryGroup:
    """Buffers at the peak that belong together: one jit argument (`params`, `opt_state`), or the
    values one JAX op makes (outputs or temporaries of `jit(step)/jvp()/dot_general`)."""

    label: str  # the argument root or the JAX op name ('' op names: the instruction)
    kind: str  # one of BUFFER_KINDS
    count: int
    size_bytes: int
    source: str = ""  # `file:line` of the first buffer, when known


@dataclass(frozen=True)
class MemoryLever:
    """One way to lower the peak, with its modelled saving in bytes (an upper bound).

    Levers overlap (sharding the optimiser state and offloading it save the same bytes): their
    savings are never added up. A lever is offered only where its `precondition` holds in the
    program (or the error text): the sentence says what was checked.
    """

    key: str  # padding, temporaries, donation, remat, fsdp, host-offload, microbatch, dtype
    title: str  # one line: what to do
    saving_bytes: int  # modelled, upper bound
    explanation: str  # how the saving was modelled
    fix: str  # the concrete change (`jax.jit(step, donate_argnums=(0, 1, 2))`)
    buffers: tuple[str, ...] = ()  # the buffers it acts on, largest first
    precondition: str = ""  # what holds in the program that makes this lever apply


# How a program was told to be a training step or inference (`ProgramMemory.workload`).
TRAINING, INFERENCE = "training", "inference"


@dataclass(frozen=True)
class VmemUse:
    """The scoped VMEM one op (a Pallas kernel or an XLA fusion) uses while it runs."""

    op: str  # HLO instruction name
    scoped_bytes: int
    source: str  # 'LLO VMEM report' or 'HLO backend_config' (`used_scoped_memory_configs`)
    op_name: str = ""  # JAX name stack, e.g. `jit(f)/pallas_call`
    kernel: bool = False  # a Pallas kernel (`tpu_custom_call`), which can set its own limit


@dataclass(frozen=True)
class SpaceMemory:
    """One memory space of one program (color 0 is HBM, 1 VMEM)."""

    space: str  # hbm, vmem, smem, host, or the compiler's own name (`color_6`)
    color: int
    peak_bytes: int  # every allocation of the space: what the compiler reserved
    argument_bytes: int
    output_bytes: int  # outputs in buffers of their own (not reusing an argument)
    temp_bytes: int  # the temporaries' heap (and thread-local scratch)
    constant_bytes: int
    alias_bytes: int  # argument buffers the program also returns (within argument_bytes)
    reported_total_bytes: int | None  # `Total bytes` of the memory-usage report, when dumped
    live_at_peak: tuple[MemoryBuffer, ...]  # largest first
    peak_position: int | None  # program position where the temporaries peak; None without live ranges
    timeline_bytes: tuple[int, ...] = ()  # temporaries live at each program position (live ranges)
    groups: tuple[MemoryGroup, ...] = ()  # live_at_peak grouped by argument or op, largest first

    @property
    def whole_program_bytes(self) -> int:
        """Bytes reserved for the whole run: arguments, own outputs and constants."""
        return self.argument_bytes + self.output_bytes + self.constant_bytes


# The forms of out-of-memory text `tpudiag.parsers.oom_error` reads, by key (`OomError.form`).
OOM_FORMS = {
    "xla-hbm-temporaries": "XLA's HBM check (`the total memory required for HLO temporaries (X) exceeds "
                           "available HBM (Y)`, jax 0.9+)",
    "libtpu-compile": "libtpu's compile report (`XLA:TPU compile permanent error. Ran out of memory in memory "
                      "space hbm. Used X of Y hbm`)",
    "tf-tpu-compile": "the TensorFlow TPU runtime's compile report (`Compilation failure: Ran out of memory in "
                      "memory space hbm`)",
    "tpu-compile": "the TPU compiler's report (`Ran out of memory in memory space hbm. Used X of Y hbm`)",
    "tpu-runtime-allocate": "the TPU runtime allocator (`Attempting to allocate X. That was not possible. "
                            "There are Y free`)",
    "tpu-runtime-reserve": "the TPU runtime allocator reserving program memory (`Attempting to reserve X at the "
                           "bottom of memory`)",
    "vmem-scoped": "libtpu's scoped VMEM check (`CompileTimeScopedVmemOom ... exceeded scoped vmem limit`)",
    "vmem-capacity": "libtpu's VMEM compile report (`Ran out of memory in memory space vmem. Used X of Y vmem`)",
    "vmem-allocation": "the TPU compiler's VMEM allocation check (`Allocation (size=X) would exceed memory`)",
}


@dataclass(frozen=True)
class OomAllocation:
    """One entry of the `Largest program allocations in hbm:` (or `vmem:`) list of an OOM text."""

    rank: int  # 1-based, largest first as printed
    size_bytes: int  # `Size: 512.00M` (binary units, two decimals)
    shape: str = ""  # with its layout, as printed
    unpadded_bytes: int | None = None  # `Unpadded size:`
    padding_bytes: int | None = None  # `Extra memory due to padding:`
    expansion: float | None = None  # `(12.6x expansion)`: size over unpadded size
    op_type: str = ""  # TensorFlow op type (`OneHot`), when printed
    op_name: str = ""  # the JAX or TensorFlow op name
    source_file: str = ""
    source_line: int = 0
    xla_label: str = ""  # the HLO instruction, as printed (often cut with `...`)
    instruction: str = ""  # the instruction's name from the label (`fusion.1668`)
    allocation_type: str = ""  # `HLO temp`, `scoped`, ...
    tag: str = ""  # VMEM lists: what the allocation is for (`input window allocation ...`)


@dataclass(frozen=True)
class OomPart:
    """One line of an OOM text's `Total hbm usage` or `Program hbm requirement` breakdown."""

    name: str  # reserved, program, arguments, global, scoped, HLO temp, output, ...
    size_bytes: int | None  # None: printed as `unknown size`
    note: str = ""  # what follows the size (`(92.8% utilization, 0.3% fragmentation (53.61M))`)


@dataclass(frozen=True)
class OomError:
    """A `RESOURCE_EXHAUSTED` message, parsed (`tpudiag.parsers.oom_error`).

    `space` is `hbm` or `vmem`. `kind`: `hbm-temporaries` (compile time: the program's total over
    the usable HBM), `hbm-capacity` (`Used X of Y hbm`), `hbm-allocation` (at run time: a buffer
    the allocator could not place), or the VMEM kinds of `tpudiag.model.llo.VmemBudget` (`scoped`,
    `capacity`, `allocation`). Sizes are printed with two decimals (`17.00G`): exact to ~5 MiB at
    gigabytes.
    """

    space: str
    kind: str
    required_bytes: int
    available_bytes: int
    message: str  # the line that says it, as printed
    hlo: str = ""  # the op named (VMEM forms)
    exceeded_by_bytes: int | None = None
    form: str = ""  # which text was read: a key of OOM_FORMS
    usage: tuple[OomPart, ...] = ()  # `Total hbm usage >= X:` (reserved, program, arguments)
    requirement: tuple[OomPart, ...] = ()  # `Program hbm requirement X:` (reserved, global, scoped, HLO temp)
    persistent: tuple[OomPart, ...] = ()  # runtime form: `Persistent allocations` (arguments, output)
    output_bytes: int | None = None  # `Output size X; shares Y with arguments.`
    output_shared_bytes: int | None = None  # the Y above: output bytes already in argument buffers
    allocations: tuple[OomAllocation, ...] = ()  # `Largest program allocations in hbm:`, largest first
    programs: tuple[str, ...] = ()  # the modules the text names (`jit(step)/...` -> `jit_step`)

    @property
    def form_text(self) -> str:
        return OOM_FORMS.get(self.form, self.form)

    def part(self, name: str) -> OomPart | None:
        """A named line of the requirement, usage or persistent breakdowns, in that order."""
        return next((p for p in (*self.requirement, *self.usage, *self.persistent) if p.name == name), None)

    @property
    def over_by_bytes(self) -> int:
        return self.exceeded_by_bytes if self.exceeded_by_bytes is not None else self.required_bytes - self.available_bytes


@dataclass(frozen=True)
class ProgramMemory:
    """The device memory of one compiled program, per memory space, with the chip's HBM."""

    module: str
    path: str  # the dump file it was read from
    generation: str  # v5e, ...; '' when unknown
    hbm_capacity_bytes: int | None  # the chip's public figure (`tpudiag.model.hardware`)
    hbm_usable_bytes: int | None  # what the compiler lets a program use (its OOM message, else a measured figure)
    usable_source: str  # 'compiler error', "the v5e compiler's figure" (measured), 'public capacity' or ''
    spaces: tuple[SpaceMemory, ...]
    oom_recorded: bool  # the dump holds the compiler's `*.oom_intermediate_module.txt`
    error: OomError | None = None  # the `--error` message joined to this program
    levers: tuple[MemoryLever, ...] = ()  # HBM levers, largest modelled saving first; () when not needed
    first: str = ""  # key of the cheapest lever that is enough alone; '' when none is
    workload: str = ""  # TRAINING or INFERENCE, told from the program
    workload_evidence: str = ""  # what told it (a backward pass, optimiser state, donated state)
    near_fraction: float = 0.8  # levers are offered from this fraction of the usable HBM on
    capacity_source: str = ""  # where hbm_capacity_bytes comes from: 'public v5e figure', 'measured by the allocator'
    mesh_devices: int = 1  # devices the program is partitioned over (`num_partitions` x replicas)
    compiler_peak_bytes: int | None = None  # `memory_analysis().peak_memory_in_bytes` (a `compile` output)
    vmem_ops: tuple[VmemUse, ...] = ()  # scoped VMEM per op, largest first
    vmem_scoped_limit_bytes: int | None = None  # the default scoped limit, or the VMEM error's
    vmem_limit_source: str = ""  # 'compiler error' or 'default for <gen>, measured'
    vmem_capacity_bytes: int | None = None  # the chip's VMEM (the LLO report's figure when dumped)
    warnings: tuple[str, ...] = ()

    @property
    def headroom_bytes(self) -> int | None:
        """Usable HBM left above the peak; None when either is unknown."""
        peak, limit = self.hbm_peak_bytes, self.hbm_limit_bytes
        return None if peak is None or limit is None else limit - peak

    @property
    def needs_levers(self) -> bool:
        """Over the limit, or at or above `near_fraction` of it: only then are levers offered."""
        peak, limit = self.hbm_peak_bytes, self.hbm_limit_bytes
        return self.does_not_fit or (peak is not None and limit is not None and peak >= self.near_fraction * limit)

    @property
    def first_lever(self) -> MemoryLever | None:
        return next((lv for lv in self.levers if lv.key == self.first), None)

    def space(self, name: str) -> SpaceMemory | None:
        return next((s for s in self.spaces if s.space == name), None)

    @property
    def hbm(self) -> SpaceMemory | None:
        return self.space("hbm")

    @property
    def hbm_limit_bytes(self) -> int | None:
        """The bound a program must fit in: the usable HBM, else the capacity."""
        return self.hbm_usable_bytes or self.hbm_capacity_bytes

    @property
    def limit_words(self) -> str:
        """How `hbm_limit_bytes` is named after its size: `usable (the compiler error)`, or `of HBM (the
        GPU's memory_size in the trace)` where only the capacity is known."""
        if self.hbm_usable_bytes:
            return f"usable ({self.usable_source})"
        return f"of HBM ({self.capacity_source})" if self.capacity_source else "of HBM"

    @property
    def hbm_peak_bytes(self) -> int | None:
        """The peak the compiler needs: its error's figure when it failed, else the buffer assignment's."""
        if self.error is not None and self.error.space == "hbm" and self.error.kind != "hbm-allocation":
            return max(self.error.required_bytes, self.hbm.peak_bytes if self.hbm else 0)
        return self.hbm.peak_bytes if self.hbm else None

    @property
    def does_not_fit(self) -> bool:
        limit, peak = self.hbm_limit_bytes, self.hbm_peak_bytes
        hbm_error = self.error is not None and self.error.space == "hbm"
        return self.oom_recorded or hbm_error or (limit is not None and peak is not None and peak > limit)


def largest_hbm_program(programs: tuple[ProgramMemory, ...]) -> ProgramMemory | None:
    """The program a report's memory section shows: the largest HBM peak."""
    return max((p for p in programs if p.hbm is not None), key=lambda p: p.hbm_peak_bytes or 0, default=None)


@dataclass(frozen=True)
class MemoryReport:
    """What `tpudiag memory` shows: one section per source of memory facts.

    `programs` is the compiled view (this module). Views from other sources (a capture's allocator
    timeline, JAX's `save_device_memory_profile`) are further fields here, each with its own
    section in `tpudiag.render.memory`, so the command and its JSON grow without changing
    existing keys.
    """

    input_path: str
    programs: tuple[ProgramMemory, ...] = ()  # largest HBM peak first
    errors: tuple[OomError, ...] = ()  # `--error` messages, also those joined to no program
    warnings: tuple[str, ...] = field(default_factory=tuple)
    standalone: tuple[OomAnalysis, ...] = ()  # the `--error` messages joined to no program, analysed alone
    # Positions in `programs` of the tiny ones the terminal folds into one line (HBM peak under
    # `tpudiag.analysis.device_memory.SMALL_PROGRAM_BYTES`); JSON lists every program.
    folded: tuple[int, ...] = ()


@dataclass(frozen=True)
class OomAnalysis:
    """An out-of-memory text analysed on its own (no program of the input is its program): the
    levers its own list of allocations and breakdown support."""

    error: OomError
    levers: tuple[MemoryLever, ...] = ()
    first: str = ""  # key of the cheapest lever that covers the overrun alone; '' when none does

    @property
    def first_lever(self) -> MemoryLever | None:
        return next((lv for lv in self.levers if lv.key == self.first), None)
