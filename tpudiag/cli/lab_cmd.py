"""`tpudiag lab`: reproduce a profiled op as a Pallas TPU kernel, check its numerics, tune its blocks.

jax is imported only inside the commands. Data goes to stdout; progress and diagnostics to stderr.
Exit codes: 0 ok, 1 numerics mismatch (`check`), 2 usage or input error (including ops the lab
cannot reproduce yet), 130 interrupted (`tune` keeps what it finished).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import Format, TerminalOrJson
from tpudiag.errors import InputError, UsageError
from tpudiag.model.text import printable

lab_app = typer.Typer(no_args_is_help=True, help="Pallas kernel reproductions of profiled ops: extract, check, tune.")


def _capture_or_example(path: Path | None, dump: Path | None) -> tuple[Path, Path | None]:
    """The capture to read and the dump to join: PATH as given, or the bundled example with its own
    compiler dumps (operand shapes and fusion bodies), as `report` does with no PATH."""
    if path is not None:
        return path, dump
    from tpudiag.examples_data import bundled_capture, bundled_dumps

    target = bundled_capture()
    return target, dump if dump is not None else next(iter(bundled_dumps()), None)


def _consoles():
    from tpudiag.cli.console import stderr_console, stdout_console

    return stdout_console(), stderr_console()


def _diagnosis(path: Path, dump: Path | None):
    """The capture and its dump through the one pipeline, so the lab sees the programs the report
    does; its warnings go to stderr as `report` shows them."""
    from tpudiag.pipeline import diagnose

    if dump is not None and not dump.is_dir():
        raise UsageError("the dump directory does not exist", path=dump)
    result = diagnose(path, dumps=(dump,) if dump is not None else ())
    _, err = _consoles()
    for w in result.warnings:
        err.print(f"warning: {w}", markup=False, highlight=False)
    return result


@lab_app.command("ops")
def ops(
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file; default: the "
                                                     "bundled example")] = None,
    top: Annotated[int, typer.Option(help="Ops to list, by self time")] = 20,
    dump: Annotated[Path | None, typer.Option("--dump", help="XLA/libtpu dump directory of the same program "
                                                             "(operands, fusion bodies, collectives' replica "
                                                             "groups)")] = None,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f")] = TerminalOrJson.terminal,
) -> None:
    """List a capture's ops by self time with the kernel family each maps to, or why none does."""
    from dataclasses import asdict

    from rich.table import Table

    from tpudiag.kernels_lab.problems import problem_fields
    from tpudiag.kernels_lab.spec import coverage, survey
    from tpudiag.render.console import markup

    path, dump = _capture_or_example(path, dump)
    all_rows = survey(_diagnosis(path, dump))
    cov = coverage(all_rows)
    rows = all_rows[:top]
    console, _ = _consoles()
    if Format(output_format) is Format.json:
        ops = [dict(asdict(r), problem=problem_fields(r.problem) if r.problem is not None else {}) for r in rows]
        data = {"ops": ops, "coverage": dict(asdict(cov), compute_share=cov.compute_share,
                                                                   collective_share=cov.collective_share)}
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return
    table = Table(show_edge=False, pad_edge=False, box=None, header_style="bold")
    for name, justify in (("op", "left"), ("category", "left"), ("time %", "right"), ("family", "left"),
                          ("problem, or why not", "left")):
        table.add_column(name, justify=justify, overflow="fold", no_wrap=name != "problem, or why not")
    for r in rows:
        if r.problem is not None:
            detail = r.problem.describe()
        else:
            detail = r.reason.removeprefix(f"`{r.op_name}` ")
        table.add_row(markup(r.op_name), markup(r.category), f"{100 * r.time_share:.1f}", r.family or "-",
                      markup(detail))
    console.print(table)
    for r in rows:
        if r.left_out:
            console.print(f"`{markup(r.op_name)}`'s reproduction leaves out: " + markup("; ".join(r.left_out)),
                          highlight=False)
    missing = [f for f in cov.collective_families if f not in cov.collective_families_reproducible]
    console.print(f"reproducible: {100 * cov.compute_share:.1f} % of compute time, {100 * cov.collective_share:.1f} % "
                  f"of collective time (self time, first host); collective families "
                  f"{', '.join(cov.collective_families_reproducible) or 'none'} of "
                  f"{', '.join(cov.collective_families) or 'none'}" + (f" (not: {', '.join(missing)})" if missing else ""),
                  markup=False, highlight=False)
    console.print(f"reproduce one: `tpudiag lab extract {path} --op NAME`", markup=False, highlight=False)


