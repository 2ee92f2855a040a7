"""XLA dump directories (`XLA_FLAGS=--xla_dump_to=DIR`) and HLO module text -> CompiledProgram.

Reads, per module, `*.after_optimizations.txt` (the scheduled HLO: in a scheduled module the
order of a computation's instructions is its schedule), and when present
`*.after_optimizations-buffer-assignment.txt`, `*.after_optimizations-memory-usage-report.txt`,
`*.after_optimizations-live-range.txt` and `*.target_arguments.txt`; `*.oom_intermediate_module.txt`
only by its presence (the compile ran out of memory). Other dump files are ignored.

Current XLA prints op metadata as `stack_frame_id=N` into tables at the top of the module
(`FileNames`, `FunctionNames`, `FileLocations`, `StackFrames`) rather than `source_file=`;
both forms are resolved to a file and line here.

Damage policy: a file that is not HLO at all, or has no complete computation, raises
InputError naming it; an instruction line that cannot be read, or a module cut off mid-way,
becomes a warning on the program and the rest is kept.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.model.compiled import (
    BufferAllocation,
    BufferValue,
    CompiledDump,
    CompiledProgram,
    Instruction,
    MemorySpaceUsage,
)
from tpudiag.model.matmuls import contraction_from_attributes
from tpudiag.model.units import MAX_PLAUSIBLE_BYTES, MAX_PLAUSIBLE_TEXT
from tpudiag.parsers.hlo_program import canonical_opcode, check_allocation_sizes, computation_from, finish_program
from tpudiag.parsers.input_files import read_input_text
from tpudiag.parsers.layout import ShapeSyntaxError, parse_shape

HLO_SUFFIX = ".after_optimizations.txt"
# The optimised module of a dump is `<prefix>.after_optimizations.txt` on a TPU; XLA's CPU compiler
# tags the stage `cpu_` (`<prefix>.cpu_after_optimizations.txt`), its GPU compiler the target
# (`<prefix>.sm_9.0_gpu_after_optimizations.txt`). Side files carry the same tag: the stem (the
# name less `after_optimizations.txt`) plus the side file's own ending.
_HLO_FILE = re.compile(r"^(?P<prefix>.+?)\.(?:cpu_|sm_\d+\.\d+_gpu_|gfx\w+?_gpu_)?after_optimizations\.txt$")
_STAGE = "after_optimizations.txt"
BUFFER_SUFFIX = "after_optimizations-buffer-assignment.txt"
VALUES_SUFFIX = "after_optimizations-buffer-assignment-values.txt"
USAGE_SUFFIX = "after_optimizations-memory-usage-report.txt"
LIVE_RANGE_SUFFIX = "after_optimizations-live-range.txt"
OOM_SUFFIX = ".oom_intermediate_module.txt"  # written when the compile ran out of memory
TARGET_SUFFIX = ".target_arguments.txt"

# Attributes whose `%name` values are called computations.
_CALL_ATTRS = ("calls", "to_apply", "condition", "body", "branch_computations",
               "true_computation", "false_computation", "called_computations")

# Attributes that have fields of their own on `Instruction`; the rest are kept as printed.
_FIELD_ATTRS = frozenset({"metadata", "backend_config", "frontend_attributes"})

_MAX_WARNINGS = 20  # per file; the rest are counted in one line

_COMP_HEADER = re.compile(r"^(?P<entry>ENTRY\s+)?%?(?P<name>[^\s(]+)\s*\(.*\)\s*->\s*.*\{\s*$")
_INST_HEAD = re.compile(r"^\s+(?P<root>ROOT\s+)?%?(?P<name>[^\s=]+)\s*=\s*")
_OPCODE = re.compile(r"\s*(?P<op>[a-z][\w\-.]*)\(")
_REF = re.compile(r"%([^\s,(){}]+)")
_META_ITEM = re.compile(r'([\w.\-]+)=("(?:[^"\\]|\\.)*"|[^\s},]+)')
_TABLE_ROW = re.compile(r"^(\d+)\s+(.*)$")
_INDEX_COMMENT = re.compile(r"/\*index=\d+\*/")
# The head of an instruction as current XLA prints it (`%` before the name): where a continued line stops.
_NEXT_INST = re.compile(r"^\s+(?:ROOT\s+)?%[^\s=]+\s*=\s")
_MAX_CONTINUATION = 10_000  # lines one instruction may continue on


def is_hlo_file(name: str) -> bool:
    """Whether a file name is a dump's optimised module (TPU, CPU or GPU compiler)."""
    return _HLO_FILE.match(name) is not None


