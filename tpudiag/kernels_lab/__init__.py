"""Kernels lab: Pallas TPU reproductions of profiled ops, their XLA references, block-size sweeps.

Layout:

- `tiling`: the (8,128) block rule and the VMEM budget check (standard library only).
- `problems`: each family's typed `Problem` (no jax), what `OpSpec.problem` holds.
- `family`: the `KernelFamily` protocol every family module satisfies, and `family_module`.
- `matmul`, `reduction`, `elementwise`, `transpose`: one kernel family per module, each with its
  `Problem`, a frozen `BlockSizes` that validates itself, a plain-JAX reference, the Pallas kernel,
  sweep candidates and a tuned-configs table. They import jax at module level, so import them only
  when needed (`family_module`).
- `multi_output`, `datamove` (copies, relayouts, dynamic slices, concatenate, pad), `collective`
  (ring all-gather / reduce-scatter / all-reduce with remote DMAs, run under `shard_map`).
- `spec`: what an op of a diagnosis is (family, typed problem, basis), inferred without jax;
  `op_text`: the op's HLO text from the dump program the diagnosis joined, or from the capture;
  `collective_spec`: a captured collective's kind and ring (replica groups).
- `repro`: writes a standalone reproduction directory (`repro.py` + `spec.json`).
- `harness`: runs a kernel beside its reference and compares numerics (also `repro.py`'s main).
- `sweep`: compiles candidates for a TPU topology in a subprocess (`compile_worker`) and ranks
  them; `render` prints the table.

Nothing here is imported by `tpudiag report`; jax loads only inside the lab commands.
"""
