"""tpudiag: performance diagnosis for TPU workloads from XProf captures and compiler dumps.

The Python API is two functions, loaded on first use so `import tpudiag` stays fast:

    import tpudiag
    d = tpudiag.diagnose("logdir", dumps=["xla_dump"])   # a Diagnosis
    d.findings_frame(); d.ops_frame(); d.steps_frame()
    diff = tpudiag.compare("base_logdir", "new_logdir")  # a Diff
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tpudiag.version import __version__

__all__ = ["CompiledInputs", "Diagnosis", "Diff", "__version__", "compare", "diagnose"]

if TYPE_CHECKING:
    from tpudiag.pipeline import Diagnosis, Diff, compare, diagnose
    from tpudiag.model.inputs import CompiledInputs


def __getattr__(name: str):
    if name in ("Diagnosis", "Diff", "compare", "diagnose"):
        from tpudiag import pipeline as module

        return getattr(module, name)
    if name == "CompiledInputs":
        from tpudiag.model.inputs import CompiledInputs

        return CompiledInputs
    raise AttributeError(f"module 'tpudiag' has no attribute {name!r}")
