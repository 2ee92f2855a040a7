"""`tpudiag compile` (deviceless TPU compile + static report) and `tpudiag simulate` (modelled capture)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated

import typer

from tpudiag.cli.options import TerminalOrJson

COMPILE_HELP = """Compile MODULE:FUNCTION for a TPU topology without a TPU and print a static report.

MODULE is a dotted module (importable from the current directory) or a path to a .py file.
It must define FUNCTION and `example_args(mesh)`, returning a tuple of positional arguments,
typically `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))`.
`mesh` is a jax Mesh over all devices of the topology with axes ("data", "model"), model = 2
(override with `mesh_shape(n_devices)` returning an ordered {axis: size} dict); it is also
the context mesh while lowering, so `jax.shard_map(..., mesh=None)` works (Pallas kernels need
shard_map on a multi-device mesh). Optional `JIT_KWARGS` (a dict) is passed to jax.jit; an
already-jitted FUNCTION is used as is. Examples: examples/models/*.py.

The compiler runs in a subprocess (libtpu reads flags once per process and aborts on fatal
errors). Only the dumps the diagnosis reads are kept in -o DIR: the optimised HLO, buffer
assignment and memory report, the LLO bundle profile, and the static LLO profile (per-op
estimated cycles; on by default on v5e, v5p and v6e, where it works). Times in the report are
modelled from the compiler's estimates at a stated clock. See docs/compile.md.
"""

SIMULATE_HELP = """Write a modelled XProf capture from a `tpudiag compile` output directory.

One /device:TPU:N plane per device, ops in the compiled schedule order, each lasting
max(estimated cycles / clock, HBM bytes / HBM bandwidth); collectives from an ICI model
(latency + ring factor x bytes / bandwidth); async start/done windows overlap the ops the
compiler scheduled between them. The capture is labelled modelled; read it with
`tpudiag report LOGDIR` or the xprof tools.
"""


def _safe(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text).strip("_")


def parse_target_and_topology(target: str, topology: str):
    """`MODULE:FUNCTION` and `--topology` of `compile` and `whatif` as (TargetSpec, Topology), or a
    UsageError before any compile."""
    from tpudiag.compiler.target import TargetError, parse_target
    from tpudiag.compiler.topology import parse_topology
    from tpudiag.errors import UsageError

    topo = parse_topology(topology)
    try:
        spec = parse_target(target)
    except TargetError as exc:
        raise UsageError(exc.message, hint=exc.hint or None) from None
    return spec, topo


def compile_command(
    target: Annotated[str, typer.Argument(help="MODULE:FUNCTION (module path or dotted name)")],
    topology: Annotated[str, typer.Option("--topology", "-t", help="TPU topology, e.g. v5e:2x2, v6e:2x2, "
                                                                  "v5p:2x2x1, TPU7x:2x2x1")],
    out: Annotated[Path | None, typer.Option("--out", "-o", help="Dump directory (default: "
                                             "./tpudiag-compile/<function>_<topology>)")] = None,
    output_format: Annotated[TerminalOrJson, typer.Option("--format", "-f", help="Output format")]
    = TerminalOrJson.terminal,
    static_profile: Annotated[bool | None, typer.Option("--static-profile/--no-static-profile",
                              help="Per-op estimated cycles from the static LLO profile (slower). "
                                   "Default: on for v5e, v5p, v6e; off for v4 and TPU7x, where it aborts")] = None,
    clock_ghz: Annotated[float | None, typer.Option(help="Clock for cycles -> time (default: v5e 1.5, "
                                                         "v5p 1.75; v6e/TPU7x unknown)")] = None,
    libtpu_flag: Annotated[list[str] | None, typer.Option("--libtpu-flag", help="Extra LIBTPU_INIT_ARGS flag "
                                                          "(repeatable), passed as given, e.g. "
                                                          "--xla_tpu_enable_async_collective_fusion=true")] = None,
    xla_flag: Annotated[list[str] | None, typer.Option("--xla-flag", help="NAME=VALUE: a compiler flag, passed in "
                        "LIBTPU_INIT_ARGS or XLA_FLAGS, whichever registers it (repeatable)")] = None,
    top: Annotated[int, typer.Option(help="Ops to list")] = 20,
    timeout_s: Annotated[float, typer.Option(help="Give up on the compile after this many seconds")] = 900.0,
) -> None:
    from tpudiag.cli.console import stderr_console
    from tpudiag.cli.outputs import emit
    from tpudiag.cli.rules_cmd import check_number_option
    from tpudiag.cli.run_cmd import route_flags
    from tpudiag.compiler.driver import compile_program
    from tpudiag.compiler.flags import LIBTPU, XLA
    from tpudiag.errors import UsageError
    from tpudiag.pipeline import diagnose
    from tpudiag.render.console import markup

    check_number_option("--clock-ghz", clock_ghz, positive=True)
    check_number_option("--timeout-s", timeout_s, positive=True)
    spec, topo = parse_target_and_topology(target, topology)
    flags = tuple(libtpu_flag or ())
    for flag in flags:
        if not flag.startswith("--"):
            raise UsageError(f"libtpu flag {flag!r} must start with `--`")
    routed = route_flags(xla_flag or (), "compile")  # a mistyped name fails here, before minutes of compiling
    flags += tuple(flag for var, flag in routed if var == LIBTPU)
    xla_flags = tuple(flag for var, flag in routed if var == XLA)
    out_dir = out if out is not None else Path("tpudiag-compile") / f"{_safe(spec.function)}_{_safe(topo.name)}"
    if static_profile and not topo.static_profile_supported:
        stderr_console().print(f"warning: the static LLO profile aborts the compiler on {topo.generation} for "
                               "most programs; trying anyway", highlight=False)
    err = stderr_console()
    for var, flag in routed:
        err.print(markup(f"{flag} goes to {var}"), highlight=False)
    if err.is_terminal:
        with err.status(markup(f"compiling {target} for {topo.name}")):
            run = compile_program(target, topo, out_dir, static_profile, flags, timeout_s, xla_flags)
    else:
        run = compile_program(target, topo, out_dir, static_profile, flags, timeout_s, xla_flags)
    # The compile output is diagnosed like any compiler dump (`tpudiag report DIR`): the static
    # report's tables, then the rules' findings on its modelled timeline.
    emit(diagnose(run.out, clock_ghz=clock_ghz), output_format.value, None, top=top)
    if output_format.value == "terminal":
        err.print(f"dumps in `{run.out}`; next: `tpudiag simulate {run.out} -o LOGDIR`", highlight=False)


def simulate_command(
    dumpdir: Annotated[Path, typer.Argument(help="Output directory of `tpudiag compile`")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Logdir to write (plugins/profile/modelled/...)")],
    clock_ghz: Annotated[float | None, typer.Option(help="Clock for cycles -> time (default: v5e 1.5, v5p 1.75; "
                                                         "required for v6e and TPU7x, whose clock is not public)")] = None,
    ici_gbps: Annotated[float | None, typer.Option(help="ICI bandwidth available to one collective, GB/s "
                                                        "(default: 2 x the chip's per-link one-way figure)")] = None,
    ici_latency_us: Annotated[float | None, typer.Option(help="Fixed latency per collective, µs (default 2)")] = None,
    steps: Annotated[int, typer.Option(help="Steps to write (identical; modelled)")] = 3,
) -> None:
    from tpudiag.cli.console import stdout_console
    from tpudiag.parsers.compile_output import load_compile_output
    from tpudiag.compiler.simulate import RUN_NAME, simulate
    from tpudiag.model.units import fmt_time
    from tpudiag.cli.rules_cmd import check_number_option
    from tpudiag.writers.files import check_new_logdir, check_not_input

    for option, value, positive in (("--clock-ghz", clock_ghz, True), ("--ici-gbps", ici_gbps, True),
                                     ("--ici-latency-us", ici_latency_us, False)):
        check_number_option(option, value, positive)
    output = load_compile_output(dumpdir)  # reads only: an unusable input is the first thing to say
    check_not_input(out, [dumpdir], what="the modelled capture")
    check_new_logdir(out, RUN_NAME)
    path, timeline, model = simulate(output, out, clock_ghz=clock_ghz, ici_gbps=ici_gbps,
                                     ici_latency_us=ici_latency_us, steps=steps)
    exposed = sum(max(0, p.dur_ps) for p, role in zip(timeline.placed, timeline.ops["async_role"])
                  if role == "done")
    console = stdout_console()
    console.print(f"wrote `{path}` (modelled): {output.facts.get('n_devices')} devices x {steps} steps, "
                  f"{len(timeline.placed)} ops per step, step {fmt_time(timeline.step_ps)}", highlight=False)
    console.print(f"clock {model.clock_hz / 1e9 if model.clock_hz else 0:g} GHz · HBM "
                  f"{model.hbm_bytes_per_s / 1e9:g} GB/s · ICI {model.ici.bytes_per_s / 1e9:g} GB/s + "
                  f"{fmt_time(model.ici.latency_ps)} · {len(timeline.windows)} async windows, "
                  f"{fmt_time(exposed)} in async dones per step", highlight=False)


def register(app: typer.Typer) -> None:
    app.command("compile", help=COMPILE_HELP)(compile_command)
    app.command("simulate", help=SIMULATE_HELP)(simulate_command)