def _module_prefix(name: str) -> str:
    """`module_0001.jit_f` of an optimised module's file name (`is_hlo_file`)."""
    m = _HLO_FILE.match(name)
    return m.group("prefix") if m else name


def load_hlo_dump(path: Path | str) -> CompiledDump:
    """Every optimised module in a `--xla_dump_to` directory (or one HLO text file).

    Raises InputError when the path is missing, holds no `*after_optimizations.txt`, or no
    module in it can be read; a damaged module among readable ones becomes a warning.
    """
    root = Path(path)
    if not root.exists():
        raise InputError("no such file or directory", path=root)
    if root.is_file():
        program = load_hlo_text(root)
        if is_hlo_file(root.name):  # one module picked out of a dump: its side files still apply
            _attach_side_files(program, root.parent, root.name)
        return CompiledDump(path=str(root), programs=[program])
    try:
        entries = sorted(root.iterdir())
    except OSError as exc:
        raise InputError(f"cannot list directory ({exc.strerror or exc})", path=root) from exc
    # Not only regular files: a FIFO or device named like a dump is reported (and skipped) by
    # load_hlo_text's regular-file check rather than silently ignored.
    hlo_files = [p for p in entries if not p.is_dir() and is_hlo_file(p.name)]
    if not hlo_files:
        raise InputError(f"no `*{HLO_SUFFIX}` files: not an XLA dump directory", path=root,
                         hint="compile with XLA_FLAGS=--xla_dump_to=DIR and pass that DIR")
    targets = {p.name[: -len(TARGET_SUFFIX)]: p for p in entries if p.name.endswith(TARGET_SUFFIX)}
    dump = CompiledDump(path=str(root), programs=[])
    errors: list[InputError] = []
    for hlo in hlo_files:
        try:
            program = load_hlo_text(hlo)
        except InputError as exc:
            errors.append(exc)
            dump.warnings.append(f"skipped {exc.one_line()}")
            continue
        _attach_side_files(program, root, hlo.name, targets)
        dump.programs.append(program)
    if not dump.programs:
        raise errors[0]
    return dump


def _count(text: str) -> int:
    """A device count of the `HloModule` line; 1 when absent or not a positive number."""
    return int(text) if text.isdigit() and int(text) > 0 else 1


def load_hlo_text(path: Path | str) -> CompiledProgram:
    """Parse one HLO module text file (a dump's `*after_optimizations.txt` or `c.as_text()`)."""
    path = Path(path)
    return parse_hlo_text(read_input_text(path), path)


def parse_hlo_text(text: str, path: Path | str = "<text>") -> CompiledProgram:
    """Parse HLO module text into a CompiledProgram; raise InputError if it is not HLO."""
    if "\x00" in text[:4096]:
        raise InputError("binary data, not HLO text", path=path)
    parser = _ModuleParser(text, str(path))
    try:
        return finish_program(parser.parse())
    except RecursionError as exc:
        raise InputError("nesting too deep to parse (a damaged or hostile HLO file)", path=path) from exc
    except OverflowError as exc:
        raise InputError("a number beyond int64 (a damaged HLO file)", path=path) from exc


