"""Run a family's Pallas kernel beside its XLA reference and compare numerics; `repro.py`'s main().

Also inlined into every generated `repro.py`; it takes the family as a module-like object (`fam`,
a `kernels_lab.family.KernelFamily`: its `Problem`, `BlockSizes`, `fit`, `reference`, `pallas`,
`make_inputs`, `SCALES_BLOCKS`, `DEFAULT_INTERPRET`), so it works both on an imported family
module and on the repro script itself.

Tolerances (max |pallas - xla| / max |xla|, both read as f32):

- float32: 1e-4. Both sides accumulate in f32; only the summation order differs, whose error grows
  like sqrt(K) x 6e-8, far below 1e-4 for any K a TPU op has.
- bfloat16: 1.6e-2, i.e. 4 units in the last place of bf16 (2^-8 each) at the output's largest
  magnitude: rounding the f32 result to bf16 alone costs up to one unit where the two orders land
  on different sides of a rounding boundary.

A problem is checked at the looser of its input and output dtypes' tolerances.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import jax
import numpy as np
from jax.experimental.pallas import tpu as pltpu

from tpudiag.kernels_lab.tiling import scale_dim  # repro: inlined

# Integer data movement must be exact.
TOLERANCES = {"float32": 1e-4, "bfloat16": 1.6e-2, "int32": 0.0, "uint32": 0.0, "int8": 0.0}


def tolerance_for(problem) -> tuple[float, str]:
    """(tolerance, the dtype it is for): the looser of the compute and output dtypes."""
    dtypes = {problem.compute_dtype, problem.out_dtype}
    dtype = max(dtypes, key=lambda d: TOLERANCES[d])
    return TOLERANCES[dtype], dtype


def _wall(fn, args, reps: int) -> float:
    """Median seconds of `reps` calls after one warm-up (compile) call."""
    jax.block_until_ready(fn(*args))
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def numerics_check(fam, problem, blocks, *, interpret, seed: int = 0, time_reps: int = 0) -> dict:
    """Run both on the same inputs; return the comparison as a JSON-ready dict. `interpret` is a bool
    or a `pltpu.InterpretParams` (the TPU-semantics interpreter)."""
    args = fam.make_inputs(problem, seed)
    kernel = jax.jit(lambda *a: fam.pallas(*a, p=problem, blocks=blocks, interpret=interpret))
    ref = jax.jit(lambda *a: fam.reference(problem, *a))
    got = jax.block_until_ready(kernel(*args))
    expected = jax.block_until_ready(ref(*args))
    # A multi-output kernel returns a tuple: each output is compared with its own reference output.
    got = got if isinstance(got, (tuple, list)) else (got,)
    expected = expected if isinstance(expected, (tuple, list)) else (expected,)
    if len(got) != len(expected):
        raise ValueError(f"the kernel returns {len(got)} outputs, the reference {len(expected)}")
    errors = [_rel_err(np.asarray(o, dtype=np.float32), np.asarray(w, dtype=np.float32))
              for o, w in zip(got, expected, strict=True)]
    err = max(errors)
    finite = err != float("inf")
    tol, tol_dtype = tolerance_for(problem)
    result = {
        "family": fam.FAMILY, "problem": dataclasses.asdict(problem), "blocks": dataclasses.asdict(blocks),
        "grid": list(blocks.grid(problem)), "backend": jax.default_backend(),
        "interpret": interpret if isinstance(interpret, bool) else "tpu",
        "max_rel_err": err, "output_errors": errors, "tolerance": tol, "tolerance_dtype": tol_dtype, "ok": bool(finite and err <= tol),
        "pallas_s": None, "reference_s": None,
    }
    if time_reps:
        result["pallas_s"] = _wall(kernel, args, time_reps)
        result["reference_s"] = _wall(ref, args, time_reps)
    return result


def _rel_err(out, want) -> float:
    """max|out - want| / max|want|; inf when the kernel produced non-finite values the reference has not."""
    if out.shape != want.shape:
        return float("inf")
    scale = float(np.max(np.abs(want))) if want.size else 0.0
    if not (np.isfinite(out).all() or not np.isfinite(want).all()):
        return float("inf")
    return float(np.max(np.abs(out - want))) / max(scale, 1e-30) if want.size else 0.0


def describe(problem) -> str:
    return " ".join(f"{k}={v}" for k, v in dataclasses.asdict(problem).items())


def _shown(name: str) -> str:
    """The op name from the trace, printable: controls and bidi overrides as escapes (repro.py runs alone,
    so this cannot use tpudiag.model.text)."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] if ord(c) < 0x10000 else f"\\U{ord(c):08x}" for c in name)


