"""tpudiag: performance diagnosis for TPU workloads from XProf captures and compiler dumps.

The Python API is three functions, loaded on first use so `import tpudiag` stays fast:

    import tpudiag
    d = tpudiag.diagnose("logdir", dumps=["xla_dump"])   # a Diagnosis
    d.findings_frame(); d.ops_frame(); d.steps_frame()
    diff = tpudiag.compare("base_logdir", "new_logdir")  # a Diff
    with tpudiag.profile() as p: ...                      # trace a block with jax.profiler
    p.diagnosis                                          # and diagnose the capture
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpudiag.version import __version__

__all__ = ["CompiledInputs", "Diagnosis", "Diff", "Profile", "__version__", "compare", "diagnose", "profile"]

if TYPE_CHECKING:
    from tpudiag.pipeline import Diagnosis, Diff, compare, diagnose
    from tpudiag.model.inputs import CompiledInputs
    from tpudiag.profiling import Profile, profile


def __getattr__(name: str):
    if name in ("Diagnosis", "Diff", "compare", "diagnose"):
        from tpudiag import pipeline as module

        return getattr(module, name)
    if name in ("Profile", "profile"):
        from tpudiag import profiling as module

        return getattr(module, name)
    if name == "CompiledInputs":
        from tpudiag.model.inputs import CompiledInputs

        return CompiledInputs
    raise AttributeError(f"module 'tpudiag' has no attribute {name!r}")