class _ModuleParser:
    def __init__(self, text: str, path: str):
        self.lines = text.splitlines()
        self.path = path
        self.warnings: list[str] = []
        self.suppressed = 0
        self.tables: dict[str, dict[int, str]] = {}

    def warn(self, message: str) -> None:
        if len(self.warnings) < _MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.suppressed += 1

    def parse(self) -> CompiledProgram:
        header = next((ln for ln in self.lines[:50] if ln.startswith("HloModule ")), None)
        if header is None:
            raise InputError("no `HloModule` line: not an HLO module text", path=self.path,
                             hint=f"pass the `*{HLO_SUFFIX}` file or its dump directory")
        attrs = _split_top(header[len("HloModule "):])
        module = attrs[0].strip() if attrs else ""
        kv = dict(_key_value(a) for a in attrs[1:])
        computations: dict = {}
        instructions: dict = {}
        entry = ""
        i = 0
        n = len(self.lines)
        while i < n:
            line = self.lines[i]
            if line in ("FileNames", "FunctionNames", "FileLocations", "StackFrames"):
                i = self._table(line, i + 1)
                continue
            m = _COMP_HEADER.match(line)
            if not m:
                i += 1
                continue
            name = m.group("name")
            is_entry = bool(m.group("entry"))
            comp_insts: list[Instruction] = []
            seen: set[str] = set()
            i += 1
            closed = False
            while i < n:
                body = self.lines[i]
                if body.startswith("}"):
                    closed = True
                    i += 1
                    break
                first = i
                body, i = self._logical_line(i)
                if body.strip():
                    inst = self._instruction(body, name, len(comp_insts), first + 1)
                    if inst is not None and inst.name in seen:
                        self.warn(f"line {i + 1}: second instruction named `{inst.name}` in `{name}` skipped")
                    elif inst is not None:
                        seen.add(inst.name)
                        comp_insts.append(inst)
                i += 1
            if not closed:
                self.warn(f"computation `{name}` is cut off at the end of the file (truncated dump?)")
            if not comp_insts:
                continue
            computations[name] = computation_from(name, is_entry, comp_insts)
            for inst in comp_insts:
                instructions[(name, inst.name)] = inst
            if is_entry:
                entry = name
        if not computations:
            raise InputError("no complete HLO computation found (empty or truncated file)", path=self.path)
        if not entry:
            self.warn("no ENTRY computation (truncated dump?); using the last computation as entry")
            entry = list(computations)[-1]
        self._check_calls(computations, instructions)
        if self.suppressed:
            self.warnings.append(f"{self.suppressed} more warnings like the above")
        return CompiledProgram(
            module=module, path=self.path, source="hlo_text", entry=entry,
            is_scheduled=kv.get("is_scheduled", "") == "true", computations=computations,
            instructions=instructions, entry_layout=kv.get("entry_computation_layout", ""),
            num_partitions=_count(kv.get("num_partitions", "")), replica_count=_count(kv.get("replica_count", "")),
            warnings=[f"`{self.path}`: {w}" for w in self.warnings])

    def _logical_line(self, i: int) -> tuple[str, int]:
        """The instruction starting at line `i`, with the lines it continues on, and the index of
        its last line. XLA prints attribute values as they are, so one can span lines (a Pallas
        kernel's `frontend_attributes={kernel_metadata={` JSON, one key a line): an instruction
        whose brackets or quotes are still open at the end of a line goes on to the next, up to
        the next instruction or computation header (`_MAX_CONTINUATION` lines at most)."""
        line = self.lines[i]
        if not _INST_HEAD.match(line) or _open_depth(line) == 0:
            return line, i
        parts = [line]
        j = i + 1
        while j < len(self.lines) and j - i <= _MAX_CONTINUATION:
            nxt = self.lines[j]
            if _NEXT_INST.match(nxt) or _COMP_HEADER.match(nxt):
                break
            parts.append(nxt)
            if _open_depth("\n".join(parts)) == 0:
                return "\n".join(parts), j
            j += 1
        return line, i  # never closed: read as the one line, which says what is wrong with it

    def _table(self, title: str, i: int) -> int:
        rows: dict[int, str] = {}
        while i < len(self.lines):
            m = _TABLE_ROW.match(self.lines[i])
            if not m:
                break
            rows[int(m.group(1))] = m.group(2)
            i += 1
        self.tables[title] = rows
        return i

    def _instruction(self, line: str, computation: str, position: int, lineno: int) -> Instruction | None:
        try:
            inst, frame_id = _parse_instruction(line, computation, position)
        except (_LineError, ShapeSyntaxError) as exc:
            self.warn(f"line {lineno}: {exc} (instruction skipped)")
            return None
        if frame_id is not None and not inst.source_file:
            inst = self._resolve_frame(inst, frame_id)
        return inst

    def _check_calls(self, computations: dict, instructions: dict) -> None:
        missing = sorted({c for inst in instructions.values() for c in inst.called_computations
                          if c not in computations})
        if missing:
            shown = ", ".join(f"`{c}`" for c in missing[:5])
            self.warn(f"{len(missing)} called computations are missing from the file: {shown}")

    def _resolve_frame(self, inst: Instruction, frame_id: int) -> Instruction:
        """Turn `stack_frame_id=N` into a file and line through the module's frame tables.

        The tables precede the computations in the file, so they are read by the time any
        instruction is.
        """
        frame = _parse_braced(self.tables.get("StackFrames", {}).get(frame_id, ""))
        loc = _parse_braced(self.tables.get("FileLocations", {}).get(_int(frame.get("file_location_id")), ""))
        file_name = self.tables.get("FileNames", {}).get(_int(loc.get("file_name_id")), "")
        if not file_name:
            return inst
        return dataclasses.replace(inst, source_file=_unquote(file_name), source_line=_int(loc.get("line")))


