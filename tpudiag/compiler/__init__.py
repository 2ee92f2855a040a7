"""Compile a JAX program for a TPU topology without a TPU, keep the dumps the diagnosis reads.

`topology` parses topology names, `target` loads the user's module (inside the worker),
`worker` is the subprocess that runs libtpu, `driver` starts it and turns its failures into
`TpudiagError`s, `static_report` and `simulate` read what it wrote. jax and libtpu are imported
only inside the worker process.
"""
