"""Compiler dump directories: discovered and read here, once, into `CompiledInputs` and the
`CompileOutput` a timeline is modelled from (the one place dumps are read, for `--dumps` and for
`tpudiag report DIR` alike).

`tpudiag report DIR` accepts, besides captures, what a compile leaves behind:

- a `tpudiag compile` output directory (`result.json`, `xla/`, `llo/`, `static_profile/`);
- an XLA dump (`--xla_dump_to`: `*.after_optimizations.txt`), an LLO dump (`--xla_jf_dump_to`)
  or both, in one directory or in folders below it of any names and nesting (`D/xla` and `D/jf`,
  `D/run/llo`), read as one compilation (`dump_parts`); the LLO dump alone works when it holds
  `TLP-hlo.txt`, the HLO as the backend saw it.

A bare dump has no `result.json`, so what it holds stands in: the TPU generation comes from
`target_arguments.txt` (`TPU_VERSION_VIPERFISH` `lite` = v5e, `TPU_VERSION_GHOSTLITE` = v6e), the
device count from the module's `num_partitions`, and per-op cycles from the static LLO profile
when the HLO text carries none. Without `target_arguments.txt` (an LLO dump alone) the generation
is the one chip whose MXUs per core and VMEM capacity match the LLO dump's.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from tpudiag.errors import InputError
from tpudiag.model.compile_output import LLO_DIR, PROFILE_DIR, RESULT_FILE, XLA_DIR, CompileOutput
from tpudiag.model.compiled import CompiledDump, CompiledProgram
from tpudiag.model.hardware import ChipChoice, ChipSource
from tpudiag.model.inputs import CompiledInputs, HloInput
from tpudiag.model.llo import LloDump
from tpudiag.parsers.compile_output import compile_facts, compile_output_of, llo_spills, matmul_flops, replica_group_sizes
from tpudiag.parsers.input_files import TRACE_SUFFIX, read_input_text


# target_arguments.txt `version` (and `variant`) -> generation, as seen in v5e, v6e and TPU7x dumps.
TARGET_GENERATIONS = (
    ("TPU_VERSION_VIPERFISH lite", "v5e"),
    ("TPU_VERSION_GHOSTLITE", "v6e"),
    ("TPU_VERSION_6acc60406", "TPU7x"),
)


# How deep below the given directory dumps are looked for, and how many directories at most: a
# `D/xla` + `D/jf` pair is one level down, a run's `D/dumps/xla` two.
MAX_DEPTH = 3
MAX_DIRS = 500


@dataclass(frozen=True)
class DumpParts:
    """Where the pieces of a dump directory are, found once (`dump_parts`): the directory holding
    the XLA dump (`*.after_optimizations.txt`), the one holding the LLO dump (jf dump files) and a
    static-profile directory outside it. A part not found is `root`, whose reader then says why.
    `notes` say which of several candidates was read."""

    root: Path
    xla: Path
    llo: Path
    static_profile: Path | None
    found: bool = False  # any dump file, or a `tpudiag compile` output
    notes: tuple[str, ...] = ()


def dump_parts(path: Path) -> DumpParts:
    """The XLA, LLO and static-profile directories of `path`: a `tpudiag compile` output's
    subdirectories, else whatever directories at most `MAX_DEPTH` levels down hold an XLA dump, an
    LLO dump (`--xla_dump_to=D/xla --xla_jf_dump_to=D/jf`, any names, in any mix and nesting) or
    static-profile textprotos, the shallowest of each kind. Nothing is found below a directory
    that holds a trace (`*.xplane.pb`, `plugins/profile`): that is a capture, not dumps."""
    path = Path(path)
    if not path.is_dir():
        return DumpParts(path, path, path, None)
    if (path / RESULT_FILE).is_file():
        xla = path / XLA_DIR if (path / XLA_DIR).is_dir() else path
        llo = path / LLO_DIR if (path / LLO_DIR).is_dir() else path
        profile = path / PROFILE_DIR if llo != path and (path / PROFILE_DIR).is_dir() else None
        return DumpParts(path, xla, llo, profile, found=True)
    kinds = _find_dumps(path)
    if kinds is None:  # a trace somewhere below: not a dump directory
        return DumpParts(path, path, path, None)
    notes = []
    chosen = {}
    for kind, what in (("xla", "XLA dumps"), ("llo", "LLO dumps"), ("static", "static LLO profiles")):
        dirs = kinds[kind]
        chosen[kind] = dirs[0] if dirs else None
        if len(dirs) > 1:
            others = ", ".join(f"`{d}`" for d in dirs[1:4]) + (" ..." if len(dirs) > 4 else "")
            notes.append(f"{len(dirs)} directories hold {what} under `{path}`: read `{dirs[0]}`, "
                         f"the shallowest (not {others}); pass the one you mean")
    llo = chosen["llo"]
    profile = chosen["static"]
    if profile is not None and llo is not None and (profile == llo or llo in profile.parents):
        profile = None  # the LLO reader finds the textprotos inside its own directory
    elif profile is not None and llo is None:
        llo, profile = profile, None  # static-profile textprotos alone are an LLO dump
    found = any(chosen.values())
    return DumpParts(path, chosen["xla"] or path, llo or path, profile, found=found, notes=tuple(notes))


def _find_dumps(root: Path) -> dict[str, list[Path]] | None:
    """Directories under `root` (itself included) holding each kind of dump file, shallowest first
    (then by name); None when one of them holds a trace. Symbolic links to directories are not
    followed, and at most `MAX_DIRS` directories are listed."""
    from tpudiag.parsers.hlo_text import is_hlo_file
    from tpudiag.parsers.llo.files import STATIC_PROFILE_SUFFIX, classify

    kinds: dict[str, list[Path]] = {"xla": [], "llo": [], "static": []}
    level, listed = [root], 0
    for depth in range(MAX_DEPTH + 1):
        below = []
        for d in level:
            if listed >= MAX_DIRS:
                break
            listed += 1
            try:
                entries = sorted(d.iterdir())
            except OSError:
                continue
            if (d / "plugins" / "profile").is_dir() or any(p.name.endswith(TRACE_SUFFIX) for p in entries):
                return None
            files = [p for p in entries if not p.is_dir()]
            if any(is_hlo_file(p.name) for p in files):
                kinds["xla"].append(d)
            if any(classify(p) is not None for p in files):
                kinds["llo"].append(d)
            if any(p.name.endswith(STATIC_PROFILE_SUFFIX) for p in files):
                kinds["static"].append(d)
            below += [p for p in entries if p.is_dir() and not p.is_symlink()]
        level = below
    return kinds


def is_dump_directory(path: Path) -> bool:
    """A directory holding compiler dumps (in it or in folders below it) and no trace."""
    path = Path(path)
    if not path.is_dir() or (path / "plugins" / "profile").is_dir():
        return False
    try:
        if any(p.name.endswith(TRACE_SUFFIX) for p in path.iterdir()):
            return False
    except OSError:
        return False
    return dump_parts(path).found


def is_hlo_text_file(path: Path) -> bool:
    """One HLO module text file (a dump's `*.after_optimizations.txt`, or `compiled.as_text()` saved)."""
    path = Path(path)
    if path.name.endswith(TRACE_SUFFIX) or not path.is_file():
        return False
    try:  # read_input_text refuses FIFOs and devices, so sniffing cannot hang
        head = read_input_text(path, limit=4096)
    except InputError:
        return False
    return head.lstrip().startswith("HloModule ")


def generation_for_target(target: str) -> str:
    """The TPU generation a `target_arguments.txt` names ('' when unknown)."""
    for prefix, generation in TARGET_GENERATIONS:
        if target.startswith(prefix):
            return generation
    return ""


def generation_for_llo(llo) -> str:
    """The generation an LLO dump was compiled for, from MXUs per core (the per-bundle utilization
    capacity) and VMEM capacity (the VMEM report), when exactly one chip has both; else ''."""
    from tpudiag.model.hardware import CHIPS

    mxus = next((u.column("MXU").capacity for u in llo.utilization if u.column("MXU") is not None), None)
    vmem = llo.vmem_report.capacity_bytes if llo.vmem_report is not None else None
    if mxus is None or vmem is None:
        return ""
    found = [c.generation for c in CHIPS if c.mxu_per_core == mxus and c.vmem_bytes == vmem]
    return found[0] if len(found) == 1 else ""


@dataclass(frozen=True)
class DumpFiles:
    """A compiler dump directory (or one HLO text file) with its XLA and LLO dumps read, once.

    `hlo` and `llo` are None where that part could not be read; `hlo_error` and `llo_error` say
    why. The modelled program (`modelled_program`) and the compiled inputs of a diagnosis are both
    made from these, so nothing here is read twice.
    """

    parts: DumpParts
    hlo: CompiledDump | None
    llo: LloDump | None  # the compile the XLA dump is about (`llo_for_programs`)
    hlo_error: InputError | None = None
    llo_error: InputError | None = None

    @property
    def path(self) -> Path:
        return self.parts.root


def read_dump_files(path: Path) -> DumpFiles:
    """Read the XLA dump (`--xla_dump_to`) and the LLO dump (`--xla_jf_dump_to`) at `path`: a
    directory holding either or both, a `tpudiag compile` output (`xla/`, `llo/`,
    `static_profile/`) or one HLO text file. A part that cannot be read is None with its error."""
    from tpudiag.parsers.hlo_text import load_hlo_dump
    from tpudiag.parsers.llo.load import load_llo_dump

    parts = dump_parts(Path(path))
    dump = llo = hlo_error = llo_error = None
    try:
        dump = load_hlo_dump(parts.xla)
    except InputError as exc:
        hlo_error = exc
    try:
        llo = load_llo_dump(parts.llo, static_profile_dir=parts.static_profile)
        if dump is not None:
            llo = llo_for_programs(parts, llo, dump.programs)
    except InputError as exc:
        llo_error = exc
    return DumpFiles(parts, dump, llo, hlo_error, llo_error)


def load_dumps(paths: Iterable[Path | str]) -> CompiledInputs:
    """LLO dumps (`--xla_jf_dump_to`) and XLA dumps (`--xla_dump_to`) from directories; a `tpudiag
    compile` output directory gives both (its `llo/`, `static_profile/` and `xla/`). A directory
    holding neither is an input error naming it."""
    return compiled_inputs([read_dump_files(Path(p)) for p in paths])


def compiled_inputs(dumps: Sequence[DumpFiles]) -> CompiledInputs:
    """The `CompiledInputs` of dump directories already read; InputError for one holding neither
    dump, with both causes (a damaged dump must say what is damaged, not only "not a dump")."""
    llo, hlo, labels, warnings = [], [], [], []
    for files in dumps:
        if files.hlo is None and files.llo is None:
            raise InputError("neither an LLO dump (`--xla_jf_dump_to`) nor an XLA dump (`--xla_dump_to`) "
                             f"(LLO: {files.llo_error.message}; XLA: {files.hlo_error.message})",
                             path=files.path, hint="pass the directory the compiler wrote its dump files to")
        if files.hlo is not None:
            hlo.extend(HloInput(p, str(files.hlo.path), generation_for_target(p.target)) for p in files.hlo.programs)
            warnings.extend([*files.hlo.warnings, *(w for p in files.hlo.programs for w in p.warnings)])
        if files.llo is not None:
            llo.append(files.llo)
            warnings.extend(files.llo.warnings)
        warnings.extend(files.parts.notes)
        found = [name for name, part in (("LLO", files.llo), ("XLA", files.hlo)) if part is not None]
        labels.append(f"{files.path} ({' + '.join(found)})")
    return CompiledInputs(llo=tuple(llo), hlo=tuple(hlo), labels=tuple(labels),
                          warnings=tuple(dict.fromkeys(warnings)))


def modelled_program(files: DumpFiles) -> CompileOutput:
    """The program a dump's timeline is modelled from, as a `CompileOutput` whose chip is not yet
    decided (`with_chip`): a compile output's own, else the XLA dump's main module, else the LLO
    dump's `TLP-hlo.txt`. InputError when there is none."""
    path = files.path
    if (path / RESULT_FILE).is_file():
        facts = compile_facts(path)
        if files.hlo is None and (path / XLA_DIR).is_dir():
            raise files.hlo_error
        if files.llo is None and (path / LLO_DIR).is_dir() and any((path / LLO_DIR).iterdir()):
            raise files.llo_error
        return compile_output_of(path, facts, files.hlo, files.llo)
    return _from_programs(path, files.hlo, files.llo,
                          [*files.parts.notes, *(files.llo.warnings if files.llo else ())])


def named_generations(files: DumpFiles, output: CompileOutput | None) -> tuple[str, str]:
    """What the files say of the chip, for `model.hardware.decide_chip`: (the generation the
    compile output or the target of the program named, the generation the LLO dump implies)."""
    if output is not None and not output.bare:
        target = output.facts.get("generation") or output.facts.get("device_kind") or ""
    elif output is not None:
        target = generation_for_target(output.program.target)
    else:  # no modelled program: the dump's main module says it, if any does
        target = generation_for_target(main_program(files.hlo.programs).target) if files.hlo else ""
    return target, generation_for_llo(files.llo) if files.llo is not None else ""


def with_chip(output: CompileOutput, choice: ChipChoice) -> CompileOutput:
    """`output` with the chip decided for it (its warnings added, a bare dump's facts filled in);
    InputError when no chip is known, since nothing can be modelled then."""
    if choice.spec is None:
        raise InputError(f"cannot tell the TPU generation of this dump (target `{output.program.target or 'unknown'}`)",
                         path=output.path,
                         hint="the XLA dump's `*.target_arguments.txt` names it; keep it with the dump, or pass --chip")
    facts = output.facts
    if output.bare:
        generation = choice.spec.generation
        device_kind = output.program.target if choice.source is ChipSource.DUMP else choice.source.value
        facts = {**facts, "generation": generation, "device_kind": device_kind, "topology": generation}
    return dataclasses.replace(output, facts=facts, chip=choice, warnings=[*output.warnings, *choice.warnings])


def llo_for_programs(parts: DumpParts, llo, programs):
    """The compile of `llo`'s directory that the XLA dump's `programs` are about.

    An LLO directory collects every compile of a process and `load_llo_dump` reads the newest; an
    XLA dump may hold other modules (`--xla_dump_hlo_module_re`, or a helper compiled after the
    step). When the newest compile's module is none of `programs` but an older compile is of the
    XLA dump's main module, that one is read: spills are the facts of its ops."""
    from tpudiag.parsers.llo.load import load_llo_dump

    if llo.compile is None or not llo.other_compiles or not programs:
        return llo
    if llo.compile.module_name in {p.module for p in programs}:
        return llo
    main = main_program(list(programs)).module
    if not any(c.module_name == main for c in llo.other_compiles):
        return llo
    return load_llo_dump(parts.llo, module=main, static_profile_dir=parts.static_profile)


def main_program(programs: list[CompiledProgram]) -> CompiledProgram:
    """The module a dump is about: the one with the most instructions. A real `--xla_dump_to` of a
    training script also holds small jits (initialisers, casts); the dump order says nothing."""
    return max(programs, key=lambda p: (len(p.instructions), p.path))


def _from_programs(path: Path, dump, llo, warnings: list[str]) -> CompileOutput:
    """The CompileOutput of an XLA dump's main module (or an LLO dump's own HLO), with the facts a
    bare dump gives: device count, static cycles and spills (the generation comes with `with_chip`)."""
    from tpudiag.parsers.hlo_text import parse_hlo_text

    if dump is not None:
        if llo is not None and llo.compile is not None and llo.compile.module_name:
            named = [p for p in dump.programs if p.module == llo.compile.module_name]
            program = main_program(named or dump.programs)
        else:
            program = main_program(dump.programs)
        if len(dump.programs) > 1:
            others = sorted({p.module for p in dump.programs} - {program.module})
            warnings.append(f"{len(dump.programs)} modules in this XLA dump; the static report shows "
                            f"`{program.module}`, the largest (others: {', '.join(others[:5])}"
                            f"{', ...' if len(others) > 5 else ''})")
        warnings.extend(dump.warnings)
    else:
        tlp = next((f for f in llo.files if f.label == "hlo" and f.program == "TLP"), None)
        if tlp is None:
            raise InputError("an LLO dump without its HLO (no `TLP-hlo.txt`): cannot list its ops", path=path,
                             hint="pass the XLA dump (`--xla_dump_to`) of the same compile, or both in one directory")
        program = parse_hlo_text(read_input_text(tlp.path), tlp.path)
    warnings.extend(program.warnings)
    mesh = {key: n for key, n in (("partitions", program.num_partitions), ("replicas", program.replica_count)) if n > 1}
    devices = program.num_partitions * program.replica_count
    if llo is not None:
        program = _with_static_cycles(program, llo)  # a copy: the dump's own program stays as read
    facts = {"status": "ok", "generation": "", "device_kind": "", "module": program.module,
             "n_devices": devices, "target": str(path), "topology": "", "mesh": mesh,
             "static_profile": bool(llo is not None and not llo.static_profile.empty)}
    return CompileOutput(path=path, facts=facts, program=program, spills=llo_spills(llo),
                         group_sizes=replica_group_sizes(program), matmul_flops=matmul_flops(program),
                         hlo_proto=None, warnings=warnings, bare=True)


def _with_static_cycles(program, llo):
    """Give entry instructions without a cycle estimate the static LLO profile's (per instance).

    The profile is what `bundle_analysis_data` carries in `compiled.as_text()`; ops it does not
    estimate (remote DMA) get its 0, as there, so the cost model's fallback applies the same way.
    """
    ops = llo.ops
    if ops.empty:
        return program
    by_name = {str(r.name): r for r in ops.itertuples(index=False)}
    program = dataclasses.replace(program, instructions=dict(program.instructions), _by_name=None)
    for key, inst in list(program.instructions.items()):
        if inst.estimated_cycles is not None or inst.name not in by_name:
            continue
        row = by_name[inst.name]
        status = str(row.cycles_status)
        if status == "estimate" and row.cycles_per_instance is not pd.NA:
            cycles = int(row.cycles_per_instance)
        elif status == "not-estimated-remote-dma":
            cycles = 0
        else:
            continue
        program.instructions[key] = dataclasses.replace(inst, estimated_cycles=cycles,
                                                         cycles_source="bundle_analysis_data")
    return program
