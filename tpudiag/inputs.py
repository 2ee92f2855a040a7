"""The first stage of a diagnosis: read every input file once and decide the chip once.

`read_inputs` turns what `tpudiag.diagnose` was given into `Inputs`, a frozen value the later
stages (analyse, join, rules, report: `tpudiag.pipeline`) read and never re-read files for:

- a capture (trace mode): each host parsed and digested where it is parsed, the per-step tables
  folded as hosts arrive, the HloProtos it embeds parsed once, and `--dumps` read once;
- compiler dumps alone (static mode): the XLA and LLO dumps read once (`parsers.dump_dir`), and
  from them both the compiled inputs the rules read and the program a timeline is modelled from.

The chip and where it came from are decided here, by one call of `model.hardware.decide_chip` on
every path, from what the files say (the capture's device; a dump's target or compile output;
what its LLO dump implies) and `--chip`. The report's header, its warnings, the join and the
rules all use that one `ChipChoice`.
"""

from __future__ import annotations

import functools

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from tpudiag.errors import InputError, UsageError
from tpudiag.model.hardware import ChipChoice, ChipSpec, decide_chip
from tpudiag.model.inputs import CompiledInputs
from tpudiag.model.memory import OomError
from tpudiag.model.report import Mode

if TYPE_CHECKING:
    from tpudiag.model.compile_output import CompileOutput
    from tpudiag.model.profile import Profile, StepTables
    from tpudiag.parsers.capture_files import HostUrl

READING = "reading host files"  # the progress text of this stage


@dataclass(frozen=True)
class Inputs:
    """What one diagnosis read, each file once, and the one chip it uses.

    `compiled.chip` is `chip.spec` and `compiled.oom_errors` the `--error` text's. Trace mode has
    `capture` and `per_step`; static mode has `program` when a timeline can be modelled from the
    dumps, else `no_timeline` says why. `warnings` are what reading and deciding the chip said, in
    the order the report shows them (a modelled program's own are in `program.warnings`).
    """

    path: str  # the input as the user gave it, as reports name it
    mode: Mode
    compiled: CompiledInputs
    chip: ChipChoice
    capture: Profile | None = None  # every host, parsed and digested where it was parsed
    per_step: StepTables | None = None  # the hosts' per-step tables, folded as they arrived
    program: CompileOutput | None = None  # its chip decided (`parsers.dump_dir.with_chip`)
    no_timeline: str = ""
    warnings: tuple[str, ...] = ()


def read_inputs(path: Path | HostUrl, dumps: Sequence[Path] = (), chip: ChipSpec | None = None, *,
                oom_errors: tuple[OomError, ...] = (), jobs: int | None = None,
                progress: Callable[[str], None] | None = None, scheduler=None,
                memory_timeline: bool = False) -> Inputs:
    """Read a capture (with its `dumps`) or compiler dumps alone, and decide the chip (`chip` is
    `--chip`, used where the files do not name one). Arguments are checked ones (`tpudiag.arguments`).

    jobs, scheduler: where the hosts are parsed (`parsers.capture.load_capture`).
    memory_timeline: a capture's allocator events are read too, in the same pass over each host
    file (`HostTrace.memory_timeline`, for `tpudiag memory`).
    """
    from tpudiag.parsers.dump_dir import is_dump_directory, is_hlo_text_file
    from tpudiag.parsers.capture_files import HostUrl

    if not isinstance(path, HostUrl) and (is_dump_directory(path) or is_hlo_text_file(path)):
        if dumps:
            raise UsageError("`--dumps` joins compiled programs to a trace, and PATH is a compiler dump directory",
                             path=path, hint="pass the capture as PATH and the dumps with --dumps")
        return _read_dumps(path, chip, oom_errors, progress)
    return _read_capture(path, dumps, chip, oom_errors, jobs, progress, scheduler, memory_timeline)


