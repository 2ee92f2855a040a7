"""What `tpudiag report` adds from compiled programs: the join's inputs, and dump directories alone.

- `join_for_report`: the compiled sources of a report (the `--dumps` the rules already loaded,
  then the HloProtos the capture embeds), parsed and joined to the trace ops.
- `is_dump_directory` / `static_report_for`: `tpudiag report DIR` on a compiler dump without a
  trace gives the static report of `tpudiag compile`.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tpudiag.analysis.join import CAPTURE_ORIGIN, HloSource, JoinResult, join_compiled
from tpudiag.analysis.profile_analysis import Analysis


def _hlo_sources(extra_inputs: Mapping[str, Any], analysis: Analysis) -> list[HloSource]:
    from tpudiag.compiler.dump_dir import generation_for_target
    from tpudiag.parsers.hlo_program import instruction_bytes
    from tpudiag.parsers.hlo_proto import host_programs

    sources: list[HloSource] = []
    for dump in extra_inputs.get("hlo") or ():
        programs = getattr(dump, "programs", None)
        origin = getattr(dump, "path", "")
        for program in (programs if programs is not None else [dump]):
            sources.append(HloSource(program, instruction_bytes(program), str(origin or program.path),
                                     generation_for_target(program.target)))
    seen: set[int] = set()
    for host in analysis.profile.hosts:
        for pid, program in host_programs(host).items():
            if pid in seen:
                continue
            seen.add(pid)
            sources.append(HloSource(program, instruction_bytes(program), CAPTURE_ORIGIN))
    return sources


def join_for_report(analysis: Analysis, extra_inputs: Mapping[str, Any] | None) -> JoinResult:
    """Join the `--dumps` (as `rules_cmd.load_dump_inputs` loaded them) and the capture's own HLO."""
    extra = extra_inputs or {}
    hosts = analysis.profile.hosts
    chip = hosts[0].device.chip if hosts else None
    return join_compiled(analysis.ops, _hlo_sources(extra, analysis), extra.get("llo") or (), chip=chip)


def is_dump_directory(path: Path) -> bool:
    """Compiler dumps and no trace: `tpudiag report` gives the static report for these."""
    from tpudiag.compiler.dump_dir import is_dump_directory as _is_dump

    return _is_dump(path)


def report_dump_directory(path: Path, output_format: str, top: int, dumps: list[Path] | None = None,
                          output: Path | None = None) -> None:
    """Print (or write to `output`) the static report of `tpudiag compile` for a dump directory."""
    import sys

    from tpudiag.cli.app import stderr_console, stdout_console
    from tpudiag.compiler.dump_dir import load_dump_directory
    from tpudiag.compiler.static_report import build_static_report
    from tpudiag.errors import UsageError
    from tpudiag.render.console import SafeConsole
    from tpudiag.render.files import atomic_open
    from tpudiag.render.static_report import render_static_json, render_static_terminal

    if dumps:
        raise UsageError("`--dumps` joins compiled programs to a trace, and PATH is a compiler dump directory",
                         path=path, hint="pass the capture as PATH and the dumps with --dumps")
    if output_format not in ("terminal", "json"):
        raise UsageError(f"a compiler dump directory gives the static report, which has no `{output_format}` format",
                         path=path, hint="use --format terminal or --format json")
    report = build_static_report(load_dump_directory(path))
    if output is not None:
        with atomic_open(output) as f:
            if output_format == "json":
                f.write(render_static_json(report) + "\n")
            else:
                render_static_terminal(report, SafeConsole(file=f, width=140, color_system=None), top=top)
        stderr_console().print(f"wrote `{output}`", markup=False, highlight=False)
    elif output_format == "json":
        sys.stdout.write(render_static_json(report) + "\n")
    else:
        render_static_terminal(report, stdout_console(), top=top)