class _LineError(ValueError):
    pass


def _parse_instruction(line: str, computation: str, position: int) -> tuple[Instruction, int | None]:
    """One instruction line, and its metadata `stack_frame_id` (None when absent)."""
    line = _INDEX_COMMENT.sub("", line)
    head = _INST_HEAD.match(line)
    if head is None:
        raise _LineError("not an instruction (`%name = shape opcode(...)`)")
    pos = head.end()
    shape_end = _shape_end(line, pos)
    shape_text = line[pos:shape_end]
    shape = parse_shape(shape_text)
    m = _OPCODE.match(line, shape_end)
    if m is None:
        raise _LineError(f"no opcode after the shape of `{head.group('name')}`")
    opcode, wrapped = canonical_opcode(m.group("op"))
    close = _matching(line, m.end() - 1)
    if close < 0:
        raise _LineError(f"unclosed operand list of `{head.group('name')}`")
    operand_text = line[m.end():close]
    attrs = dict(_key_value(a) for a in _split_top(line[close + 1:].lstrip(", ")) if a.strip())
    operands: tuple[str, ...] = ()
    param_number = None
    if opcode == "parameter":
        param_number = _int(operand_text.strip(), default=None)
    elif opcode != "constant":
        names = []
        for item in _split_top(operand_text):
            refs = _REF.findall(item)
            if refs:
                names.append(refs[-1])
        operands = tuple(names)
    called = tuple(ref for key in _CALL_ATTRS if key in attrs for ref in _REF.findall(attrs[key]))
    meta = _parse_braced(attrs.get("metadata", ""))
    frontend = _frontend_attributes(attrs.get("frontend_attributes", ""))
    inst = Instruction(
        computation=computation, name=head.group("name"), opcode=opcode, shape_text=shape_text,
        shape=shape, operands=operands, called_computations=called,
        fusion_kind=attrs.get("kind", "") if opcode == "fusion" else "",
        custom_call_target=_unquote(attrs.get("custom_call_target", "")),
        op_name=_unquote(meta.get("op_name", "")), source_file=_unquote(meta.get("source_file", "")),
        source_line=_int(meta.get("source_line")), backend_config=_backend_config(attrs.get("backend_config", "")),
        async_execution_thread=_unquote(attrs.get("async_execution_thread", "")),
        frontend_attributes=frontend, is_root=bool(head.group("root")), position=position,
        parameter_number=param_number, wrapped_opcode=wrapped,
        attributes=tuple((k, v) for k, v in attrs.items() if k not in _FIELD_ATTRS),
        contraction=contraction_from_attributes(opcode, attrs))
    return inst, _int(meta.get("stack_frame_id"), default=None)


