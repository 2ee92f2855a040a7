"""What an HLO instruction's name and category say about it: collective family, async role, I/O.

TPU names come in several forms: `all-gather-start.1`, double-suffix clones such as
`all-gather-start.1.0` (which XProf's async overlap does not pair), v5e's
`async-collective-start.3`, reduce-scatter fusions `all-reduce-scatter.2`, SparseCore offloads
`all-gather.25.cloned.1.call-start`. These helpers accept all of them.
"""

from __future__ import annotations

import re
from collections import deque
from functools import lru_cache
from collections.abc import Sequence

import numpy as np

# Checked in order: the first pattern found in the name (or category) wins, so the more
# specific `reduce-scatter` is tested before `all-reduce` (all-reduce-scatter is a reduce-scatter).
# Separators may be '-' (HLO opcodes, most names) or '_' (v6e names gathers `all_gather.3`).
_FAMILY_PATTERNS = (
    ("reduce-scatter", re.compile(r"reduce[-_]scatter")),
    ("ragged-all-to-all", re.compile(r"ragged[-_]all[-_]to[-_]all")),
    ("all-to-all", re.compile(r"all[-_]to[-_]all")),
    ("all-gather", re.compile(r"all[-_]gather")),
    ("all-reduce", re.compile(r"all[-_]reduce")),
    ("collective-permute", re.compile(r"collective[-_]permute")),
    ("collective-broadcast", re.compile(r"collective[-_]broadcast")),
    ("collective", re.compile(r"async-collective(?![-_]fusion)")),
    ("send", re.compile(r"^send(?:-start|-done)?(?:\.\d+)*$")),
    ("recv", re.compile(r"^recv(?:-start|-done)?(?:\.\d+)*$")),
)

# A collective library's kernel that no HLO op names (TensorFlow's, or one launched outside XLA):
# NCCL's `ncclDevKernel_AllReduce_Sum_f32_RING_LL` (older `ncclKernel_AllReduce_RING_LL_Sum_float`),
# RCCL's, which keeps NCCL's names, or its `ncclDevKernel_Generic`. The operation is CamelCase after
# the prefix; one the name does not say (`Generic`, `SendRecv`, a plain `Reduce`) is a `collective`.
_LIBRARY_KERNEL = re.compile(r"\b[nr]ccl(?:Dev)?Kernel_?(?P<op>[A-Za-z]*)")
_LIBRARY_FAMILIES = (("ReduceScatter", "reduce-scatter"), ("AllGather", "all-gather"), ("AllReduce", "all-reduce"),
                     ("AllToAll", "all-to-all"), ("Broadcast", "collective-broadcast"))

IO_CATEGORIES = frozenset({
    "infeed", "outfeed", "host send", "host send-done", "host recv", "host recv-done",
})

_SUFFIX = re.compile(r"(?:\.\d+)+$")
_ASYNC_ROLE = re.compile(r"^(?P<base>.*?)[-.](?P<role>start|done)$")


# Analyses and rules ask per distinct name on every host: a pod repeats the same few hundred
# names per host, so each is classified once. Bounded, as trace names are untrusted.
_NAME_CACHE = 1 << 16


@lru_cache(maxsize=_NAME_CACHE)
def collective_family(name: str, category: str = "") -> str:
    """The collective family of an op, or '' when it is not a collective: its name's
    (`name_family`), else its category's (`category_family`).

    `async-collective-fusion` continuations (compute carrying a collective step) are compute, not
    collectives; the name test excludes them whatever their category.
    """
    by_name = name_family(name)
    return by_name if by_name is not None else category_family(category)