def run_main(fam, *, op_name: str, problem, run_problem, blocks, vmem_bytes: int, scale_down: int = 1,
             argv=None) -> int:
    """The reproduction's command line. Exit 0 when numerics agree, 1 when they do not."""
    parser = argparse.ArgumentParser(description=f"Reproduce `{_shown(op_name)}`: Pallas kernel vs XLA reference")
    parser.add_argument("--full", action="store_true", help="run the op's full profiled shapes even off TPU")
    parser.add_argument("--interpret", action="store_true", help="force Pallas interpret mode")
    parser.add_argument("--tpu-interpret", action="store_true",
                        help="interpret with TPU semantics (pltpu.InterpretParams: simulated VMEM, DMAs and "
                             "semaphores; slower, stricter)")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    on_tpu = jax.default_backend() == "tpu"
    interpret = args.interpret or args.tpu_interpret or not on_tpu
    target = problem if (on_tpu or args.full) else run_problem
    # Scaled-down runs shrink the blocks by the same factor, so the grid keeps the full problem's shape
    # as far as the (8,128) rule allows.
    # (Families whose knobs are not dims, e.g. a collective's direction, keep them as they are.)
    chosen = blocks if target == problem else fam.fit(
        target, *[scale_dim(b, scale_down) if fam.SCALES_BLOCKS else b for b in dataclasses.astuple(blocks)])
    chosen.validate(target, vmem_bytes)
    mode = pltpu.InterpretParams() if args.tpu_interpret else interpret
    result = numerics_check(fam, target, chosen, interpret=mode, time_reps=0 if interpret else 10)
    # a family that interprets only with TPU semantics (remote DMAs: collectives) says so
    tpu_only = fam.DEFAULT_INTERPRET is not None
    result["interpret"] = "tpu" if args.tpu_interpret or (interpret and tpu_only) else interpret
    result["op"] = op_name
    result["scaled_down"] = target != problem
    if args.json:
        print(json.dumps(result))
        return 0 if result["ok"] else 1
    print(f"{_shown(op_name)} ({fam.FAMILY}) {describe(target)}")
    if target != problem:
        print(f"  scaled down for the CPU from {describe(problem)} (run with --full for the real shapes)")
    print(f"  blocks {chosen.label()}, grid {tuple(result['grid'])}")
    mode = ("Pallas TPU-semantics interpreter (timings not meaningful)" if result["interpret"] == "tpu"
            else "Pallas interpret mode (timings not meaningful)" if interpret else "compiled Pallas kernel")
    print(f"  backend {result['backend']}, {mode}")
    verdict = "OK" if result["ok"] else "MISMATCH"
    print(f"numerics: max|pallas - xla| / max|xla| = {result['max_rel_err']:.3g}, tolerance "
          f"{result['tolerance']:.3g} ({result['tolerance_dtype']}) -> {verdict}")
    if result["pallas_s"] is not None:
        print(f"time (measured here, median of 10): pallas {result['pallas_s'] * 1e6:,.1f} us, "
              f"xla {result['reference_s'] * 1e6:,.1f} us")
    sys.stdout.flush()
    return 0 if result["ok"] else 1
