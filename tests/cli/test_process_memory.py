"""The CLI process keeps the memory it frees (glibc's malloc) and asks for no huge pages (numpy):
a one-host report allocates and frees hundreds of large temporaries, and fresh pages cost it a
third of its CPU time in system time (docs/speed.md). It runs the garbage collector's young pass
every 100,000 allocations, not every 700 (250 passes for 0.13 s of CPU in a one-host report)."""

from __future__ import annotations

import gc
import subprocess
import sys

import pytest

_PROBE = """
import resource, sys
import numpy as np
from tpudiag.cli.app import keep_freed_memory
if sys.argv[1] == "keep":
    keep_freed_memory()
np._core.multiarray._set_madvise_hugepage(False)  # 4 KiB faults in both runs, so counts compare
faults = []
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    a = np.ones(4 << 20)  # 32 MiB, written whole, then freed
    del a
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(faults[-1])
"""


def _faults_of_a_freed_array_written_again(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], capture_output=True, text=True, check=True, timeout=120)
    return int(out.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="mallopt is glibc's")
def test_freed_arrays_are_reused_without_new_page_faults():
    # 32 MiB is 8192 pages of 4 KiB: malloc's default hands the block back to the kernel and the
    # next array faults every page in again; kept, the same pages are written again.
    assert _faults_of_a_freed_array_written_again("default") > 4000
    assert _faults_of_a_freed_array_written_again("keep") < 1000


def test_report_turns_numpy_huge_pages_off():
    import numpy as np

    from tpudiag.cli.app import no_huge_pages

    previous = np._core.multiarray._set_madvise_hugepage(True)
    try:
        no_huge_pages()
        assert np._core.multiarray._set_madvise_hugepage(previous) is False
    finally:
        np._core.multiarray._set_madvise_hugepage(previous)


def test_the_cli_collects_garbage_every_hundred_thousand_allocations():
    from tpudiag.cli.app import main

    previous = gc.get_threshold()
    gc.set_threshold(700, *previous[1:])
    try:
        with pytest.raises(SystemExit):
            main(["--version"])
        assert gc.get_threshold() == (100_000, *previous[1:])
    finally:
        gc.set_threshold(*previous)


_EXIT_PROBE = """
import atexit, gc, sys
from tpudiag.cli.app import main
atexit.register(lambda: sys.stderr.write(f"\\nFROZEN {gc.get_freeze_count()}"))
as_process = sys.argv[1] == "process"
sys.argv = ["tpudiag", "--version"]
main() if as_process else main(["--version"])
"""


@pytest.mark.parametrize("mode", ["process", "call"])
def test_only_the_process_command_skips_the_exit_collection(mode):
    # Called as the process's command (no argv), main freezes what is alive for the exit; called
    # with argv (tests, other programs) it leaves the caller's collector alone.
    proc = subprocess.run([sys.executable, "-c", _EXIT_PROBE, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    frozen = int(proc.stderr.rsplit("FROZEN ", 1)[-1])
    assert (frozen > 10_000) if mode == "process" else frozen == 0


_IMPORTS_PROBE = """
import gc, sys
from tpudiag.cli import app
app._command_process = sys.argv[1] == "process"
app.fewer_collections()  # as main sets it: no young pass within these 5,000 allocations
with app.imports_uncollected():
    enabled_inside = gc.isenabled()
    made = [[] for _ in range(5000)]  # 5,000 young objects that live on, as imported modules do
print(enabled_inside, gc.isenabled(), gc.get_freeze_count() >= 5000, gc.get_count()[0])
"""


@pytest.mark.parametrize("mode", ["process", "call"])
def test_only_the_process_command_imports_uncollected_and_freezes_the_imports(mode):
    # As the process's command, the report's imports run with the collector off and what they made
    # is frozen (the young count starts again from zero); called with argv, the caller's collector
    # is left alone: on, nothing frozen, the 5,000 young objects still counted.
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_PROBE, mode], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    enabled_inside, enabled_after, frozen, young = proc.stdout.split()
    assert enabled_after == "True"
    if mode == "process":
        assert (enabled_inside, frozen) == ("False", "True")
        assert int(young) < 100
    else:
        assert (enabled_inside, frozen) == ("True", "False")
        assert int(young) >= 5000