def event_families(names: Sequence[str], categories: Sequence[str], name_codes: np.ndarray,
                   category_codes: np.ndarray) -> tuple[np.ndarray, tuple[str, ...]]:
    """`collective_family(name, category)` of every event, classified once per distinct name and
    category (traces hold millions of events, and a few thousand names): (a family id per event,
    int16, and the families the ids index, '' at 0). The codes are a categorical column's: -1 (no
    name or category) says nothing. The steps table and the collective windows both take their
    collectives from here, so they cannot disagree on one."""
    ids: dict[str, int] = {"": 0}
    verdicts = [name_family(n) for n in names]
    by_name = np.array([ids.setdefault(v, len(ids)) if v else 0 for v in verdicts] + [0], dtype=np.int16)
    name_decides = np.array([v is not None for v in verdicts] + [False], dtype=bool)
    by_category = np.array([ids.setdefault(category_family(c), len(ids)) for c in categories] + [0], dtype=np.int16)
    family = np.where(name_decides[name_codes], by_name[name_codes], by_category[category_codes])
    return family, tuple(ids)


@lru_cache(maxsize=_NAME_CACHE)
def name_family(name: str) -> str | None:
    """What the name alone says of `collective_family`: its family, '' for an `async-collective-fusion`
    continuation (never a collective), or None when the category decides."""
    if "async_collective_fusion" in name or name.startswith("async-collective-fusion"):
        return ""
    for family, pattern in _FAMILY_PATTERNS:
        if pattern.search(name):
            return family
    library = _LIBRARY_KERNEL.search(name)
    if library is not None:
        op = library.group("op")
        return next((family for word, family in _LIBRARY_FAMILIES if op.startswith(word)), "collective")
    return None


@lru_cache(maxsize=_NAME_CACHE)
def category_family(category: str) -> str:
    """The family an op's category names (`all-reduce fusion`), or '': `collective_family` of an op
    whose name says nothing."""
    cat = category.lower()
    for family, pattern in _FAMILY_PATTERNS[:7]:
        if pattern.search(cat):
            return family
    return ""


def library_collective(name: str) -> bool:
    """Whether a GPU kernel is a collective library's own (NCCL, RCCL), named by its kernel: it runs on
    the library's stream, beside compute."""
    return _LIBRARY_KERNEL.search(name) is not None


@lru_cache(maxsize=_NAME_CACHE)
def async_role(name: str) -> tuple[str, str] | None:
    """('start'|'done', base) for an async start or done op, else None.

    The base has every trailing numeric suffix removed, so `all-gather-start.1.0` and
    `all-gather-done.1.0` share the base `all-gather` and the key `all-gather/.1.0`.
    """
    stripped = _SUFFIX.sub("", name)
    m = _ASYNC_ROLE.match(stripped)
    if m is None:
        return None
    return m.group("role"), m.group("base")


def async_pair_key(name: str) -> str | None:
    """A key shared by an async start op and its done op: base plus numeric suffix."""
    suffix_match = _SUFFIX.search(name)
    suffix = suffix_match.group(0) if suffix_match else ""
    role = async_role(name)
    if role is None:
        return None
    return f"{role[1]}{suffix}"


def has_double_suffix(name: str) -> bool:
    """True for names like `all-gather-start.1.0` that XProf's async overlap does not recognise."""
    m = _SUFFIX.search(name)
    return bool(m) and m.group(0).count(".") >= 2


def is_io(category: str) -> bool:
    return category.lower() in IO_CATEGORIES


def pair_async(names: Sequence[str]) -> list[tuple[int, int]]:
    """(start index, done index) of async pairs in `names` (in time order), in order of the dones.

    Each start pairs with the next done of the same key; keys keep every numeric suffix, so
    double-suffix names (`all-gather-start.1.0`) pair, unlike in XProf's CLI.
    """
    open_starts: dict[str, deque[int]] = {}
    pairs = []
    for i, name in enumerate(names):
        role = async_role(name)
        if role is None:
            continue
        key = async_pair_key(name)
        if role[0] == "start":
            open_starts.setdefault(key, deque()).append(i)
        elif open_starts.get(key):
            pairs.append((open_starts[key].popleft(), i))
    return pairs


def window_family(start_name: str) -> str:
    """What an async window moves: its collective family, else `copy`, else `other`."""
    return collective_family(start_name) or ("copy" if "copy" in start_name else "other")
