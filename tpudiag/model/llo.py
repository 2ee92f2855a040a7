"""What the TPU compiler's LLO dumps (`--xla_jf_dump_to`) say about each HLO op.

Everything here is static: counted in the compiled program, not measured. Cycle estimates come
from the compiler's own model (`--xla_jf_dump_static_llo_profile_to`) and are modelled, never
checked on hardware. Bundle counts count each loop body once (no trip counts); the static profile's
cycles do include trip counts. See `shared/reference/tpu-compiler-dumps.md` §5-7.

Small facts are frozen dataclasses; per-op and per-instruction facts are pandas tables with the
schemas below. Counts and cycles are int64; where a value can be unknown the column is pandas'
nullable `Int64` (NA = the dump did not say), never a 0 that would read as "measured zero".
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tpudiag.model.schemas import Column, TableSchema

# A spill slot is one vreg: 8 sublanes x 128 lanes x 4 bytes. The VMEM report's SPILL bytes are
# slots x this (MLP fusion.7: 83 slots, 339,968 bytes).
VREG_BYTES = 4096

# Capacity-header columns of `final_hlo-static-per-bundle-utilization` seen on v4-TPU7x. Others
# are parsed the same way but reported as a warning, since their meaning is unverified.
KNOWN_UTILIZATION_COLUMNS = ("MXU", "XLU", "VALU", "VPOP", "EUP", "VLOAD", "VLOAD:FILL", "VSTORE",
                             "VSTORE:SPILL", "SALU")

# Unit names of `hlo-static-bundle-profile`. MXU_i / XLU_i take an op name after the unit; the
# others stand alone. Counters (the *_COUNT and *_STARVATION units) count events, not slot issues.
KNOWN_PROFILE_UNITS = ("VECTOR_ALU", "VECTOR_POP", "VECTOR_EUP", "VECTOR_LOAD_AND_MISC",
                       "VECTOR_STORE", "VECTOR_MISC",
                       # v6e lists these two in place of VECTOR_STORE (its store slots are shared)
                       "VECTOR_LOAD_AND_STORE_AND_MISC", "VECTOR_STORE_AND_MISC",
                       "SCALAR_ALU", "CMEM_LOAD", "SMEM_SPILL_COUNT",
                       "SMEM_FILL_COUNT", "VMEM_SPILL_COUNT", "VMEM_FILL_COUNT",
                       "VMEM_TO_HBM_ESTIMATED_STARVATION", "HBM_TO_VMEM_ESTIMATED_STARVATION")
INDEXED_PROFILE_UNITS = ("MXU", "XLU")  # followed by _<index>

NO_HLO = "<no-hlo-instruction>"  # the bundle profile's name for code that belongs to no HLO op


class LloTableSchema(TableSchema):
    """`TableSchema` that also casts pandas' nullable `Int64` and `boolean` columns."""

    def frame(self, data: dict[str, object] | None = None, length: int | None = None) -> pd.DataFrame:
        data = dict(data or {})
        nullable = {c.name: c.dtype for c in self.columns if c.dtype in ("Int64", "boolean")}
        if length != 0:
            missing = [c.name for c in self.columns if c.name not in data]
            if missing:
                raise ValueError(f"{self.name} table: missing columns {missing}")
        held = {name: data.pop(name, []) for name in nullable}
        # Build the plain columns with the base class, then add the nullable ones in order.
        plain = TableSchema(self.name, tuple(c for c in self.columns if c.name not in nullable))
        df = plain.frame(data, length=length)
        for name, dtype in nullable.items():
            df[name] = pd.array(list(held[name]), dtype=dtype)
        return df[self.names]


# ---- tables ----------------------------------------------------------------------------------

BUNDLE_PROFILE = LloTableSchema("llo_bundle_profile", (
    Column("program", "category", "LLO program whose dump this is (`TLP` for the top-level program)"),
    Column("block", "int32", "index of the `HLO:` block in the file; the same HLO may have several"),
    Column("hlo", "category", f"HLO instruction name (`fusion.7`), or `{NO_HLO}`"),
    Column("opcode", "category", "HLO opcode from the block header (`fusion`, `custom-call`), or ''"),
    Column("calls", "category", "called computation (`all-reduce-scatter.2`, `async_collective_fusion.75`) "
                                "or ''"),
    Column("unit", "category", "functional unit or counter, e.g. MXU_0, VECTOR_STORE, VMEM_SPILL_COUNT"),
    Column("op", "category", "instruction kind on indexed units (`matmul_packed`), else ''"),
    Column("count", "int64", "static instruction count (numerator)"),
    Column("capacity", "int64", "static issue capacity: slots x static bundles (denominator)"),
    Column("fraction", "float64", "count / capacity as printed"),
))

