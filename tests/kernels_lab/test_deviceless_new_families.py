"""Deviceless compiles (libtpu, no TPU) of the collective family and the new datamove / reduction ops.

- A property test: every reproduction of random odd shapes compiles for v5e:2x2 and v6e:2x2, or the
  compiler says why in one line (VMEM, a Mosaic limitation). Collectives compile over a ring of the
  topology's devices (shard_map over a mesh of 2 or 4 of them).
- `lab tune` on a captured collective compiles each candidate and the XLA collective for the
  capture's topology: the static profile gives remote DMAs 0 cycles (reference §6), so neither has a
  cycle estimate; XLA's cost model (`optimal_seconds`) is reported beside the modelled ICI ranking.

Each compile runs in a subprocess (libtpu reads its flags once per process). Kept to a few
examples: compiles are slow on 2 cores.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytest.importorskip("jax", reason="the kernels lab needs jax (the tpu extra)")

_COMPILE = r"""
import json, sys
import jax, numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec
from tpudiag.kernels_lab import collective as col, datamove as dm, reduction as red
from tpudiag.kernels_lab.sweep import compile_error_reason
fams = {"collective": col, "datamove": dm, "reduction": red}
out = []
for topo_name in ("v5e:2x2", "v6e:2x2"):
    devices = topologies.get_topology_desc(platform="tpu", topology_name=topo_name).devices
    single = NamedSharding(Mesh(np.array([devices[0]]), ("x",)), PartitionSpec())
    for family, case, blocks in json.loads(sys.argv[1]):
        fam = fams[family]
        p = fam.Problem(**case)
        b = fam.BlockSizes(**blocks)
        kw = {}
        sharding = single
        if family == "collective":
            kw["mesh"] = fam.device_mesh(p, devices)
            sharding = fam.input_sharding(kw["mesh"])
        specs = [jax.ShapeDtypeStruct(s, d, sharding=sharding) for s, d in fam.input_structs(p)]
        try:
            jax.jit(lambda *a: fam.pallas(*a, p=p, blocks=b, **kw)).lower(*specs).compile()
            out.append([topo_name, family, case.get("kind") or case.get("op"), "ok", ""])
        except Exception as exc:
            out.append([topo_name, family, case.get("kind") or case.get("op"), "refused",
                        compile_error_reason(str(exc))])
print(json.dumps(out))
"""
# What the compiler may legitimately refuse, by what it says: VMEM, or a Mosaic limitation
# (e.g. offsets along tiled dims that are not tile-aligned).
KNOWN_REFUSALS = ("VMEM OOM", "Mosaic failed to compile TPU kernel", "Not implemented", "not implemented",
                  "Unsupported", "unsupported")


def _compile(cases: list) -> list:
    env = dict(os.environ, TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1", JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(cases)], capture_output=True, text=True,
                          env=env, timeout=600)
    if proc.returncode != 0 and importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed: no deviceless compile")
    assert proc.returncode == 0, proc.stderr[-1500:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.libtpu
@settings(max_examples=2, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(rows=st.integers(1, 40), cols=st.sampled_from([128, 130, 256]),
       dtype=st.sampled_from(["bfloat16", "float32"]), devices=st.sampled_from([2, 4]),
       chunks=st.sampled_from([1, 2]), bidirectional=st.booleans())
def test_every_new_reproduction_compiles_deviceless_or_says_why(rows, cols, dtype, devices, chunks, bidirectional):
    ring = dict(direction=1, chunks=min(chunks, max(1, rows // 2)), bidirectional=bidirectional and rows >= 2)
    cases = [["collective", dict(kind=k, devices=devices, rows=rows, cols=cols, dtype=dtype), ring]
             for k in ("all-gather", "reduce-scatter", "all-reduce")]
    cases += [["reduction", dict(op="colsum", outer=3, rows=rows, cols=cols, dtype=dtype, out_dtype="float32"),
               dict(block_rows=rows if rows < 8 else 8)],
              ["datamove", dict(op="concatenate", in_dims=(rows, 2 * cols), out_dims=(rows, 2 * cols),
                                parts=(cols, cols), axis=1, dtype=dtype), dict(whole=1)],
              ["datamove", dict(op="concatenate", in_dims=(rows + 8, cols), out_dims=(rows + 8, cols),
                                parts=(8, rows), axis=0, dtype=dtype), dict(whole=1)],
              ["datamove", dict(op="pad", in_dims=(rows, cols), out_dims=(rows + 3, cols), pad_low=(1, 0),
                                pad_high=(2, 0), dtype=dtype), dict(whole=1)]]
    results = _compile(cases)
    assert len(results) == 2 * len(cases)
    for topo, family, op, status, reason in results:
        assert status == "ok" or any(k in reason for k in KNOWN_REFUSALS), (topo, family, op, reason)
        assert "\n" not in reason
    # the unsplit ring compiles on both generations whatever the shard (what extract writes by default);
    # split streams may be refused only when their windows are not tile-aligned, which `candidates` skips
    from tpudiag.kernels_lab import collective as col

    for (family, case, blocks), (topo, _, _, status, reason) in zip(cases * 2, results, strict=True):
        if family != "collective":
            continue
        p, b = col.Problem(**case), col.BlockSizes(**blocks)
        if not b.bidirectional and b.chunks == 1 or col.tile_aligned(p, b):
            assert status == "ok", (topo, case, blocks, reason)


BUNDLED = Path(__file__).resolve().parents[2] / "examples" / "models" / "captures" / "transformer_train_v5e"


@pytest.mark.libtpu
@pytest.mark.skipif(not BUNDLED.exists(), reason="the bundled example is not in this checkout")
def test_tune_a_captured_collective_for_its_topology(tmp_path, capsys):
    """all-reduce.4 of the bundled v5e step (bf16 1024x768 over the ring {0, 2} of v5e:2x2)."""
    if importlib.util.find_spec("libtpu") is None:
        pytest.skip("libtpu is not installed: no deviceless compile")
    from tpudiag.cli.app import main

    out = tmp_path / "ar"
    with pytest.raises(SystemExit):
        main(["lab", "extract", "--op", "all-reduce.4", "-o", str(out)])
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(["lab", "tune", str(out), "--no-measure", "--max-candidates", "3", "--format", "json", "--write"])
    assert exc.value.code in (0, None)
    result = json.loads(capsys.readouterr().out)
    assert result["basis"] == "ici-model" and result["topology"] == "v5e:2x2"
    assert [r["status"] for r in result["results"]] == ["ok"] * 3
    for r in result["results"]:
        assert r["est_cycles"] is None and "0 cycles to ops with remote DMAs" in r["reason"]
        assert r["ici_s"] > 0 and r["bounded_s"] == max(r["ici_s"], r["hbm_floor_s"])
    # XLA's collective compiled for the same ring: no cycle estimate either, its cost model's time instead
    assert result["xla"]["est_cycles"] is None and result["xla"]["optimal_s"] > 0
    assert result["xla"]["measured_s"] > 0  # from the capture
    labels = [r["label"] for r in result["results"]]
    assert labels == ["ring +1, 1 chunk", "ring -1, 1 chunk", "ring +1, 2 chunks"]