def default_lab_dir(op: str, base: Path | None = None) -> Path:
    """`lab-<op>` inside `base` (default: the working directory), from a sanitised op name: an op named
    `../../x` or `/etc` cannot place the directory anywhere else."""
    from tpudiag.model.text import path_component

    return (Path.cwd() if base is None else base) / f"lab-{path_component(op)}"


@lab_app.command("extract")
def extract(
    op: Annotated[str, typer.Option("--op", help="HLO op name, e.g. `fusion.2`")],
    path: Annotated[Path | None, typer.Argument(help="Logdir, run directory or .xplane.pb file; default: the "
                                                     "bundled example (with its compiler dumps)")] = None,
    out: Annotated[Path | None, typer.Option("-o", "--out", help="Directory to write (default: lab-<op> here, "
                                                                 "the name sanitised)")] = None,
    dump: Annotated[Path | None, typer.Option("--dump", help="XLA/libtpu dump directory with the op's HLO "
                                                             "(operands, fusion body)")] = None,
    topology: Annotated[str | None, typer.Option(help="Target topology (default: the capture's device, "
                                                      "e.g. v6e:2x2)")] = None,
    scale_down: Annotated[int, typer.Option("--scale-down", help="Divide every dim by N for the CPU run "
                                                                 "(alignment kept); tune still uses the full "
                                                                 "problem")] = 1,
) -> None:
    """Write a runnable reproduction of one op: `repro.py` (XLA reference + Pallas kernel) and `spec.json`."""
    from tpudiag.kernels_lab.problems import problem_fields
    from tpudiag.kernels_lab.reproduce import write_repro
    from tpudiag.kernels_lab.spec import spec_from_diagnosis
    from tpudiag.writers.files import check_not_input

    if scale_down < 1:
        raise UsageError(f"--scale-down must be at least 1, got {scale_down}")
    path, dump = _capture_or_example(path, dump)
    out_dir = out if out is not None else default_lab_dir(op)
    check_not_input(out_dir, [path, dump], what="the reproduction")
    spec = spec_from_diagnosis(_diagnosis(path, dump), op, topology=topology, scale_down=scale_down)
    if spec.family == "pallas":
        _extract_pallas(spec, out_dir)
        return
    try:
        repro, blocks = write_repro(spec, out_dir)
    except InputError as exc:
        exc.path = exc.path or str(path)  # the op's numbers came from this capture
        raise
    console, _ = _consoles()
    console.print(f"wrote `{repro}` and `{out_dir / 'spec.json'}`", markup=False, highlight=False)
    console.print(f"  family {spec.family}: {problem_fields(spec.problem)}", markup=False, highlight=False)
    if spec.run_problem != spec.problem:
        how = f" (--scale-down {spec.scale_down})" if spec.scale_down > 1 else ""
        console.print(f"  CPU run{how}: {problem_fields(spec.run_problem)}", markup=False, highlight=False)
    console.print(f"  blocks {blocks.label()} (default for {spec.generation}; run `tpudiag lab tune "
                  f"{out_dir}` to sweep)", markup=False, highlight=False)
    for line in spec.basis:
        console.print(f"  basis: {line}", markup=False, highlight=False)
    for line in spec.notes:
        console.print(f"  note: {line}", markup=False, highlight=False)
    try:
        blocks.validate(spec.problem, spec.vmem_bytes)
    except ValueError as exc:
        console.print(f"  note: the full problem does not fit this kernel: {exc}", markup=False, highlight=False)
    console.print(f"run it: `python {repro}`", markup=False, highlight=False)