def parse_instruction(line: str, computation: str = "") -> Instruction | None:
    """One instruction line as a dump or a trace's op metadata prints it (`%name = shape opcode(...)`,
    operands with or without their shapes), read as a dump's instructions are; None when the text is
    not one. The fields `finish_program` derives from the whole program are left at their defaults."""
    try:
        return _parse_instruction("  " + line.strip(), computation, 0)[0]
    except (_LineError, ShapeSyntaxError):
        return None


def _frontend_attributes(text: str) -> tuple[tuple[str, str], ...]:
    """`{a="x",b={...}}` -> (('a', 'x'), ('b', '{...}')): values unquoted, a braced value (a
    kernel's JSON metadata, which may span lines) kept whole."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    return tuple((k, _unquote(v)) for k, v in map(_key_value, _split_top(text)) if k)


def _backend_config(raw: str) -> str:
    raw = raw.strip()
    if raw.startswith('"'):  # older dumps quote the config as a string
        return _unquote(raw)
    return raw


def _shape_end(line: str, pos: int) -> int:
    """Index just after the shape starting at `pos`: the first space at bracket depth 0."""
    depth = 0
    i = pos
    while i < len(line):
        ch = line[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == " " and depth == 0:
            return i
        i += 1
    raise _LineError("the line ends inside the result shape (truncated?)")


# Quoted strings (skipped whole, escapes included) and the characters that give text structure.
# Scanning with finditer keeps the per-character loop in C: backend configs make lines long.
_STRUCTURE = re.compile(r'"(?:[^"\\]|\\.)*"?|[()\[\]{},]')
_CLOSERS = {"(": ")", "[": "]", "{": "}"}


def _matching(text: str, open_at: int) -> int:
    """Index of the bracket closing the one at `open_at`, skipping quoted strings; -1 if none."""
    stack: list[str] = []
    for m in _STRUCTURE.finditer(text, open_at):
        ch = m.group(0)
        if ch in _CLOSERS:
            stack.append(_CLOSERS[ch])
        elif stack and ch == stack[-1]:
            stack.pop()
            if not stack:
                return m.start()
    return -1


def _open_depth(text: str) -> int:
    """How many brackets are still open at the end of `text` (quoted strings skipped); an open
    quoted string counts as one more."""
    depth = 0
    for m in _STRUCTURE.finditer(text):
        tok = m.group(0)
        if tok[0] == '"':
            if len(tok) == 1 or not tok.endswith('"') or _escaped_end(tok):
                return depth + 1
        elif tok in "([{":
            depth += 1
        elif tok in ")]}":
            depth = max(0, depth - 1)
    return depth


def _escaped_end(tok: str) -> bool:
    """Whether the closing quote of a quoted token is escaped (an odd run of backslashes before it)."""
    run = len(tok) - 1 - len(tok[:-1].rstrip("\\"))
    return run % 2 == 1


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets and quoted strings."""
    parts: list[str] = []
    depth = 0
    start = 0
    for m in _STRUCTURE.finditer(text):
        ch = m.group(0)
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append(text[start:m.start()])
            start = m.end()
    parts.append(text[start:])
    return [p.strip() for p in parts if p.strip()]


def _key_value(item: str) -> tuple[str, str]:
    key, _, value = item.partition("=")
    return key.strip(), value.strip()


