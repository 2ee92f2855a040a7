"""`repro.py` for a captured Pallas kernel (the `pallas` family): the user's own kernel body,
called through a `pl.pallas_call` rebuilt from the facts its serialised Mosaic body states.

The lab has no kernel of its own for a `tpu_custom_call`: the reproduction imports the user's
module from the kernel's source file, takes the kernel body function by name, and rebuilds the
call with the captured grid, each operand's and output's block and index map, the scratch
buffers, the dimension semantics and the captured operand and output shapes. It compiles it for
one device of the capture's topology without a TPU (as `lab tune` does), and runs and times it
on a TPU. No jax here: this only writes text.

Trace content is untrusted. The kernel name goes into the code only as a validated identifier;
the source path, op name and topology only as `repr` string literals; index maps only as
validated terms (`g<axis>` or an integer); dtypes only through a fixed table. What cannot be
written faithfully (a computed index map, scalar prefetch, semaphores, an unknown dtype) is not
guessed: the repro states it, and building the call raises with that reason.
"""

from __future__ import annotations

import keyword
import re
from dataclasses import dataclass

from tpudiag.kernels_lab.problems import pallas
from tpudiag.model.hlo_shapes import parse_shapes
from tpudiag.model.units import JNP_DTYPES

_SPACES = {"vmem": "pltpu.VMEM", "smem": "pltpu.SMEM", "any": "pl.ANY"}
_TERM = re.compile(r"g\d+|-?\d+")

LEFT_OUT = pallas.LEFT_OUT


@dataclass(frozen=True)
class PallasRepro:
    """What `lab extract` writes for a Pallas kernel, and what it could not write faithfully."""

    text: str  # repro.py
    unsupported: tuple[str, ...]  # why the call cannot be rebuilt as captured; empty when it can
    left_out: tuple[str, ...] = LEFT_OUT


def _identifier(name: str) -> bool:
    return name.isidentifier() and name.isascii() and not keyword.iskeyword(name)


def _index_map(block, n_grid: int) -> tuple[str | None, str]:
    """`lambda g0, g1, g2: (g0, g2)` for a block whose map the body gives as grid indices and constants."""
    if block.index_map is None:
        return None, block.index_map_note or "its index map is not in the body"
    terms = list(block.index_map)
    if not all(_TERM.fullmatch(t) for t in terms) or any(t.startswith("g") and int(t[1:]) >= n_grid for t in terms):
        return None, "its index map's terms are not grid indices or integers"
    params = ", ".join(f"g{i}" for i in range(n_grid))
    body = ", ".join(terms) + ("," if len(terms) == 1 else "")
    return f"lambda {params}: ({body})", ""


def _spec(block, n_grid: int, problems: list[str]) -> str:
    label = f"{block.role} {block.index}"
    space = _SPACES.get(block.memory_space)
    if not block.windowed:
        if space is None:
            problems.append(f"{label}: memory space `{block.memory_space}` is not one the repro writes")
            return "None"
        return f"pl.BlockSpec(memory_space={space})"
    lam, why = _index_map(block, n_grid)
    if lam is None:
        problems.append(f"{label} (block {block.shape_text}): {why}")
        return "None"
    extra = "" if block.memory_space == "vmem" or space is None else f", memory_space={space}"
    return f"pl.BlockSpec({tuple(block.shape)!r}, {lam}{extra})"


def _arrays(texts: tuple[str, ...], role: str, problems: list[str]) -> list[tuple[tuple[int, ...], str]]:
    out = []
    for text in texts:
        shapes = parse_shapes(text)
        if len(shapes) != 1 or shapes[0].dtype not in JNP_DTYPES:
            problems.append(f"{role} `{text}`: not an array of a dtype the repro writes")
            continue
        out.append((tuple(shapes[0].dims), JNP_DTYPES[shapes[0].dtype]))
    return out