def _pallas_kernel(directory: Path):
    """The user's kernel (`MosaicKernel`) when `directory` holds a Pallas kernel's reproduction, else None."""
    from tpudiag.kernels_lab.spec import OpSpec

    if not (directory / "spec.json").is_file():
        return None
    spec = OpSpec.from_json(directory / "spec.json")
    return spec.problem.kernel if spec.family == "pallas" else None


def _extract_pallas(spec, out_dir: Path) -> None:
    """`lab extract` on a Pallas kernel: a repro.py calling the user's kernel with the captured shapes."""
    from tpudiag.kernels_lab.reproduce import write_pallas_repro
    from tpudiag.model.kernels import halving, tune_command

    repro, made = write_pallas_repro(spec, out_dir)
    console, err = _consoles()
    k = spec.problem.kernel
    console.print(f"wrote `{repro}` and `{out_dir / 'spec.json'}`", markup=False, highlight=False)
    console.print(f"  family pallas: {spec.problem.describe()}", markup=False, highlight=False)
    console.print(f"  on {', '.join(spec.problem.operands) or 'no operands'} -> {', '.join(spec.problem.outputs)}",
                  markup=False, highlight=False)
    for line in spec.basis:
        console.print(f"  basis: {line}", markup=False, highlight=False)
    if spec.scale_down > 1:
        console.print(f"  note: --scale-down {spec.scale_down} is not applied: your kernel runs with the grid, blocks "
                      "and shapes it was captured with", markup=False, highlight=False)
    console.print("  left out: " + "; ".join(made.left_out), markup=False, highlight=False)
    if made.unsupported:
        for line in made.unsupported:
            err.print(f"warning: not rebuilt as captured: {line}", markup=False, highlight=False)
        err.print("warning: repro.py states this and raises instead of guessing; fill in what it names",
                  markup=False, highlight=False)
    console.print(f"run it: `python {repro}` (compiles for one device of {spec.topology} without a TPU; runs it on "
                  "a TPU)", markup=False, highlight=False)
    half = halving(k)
    console.print("tune its block sizes: " + (tune_command(k, half.dim, (half.after, half.before)) if half else
                                              tune_command(k, "a block dim")),
                  markup=False, highlight=False)


@lab_app.command("check")
def check(
    directory: Annotated[Path, typer.Argument(help="A reproduction directory from `tpudiag lab extract`")],
    full: Annotated[bool, typer.Option("--full", help="Check the full profiled shapes (slow on CPU)")] = False,
    tpu_interpret: Annotated[bool, typer.Option("--tpu-interpret", help="Use the TPU-semantics interpreter "
                                                                        "(simulated VMEM and DMAs; slower)")]
    = False,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f")] = TerminalOrJson.terminal,
) -> None:
    """Numerics of the Pallas kernel against the XLA reference, on CPU in interpret mode; exit 1 on mismatch."""
    repro = directory / "repro.py"
    if not repro.is_file():
        raise InputError("no repro.py here", path=directory, hint="create it with `tpudiag lab extract`")
    kernel = _pallas_kernel(directory)
    if kernel is not None:
        raise UsageError(f"`{directory}` reproduces your own Pallas kernel `{printable(kernel.name)}`: the lab has no "
                         "reference to check it against", hint=f"run it on the CPU: `python {repro} --interpret`")
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    cmd = [sys.executable, str(repro), "--json", "--interpret"] + (["--full"] if full else [])
    cmd += ["--tpu-interpret"] if tpu_interpret else []
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    result = None
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith("{"):
            result = json.loads(line)
            break
    if result is None:
        tail = " ".join((proc.stderr or proc.stdout).strip().splitlines()[-1:]) or f"exit status {proc.returncode}"
        raise InputError(f"repro.py failed: {tail}", path=repro)
    console, _ = _consoles()
    if Format(output_format) is Format.json:
        sys.stdout.write(json.dumps(result) + "\n")
    else:
        verdict = "OK" if result["ok"] else "MISMATCH"
        shape = " ".join(f"{k}={v}" for k, v in result["problem"].items())
        console.print(f"`{result['op']}` ({result['family']}) {shape}", markup=False, highlight=False)
        how = "TPU-semantics interpreter" if result["interpret"] == "tpu" else "interpret mode"
        console.print(f"  blocks {result['blocks']}, grid {tuple(result['grid'])}, CPU {how}"
                      + (" (scaled-down problem)" if result["scaled_down"] else ""), markup=False, highlight=False)
        console.print(f"numerics: max|pallas - xla| / max|xla| = {result['max_rel_err']:.3g}, tolerance "
                      f"{result['tolerance']:.3g} for {result['tolerance_dtype']} -> {verdict}",
                      markup=False, highlight=False)
    if not result["ok"]:
        raise typer.Exit(1)


