"""`RESOURCE_EXHAUSTED` messages from JAX (a compile or a run that ran out of device memory) -> OomError.

HBM forms (the first measured on v5e with jax 0.10.2, shared/reference/tpu-compiler-dumps.md §11;
the other two are the compiler's capacity form and the runtime allocator's):

- `Ran out of memory on HBM, the total memory required for HLO temporaries (17.00G) exceeds
  available HBM (15.75G).`
- `Ran out of memory in memory space hbm. Used 20.00G of 15.75G hbm. Exceeded hbm capacity by 4.25G.`
- `Attempting to allocate 1.00G. That was not possible. There are 512.00M free.`

VMEM forms are read by `tpudiag.parsers.llo.vmem_oom` and turned into the same type. Sizes are
binary units with two decimals (`17.00G` = 17 GiB), as the compiler prints them.
"""

from __future__ import annotations

import re

from tpudiag.model.memory import OomError
from tpudiag.parsers.llo.vmem_oom import line_at, parse_vmem_oom, size_bytes

_SIZE = r"(\d+(?:\.\d+)?)\s?([KMGT]?)i?B?"
_TEMPORARIES = re.compile(rf"total memory required for HLO temporaries \({_SIZE}\) exceeds available HBM "
                          rf"\({_SIZE}\)")
_CAPACITY = re.compile(rf"Used {_SIZE} of {_SIZE} hbm\.(?: Exceeded hbm capacity by {_SIZE})?", re.IGNORECASE)
_ALLOCATE = re.compile(rf"Attempting to allocate {_SIZE}\. That was not possible\. There are {_SIZE} free")


def parse_oom_error(text: str) -> OomError | None:
    """The out-of-memory error in `text` (HBM or VMEM), or None when it holds none."""
    m = _TEMPORARIES.search(text)
    if m is not None:
        return OomError(space="hbm", kind="hbm-temporaries", required_bytes=size_bytes(m[1], m[2]),
                        available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()))
    m = _CAPACITY.search(text)
    if m is not None:
        exceeded = size_bytes(m[5], m[6]) if m[5] else None
        return OomError(space="hbm", kind="hbm-capacity", required_bytes=size_bytes(m[1], m[2]),
                        available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()),
                        exceeded_by_bytes=exceeded)
    m = _ALLOCATE.search(text)
    if m is not None:
        return OomError(space="hbm", kind="hbm-allocation", required_bytes=size_bytes(m[1], m[2]),
                        available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()))
    budget = parse_vmem_oom(text)
    if budget is not None:
        return OomError(space="vmem", kind=budget.kind, required_bytes=budget.used_bytes,
                        available_bytes=budget.limit_bytes, message=budget.message, hlo=budget.hlo,
                        exceeded_by_bytes=budget.exceeded_by_bytes)
    return None