STATIC_PROFILE = LloTableSchema("llo_static_profile", (
    Column("hlo", "category", "hlo_op_name: HLO instruction name (custom-call name for Pallas)"),
    Column("estimated_cycles", "int64", "compiler-estimated cycles of one instance, trip counts included"),
    Column("num_equivalent_hlos", "int64", "identical ops deduplicated into this one"),
    Column("total_cycles", "Int64", "estimated_cycles x num_equivalent_hlos; NA when the estimate "
                                    "is not one (remote DMA)"),
    Column("dma_instruction_type", "category", "NONE, LOCAL or LOCAL_AND_REMOTE (prefix dropped)"),
    Column("file", "string", "textproto file name"),
))

SPILL_INSTRUCTIONS = LloTableSchema("llo_spill_instructions", (
    Column("program", "category", "LLO program"),
    Column("kind", "category", "vmem_spill (vst), vmem_fill (vld), smem_spill (sst), smem_fill (sld)"),
    Column("bundle", "int64", "bundle address (the hex number at the start of the line)"),
    Column("instruction", "string", "result name of the spill instruction, e.g. %49016"),
    Column("slot", "category", "spill slot, e.g. #allocation14_spill"),
    Column("region", "Int64", "post-ra region holding the instruction; NA without post-ra"),
    Column("hlo", "category", "HLO op of that region (post-ra `#{...}`), else the program name; "
                              "'' for top-level code of no op"),
    Column("in_loop", "boolean", "the region is inside a loop (post-ra `// loop_body` etc.), so the "
                                 "instruction runs once per iteration; NA without post-ra"),
))

SPILL_SLOTS = LloTableSchema("llo_spill_slots", (
    Column("program", "category", "LLO program"),
    Column("slot", "category", "allocation name, e.g. #allocation14_spill"),
    Column("space", "category", "vmem or smem"),
    Column("size_bytes", "int64", "slot size"),
    Column("shape", "string", "slot shape, e.g. u32[8,128]{1,0}"),
    Column("region", "Int64", "region the slot is declared in; NA when unknown"),
    Column("hlo", "category", "HLO op of that region, else the program name"),
))

SCHEDULE = LloTableSchema("llo_schedule", (
    Column("program", "category", "LLO program"),
    Column("hlo", "category", "HLO instruction name, or `<no hlo>`"),
    Column("bundles", "float64", "scheduled bundles attributed to the HLO (fractional: shared bundles split)"),
    Column("percent", "float64", "share of the program's non-empty bundles, as printed"),
    Column("hlo_text", "string", "HLO instruction text from the line"),
))

VMEM_ALLOCATIONS = LloTableSchema("llo_vmem_allocations", (
    Column("hlo", "category", "HLO op (key of hlo_breakdowns; `<top-inlining-caller>` is the TLP)"),
    Column("block", "int32", "index of the block within the HLO"),
    Column("block_type", "category", "SCOPED or HLO_TEMPORARY"),
    Column("block_bytes", "int64", "block_size of the enclosing block"),
    Column("size_bytes", "int64", "allocation size"),
    Column("padding_bytes", "int64", "padding inside the allocation"),
    Column("shape", "string", "allocation shape; '' when absent (spills)"),
    Column("tag", "string", "e.g. `scoped memory for fusion.7`, `operand span for operand 1`, SPILL"),
    Column("is_spill", "bool", "tag is SPILL"),
))

TOP_INLINING_CALLER = "<top-inlining-caller>"  # the VMEM report's entry for the whole program, not one op


@dataclass(frozen=True)
class ScopedVmem:
    """An op's SCOPED blocks in the LLO VMEM report, read two ways for two consumers.

    `largest_bytes`: its largest block, what libtpu checks against the scoped limit (one allocation:
    `Scoped allocation with size X and limit Y`), so what the memory view (`analysis.device_memory`)
    and the report compare with the limit. `total_bytes`: the sum of its distinct blocks, all the
    scoped VMEM its code holds, what the LLO ops table's `vmem_scoped_bytes` and `lab tune`'s VMEM
    total carry. They differ only for an op with several SCOPED blocks.
    """

    largest_bytes: int
    total_bytes: int


def scoped_vmem_per_op(vmem_allocations: pd.DataFrame) -> dict[str, ScopedVmem]:
    """Per HLO op (the program's own entry left out), its SCOPED blocks (`ScopedVmem`)."""
    if vmem_allocations.empty:
        return {}
    table = vmem_allocations[(vmem_allocations["block_type"] == "SCOPED")
                             & (vmem_allocations["hlo"] != TOP_INLINING_CALLER)].drop_duplicates(["hlo", "block"])
    sizes = table.groupby("hlo", observed=True)["block_bytes"].agg(["max", "sum"])
    return {str(op): ScopedVmem(int(r["max"]), int(r["sum"])) for op, r in sizes.iterrows()}


