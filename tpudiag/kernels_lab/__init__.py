"""Kernels lab: Pallas TPU reproductions of profiled ops, their XLA references, block-size sweeps.

Layout:

- `tiling`: the (8,128) block rule and the VMEM budget check (standard library only).
- `matmul`, `reduction`, `elementwise`, `transpose`: one kernel family per module, each with a frozen
  `BlockSizes` that validates itself, a plain-JAX reference, the Pallas kernel, sweep candidates
  and a tuned-configs table. They import jax at module level, so import them only when needed.
- `multi_output`, `datamove` (copies, relayouts, dynamic slices, concatenate, pad), `collective`
  (ring all-gather / reduce-scatter / all-reduce with remote DMAs, run under `shard_map`).
- `spec`: what an op from a capture is (family, shapes, dtypes), inferred without jax;
  `collective_spec`: a captured collective's kind and ring (replica groups).
- `repro`: writes a standalone reproduction directory (`repro.py` + `spec.json`).
- `harness`: runs a kernel beside its reference and compares numerics (also `repro.py`'s main).
- `sweep`: compiles candidates for a TPU topology in a subprocess (`compile_worker`) and ranks
  them; `render` prints the table.

Nothing here is imported by `tpudiag report`; jax loads only inside the lab commands.
"""
