"""Small XLA dump directories of an Adam training step, written in code for the memory tests.

They follow the files a real v5e compile writes (`*.after_optimizations.txt`,
`*-buffer-assignment.txt`, `*-live-range.txt`, `*-memory-usage-report.txt`,
`*.target_arguments.txt`, and `*.oom_intermediate_module.txt` when it ran out of memory) with the
issue's shapes: per layer a bf16 [8192, 8192] weight with f32 m and v, a bf16 [16384, 8192]
batch, and one bf16 [16384, 8192] forward activation per layer kept for the backward pass.
The real compiles (tests/compiler/test_memory_libtpu.py) check the same numbers against
`memory_analysis()`; these keep the rule's tests fast and free of libtpu.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "module_0000.jit_step.cl_1"
W, STATE, ACT = "bf16[8192,8192]{1,0:T(8,128)(2,1)}", "f32[8192,8192]{1,0:T(8,128)}", "bf16[16384,8192]{1,0:T(8,128)(2,1)}"
W_BYTES, STATE_BYTES, ACT_BYTES = 8192 * 8192 * 2, 8192 * 8192 * 4, 16384 * 8192 * 2
TARGET = 'tpu_topology_args {\n  version: TPU_VERSION_VIPERFISH\n  variant: "lite"\n}\n'


def write_adam_dump(root: Path, layers: int, *, donate: bool = False, live_activations: int | None = None,
                    oom: bool = False, target: bool = True, kernels: dict[str, int] | None = None,
                    inference: bool = False, mesh: int = 1, sharding: str = "") -> Path:
    """A dump directory of an Adam step with `layers` layers; returns `root`.

    `live_activations`: how many forward activations are live together at the temporaries' peak
    (default: all of them, as without remat). Donated arguments hold their updated value.
    `kernels`: Pallas kernels (`tpu_custom_call`) to add, by name, with the scoped VMEM their
    `used_scoped_memory_configs` record. `inference`: the same buffers with no backward pass in
    the op names (`jit(step)/dot_general`, no `jvp(` or `transpose(`), as a forward function that
    returns updated state (a cache) would be. `mesh`: the module's `num_partitions`; `sharding`:
    the parameters' HLO sharding (`{replicated}`, `{devices=[4,1]<=[4]}`), per-device shapes as written.
    """
    root.mkdir(parents=True, exist_ok=True)
    kept = layers if live_activations is None else live_activations
    params = [(f"params_{i}_.1", W, W_BYTES, f"params[{i}]") for i in range(layers)]
    params += [(f"m_{i}_.1", STATE, STATE_BYTES, f"m[{i}]") for i in range(layers)]
    params += [(f"v_{i}_.1", STATE, STATE_BYTES, f"v[{i}]") for i in range(layers)]
    params.append(("x.1", ACT, ACT_BYTES, "x"))
    fwd, bwd = ("jit(step)/dot_general", "jit(step)/add") if inference else (
        "jit(step)/jvp()/dot_general", "jit(step)/transpose(jvp())/dot_general")
    shard = f", sharding={sharding}" if sharding else ""
    hlo = [f"HloModule jit_step, is_scheduled=true, num_partitions={mesh}\n\n"
           "%f (a: f32[2]) -> f32[2] {\n  ROOT %a = f32[2] parameter(0)\n}\n",
           "ENTRY %main.1 () -> () {"]
    for n, (name, shape, _, op) in enumerate(params):
        hlo.append(f'  %{name} = {shape} parameter({n}){shard if name != "x.1" else ""}, metadata={{op_name="{op}"}}')
    for i in range(layers):
        hlo.append(f"  %act.{i} = {ACT} fusion(%x.1, %params_{i}_.1), kind=kOutput, calls=%f, "
                   f'metadata={{op_name="{fwd}" source_file="train.py" source_line=12}}')
    for i in range(layers):
        hlo.append(f"  %update.{i} = ({W}, {STATE}, {STATE}) fusion(%act.{i}, %m_{i}_.1, %v_{i}_.1), kind=kLoop, "
                   f'calls=%f, metadata={{op_name="{bwd}" source_file="train.py" '
                   f"source_line=20}}")
    for name, vmem in (kernels or {}).items():
        config = f'{{"used_scoped_memory_configs":[{{"memory_space":"1","offset":"0","size":"{vmem}"}}]}}'
        hlo.append(f'  %{name} = {ACT} custom-call(%x.1), custom_call_target="tpu_custom_call", '
                   f'metadata={{op_name="jit(step)/pallas_call" source_file="kernel.py" source_line=7}}, '
                   f"backend_config={config}")
    outs = ", ".join(f"%update.{i}" for i in range(layers))
    hlo.append(f"  ROOT %tuple.1 = () tuple({outs})\n}}\n")
    (root / f"{PREFIX}.after_optimizations.txt").write_text("\n".join(hlo))

    allocs, n = [], 0
    for p, (name, shape, size, _) in enumerate(params):
        flags = f"parameter {p}, shape |{shape.split('{')[0]}| at ShapeIndex {{}}"
        if donate and name != "x.1":
            flags = "maybe-live-out, " + flags
        allocs.append(f"allocation {n}: size {size}, {flags}:\n value: <{n} {name} @0> (size={size},offset=0): {shape}")
        n += 1
    if not donate:
        for i in range(layers):
            for k, (shape, size) in enumerate(((W, W_BYTES), (STATE, STATE_BYTES), (STATE, STATE_BYTES))):
                allocs.append(f"allocation {n}: size {size}, maybe-live-out:\n"
                              f" value: <{n} update.{i}{{{k}}} @0> (size={size},offset=0): {shape}")
                n += 1
    temp = [f" value: <{900 + i} act.{i} @0> (size={ACT_BYTES},offset={ACT_BYTES * (i % kept)}): {ACT}"
            for i in range(layers)]
    allocs.append(f"allocation {n}: size {ACT_BYTES * kept}, preallocated-temp:\n" + "\n".join(temp))
    (root / f"{PREFIX}.after_optimizations-buffer-assignment.txt").write_text(
        "BufferAssignment:\n" + "\n".join(allocs) + "\n")

    # Program order: parameters, the forward activations, then the updates. Activation i is
    # defined at `start + i` and used by the last update that needs it; `kept` are live together.
    start, end = len(params), len(params) + 2 * layers
    ranges = [f"    {name}{{}}:0-{end}" for name, *_ in params]
    for i in range(layers):
        ranges.append(f"    act.{i}{{}}:{start + i}-{start + i + kept - 1}")
        for k in range(3):
            ranges.append(f"    update.{i}{{{k}}}:{start + layers + i}-{end}")
    (root / f"{PREFIX}.after_optimizations-live-range.txt").write_text(
        f"HloLiveRange (max {end}):\n  InstructionSequence:\n    0:x.1\n  BufferLiveRange:\n"
        + "\n".join(ranges) + "\n  Live ranges at 0 (peak):\n")
    total = sum(int(a.split("size ", 1)[1].split(",", 1)[0]) for a in allocs)
    (root / f"{PREFIX}.after_optimizations-memory-usage-report.txt").write_text(
        f"Memory Space: default (color=0)\nTotal bytes: {total} ({total / 2**30:.2f}GiB)\n")
    if target:
        (root / f"{PREFIX}.target_arguments.txt").write_text(TARGET)
    if oom:
        (root / f"{PREFIX}.oom_intermediate_module.txt").write_text("\n".join(hlo))
    return root