OPS = LloTableSchema("llo_ops", (
    Column("name", "category", "HLO instruction name; joins the trace's op name"),
    Column("llo_program", "category", "the op's own LLO program when its files were dumped, else '' "
                                      "(inlined in the TLP, or filtered out)"),
    Column("opcode", "category", "HLO opcode, '' when no dump names it"),
    Column("calls", "category", "called computation, e.g. `all-reduce-scatter.2`: names what a kCustom "
                                "fusion does; '' when unknown"),
    Column("is_collective", "bool", "collective op, reduce-scatter or async-collective fusion, or any op "
                                    "with remote DMA (static profile)"),
    Column("estimated_cycles", "Int64", "static-profile cycles x num_equivalent_hlos; NA when unknown"),
    Column("cycles_per_instance", "Int64", "static-profile cycles of one instance: identical ops deduplicated "
                                           "into this one do not get rows of their own, so a trace op "
                                           "matching one of them has this cost"),
    Column("num_equivalent_hlos", "Int64", "identical ops the estimate stands for (1 = just this one)"),
    Column("cycles_status", "category", "estimate | not-estimated-remote-dma | no-static-profile"),
    Column("spill_stores", "Int64", "VMEM spill stores (vst): bundle profile, else final_bundles"),
    Column("spill_fills", "Int64", "VMEM spill fills (vld)"),
    Column("smem_spill_stores", "Int64", "SMEM spill stores (sst)"),
    Column("smem_spill_fills", "Int64", "SMEM spill fills (sld)"),
    Column("spill_slots", "Int64", "spill slots declared in post-ra"),
    Column("vmem_spill_bytes", "Int64", "VMEM report SPILL bytes (slots x 4 KiB)"),
    Column("vmem_scoped_bytes", "Int64", "VMEM report SCOPED blocks, summed (`ScopedVmem.total_bytes`)"),
    Column("vmem_temporary_bytes", "Int64", "VMEM report HLO_TEMPORARY block bytes"),
    Column("bundles", "Int64", "static bundles of the op's own LLO program (schedule analysis, else "
                               "per-bundle utilization rows)"),
    Column("tlp_bundles", "float64", "bundles the TLP schedule attributes to the op; NaN when absent"),
    Column("mxu_busy_fraction", "float64", "sum of busy MXUs over bundles / (bundles x MXU capacity)"),
    Column("mxu_matmul_fraction", "float64", "bundle profile: matmul issue fraction, mean over MXUs"),
    Column("hbm_to_vmem_starvation", "Int64", "bundle profile HBM_TO_VMEM_ESTIMATED_STARVATION count"),
    Column("vmem_to_hbm_starvation", "Int64", "bundle profile VMEM_TO_HBM_ESTIMATED_STARVATION count"),
    Column("register_pressure", "Int64", "vreg pressure of the op's program before RA; NA when not dumped"),
))


# ---- small facts -----------------------------------------------------------------------------

@dataclass(frozen=True)
class DumpFile:
    """One file of a dump, with what its name says."""

    path: str
    timestamp_ns: int  # the leading number; one per LLO program and compile
    program: str  # LLO program: TLP, fusion.7, _lambda_.1, <late-initialization>, ...
    index: int  # the NN pass index; -1 for files without one (TLP-hlo.txt)
    label: str  # pass label: final_bundles, post-ra, vmem_report, hlo, ...


@dataclass(frozen=True)
class LloCompile:
    """One compile found in a dump directory (libtpu appends every compile of a process to it)."""

    timestamp_ns: int  # the TLP program's timestamp; the compile's other programs follow it
    module_name: str  # HLO module, e.g. jit_train_step; '' when no file names it
    n_files: int


@dataclass(frozen=True)
class UtilizationColumn:
    name: str  # MXU, VALU, VSTORE:SPILL, ...
    capacity: int  # slots (MXUs for MXU) per bundle, from the CAPACTIY header
    total: int  # sum of the column over all bundles


@dataclass(frozen=True)
class BundleUtilization:
    """Summary of one program's `final_hlo-static-per-bundle-utilization` file."""

    program: str
    bundles: int  # rows = scheduled bundles
    columns: tuple[UtilizationColumn, ...]

    def column(self, name: str) -> UtilizationColumn | None:
        return next((c for c in self.columns if c.name == name), None)

    def _total(self, name: str) -> int | None:
        col = self.column(name)
        return None if col is None else col.total

    @property
    def vload_fill(self) -> int | None:
        return self._total("VLOAD:FILL")

    @property
    def vstore_spill(self) -> int | None:
        return self._total("VSTORE:SPILL")

    @property
    def mxu_busy_fraction(self) -> float | None:
        col = self.column("MXU")
        if col is None or self.bundles == 0 or col.capacity <= 0:
            return None
        return col.total / (self.bundles * col.capacity)