def _parse_braced(text: str) -> dict[str, str]:
    """`{a="x" b=3}` or `{a="x",b="y"}` -> {'a': '"x"', 'b': '3'} (values as written)."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        text = text[1:-1]
    return {m.group(1): m.group(2).rstrip(",") for m in _META_ITEM.finditer(text)}


_ESCAPE = re.compile(r"\\(.)")
_ESCAPED = {"n": "\n", "t": "\t", "r": "\r"}


def _unquote(value: str) -> str:
    """A quoted HLO string's content. XLA escapes C-style (`\\'` too, which JSON lacks)."""
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] == '"':
        return _ESCAPE.sub(lambda m: _ESCAPED.get(m.group(1), m.group(1)), value[1:-1])
    return value


def _int(value, default: int | None = 0):
    if value is None:
        return default
    try:
        return int(str(value).strip().strip('"'))
    except ValueError:
        return default


def _attach_side_files(program: CompiledProgram, root: Path, hlo_name: str,
                       targets: dict[str, Path] | None = None) -> None:
    """Buffer assignment, memory usage and target of the module file `hlo_name` in dump directory
    `root` (`targets`: the directory's target files by module prefix; None lists them, for one file
    given alone)."""
    stem = hlo_name[: -len(_STAGE)]  # `module_0001.jit_f.` or, from XLA's CPU compiler, `….cpu_`
    prefix = _module_prefix(hlo_name)
    _attach(program, root / (stem + BUFFER_SUFFIX), _set_allocations, "buffer assignment")
    _attach(program, root / (stem + VALUES_SUFFIX), _parse_total_bytes, "buffer values", limit=4096)
    _attach(program, root / (stem + USAGE_SUFFIX), _set_memory_spaces, "memory-usage report")
    _attach(program, root / (stem + LIVE_RANGE_SUFFIX), _set_live_ranges, "live ranges")
    program.oom_recorded = (root / (prefix + OOM_SUFFIX)).is_file()
    if targets is None:
        try:
            targets = {p.name[: -len(TARGET_SUFFIX)]: p for p in root.iterdir() if p.name.endswith(TARGET_SUFFIX)}
        except OSError:
            targets = {}
    target = targets.get(prefix) or _only_target(targets)
    if target is not None:
        _attach(program, target, _parse_target, "target arguments")


def _only_target(targets: dict[str, Path]) -> Path | None:
    """A directory's target file when every compile in it targeted the same chip."""
    texts = set()
    for p in targets.values():
        try:
            texts.add(read_input_text(p, limit=4096))
        except InputError:
            return None  # an unreadable target file: no chip from it, as when targets differ
    return next(iter(targets.values())) if len(texts) == 1 else None


def _attach(program: CompiledProgram, path: Path, parse, what: str, limit: int = -1) -> None:
    """Parse an optional side file into `program`; damage becomes a warning, not an error."""
    if not path.exists():
        return
    try:
        text = read_input_text(path, limit=limit)
        parse(program, text)
    except InputError as exc:
        program.warnings.append(f"cannot read {what}: {exc.one_line()}; ignored")
    except (ValueError, IndexError) as exc:
        program.warnings.append(f"`{path}`: unreadable {what} ({exc}); ignored")


_ALLOC = re.compile(r"^allocation (\d+): size (\d+)(.*):\s*$")
_VALUE = re.compile(r"^\s+value: <(\d+) (\S+) @\d+> \(size=(\d+),offset=(\d+)\): (.*)$")


def parse_buffer_assignment(text: str) -> tuple[BufferAllocation, ...]:
    """The allocations of a `*-buffer-assignment.txt`; ValueError when there are none."""
    allocs: list[BufferAllocation] = []
    current: dict | None = None
    values: list[BufferValue] = []

    def flush() -> None:
        if current is not None:
            allocs.append(BufferAllocation(values=tuple(values), **current))

    for line in text.splitlines():
        m = _ALLOC.match(line)
        if m:
            flush()
            values = []
            flags = m.group(3)
            color = re.search(r"color (\d+)", flags)
            param = re.search(r"parameter (\d+)", flags)
            current = dict(
                index=int(m.group(1)), size_bytes=int(m.group(2)), color=int(color.group(1)) if color else 0,
                parameter_number=int(param.group(1)) if param else None, is_output="output shape" in flags,
                maybe_live_out="maybe-live-out" in flags, is_thread_local="thread-local" in flags,
                is_temp="preallocated-temp" in flags, is_constant="constant" in flags)
            continue
        v = _VALUE.match(line)
        if v and current is not None:
            values.append(BufferValue(value_id=int(v.group(1)), name=v.group(2), size_bytes=int(v.group(3)),
                                      offset_bytes=int(v.group(4)), shape_text=v.group(5).strip()))
    flush()
    if not allocs:
        raise ValueError("no `allocation N: size S` lines")
    return check_allocation_sizes(tuple(allocs))


def _set_allocations(program: CompiledProgram, text: str) -> None:
    program.allocations = parse_buffer_assignment(text)


_TOTAL = re.compile(r"^Total bytes used: (\d+)", re.M)


def _parse_total_bytes(program: CompiledProgram, text: str) -> None:
    m = _TOTAL.search(text)  # the total heads a file that can run to megabytes: only its head is read
    if m is None:
        raise ValueError("no `Total bytes used:` line")
    program.total_bytes_used = _plausible_bytes(m.group(1), "`Total bytes used:`")


def _plausible_bytes(digits: str, what: str) -> int:
    """A byte count read from a side file; ValueError past any memory (checked on its digits first)."""
    if len(digits) > 20 or int(digits) > MAX_PLAUSIBLE_BYTES:
        raise ValueError(f"{what} {digits[:20]}{'...' if len(digits) > 20 else ''} is past "
                         f"{MAX_PLAUSIBLE_TEXT}")
    return int(digits)


_SPACE = re.compile(r"^Memory Space: (.+?) \(color=(\d+)\)\s*$")
_SPACE_TOTAL = re.compile(r"^Total bytes: (\d+)")


def parse_memory_usage(text: str) -> tuple[MemorySpaceUsage, ...]:
    """The `Memory Space:` totals of a `*-memory-usage-report.txt`; ValueError when there are none."""
    spaces: list[MemorySpaceUsage] = []
    name, color = None, 0
    for line in text.splitlines():
        m = _SPACE.match(line)
        if m:
            name, color = m.group(1), int(m.group(2))
            continue
        t = _SPACE_TOTAL.match(line)
        if t and name is not None:
            spaces.append(MemorySpaceUsage(name=name, color=color,
                                           total_bytes=_plausible_bytes(t.group(1), "`Total bytes:`")))
            name = None
    if not spaces:
        raise ValueError("no `Memory Space:` blocks")
    return tuple(spaces)


def _set_memory_spaces(program: CompiledProgram, text: str) -> None:
    program.memory_spaces = parse_memory_usage(text)


_LIVE_HEAD = re.compile(r"^HloLiveRange \(max (\d+)\):")
_LIVE_VALUE = re.compile(r"^\s+(\S+\{[\d,]*\}):(\d+)-(\d+)\s*$")


def parse_live_ranges(text: str) -> tuple[dict[str, tuple[int, int]], int]:
    """`*-live-range.txt`: (value -> (first, last) program position, number of positions).

    Reads the `BufferLiveRange:` block (`params_0_.1{}:0-94`); the file's own peak summary is
    not read: it leaves out outputs defined after its peak, which the compiler reserves for the
    whole program. ValueError when there is no `HloLiveRange` header.
    """
    head = _LIVE_HEAD.match(text)
    if head is None:
        raise ValueError("no `HloLiveRange (max N):` header")
    # Each position is a line of the file's `InstructionSequence`: a larger max is damage, refused
    # before it sizes anything (the memory timeline has one entry per position).
    digits, lines = head.group(1), text.count("\n") + 1
    if len(digits) > len(str(lines)) or int(digits) > lines:
        raise ValueError(f"`max {digits[:20]}{'...' if len(digits) > 20 else ''}` positions in a file of "
                         f"{lines} lines (each position is a line of its InstructionSequence)")
    ranges: dict[str, tuple[int, int]] = {}
    in_block = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "BufferLiveRange:":
            in_block = True
            continue
        if in_block:
            m = _LIVE_VALUE.match(line)
            if m is None:
                break  # the block ends at the next heading
            ranges[m.group(1)] = (int(m.group(2)), int(m.group(3)))
    return ranges, int(digits)


def _set_live_ranges(program: CompiledProgram, text: str) -> None:
    program.live_ranges, program.live_range_positions = parse_live_ranges(text)


def _parse_target(program: CompiledProgram, text: str) -> None:
    version = re.search(r"^\s*version: (\S+)", text, re.M)
    variant = re.search(r'^\s*variant: "([^"]*)"', text, re.M)
    if version is None:
        raise ValueError("no `version:` line")
    program.target = version.group(1) + (f" {variant.group(1)}" if variant and variant.group(1) else "")
