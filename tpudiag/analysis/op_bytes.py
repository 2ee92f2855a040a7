"""Bytes of each op by memory space, from the layouts in its HLO text (issue 27 §1).

The trace's own bytes (`bytes_accessed`, `hbm_bytes`) are XLA's cost analysis, recorded by the
profiler; on TPU they count HBM traffic, so an op whose data sits in VMEM (`S(1)` in its layouts)
shows none. This module reads the op's operands and results, with their memory spaces, from the
HLO text the trace carries, and gives per occurrence (all modelled: logical bytes of the arrays,
each read or written once):

- bytes read and written in HBM (`S(0)`, no space printed), VMEM (`S(1)`) and host memory
  (`S(5)`, pinned host memory on TPU); sync flags and semaphores (`S(2)`, `S(4)`) are not data;
- for an async copy or slice start (`copy-start`, `slice-start`), the spaces it moves between;
- `copied_hbm_bytes`: operands in VMEM that an async copy or slice brought there from HBM (the
  operand is the copy's `-done`, or an op the trace records whose operands all are, or an element
  of a tuple such an op makes: the KV cache a decode step updates in place, `dynamic-update-slice`
  in a tuple fusion over the cache's `copy-done`, and its attention fusions read through a
  `get-tuple-element`): the bytes the op's roofline has to count, since XLA's cost analysis counts
  them on the copy, not on the op that reads them. Prefetches XLA hides behind other work still had
  to cross HBM once per step. A tuple element takes the origin of the producer's operands of its
  dtype and dims (an in-place update's result is its operand's buffer), when there are some and
  they all agree.

Pure: reads the op metadata table, and the `get-tuple-element`s of the program (`tuples`), which
the trace does not record.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

import numpy as np
import pandas as pd

from tpudiag.model.compiled import HOST_MEMORY_SPACE, memory_space_name
from tpudiag.model.hlo_names import async_role
from tpudiag.model.hlo_shapes import named_operands, result_shapes, shape_bytes

HBM, VMEM = 0, 1
_ASYNC_MOVES = ("copy-start", "slice-start", "dynamic-slice-start")
_ASYNC_DONES = ("copy-done", "slice-done", "dynamic-slice-done")
_LAST_OPERAND = re.compile(r"%(?P<name>[\w.\-]+)\)")
_MAX_DEPTH = 3  # copies reached through at most this many recorded ops (a custom call joining slices)

COLUMNS = ("hbm_read_bytes", "hbm_write_bytes", "vmem_read_bytes", "vmem_write_bytes", "host_read_bytes",
           "host_write_bytes", "copied_hbm_bytes")


def _space_bytes(shapes, space: int) -> float:
    return float(sum(shape_bytes(s) for s in shapes if s.memory_space == space))


def _opcode(text: str, name: str) -> str:
    """The op's opcode, with a generic `async-start`/`async-done` named by what it wraps when that is
    a copy or slice (`slice-start` is printed `async-start(...)`)."""
    rhs = text.split("=", 1)[1] if "=" in text else ""
    for token in rhs.replace("(", " ( ").split():
        if token in ("async-start", "async-done"):
            role = async_role(name)
            base = role[1] if role else ""
            return f"{base}-{token[6:]}" if base in ("copy", "slice", "dynamic-slice") else token
        if token.endswith(("-start", "-done")) or token in ("custom-call", "fusion", "copy", "bitcast"):
            return token
    return ""


class _Program:
    """The HLO texts the trace records for one program, by instruction name, and (asked for only
    where a name is not among them) its tuple elements: name -> (producer, index)."""

    def __init__(self, texts: dict[str, str], tuples: Callable[[], dict[str, tuple[str, int]]]):
        self.texts = texts
        self._tuples = tuples
        self._elements: dict[str, tuple[str, int]] | None = None

    def _element(self, name: str) -> tuple[str, int] | None:
        if self._elements is None:
            self._elements = self._tuples()
        return self._elements.get(name)

    def brought_from_hbm(self, name: str, depth: int = 0) -> bool:
        """Whether the value `name` reached VMEM through an async copy or slice from HBM."""
        if depth > _MAX_DEPTH:
            return False
        text = self.texts.get(name)
        if text is None:
            element = self._element(name)
            producer = self.texts.get(element[0]) if element is not None else None
            if producer is None:
                return False
            results = result_shapes(producer)
            if element[1] >= len(results):
                return False
            same = [n for s, n in named_operands(producer) if s == results[element[1]]]
            return bool(same) and all(self.brought_from_hbm(n, depth + 1) for n in same)
        opcode = _opcode(text, name)
        operands = named_operands(text)
        if opcode in _ASYNC_DONES:  # its operand is the start's tuple: `copy-done((...) %copy-start)`
            named = _LAST_OPERAND.search(text.split("=", 1)[1])
            start = self.texts.get(named.group("name")) if named else None
            sources = named_operands(start) if start else []
            return bool(sources) and sources[0][0].memory_space == HBM
        if opcode in _ASYNC_MOVES or not operands:
            return False
        return all(self.brought_from_hbm(n, depth + 1) for _, n in operands)


def op_bytes(meta: pd.DataFrame,
             tuples: Callable[[int], dict[str, tuple[str, int]]] | None = None) -> pd.DataFrame:
    """Per (program_id, name) of the op metadata: `COLUMNS` per occurrence, and `moves` (`hbm->vmem`,
    `host->hbm`, ...) for an async copy or slice start, else ''. `tuples(program_id)`: the program's
    `get-tuple-element`s (`parsers.hlo_proto.tuple_elements`), asked for only when needed."""
    rows: dict[str, list] = {c: [] for c in ("program_id", "name", *COLUMNS, "moves")}
    if meta.empty:
        return pd.DataFrame({c: pd.Series(dtype="float64" if c in COLUMNS else object) for c in rows})
    names = meta["name"].astype(str).to_numpy()
    texts = meta["hlo_text"].fillna("").astype(str).to_numpy()
    programs = meta["program_id"].to_numpy()
    by_program: dict[int, _Program] = {}
    for p in np.unique(programs):
        at = programs == p
        by_program[p] = _Program(dict(zip(names[at], texts[at])),
                                 (lambda p=p: tuples(int(p))) if tuples is not None else dict)
    for program, name, text in zip(programs, names, texts):
        operands = named_operands(text)
        results = result_shapes(text)
        shapes = [s for s, _ in operands]
        moves = ""
        opcode = _opcode(text, name)
        if opcode in _ASYNC_MOVES and shapes and results:
            # `(destination, source, context...) copy-start(source)`; `((operands), destination, context...)
            # async-start(operands)` for a slice: where it goes is the first array, or the one after the operands.
            dest = results[len(shapes)] if text.split("=", 1)[1].lstrip().startswith("((") else results[0]
            moves = f"{memory_space_name(shapes[0].memory_space)}->{memory_space_name(dest.memory_space)}"
            # It reads what it writes (a slice reads its slice, not the whole operand).
            shapes, results = [replace(dest, text=shapes[0].text)], [dest]
        elif opcode in _ASYNC_DONES:
            operands, shapes, results = [], [], []  # the start's tuple: the pair's bytes are on the start, once
        copied = sum(shape_bytes(s) for s, n in operands
                     if s.memory_space == VMEM and by_program[program].brought_from_hbm(n))
        values = (_space_bytes(shapes, HBM), _space_bytes(results, HBM), _space_bytes(shapes, VMEM),
                  _space_bytes(results, VMEM), _space_bytes(shapes, HOST_MEMORY_SPACE),
                  _space_bytes(results, HOST_MEMORY_SPACE), float(copied))
        rows["program_id"].append(program)
        rows["name"].append(name)
        for column, value in zip(COLUMNS, values):
            rows[column].append(value)
        rows["moves"].append(moves)
    return pd.DataFrame(rows)