@dataclass(frozen=True)
class LiveRange:
    """One line of a register-pressure dump: `len=9414 lr=[948, 10362) wt=36 users=8 :: %v = ...`."""

    length: int
    start: int
    end: int
    weight: int
    users: int
    instruction: str  # the defining LLO instruction


@dataclass(frozen=True)
class RegisterPressure:
    program: str
    register_class: str  # "vregs" (the only class seen)
    pressure: int  # max simultaneously live registers before allocation; > 64 vregs on v5e spills
    top_live_ranges: tuple[LiveRange, ...]  # longest first, as dumped (at most `max_live_ranges`)


@dataclass(frozen=True)
class ScheduleAnalysis:
    program: str
    total_bundles: int
    empty_bundles: int
    non_empty_bundles: int


@dataclass(frozen=True)
class VmemReport:
    module_name: str
    capacity_bytes: int | None


@dataclass(frozen=True)
class VmemOomAllocation:
    """One entry of `Largest program allocations in vmem:` in a VMEM OOM error."""

    rank: int  # 1-based position in the list (largest first)
    size_bytes: int  # parsed from `Size: 64.00M` (MiB, two decimals: +-5 KiB)
    operator: str  # e.g. op_name="jit(f)/pallas_call"
    shape: str
    unpadded_size_bytes: int | None
    tag: str  # input window allocation ..., scratch operand, register allocator spill slots ...
    xla_label: str
    allocation_type: str


@dataclass(frozen=True)
class BundleDma:
    """DMA instructions in one LLO program's `final_bundles`, comments stripped (a `BoundsCheck`
    comment names the DMA it guards too)."""

    program: str
    bundles: int  # bundle lines
    issue_bundles: int  # bundles starting a DMA: dma.hbm_to_vmem, dma.vmem_to_hbm, dma.general, ...
    wait_bundles: int  # bundles waiting on one (dma.done.wait)


@dataclass(frozen=True)
class VmemBudget:
    """A VMEM out-of-memory compile error, parsed.

    `kind` is `scoped` (E1001 CompileTimeScopedVmemOom: one op's stack allocation over the scoped
    limit, default 16 MiB on v5e), `capacity` (the program over physical VMEM, with a ranked list
    of its largest allocations) or `allocation` (one allocation, e.g. a scratch operand, larger
    than physical VMEM; sizes exact). Byte values come
    from text printed as `28.00M` (MiB with two decimals), so they are exact to about 5 KiB.
    """

    kind: str
    hlo: str  # op named in the message ('' when absent)
    limit_bytes: int  # scoped limit or physical capacity
    used_bytes: int
    exceeded_by_bytes: int
    allocations: tuple[VmemOomAllocation, ...] = ()
    scoped_bytes: int | None = None  # `Program vmem requirement ... scoped` when printed
    message: str = ""  # the first line of the error


@dataclass
class LloDump:
    """Everything parsed from one `--xla_jf_dump_to` directory. Tables follow the schemas above."""

    path: str
    files: tuple[DumpFile, ...]  # the files of the compile read (see `compile`)
    ops: pd.DataFrame  # OPS: one row per HLO op, the table to join with trace ops
    bundle_profile: pd.DataFrame  # BUNDLE_PROFILE
    static_profile: pd.DataFrame  # STATIC_PROFILE
    spill_instructions: pd.DataFrame  # SPILL_INSTRUCTIONS
    spill_slots: pd.DataFrame  # SPILL_SLOTS
    schedule: pd.DataFrame  # SCHEDULE
    vmem_allocations: pd.DataFrame  # VMEM_ALLOCATIONS
    utilization: tuple[BundleUtilization, ...] = ()
    schedules: tuple[ScheduleAnalysis, ...] = ()
    register_pressure: tuple[RegisterPressure, ...] = ()
    bundle_dma: tuple[BundleDma, ...] = ()  # per program with `final_bundles`
    vmem_report: VmemReport | None = None
    compile: LloCompile | None = None  # the compile read; None when the directory has no TLP files
    other_compiles: tuple[LloCompile, ...] = ()  # further compiles in the directory, not read
    warnings: list[str] = field(default_factory=list)

    @property
    def programs(self) -> tuple[str, ...]:
        return tuple(sorted({f.program for f in self.files}))

    def utilization_for(self, program: str) -> BundleUtilization | None:
        return next((u for u in self.utilization if u.program == program), None)

    def dma_for(self, program: str) -> BundleDma | None:
        return next((d for d in self.bundle_dma if d.program == program), None)

    def register_pressure_for(self, program: str) -> RegisterPressure | None:
        return next((r for r in self.register_pressure if r.program == program), None)
