"""`analysis.kernels` on hand-built inputs: a program with two kernels, one LLO dump whose bundle
profile, ops row and static profile are written here (the fields `parsers.llo` fills), each unit's
share worked by hand as count / capacity per unit instance, then the mean over instances. No jaxlib
needed (`test_mosaic_kernels.py` checks the same on the committed dumps)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd
import pytest

from tpudiag.analysis.kernels import pallas_kernels
from tpudiag.model.llo import BundleDma
from tpudiag.model.memory import VmemUse


def _profile(rows):
    return pd.DataFrame(rows, columns=["hlo", "program", "unit", "op", "count", "capacity"])


PROFILE = _profile([
    ("k.1", "TLP", "MXU_0", "matmul", 30, 100), ("k.1", "TLP", "MXU_0", "matmul_packed", 20, 100),  # 0.5
    ("k.1", "TLP", "MXU_1", "matmul", 10, 100),  # 0.1: MXU mean (0.5 + 0.1) / 2 = 0.3
    ("k.1", "TLP", "MXU_1", "vpush", 90, 100),  # not a matmul op: left out
    ("k.1", "TLP", "XLU_0", "all", 5, 50), ("k.1", "TLP", "XLU_1", "all", 0, 50),  # (0.1 + 0) / 2
    ("k.1", "TLP", "VECTOR_ALU", "", 25, 100), ("k.1", "TLP", "VECTOR_ALU", "add", 99, 100),  # only the op-less row
    ("k.1", "TLP", "VECTOR_LOAD_AND_MISC", "", 7, 10),
    ("k.1", "TLP", "VECTOR_STORE", "", 1, 10), ("k.1", "TLP", "VECTOR_STORE_AND_MISC", "", 2, 10),  # two names, one unit
    ("k.1", "TLP", "VECTOR_EUP", "", 1, 1),  # a unit of one slot, used: 1.0
    ("k.1", "TLP", "SCALAR_ALU", "", 0, 0),  # no capacity: left out, so no SCALAR_ALU share
    ("k.1", "other", "VECTOR_EUP", "", 1, 1),  # another LLO program's row: the TLP's are kept
])


def _dump(**kw):
    base = dict(ops=pd.DataFrame({"name": ["k.1"], "estimated_cycles": [900.0], "bundles": [120.0],
                                  "spill_stores": [3.0], "spill_fills": [5.0]}),
                bundle_profile=PROFILE, static_profile=pd.DataFrame({"hlo": ["k.1", "k.2"],
                                                                     "dma_instruction_type": ["LOCAL", None]}),
                dma_for=lambda op: BundleDma(op, 50, 4, 2) if op == "k.1" else None)
    return SimpleNamespace(**(base | kw))


def _program(**insts):
    return SimpleNamespace(module="jit_f", kernels={n: f"kernel {n}" for n in insts}, find=insts.get)


def _inst(config="", cycles=None, source_file="/src/model/kern.py", line=42):
    return SimpleNamespace(source_file=source_file, source_line=line, backend_config=config, estimated_cycles=cycles)


def test_a_kernels_units_bundles_spills_and_dma_from_its_llo_dump():

    scoped = '{"used_scoped_memory_configs":[{"memory_space":"1","size":"4096"}]}'
    program = _program(**{"k.2": _inst(cycles=77, source_file=""), "k.1": _inst(scoped)})
    compiled = SimpleNamespace(chip=SimpleNamespace(generation="v5e"), programs=[program], llo=[_dump()])
    k1, k2 = pallas_kernels(compiled)  # by op name
    assert (k1.op, k1.program, k1.kernel, k1.call_site) == ("k.1", "jit_f", "kernel k.1", "kern.py:42")
    assert k1.vmem_used_bytes == 4096 and (k1.vmem_limit_bytes, k1.vmem_limit_source) == (
        16 << 20, "default for v5e, measured")
    assert (k1.estimated_cycles, k1.bundles, k1.spill_stores, k1.spill_fills) == (900, 120, 3, 5)
    assert [(u.unit, u.fraction) for u in k1.units] == [
        ("MXU matmul", pytest.approx(0.3)), ("XLU", pytest.approx(0.05)), ("VECTOR_ALU", pytest.approx(0.25)),
        ("VECTOR_LOAD", pytest.approx(0.7)), ("VECTOR_STORE", pytest.approx(0.15)), ("VECTOR_EUP", 1.0)]
    assert (k1.final_bundles, k1.dma_issue_bundles, k1.dma_wait_bundles, k1.dma_instruction_type) == (50, 4, 2, "LOCAL")
    # k.2: nothing in the LLO dump; its own cycles, no call site without a file, no scoped VMEM stated
    assert (k2.call_site, k2.estimated_cycles, k2.bundles, k2.units, k2.vmem_used_bytes) == ("", 77, None, (), None)
    assert (k2.final_bundles, k2.dma_issue_bundles, k2.dma_wait_bundles, k2.dma_instruction_type) == (None,) * 3 + ("",)


def test_a_kernels_scoped_limit_comes_from_its_programs_memory_first():

    program = _program(**{"k.1": _inst()})
    memory = [SimpleNamespace(module="jit_other", vmem_ops=(), vmem_scoped_limit_bytes=1, vmem_limit_source="x"),
              SimpleNamespace(module="jit_f", vmem_ops=(VmemUse("k.1", 8192, "LLO VMEM report"),),
                              vmem_scoped_limit_bytes=100 << 20, vmem_limit_source="compiler error")]
    [k] = pallas_kernels(SimpleNamespace(chip=SimpleNamespace(generation="v5e"), programs=[program], llo=[]), memory)
    assert (k.vmem_used_bytes, k.vmem_limit_bytes, k.vmem_limit_source) == (8192, 100 << 20, "compiler error")
    # a program's memory without a limit, on an unknown chip: no limit
    memory = [SimpleNamespace(module="jit_f", vmem_ops=(), vmem_scoped_limit_bytes=None, vmem_limit_source="")]
    [k] = pallas_kernels(SimpleNamespace(chip=SimpleNamespace(generation="v9"), programs=[program], llo=[]), memory)
    assert (k.vmem_used_bytes, k.vmem_limit_bytes, k.vmem_limit_source) == (None, None, "")
    [k] = pallas_kernels(SimpleNamespace(chip=None, programs=[program], llo=[]))
    assert (k.vmem_limit_bytes, k.vmem_limit_source) == (None, "")
    [k] = pallas_kernels(SimpleNamespace(chip=SimpleNamespace(generation="v6e"), programs=[program], llo=[]))
    assert (k.vmem_limit_bytes, k.vmem_limit_source) == (32 << 20, "default for v6e, measured")


def test_the_first_llo_dump_that_has_the_kernel_gives_its_rows():

    empty = _dump(ops=pd.DataFrame({"name": ["other"]}), bundle_profile=_profile([]),
                  static_profile=pd.DataFrame({"hlo": ["k.1"], "dma_instruction_type": [None]}),
                  dma_for=lambda op: BundleDma(op, 0, 0, 0))  # no bundles: not this kernel's counts
    # a dump with the kernel's profile rows but no ops row, and not under the top-level program
    profile_only = _dump(ops=pd.DataFrame({"name": ["other"]}),
                         bundle_profile=_profile([("k.1", "sub", "VECTOR_ALU", "", 1, 4)]))
    program = _program(**{"k.1": _inst()})
    [k] = pallas_kernels(SimpleNamespace(chip=None, programs=[program], llo=[empty, profile_only, _dump()]))
    assert [(u.unit, u.fraction) for u in k.units] == [("VECTOR_ALU", 0.25)] and k.bundles is None
    assert (k.final_bundles, k.dma_instruction_type) == (50, "LOCAL")  # the first with bundles, with a type