def render_pallas(*, op_name: str, header: str, problem: pallas.Problem, topology: str,
                  source_file: str) -> PallasRepro:
    """The text of `repro.py` for the captured kernel of `problem` on one device of `topology`;
    `source_file` is the kernel's file as found here (else as the body names it)."""
    k = problem.kernel
    problems: list[str] = []
    if not _identifier(k.name):
        problems.append(f"the kernel's name {k.name!r} is not a Python identifier")
    if not k.source_file:
        problems.append("the body carries no source location: the kernel's module is unknown")
    if k.scalar_prefetch:
        problems.append(f"{k.scalar_prefetch} scalar-prefetch operand(s) (`PrefetchScalarGridSpec`): their "
                        "values are not in the capture")
    ins, outs = k.of("input"), k.of("output")
    n_grid = len(k.grid)
    in_specs = [_spec(b, n_grid, problems) for b in ins]
    out_specs = [_spec(b, n_grid, problems) for b in outs]
    scratch = []
    for b in k.of("scratch"):
        space = {"vmem": "pltpu.VMEM", "smem": "pltpu.SMEM"}.get(b.memory_space)
        if space is None or b.dtype not in JNP_DTYPES:
            problems.append(f"scratch {b.index} ({b.shape_text} {b.dtype} {b.memory_space}): not a VMEM/SMEM "
                            "array the repro writes (semaphores are not reproduced)")
            continue
        scratch.append(f"{space}({tuple(b.shape)!r}, jnp.{JNP_DTYPES[b.dtype]})")
    operands = _arrays(problem.operands[k.scalar_prefetch:], "operand", problems)
    results = _arrays(problem.outputs, "output", problems)
    if len(operands) != len(ins) or len(results) != len(outs):
        problems.append(f"the call has {len(operands)} operand(s) and {len(results)} output(s) for the kernel's "
                        f"{len(ins)} input and {len(outs)} output block(s)")
    semantics = tuple(s for s in k.dimension_semantics if _identifier(s))
    if len(semantics) != len(k.dimension_semantics):
        problems.append("a dimension semantics is not a plain name")
    name = k.name if _identifier(k.name) else "_kernel"
    comment = "\n".join(f"#   - {p}" for p in problems) or "#   (none: the call is rebuilt as captured)"
    left = "\n".join(f"#   - {x}" for x in LEFT_OUT)
    text = f'''#!/usr/bin/env python3
"""Reproduction of a captured Pallas kernel (`OP_NAME` below): your kernel body, called as it was captured.

Written by `tpudiag lab extract`. It imports your module from `SOURCE_FILE`, takes the kernel body
`KERNEL_NAME`, and rebuilds its `pl.pallas_call` from the facts the captured Mosaic body states:
grid, each operand's and output's block and index map, scratch buffers, dimension semantics, and
the captured operand and output shapes. `python repro.py` compiles it for one device of
`TOPOLOGY` without a TPU (libtpu only, deviceless); on a TPU it compiles, runs and times it.
`--interpret` runs it on the CPU in Pallas interpret mode (slow). Needs only jax (and libtpu).
"""

{header}

# Left out of this reproduction (it is the kernel alone, on one device):
{left}
# Not rebuilt as captured (building the call raises with these reasons):
{comment}

from __future__ import annotations

import argparse
import glob
import importlib.util
import json
import os
import sys
import time
from pathlib import Path

ON_TPU = bool(glob.glob("/dev/accel*") or glob.glob("/dev/vfio/[0-9]*"))
if not ON_TPU:  # compile for the topology without a TPU: libtpu, no device, no metadata server
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from jax.experimental import pallas as pl  # noqa: E402
from jax.experimental.pallas import tpu as pltpu  # noqa: E402

OP_NAME = {op_name!r}
SOURCE_FILE = {source_file!r}  # the kernel body's file (the captured body's locations name it)
SOURCE_LINES = ({k.first_line}, {k.last_line})
KERNEL_NAME = {name!r}
TOPOLOGY = {topology!r}  # the capture's; compiled for one of its devices
GRID = {tuple(k.grid)!r}
DIMENSION_SEMANTICS = {semantics!r}
OPERANDS = {operands!r}  # (shape, dtype) of each operand, as captured (one device's)
OUTPUTS = {results!r}
UNSUPPORTED = {tuple(problems)!r}


def load_kernel():
    """Your kernel body: `KERNEL_NAME` of the module at `SOURCE_FILE` (relative: to the working
    directory, else to this file's directory)."""
    path = Path(SOURCE_FILE)
    if not path.is_absolute() and not path.is_file():
        path = Path(__file__).resolve().parent / path
    if not path.is_file():
        raise SystemExit(f"error: the kernel's source file {{str(path)!r}} is not here: edit SOURCE_FILE in {{__file__}}")
    spec = importlib.util.spec_from_file_location("tpudiag_lab_user_kernel", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    kernel = getattr(module, KERNEL_NAME, None)
    if not callable(kernel):
        raise SystemExit(f"error: {{str(path)!r}} has no module-level function {{KERNEL_NAME!r}} (a kernel named "
                         "with `pallas_call(name=...)`, or defined inside a function): edit KERNEL_NAME")
    return kernel


def build(kernel, interpret=False):
    """The `pl.pallas_call` as captured."""
    if UNSUPPORTED:
        raise NotImplementedError("the captured call cannot be rebuilt faithfully: " + "; ".join(UNSUPPORTED))
    return pl.pallas_call(
        kernel,
        grid=GRID,
        in_specs=[{", ".join(in_specs)}],
        out_specs=[{", ".join(out_specs)}],
        out_shape=[jax.ShapeDtypeStruct(shape, jnp.dtype(dtype)) for shape, dtype in OUTPUTS],
        scratch_shapes=[{", ".join(scratch)}],
        compiler_params=pltpu.CompilerParams(dimension_semantics=DIMENSION_SEMANTICS),
        interpret=interpret,
    )


def make_inputs(seed=0):
    """Random inputs of the captured shapes and dtypes (your values are not in the capture)."""
    keys = jax.random.split(jax.random.PRNGKey(seed), max(1, len(OPERANDS)))
    out = []
    for key, (shape, dtype) in zip(keys, OPERANDS):
        dt = jnp.dtype(dtype)
        if jnp.issubdtype(dt, jnp.floating):
            out.append(jax.random.normal(key, shape, jnp.float32).astype(dt))
        elif dt == jnp.bool_:
            out.append(jax.random.bernoulli(key, 0.5, shape))
        else:
            out.append(jax.random.randint(key, shape, 0, 8).astype(dt))
    return out


def lower_deviceless(topology=TOPOLOGY):
    """The call lowered for one device of `topology`, without a TPU."""
    from jax.experimental import topologies
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    device = topologies.get_topology_desc(platform="tpu", topology_name=topology).devices[0]
    sharding = NamedSharding(Mesh(np.array([device]), ("x",)), PartitionSpec())
    specs = [jax.ShapeDtypeStruct(shape, jnp.dtype(dtype), sharding=sharding) for shape, dtype in OPERANDS]
    return jax.jit(build(load_kernel())).lower(*specs), device.device_kind


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description="Reproduce a captured Pallas kernel with its captured shapes")
    parser.add_argument("--interpret", action="store_true", help="run on the CPU in Pallas interpret mode")
    parser.add_argument("--json", action="store_true", help="print the result as one JSON line")
    args = parser.parse_args(argv)
    result = {{"op": OP_NAME, "kernel": KERNEL_NAME, "grid": list(GRID), "topology": TOPOLOGY, "compiled": False,
              "ran": False, "device_kind": None, "time_s": None, "mode": None}}
    if args.interpret:
        out = jax.block_until_ready(build(load_kernel(), interpret=True)(*make_inputs()))
        result.update(ran=True, mode="interpret", device_kind=jax.devices()[0].device_kind)
    elif ON_TPU and jax.default_backend() == "tpu":
        call = jax.jit(build(load_kernel()))
        inputs = make_inputs()
        jax.block_until_ready(call(*inputs))  # compile and warm up
        times = []
        for _ in range(10):
            t0 = time.perf_counter()
            jax.block_until_ready(call(*inputs))
            times.append(time.perf_counter() - t0)
        result.update(compiled=True, ran=True, mode="tpu", device_kind=jax.devices()[0].device_kind,
                      time_s=float(np.median(times)))
    else:
        lowered, kind = lower_deviceless()
        lowered.compile()
        result.update(compiled=True, mode="deviceless", device_kind=kind)
    if args.json:
        print(json.dumps(result))
        return 0
    where = {{"interpret": "ran on the CPU in Pallas interpret mode",
             "tpu": f"ran on {{result['device_kind']}}: {{(result['time_s'] or 0) * 1e6:,.1f}} us (median of 10, measured)",
             "deviceless": f"compiled for one {{result['device_kind']}} of {{TOPOLOGY}} (deviceless; nothing ran)"}}
    print(f"{{KERNEL_NAME}} grid {{GRID}} {{','.join(DIMENSION_SEMANTICS)}}: {{where[result['mode']]}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
'''
    return PallasRepro(text=text, unsupported=tuple(problems))