@lab_app.command("tune")
def tune(
    directory: Annotated[Path, typer.Argument(help="A reproduction directory from `tpudiag lab extract`, or "
                                                   "MODULE:FN, your own kernel function (with --param)")],
    topology: Annotated[str | None, typer.Option(help="TPU topology to compile for (default: spec.json's, "
                                                      "from the capture's device)")] = None,
    max_candidates: Annotated[int | None, typer.Option("--max-candidates", help="Sweep only the first N "
                                                                                "candidates")] = None,
    scale_down: Annotated[int, typer.Option("--scale-down", help="Sweep a problem with every dim / N "
                                                                 "(faster compiles; the result is not "
                                                                 "written into repro.py)")] = 1,
    measure: Annotated[bool | None, typer.Option("--measure/--no-measure", help="Time on the attached TPU "
                                                                                "(default: when one is present)")]
    = None,
    timeout: Annotated[float, typer.Option(help="Seconds allowed per compile")] = 900.0,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f")] = TerminalOrJson.terminal,
    write: Annotated[bool, typer.Option("--write", help="Write the best block sizes into repro.py (otherwise "
                                                        "they are only printed)")] = False,
    param: Annotated[list[str] | None, typer.Option("--param", help="MODULE:FN only: NAME=V1,V2,... keyword "
                                                                    "arguments of FN to sweep (repeatable; "
                                                                    "candidates are their cartesian product)")]
    = None,
    jobs: Annotated[int | None, typer.Option("--jobs", "-j", help="MODULE:FN only: compiles at a time (default: "
                                                                  "the machine's cores)")] = None,
    cache: Annotated[Path | None, typer.Option("--cache-dir", help="MODULE:FN only: where compiles are cached "
                                                                   "(default: ~/.cache/tpudiag/lab-tune, "
                                                                   "TPUDIAG_CACHE_DIR)")] = None,
) -> None:
    """Sweep block sizes: compile each for the TPU topology, reject what the compiler refuses, rank.

    `tpudiag lab tune MODULE:FN --param bm=256,512 --param bk=256,512` tunes your own kernel function
    instead: each candidate's parameters are passed to FN as keyword arguments, FN is compiled on the
    module's `example_args(mesh)` (as `tpudiag compile` does) and ranked by the compiler's cycles."""
    if param or (":" in str(directory) and not directory.is_dir()):
        if write or max_candidates is not None or scale_down != 1 or measure:
            raise UsageError("--write, --max-candidates, --scale-down and --measure are for reproduction "
                             "directories, not MODULE:FN")
        _tune_kernel(str(directory), param or [], topology, jobs, cache, timeout, output_format)
        return
    from tpudiag.kernels_lab.family import family_module
    from tpudiag.kernels_lab.reproduce import set_blocks
    from tpudiag.kernels_lab.sweep import run_sweep
    from tpudiag.model.kernels import halving, tune_command

    kernel = _pallas_kernel(directory)
    if kernel is not None:
        half = halving(kernel)
        raise UsageError(f"`{directory}` reproduces your own Pallas kernel `{printable(kernel.name)}`: its block sizes "
                         "are tuned by compiling the function that calls it",
                         hint=tune_command(kernel, half.dim, (half.after, half.before)) if half
                         else tune_command(kernel, "a block dim"))

    console, err = _consoles()
    try:
        result = run_sweep(directory, topology=topology, measure=measure, max_candidates=max_candidates,
                           scale_down=scale_down, timeout_s=timeout,
                           progress=lambda line: err.print(line, markup=False, highlight=False))
    except KeyboardInterrupt:
        err.print(f"interrupted: finished candidates are kept in `{directory}`/tune-*.jsonl; run the same "
                  "command again to resume", markup=False, highlight=False)
        raise typer.Exit(130) from None
    best = result.best
    written = ""
    if best is not None and scale_down == 1 and not write:
        written = f"best: {best.label}; not written into repro.py (pass --write to write it)"
    elif best is not None and scale_down == 1:
        fam = family_module(result.family)
        blocks = fam.BlockSizes(**best.blocks)
        basis = (f"Best of {len(result.results)} candidates for {result.topology} by `tpudiag lab tune`: "
                 f"{result.basis_text}. {_best_text(best)}")
        set_blocks(directory / "repro.py", blocks, basis)
        written = f"wrote {best.label} into `{directory / 'repro.py'}`"
    elif best is not None:
        written = f"not written into repro.py: swept a problem scaled down {scale_down}x"
    if Format(output_format) is Format.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from tpudiag.kernels_lab.render import render_sweep

        render_sweep(result, console)
        if written:
            console.print(written, markup=False, highlight=False)
    if written and Format(output_format) is Format.json:
        err.print(written, markup=False, highlight=False)
        if result.reference_warning:
            err.print(f"warning: {result.reference_warning}", markup=False, highlight=False)
    if best is None and result.basis == "measured":
        raise UsageError("no candidate ran on the attached TPU", hint="see the status column and its notes")
    if best is None:
        raise UsageError("no candidate compiled with an estimate to rank",
                         hint="see the status column; try another topology (static estimates exist for "
                              "v5e, v5p and v6e)")


