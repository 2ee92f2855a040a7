"""Subprocess that compiles a reproduction's kernel for a TPU topology, one candidate per request.

Run by `tpudiag.kernels_lab.sweep`, never imported by tpudiag itself:

    python -m tpudiag.kernels_lab.compile_worker DIR TOPOLOGY PROBLEM_JSON [--measure]

It imports `DIR/repro.py` (so it compiles exactly the kernel that was written out), builds its
`Problem` from PROBLEM_JSON (the full problem, or a scaled-down one), then reads JSON
requests from stdin, one per line: `{"id": ..., "kind": "pallas", "blocks": {...}}` or
`{"id": ..., "kind": "xla"}` (the plain-JAX reference); it answers one JSON line each:
`{"id", "status": "ok"|"rejected", "est_cycles", "compile_s", "error"}`.

Why a subprocess: libtpu reads its flags once per process, and a compiler fatal error (e.g. the
static LLO profile on an unsupported op) aborts the whole process (`shared/reference/
tpu-compiler-dumps.md` §1). The parent sets the environment: `LIBTPU_INIT_ARGS` with
`--xla_jf_dump_static_llo_profile_to`, `ALLOW_MULTIPLE_LIBTPU_LOAD=1`, `TPU_SKIP_MDS_QUERY=1`.

Estimated cycles are read from `bundle_analysis_data.estimated_cycles` in the compiled module's
backend configs (written when the static LLO profile flag is on), summed over the module's ops.
With `--measure` (a TPU is attached) it also runs each candidate on the local TPU and reports the
median wall time of 10 runs.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

BUNDLE_CYCLES = re.compile(r'"bundle_analysis_data":\{"estimated_cycles":"?(\d+)')


def estimated_cycles(hlo_text: str) -> int | None:
    """Sum of the static-profile estimated cycles over the module's ops; None when absent."""
    found = [int(c) for c in BUNDLE_CYCLES.findall(hlo_text)]
    return sum(found) if found else None


# A Pallas kernel that talks to other devices carries its mesh axes (`kernel_metadata`); XLA's own
# collectives are opcodes.
_REMOTE_OP = re.compile(r'custom_call_target="tpu_custom_call".*mesh_axes|= [^=]*\b(?:all-gather|all-reduce|'
                        r'reduce-scatter|all-to-all|collective-permute)(?:-start)?\(', re.S)
_NONZERO = re.compile(r'"estimated_cycles":"?[1-9]')
_INSTRUCTION = re.compile(r"\n(?=\s*(?:ROOT\s+)?%[\w.\-]+ = )")


def remote_dma_unestimated(hlo_text: str) -> bool:
    """The module holds a collective (XLA's, or a Pallas kernel with remote DMAs) without a nonzero
    static estimate: the profile gives remote DMAs 0 cycles (`shared/reference/tpu-compiler-dumps.md`
    §6), so the module's cycle sum would count only what surrounds the collective."""
    return any(_REMOTE_OP.search(ins) and not _NONZERO.search(ins) for ins in _INSTRUCTION.split(hlo_text))


def main(argv: list[str]) -> int:
    out_dir, topology, problem_json = Path(argv[0]), argv[1], argv[2]
    measure = "--measure" in argv[3:]

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tpudiag.kernels_lab.reproduce import load_repro

    repro = load_repro(out_dir)
    if measure:
        devices = jax.devices()
    else:
        from jax.experimental import topologies

        devices = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices
    problem = repro.Problem(**json.loads(problem_json))
    kw, ready = {}, {"ready": True}
    if hasattr(repro, "device_mesh"):  # a collective: its ring's devices of the topology
        if problem.group and max(problem.group) >= len(devices):
            ready["note"] = (f"the captured group {list(problem.group)} is not in {topology} "
                             f"({len(devices)} devices): compiled for devices 0..{problem.devices - 1}")
            problem = repro.Problem(**dict(json.loads(problem_json), group=()))
        if problem.devices > len(devices):
            print(json.dumps({"ready": False, "error": f"{problem.devices} devices needed, {topology} has "
                                                       f"{len(devices)}"}), flush=True)
            return 2
        mesh = repro.device_mesh(problem, devices)
        kw["mesh"] = mesh
        sharding = repro.input_sharding(mesh)
        device = mesh.devices.flat[0]
    else:
        device = devices[0]
        sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in repro.input_structs(problem)]
    print(json.dumps(dict(ready, device_kind=device.device_kind)), flush=True)

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request["kind"] == "xla":
            fn = jax.jit(lambda *a: repro.reference(problem, *a, **kw))
        else:
            blocks = repro.BlockSizes(**request["blocks"])
            fn = jax.jit(lambda *a, b=blocks: repro.pallas(*a, p=problem, blocks=b, **kw))
        answer = {"id": request["id"], "status": "ok", "est_cycles": None, "compile_s": None, "error": None,
                  "measured_s": None, "optimal_s": None, "note": None}
        t0 = time.perf_counter()
        try:
            compiled = fn.lower(*specs).compile()
        except Exception as exc:  # the compiler's refusal is the result we report, not a crash
            answer.update(status="rejected", error=f"{type(exc).__name__}: {exc}"[:4000])
        else:
            answer["compile_s"] = time.perf_counter() - t0
            text = compiled.as_text()
            answer["est_cycles"] = estimated_cycles(text)
            if remote_dma_unestimated(text):
                answer["est_cycles"] = None
                answer["note"] = ("no compiler estimate: the static LLO profile gives 0 cycles to ops with remote "
                                  "DMAs (DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE), the Pallas kernel's and XLA's "
                                  "collective alike")
            cost = compiled.cost_analysis() or {}
            cost = cost[0] if isinstance(cost, list) else cost
            optimal = cost.get("optimal_seconds")
            answer["optimal_s"] = float(optimal) if optimal is not None and optimal > 0 else None
            if measure:
                answer["measured_s"] = _measure(jax, compiled, repro, problem)
        print(json.dumps(answer), flush=True)
    return 0


def _measure(jax, compiled, repro, problem) -> float:
    args = repro.make_inputs(problem)
    jax.block_until_ready(compiled(*args))
    times = []
    for _ in range(10):
        t0 = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

