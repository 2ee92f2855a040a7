"""The compile worker: `python -m tpudiag.compiler.worker REQUEST_JSON`, one compile per process.

libtpu reads its flags once per process, holds a per-process lockfile and aborts the process on
fatal compiler errors, so the driver (`tpudiag.compiler.driver`) runs every compile here, in a
fresh process whose environment already carries the dump flags. The worker writes
`<out>/result.json`: `{"status": "ok", ...facts}` (exit 0), `{"status": "input_error", ...}` for
problems in the user's module (exit 3), or `{"status": "compile_error", ...}` when the compiler
raised (exit 4). A fatal abort leaves no result: the driver reads the compiler's stderr instead.
"""

from __future__ import annotations

import functools
import json
import re
import sys
import time
from pathlib import Path

from tpudiag.compiler.target import TargetError, call_example_args, load_module, parse_target, resolve
from tpudiag.model.compile_output import HLO_PROTO_FILE, HLO_TEXT_FILE, RESULT_FILE

EXIT_INPUT_ERROR = 3
EXIT_COMPILE_ERROR = 4


def _write(out: Path, payload: dict) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / RESULT_FILE).write_text(json.dumps(payload, indent=1, sort_keys=True) + "\n")


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]


def _number(value) -> float | None:
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _lowered_module(lowered) -> str:
    """The module name of a lowered program (`jit_step`), which its HLO dump files carry; '' if unknown."""
    try:
        m = re.search(r"module @([\w.\-]+)", lowered.as_text()[:4096])
    except Exception:  # the name only trims the dump of a failed compile: never fail for it
        return ""
    return m.group(1) if m else ""


def _facts(compiled) -> dict:
    facts: dict = {}
    try:
        cost = compiled.cost_analysis()
        if isinstance(cost, list):  # older jax returned one dict per computation
            cost = cost[0] if cost else {}
        for key in ("flops", "bytes accessed", "transcendentals", "optimal_seconds"):
            if key in cost:
                facts[key.replace(" ", "_")] = _number(cost[key])
    except Exception as exc:  # cost analysis is optional: a missing figure is not a failed compile
        facts["cost_analysis_error"] = _first_line(exc)
    try:
        mem = compiled.memory_analysis()
        for key in ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
                    "temp_size_in_bytes", "generated_code_size_in_bytes", "peak_memory_in_bytes"):
            value = getattr(mem, key, None)
            if value is not None:
                facts[key] = int(value)
    except Exception as exc:
        facts["memory_analysis_error"] = _first_line(exc)
    return facts


def run(request: dict) -> int:
    out = Path(request["out"])
    try:
        spec = parse_target(request["target"])
        module = load_module(spec)
        fn, example_args, mesh_shape_fn, jit_kwargs = resolve(module, spec)
    except TargetError as exc:
        _write(out, {"status": "input_error", "message": exc.message, "hint": exc.hint})
        return EXIT_INPUT_ERROR

    try:
        import jax
        import numpy as np
        from jax.experimental import topologies
        from jax.sharding import Mesh
    except ImportError as exc:
        _write(out, {"status": "compile_error", "stage": "import", "message": f"cannot import jax: {exc}"})
        return EXIT_COMPILE_ERROR

    from tpudiag.compiler.topology import default_mesh_shape

    kwargs = {}
    if request.get("single_chip"):
        kwargs["chips_per_host_bounds"] = [1, 1, 1]
    try:
        topo = topologies.get_topology_desc(platform="tpu", topology_name=request["topology"], **kwargs)
    except Exception as exc:  # libtpu's own error, e.g. an unknown generation or grid
        _write(out, {"status": "compile_error", "stage": "topology", "message": _first_line(exc)})
        return EXIT_COMPILE_ERROR
    devices = list(topo.devices)
    n = len(devices)
    try:
        shape = dict(mesh_shape_fn(n)) if mesh_shape_fn is not None else default_mesh_shape(n)
        if int(np.prod(list(shape.values()))) != n:
            raise TargetError(f"mesh_shape({n}) = {shape} does not use all {n} devices")
        mesh = Mesh(np.array(devices).reshape(tuple(shape.values())), tuple(shape))
        args = call_example_args(example_args, mesh, spec)
    except TargetError as exc:
        _write(out, {"status": "input_error", "message": exc.message, "hint": exc.hint})
        return EXIT_INPUT_ERROR
    except Exception as exc:
        _write(out, {"status": "input_error", "message": f"building the mesh failed: {_first_line(exc)}",
                     "hint": "mesh_shape(n_devices) must return an ordered {axis: size} dict"})
        return EXIT_INPUT_ERROR
    params = request.get("params") or {}
    if params:  # `lab tune MODULE:FN --param k=v`: one candidate's keyword arguments, bound before jit
        fn = functools.partial(fn, **params)
    jitted = fn if hasattr(fn, "lower") and not params else jax.jit(fn, **jit_kwargs)
    t0 = time.perf_counter()
    try:
        with jax.set_mesh(mesh):  # the context mesh, for shard_map(mesh=None) and bare PartitionSpecs
            lowered = jitted.lower(*args)
    except Exception as exc:  # tracing the user's function failed: their error, one line
        _write(out, {"status": "input_error", "stage": "lower", "detail": str(exc)[:20000],
                     "message": f"tracing `{spec.function}` failed: {type(exc).__name__}: {_first_line(exc)}",
                     "hint": "check that example_args(mesh) matches the function's signature"})
        return EXIT_INPUT_ERROR
    t1 = time.perf_counter()
    try:
        compiled = lowered.compile(compiler_options=request.get("compiler_options") or None)
    except Exception as exc:
        _write(out, {"status": "compile_error", "stage": "compile", "message": _first_line(exc),
                     "detail": str(exc)[:20000], "module": _lowered_module(lowered)})
        return EXIT_COMPILE_ERROR
    t2 = time.perf_counter()
    text = compiled.as_text()
    (out / HLO_TEXT_FILE).write_text(text)
    module_name = text.split(None, 2)[1].rstrip(",") if text.startswith("HloModule") else ""
    try:
        (out / HLO_PROTO_FILE).write_bytes(
            compiled.runtime_executable().hlo_modules()[0].as_serialized_hlo_module_proto())
    except Exception:  # optional: simulate embeds the proto only when it is there
        pass
    payload = {
        "status": "ok",
        "target": request["target"],
        "params": params,
        "topology": request["topology"],
        "module": module_name,
        "device_kind": devices[0].device_kind,
        "n_devices": n,
        "mesh": shape,
        "lower_s": round(t1 - t0, 3),
        "compile_s": round(t2 - t1, 3),
        "jax_version": jax.__version__,
        **_facts(compiled),
    }
    _write(out, payload)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        sys.stderr.write("usage: python -m tpudiag.compiler.worker REQUEST_JSON\n")
        return 2
    return run(json.loads(argv[0]))


if __name__ == "__main__":
    sys.exit(main())
