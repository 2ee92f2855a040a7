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


def main(argv: list[str]) -> int:
    out_dir, topology, problem_json = Path(argv[0]), argv[1], argv[2]
    measure = "--measure" in argv[3:]

    import jax
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from tpudiag.kernels_lab.reproduce import load_repro

    repro = load_repro(out_dir)
    if measure:
        device = jax.devices()[0]
    else:
        from jax.experimental import topologies

        device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    problem = repro.Problem(**json.loads(problem_json))
    specs = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in repro.input_structs(problem)]
    print(json.dumps({"ready": True, "device_kind": device.device_kind}), flush=True)

    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        if request["kind"] == "xla":
            fn = jax.jit(lambda *a: repro.reference(problem, *a))
        else:
            blocks = repro.BlockSizes(**request["blocks"])
            fn = jax.jit(lambda *a, b=blocks: repro.pallas(*a, p=problem, blocks=b))
        answer = {"id": request["id"], "status": "ok", "est_cycles": None, "compile_s": None, "error": None,
                  "measured_s": None}
        t0 = time.perf_counter()
        try:
            compiled = fn.lower(*specs).compile()
        except Exception as exc:  # the compiler's refusal is the result we report, not a crash
            answer.update(status="rejected", error=f"{type(exc).__name__}: {exc}"[:4000])
        else:
            answer["compile_s"] = time.perf_counter() - t0
            answer["est_cycles"] = estimated_cycles(compiled.as_text())
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

