"""`RESOURCE_EXHAUSTED` texts (a compile or a run that ran out of device memory) -> OomError.

Every form XLA, libtpu and the TensorFlow TPU runtime print, each recorded in `OomError.form`
(`tpudiag.model.memory.OOM_FORMS`). HBM forms, with where each was seen:

- `xla-hbm-temporaries`: `Ran out of memory on HBM, the total memory required for HLO temporaries
  (17.00G) exceeds available HBM (15.75G).` (v5e, jax 0.10.2: shared/reference/tpu-compiler-dumps.md §11).
- `libtpu-compile`: `XLA:TPU compile permanent error. Ran out of memory in memory space hbm. Used
  63.80G of 30.75G hbm. Exceeded hbm capacity by 33.05G.` (jax issues 2022-2026; newer libtpu
  prefixes `E1000: CompileTimeHbmOom:`), then `Total hbm usage >= X:` (reserved, program,
  arguments), `Output size X; shares Y with arguments.`, `Program hbm requirement X:` (reserved,
  global, scoped, HLO temp) and a ranked `Largest program allocations in hbm:` list whose entries
  carry `Size`, `Operator` (`op_name="jit(step)/..." source_file=... source_line=...`), `Shape`,
  `Unpadded size`, `Extra memory due to padding: 471.50M (12.6x expansion)`, `XLA label`,
  `Allocation type`.
- `tf-tpu-compile`: the same report from the TensorFlow TPU runtime (`Compilation failure: Ran out
  of memory in memory space hbm. ...`, `Resource exhausted: {{function_node ...}}`), whose labels
  start with `%` and whose operators are `op_type="OneHot" op_name="one_hot"`.
- `tpu-compile`: that report with no marker of who printed it (older jax: `RESOURCE_EXHAUSTED:
  Ran out of memory in memory space hbm.`).
- `tpu-runtime-allocate`: `Error allocating device buffer: Attempting to allocate 4.39G. That was
  not possible. There are 2.30G free.; (0x0x0_HBM0)`.
- `tpu-runtime-reserve`: `Attempting to reserve 3.95G at the bottom of memory. That was not
  possible. There are 1.92G free, 0B reserved, and 1.92G reservable.`, then `HBM capacity 8.00G:`,
  `Persistent allocations include some or all of:` (arguments, output) and the requirement.

VMEM forms are read by `tpudiag.parsers.llo.vmem_oom` and turned into the same type. Sizes are
binary units with two decimals (`17.00G` = 17 GiB), as the compiler prints them. A size past any
device's memory (`Used 1<309 zeros>G`) is an `OomSizeError`, never an overflow.
"""

from __future__ import annotations

import re

from tpudiag.model.memory import OomAllocation, OomError, OomPart
from tpudiag.parsers.llo.vmem_oom import parse_vmem_oom
from tpudiag.parsers.oom_text import OomSizeError, line_at, parse_allocations, size_bytes

__all__ = ["OomSizeError", "parse_oom_error"]

_SIZE = r"(\d+(?:\.\d+)?)\s?([KMGT]?)i?B?"
_TEMPORARIES = re.compile(rf"total memory required for HLO temporaries \({_SIZE}\) exceeds available HBM "
                          rf"\({_SIZE}\)")
_CAPACITY = re.compile(rf"Used {_SIZE} of {_SIZE} hbm\.(?: Exceeded hbm capacity by {_SIZE})?", re.IGNORECASE)
_ALLOCATE = re.compile(rf"Attempting to allocate {_SIZE}\. That was not possible\. There are {_SIZE} free")
_RESERVE = re.compile(rf"Attempting to reserve {_SIZE} at the bottom of memory\. That was not possible\. "
                      rf"There are {_SIZE} free")
_OUTPUT = re.compile(rf"Output size (?:{_SIZE}|unknown)(?:; shares {_SIZE} with arguments)?")
_SECTION = re.compile(r"^\s*(?P<head>Total hbm usage >=|Program hbm requirement|Persistent allocations include)"
                      r"[^\n]*:\s*$")
_PART = re.compile(rf"^\s+(?P<name>[A-Za-z][A-Za-z /()_-]*?)\s+(?:{_SIZE}|(?P<unknown>unknown size))"
                   r"(?P<note>[^\n]*)$")