def _read_capture(path, dumps: Sequence[Path], chip: ChipSpec | None, oom_errors: tuple[OomError, ...],
                  jobs: int | None, progress, scheduler, memory_timeline: bool = False) -> Inputs:
    from tpudiag.analysis.host_digest import StepFold, parse_and_digest
    from tpudiag.analysis.memory_timeline import timeline_of_planes
    from tpudiag.parsers.capture import load_capture
    from tpudiag.parsers.capture_files import find_capture
    from tpudiag.parsers.dask_hosts import check_scheduler
    from tpudiag.parsers.dump_dir import load_dumps

    find_capture(path)  # fail fast with the precise input error, before parsing any dump
    check_scheduler(scheduler)  # likewise for an address that is not a Dask scheduler
    loaded = load_dumps(dumps)
    if progress is not None:
        progress(READING)
    # Each host is digested where it is parsed, and its per-step tables are folded into the
    # capture's as it arrives: the driver holds small per-host digests and one fold, no events.
    fold = StepFold()
    task = functools.partial(parse_and_digest, also=timeline_of_planes) if memory_timeline else parse_and_digest
    profile = load_capture(path, jobs=jobs, progress=progress, scheduler=scheduler, per_host=task, on_host=fold.add)
    compiled, choice = capture_compiled(profile, loaded, chip, oom_errors)
    # The chip's warnings, then what reading `--dumps` set aside, after the capture's own.
    return Inputs(path=str(path), mode=Mode.TRACE, compiled=compiled, chip=choice, capture=profile,
                  per_step=fold.result(), warnings=(*choice.warnings, *compiled.warnings))


def capture_compiled(profile: Profile, dumps: CompiledInputs = CompiledInputs(), chip: ChipSpec | None = None,
                     oom_errors: tuple[OomError, ...] = ()) -> tuple[CompiledInputs, ChipChoice]:
    """The compiled inputs of a capture read: `dumps` (its `--dumps`, read), the HloProtos it
    embeds, and the chip decided from its device and `chip` (`--chip`); with that `ChipChoice`."""
    from tpudiag.parsers.hlo_proto import capture_hlo_inputs

    hosts = profile.hosts
    choice = decide_chip(trace=hosts[0].device.chip if hosts else None, user=chip, what="capture")
    return replace(dumps, embedded=capture_hlo_inputs(profile), chip=choice.spec, oom_errors=oom_errors), choice


def _read_dumps(path: Path, chip: ChipSpec | None, oom_errors: tuple[OomError, ...], progress) -> Inputs:
    """Compiler dumps alone, read once: the compiled inputs, and the program a timeline is modelled
    from when there is one and its chip is known. InputError only when nothing can be read."""
    from tpudiag.parsers.dump_dir import compiled_inputs, modelled_program, named_generations, read_dump_files, with_chip

    if progress is not None:
        progress(READING)
    files = read_dump_files(path)
    compiled = compiled_inputs([files])
    program, why = None, None
    try:
        program = modelled_program(files)
    except InputError as exc:
        why = exc
    target, llo = named_generations(files, program)
    choice = decide_chip(target=target, llo=llo, user=chip)
    if program is not None:
        try:
            program = with_chip(program, choice)  # the chip's warnings are the program's, with the static report's
        except InputError as exc:
            program, why = None, exc
    compiled = replace(compiled, chip=choice.spec, oom_errors=oom_errors)
    if program is not None:
        return Inputs(path=str(path), mode=Mode.STATIC, compiled=compiled, chip=choice, program=program)
    no_timeline = (f"no modelled timeline: {why.message}; rules that need it are skipped"
                   + (f" (hint: {why.hint})" if why.hint else ""))
    # What reading both dumps set aside (a damaged module file skipped), as with a timeline.
    warnings = (no_timeline, *choice.warnings, *compiled.warnings)
    return Inputs(path=str(path), mode=Mode.STATIC, compiled=compiled, chip=choice, no_timeline=no_timeline,
                  warnings=warnings)
