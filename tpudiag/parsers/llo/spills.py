"""Spill instructions in `final_bundles`, spill slots and the region tree in `post-ra`.

`final_bundles` has one VLIW bundle per line, `0x4b LB: > { instr ;; instr } /* comments */`;
a VMEM spill is `%n = vst [vmem:[#allocation14_spill] sm:$0xff] /*vst_source=*/%v...`, a fill
`%v = vld [vmem:[#allocationN_spill] ...]`, SMEM ones use `sst`/`sld [smem:[...]]`. Trailing
comments open and close regions, but not where the instruction was placed: the region of
a spill is taken from `post-ra`, where the same instruction (`%49016 = vst ...`) sits inside its
region, matched by its result name.

`post-ra` declares regions as `$region3: #{fusion.7} parent=0 // loop_body` (the `#{...}` names
the HLO op the region implements; unnamed regions inherit their parent's) and spill slots as
`#allocation14_spill [shape = 'u32[8,128]{1,0}', space=vmem, size = 0x1000, scoped, tag = 'spilled
vreg/vmreg']`. Together they say which HLO op of the top-level program a spill belongs to.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from tpudiag.model.llo import BundleDma

_BUNDLE = re.compile(r"^\s*(?P<addr>0x[0-9a-fA-F]+|[0-9]+)\s+(?:[A-Z]{2}\s*)*:")
_SPILL = re.compile(r"(?P<lhs>%\w+)\s*=\s*(?P<op>vst|vld|sst|sld)\b[^\[;]*"
                    r"\[(?P<space>vmem|smem):\[(?P<slot>#allocation\d+_spill)")
# Region kinds (post-ra `// loop_body`) whose code runs once per iteration. The LB/LH keys of
# final_bundles mark only a loop's first bundle, so they cannot say whether a bundle is inside one.
_LOOP_KINDS = frozenset({"loop_header", "loop_header_branch", "loop_body", "loop_footer",
                         "loop_footer_branch"})
_KIND = {("vst", "vmem"): "vmem_spill", ("vld", "vmem"): "vmem_fill",
         ("sst", "smem"): "smem_spill", ("sld", "smem"): "smem_fill"}

_REGION = re.compile(r"^\s*\$region(?P<id>\d+):(?:\s*#\{(?P<hlo>[^}]*)\})?(?:\s*parent=(?P<parent>\d+))?"
                     r"(?:\s*//\s*(?P<kind>\w+))?")
_SLOT = re.compile(r"^\s*(?P<slot>#allocation\d+_spill) \[shape = '(?P<shape>[^']*)', "
                   r"space=(?P<space>\w+), size = (?P<size>0x[0-9a-fA-F]+|[0-9]+)")


def _number(text: str) -> int:
    """`0x4b` or `75` (not int(text, 0): that rejects decimal `007`)."""
    return int(text, 16) if text.startswith("0x") else int(text)


@dataclass
class RegionTree:
    """Parent and HLO op of each post-ra region of one program."""

    parent: dict[int, int] = field(default_factory=dict)
    hlo: dict[int, str] = field(default_factory=dict)
    kind: dict[int, str] = field(default_factory=dict)  # loop_body, pred_region, ...
    spill_region: dict[str, int] = field(default_factory=dict)  # spill instruction result -> region

    def _ancestors(self, region: int | None):
        seen = set()
        while region is not None and region not in seen:
            seen.add(region)
            yield region
            region = self.parent.get(region)

    def in_loop(self, region: int | None) -> bool | None:
        if region is None:
            return None
        return any(self.kind.get(r) in _LOOP_KINDS for r in self._ancestors(region))

    def hlo_of(self, region: int | None) -> str | None:
        return next((self.hlo[r] for r in self._ancestors(region) if r in self.hlo), None)


def parse_post_ra(text: str, program: str) -> tuple[RegionTree, list[dict]]:
    """The region tree and `SPILL_SLOTS` rows (hlo filled in by the caller's default if unknown)."""
    tree = RegionTree()
    slots: list[dict] = []
    current: int | None = None
    for line in text.splitlines():
        m = _REGION.match(line)
        if m is not None:
            current = int(m["id"])
            if m["parent"] is not None:
                tree.parent[current] = int(m["parent"])
            if m["hlo"]:
                tree.hlo[current] = m["hlo"]
            if m["kind"]:
                tree.kind[current] = m["kind"]
            continue
        if current is not None and "_spill" in line:
            for spill in _SPILL.finditer(line):
                tree.spill_region[spill["lhs"]] = current
        m = _SLOT.match(line)
        if m is not None:
            slots.append({"program": program, "slot": m["slot"], "space": m["space"],
                          "size_bytes": _number(m["size"]), "shape": m["shape"], "region": current})
    for row in slots:
        row["hlo"] = tree.hlo_of(row["region"])
    return tree, slots


_COMMENT = re.compile(r"/\*.*?\*/")
_DMA = re.compile(r"\bdma\.(?P<kind>[a-z_]+(?:\.[a-z_]+)*)")


def count_dma(text: str, program: str) -> BundleDma:
    """How many of the program's bundles start a DMA and how many wait on one (`dma.done.*`)."""
    bundles = issue = wait = 0
    for line in text.splitlines():
        if _BUNDLE.match(line) is None:
            continue
        bundles += 1
        kinds = [m["kind"] for m in _DMA.finditer(_COMMENT.sub("", line))]
        issue += any(not k.startswith("done") for k in kinds)
        wait += any(k.startswith("done") for k in kinds)
    return BundleDma(program, bundles, issue, wait)


def parse_final_bundles(text: str, program: str, file_name: str, warnings: list[str]) -> list[dict]:
    """`SPILL_INSTRUCTIONS` rows (hlo None: resolved against the region tree by the caller)."""
    rows: list[dict] = []
    bundles = 0
    for line in text.splitlines():
        m = _BUNDLE.match(line)
        if m is None:
            continue
        bundles += 1
        for s in _SPILL.finditer(line):
            kind = _KIND.get((s["op"], s["space"]))
            if kind is None:  # e.g. a vst into SMEM: not a spill pattern we know
                continue
            rows.append({"program": program, "kind": kind, "bundle": _number(m["addr"]),
                         "instruction": s["lhs"], "slot": s["slot"], "region": None, "hlo": None,
                         "in_loop": None})
    if bundles == 0:
        warnings.append(f"`{file_name}`: no bundle lines")
    return rows