_JIT = re.compile(r"jit\((?P<name>[A-Za-z_][\w.]*)\)")
_FUNCTION_NODE = re.compile(r"\{\{function_node (?P<name>[\w.]+)\}\}")
_TF_MARKERS = ("Compilation failure:", "Resource exhausted:", "{{function_node", "/job:", "tensorflow")
_LIBTPU_MARKERS = ("XLA:TPU compile permanent error", "CompileTimeHbmOom", "XlaRuntimeError", "JaxRuntimeError",
                   "jaxlib", "jax.errors")


def parse_oom_error(text: str) -> OomError | None:
    """The out-of-memory error in `text` (HBM or VMEM), or None when it holds none.

    Raises OomSizeError (a ValueError) for a size no device could have."""
    m = _TEMPORARIES.search(text)
    if m is not None:
        return _with_report(text, OomError(
            space="hbm", kind="hbm-temporaries", required_bytes=size_bytes(m[1], m[2]),
            available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()), form="xla-hbm-temporaries"))
    m = _CAPACITY.search(text)
    if m is not None:
        exceeded = size_bytes(m[5], m[6]) if m[5] else None
        return _with_report(text, OomError(
            space="hbm", kind="hbm-capacity", required_bytes=size_bytes(m[1], m[2]),
            available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()),
            exceeded_by_bytes=exceeded, form=_compile_form(text)))
    m = _RESERVE.search(text)
    if m is not None:
        return _with_report(text, OomError(
            space="hbm", kind="hbm-allocation", required_bytes=size_bytes(m[1], m[2]),
            available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()), form="tpu-runtime-reserve"))
    m = _ALLOCATE.search(text)
    if m is not None:
        return _with_report(text, OomError(
            space="hbm", kind="hbm-allocation", required_bytes=size_bytes(m[1], m[2]),
            available_bytes=size_bytes(m[3], m[4]), message=line_at(text, m.start()), form="tpu-runtime-allocate"))
    budget = parse_vmem_oom(text)
    if budget is not None:
        return OomError(space="vmem", kind=budget.kind, required_bytes=budget.used_bytes,
                        available_bytes=budget.limit_bytes, message=budget.message, hlo=budget.hlo,
                        exceeded_by_bytes=budget.exceeded_by_bytes, form=f"vmem-{budget.kind}",
                        allocations=(allocations := parse_allocations(text)),
                        programs=_programs(text, allocations))
    return None


def _compile_form(text: str) -> str:
    if any(k in text for k in _LIBTPU_MARKERS):
        return "libtpu-compile"
    if any(k in text for k in _TF_MARKERS):
        return "tf-tpu-compile"
    return "tpu-compile"


def _with_report(text: str, error: OomError) -> OomError:
    """`error` with the breakdowns, the output line, the allocations list and the programs named."""
    sections: dict[str, list[OomPart]] = {}
    current: list[OomPart] | None = None
    for line in text.splitlines():
        head = _SECTION.match(line)
        if head is not None:
            current = sections.setdefault(head["head"].split()[0], [])
            continue
        part = _PART.match(line) if current is not None else None
        if part is None:
            current = None
            continue
        size = None if part["unknown"] else size_bytes(part[2], part[3])
        current.append(OomPart(name=part["name"].strip(), size_bytes=size, note=part["note"].strip()))
    output = _OUTPUT.search(text)
    out_bytes = size_bytes(output[1], output[2]) if output is not None and output[1] else None
    shared = size_bytes(output[3], output[4]) if output is not None and output[3] else None
    allocations = parse_allocations(text)
    return OomError(
        space=error.space, kind=error.kind, required_bytes=error.required_bytes,
        available_bytes=error.available_bytes, message=error.message, hlo=error.hlo, exceeded_by_bytes=error.exceeded_by_bytes, form=error.form,
        usage=tuple(sections.get("Total", ())), requirement=tuple(sections.get("Program", ())),
        persistent=tuple(sections.get("Persistent", ())), output_bytes=out_bytes, output_shared_bytes=shared,
        allocations=allocations, programs=_programs(text, allocations))


def _programs(text: str, allocations: tuple[OomAllocation, ...]) -> tuple[str, ...]:
    """The modules the text names: an allocation's op name that starts `jit(step)` is module
    `jit_step`; TensorFlow's `{{function_node NAME}}` is NAME. Sorted, without repeats."""
    names = {f"jit_{m['name']}" for a in allocations if (m := _JIT.match(a.op_name)) is not None}
    names |= {m["name"] for m in _FUNCTION_NODE.finditer(text)}
    return tuple(sorted(names))
