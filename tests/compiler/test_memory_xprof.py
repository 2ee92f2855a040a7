"""The device memory of a capture's embedded program against XProf's memory viewer, the reference.

A real JAX capture (8 MI300X GPUs, Transformer Engine fused attention, `../shared/data`) embeds its
HloProto with the buffer assignment and the heap simulator's trace. tpudiag reads them into the
same memory model as an XLA dump; xprof's `memory_viewer` (the installed tensorboard-plugin-profile)
must give the same peak, position of the peak, arguments, outputs and live set. xprof reads the
program from `<module>.hlo_proto.pb` beside the capture, as the profile plugin writes it: the test
writes that file beside a copy of the capture, never in `../shared`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import SHARED
from tpudiag import diagnose

RUN = SHARED / "data" / "real-captures" / "jax-gpu-te-fused-attn" / "plugins" / "profile" / "run"
MiB = float(1 << 20)
_ORACLE = """
import sys
from xprof.convert import raw_to_tool_data
data, _ = raw_to_tool_data.xspace_to_tool_data([sys.argv[1]], "memory_viewer",
                                               {"module_name": sys.argv[2], "program_id": sys.argv[3], "memory_space": "0"})
sys.stdout.write(data.decode() if isinstance(data, bytes) else data)
"""


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    if not RUN.is_dir():
        pytest.skip(f"{RUN} is not here (../shared is absent on a bare clone)")
    copy = tmp_path_factory.mktemp("xprof") / "run"
    shutil.copytree(RUN, copy)
    d = diagnose(copy)
    [program] = [p for p in d.report.memory if p.module == "jit_loss_fn"]
    pid = program.path.rsplit(" ", 1)[-1]
    host = d.analysis.profile.hosts[0]
    (copy / "jit_loss_fn.hlo_proto.pb").write_bytes(host.hlo_protos[int(pid)])
    xplane = next(copy.glob("*.xplane.pb"))
    proc = subprocess.run([sys.executable, "-c", _ORACLE, str(xplane), "jit_loss_fn", pid], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout, proc.stderr[-2000:]
    return program, json.loads(proc.stdout)


def test_peak_and_its_position_equal_xprofs(both):
    program, theirs = both
    hbm = program.hbm
    assert hbm.peak_bytes / MiB == pytest.approx(theirs["totalBufferAllocationMib"], rel=1e-6)
    assert hbm.peak_position == theirs["peakHeapSizePosition"]
    live = sum(b.size_bytes for b in hbm.live_at_peak) / MiB  # buffers under 4 KiB are left out: 0.13 KiB here
    assert live == pytest.approx(theirs["peakHeapMib"], abs=0.01)


def test_arguments_and_outputs_equal_xprofs(both):
    program, theirs = both
    assert program.hbm.argument_bytes / MiB == pytest.approx(theirs["entryComputationParametersMib"], rel=1e-9)
    assert program.hbm.output_bytes / MiB == pytest.approx(theirs["maybeLiveOutMib"], rel=1e-9)


def test_the_live_set_at_the_peak_is_xprofs(both):
    program, theirs = both
    ours = sorted(b.size_bytes for b in program.hbm.live_at_peak)
    # xprof's max-heap list holds the same buffers (a trailing padding entry aside), by logical buffer.
    assert len(ours) == len([b for b in theirs["maxHeap"] if b.get("instructionName")])