def _tune_kernel(target: str, param: list[str], topology: str | None, jobs: int | None, cache: Path | None,
                 timeout: float, output_format: TerminalOrJson) -> None:
    """`lab tune MODULE:FN --param ...`: compile each parameter set deviceless, rank by estimated cycles."""
    from tpudiag.kernels_lab.kernel_tune import DEFAULT_TOPOLOGY, parse_params, tune_kernel

    console, err = _consoles()
    if jobs is not None and jobs < 1:
        raise UsageError(f"--jobs must be at least 1, got {jobs}")
    result = tune_kernel(target, parse_params(param), topology=topology or DEFAULT_TOPOLOGY, jobs=jobs,
                         cache=cache, timeout_s=timeout,
                         progress=lambda line: err.print(line, markup=False, highlight=False))
    if Format(output_format) is Format.json:
        sys.stdout.write(result.to_json() + "\n")
    else:
        from tpudiag.kernels_lab.render import render_kernel_tune

        render_kernel_tune(result, console)
    if result.best is None:
        reasons = {c.reason for c in result.candidates}
        if len(reasons) == 1 and "partitioned" in next(iter(reasons)):
            raise UsageError(f"no candidate compiled on {result.topology}: the kernel gets the example arguments "
                             "sharded over its devices", hint="tune it on one chip (e.g. --topology v5e:1x1), or "
                             "tune a function that wraps the kernel in jax.shard_map")
        if len(reasons) == 1 and len(result.candidates) > 1:
            raise UsageError(f"every candidate was refused for the same reason: {next(iter(reasons))}",
                             hint="check that FN takes each --param as a keyword argument, and its example_args")
        raise UsageError("no candidate compiled with an estimate to rank", hint="see the status column")


def _best_text(best) -> str:
    parts = []
    if best.measured_s is not None:
        parts.append(f"{best.measured_s * 1e6:,.1f} us measured")
    if best.est_cycles is not None:
        parts.append(f"{best.est_cycles:,} estimated cycles")
    return "; ".join(parts) + "." if parts else ""


def register(app: typer.Typer) -> None:
    app.add_typer(lab_app, name="lab")
