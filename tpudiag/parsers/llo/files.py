"""Find the files of an LLO dump directory and say what each one is.

libtpu names jf dump files `<ns-timestamp>-<LLO program>-<NN>-<pass label>.txt` (one timestamp
per program and compile), plus `<ts>-TLP-hlo.txt` without an index, `<ts>-TLP-NN-vmem_report.html`
and, under `--xla_jf_dump_static_llo_profile_to`, `<hlo>_static_llo_profile.textproto`. Program
names contain dashes and dots (`all-reduce`, `fusion.7`, `<late-initialization>`), so the program
is everything between the timestamp and the last `-NN-`.
"""

from __future__ import annotations

import bisect
import re
from pathlib import Path

from tpudiag.errors import InputError
from tpudiag.model.llo import DumpFile, LloCompile
from tpudiag.parsers.input_files import read_input_bytes

_INDEXED = re.compile(r"^(?P<ts>[0-9]+)-(?P<program>.+)-(?P<index>[0-9]{2,})-(?P<label>[^/]+?)\.(?:txt|html|csv)$")
_TLP_HLO = re.compile(r"^(?P<ts>[0-9]+)-(?P<program>.+)-hlo\.txt$")
STATIC_PROFILE_SUFFIX = "_static_llo_profile.textproto"

# Pass labels this package parses.
PARSED_LABELS = frozenset({
    "hlo-static-bundle-profile", "final_hlo-static-per-bundle-utilization",
    "schedule-analysis_final_bundles", "register-pressure", "final_bundles", "post-ra",
    "vmem_report",
})
# Labels that are known and deliberately not parsed: no warning for these.
KNOWN_UNPARSED_LABELS = frozenset({
    "hlo", "fingerprints", "all-fingerprints", "buffer-assignment", "post-grt",
    "pre-availability-transform", "post-availability-transform",
    "pre-finalize-registers-and-allocations", "post-scalar-select-transform",
    "pre-delay_hlo-static-per-bundle-utilization", "trace-markers", "post-code-generation",
    "heap_sizes", "critical-path", "original", "deduplication-map", "overlay-graph",
})
_KNOWN_UNPARSED_PREFIXES = ("schedule-analysis_", "packed-bundles", "memory-space-assignment-",
                            "pb-assembly", "compiler-metadata")


def classify(path: Path) -> DumpFile | None:
    """What a jf dump file name says, or None when the name is not one."""
    m = _INDEXED.match(path.name)
    if m is not None:
        return DumpFile(str(path), int(m["ts"]), m["program"], int(m["index"]), m["label"])
    m = _TLP_HLO.match(path.name)
    if m is not None:
        return DumpFile(str(path), int(m["ts"]), m["program"], -1, "hlo")
    return None


def is_known_label(label: str) -> bool:
    return (label in PARSED_LABELS or label in KNOWN_UNPARSED_LABELS
            or label.startswith(_KNOWN_UNPARSED_PREFIXES))


def read_text(path: Path, warnings: list[str]) -> str | None:
    """The file's text, or None with a warning when it cannot be read.

    Bytes that are not UTF-8 are replaced (the dumps are ASCII), with one warning, so a damaged
    file still yields whatever lines of it are intact.
    """
    try:
        data = read_input_bytes(path)
    except InputError as exc:  # a FIFO, a device, over the size cap, unreadable
        warnings.append(f"`{path.name}`: {exc.message}; skipped")
        return None
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        warnings.append(f"`{path.name}`: not UTF-8 text; undecodable bytes replaced")
    return text


TOP_LEVEL = "TLP"
_HLO_MODULE = re.compile(r"^HloModule ([^\s,]+)")
_VMEM_MODULE = re.compile(r'"module_name":\s*"([^"\\]*)"')


def group_compiles(files: list[DumpFile]) -> list[tuple[int, list[DumpFile]]]:
    """Split a directory's files by compile: [(TLP timestamp, files)], oldest first.

    libtpu stamps each LLO program when it is created; a compile creates its TLP first and its
    fusions after it (seen in every fixture), so a file belongs to the last TLP stamped at or
    before it. Files older than every TLP go with the first compile; without any TLP there is a
    single group with timestamp 0.
    """
    stamps = sorted({f.timestamp_ns for f in files if f.program == TOP_LEVEL})
    if not stamps:
        return [(0, list(files))]
    groups: list[list[DumpFile]] = [[] for _ in stamps]
    for f in files:
        groups[max(bisect.bisect_right(stamps, f.timestamp_ns) - 1, 0)].append(f)
    return list(zip(stamps, groups))


def module_name(files: list[DumpFile]) -> str:
    """The HLO module of a compile, from `TLP-hlo.txt`'s first line or the VMEM report; '' if neither."""
    for label, pattern, limit in (("hlo", _HLO_MODULE, 4096), ("vmem_report", _VMEM_MODULE, 1 << 16)):
        for f in files:
            if f.program == TOP_LEVEL and f.label == label:
                try:
                    head = read_input_bytes(f.path, limit=limit).decode("utf-8", errors="replace")
                except InputError:
                    continue  # the parser reports unreadable files
                m = pattern.search(head)
                if m is not None:
                    return m.group(1)
    return ""


def describe(stamp: int, files: list[DumpFile]) -> LloCompile:
    return LloCompile(stamp, module_name(files), len(files))
