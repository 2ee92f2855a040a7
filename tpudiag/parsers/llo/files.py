"""Find the files of an LLO dump directory and say what each one is.

libtpu names jf dump files `<ns-timestamp>-<LLO program>-<NN>-<pass label>.txt` (one timestamp
per program and compile), plus `<ts>-TLP-hlo.txt` without an index, `<ts>-TLP-NN-vmem_report.html`
and, under `--xla_jf_dump_static_llo_profile_to`, `<hlo>_static_llo_profile.textproto`. Program
names contain dashes and dots (`all-reduce`, `fusion.7`, `<late-initialization>`), so the program
is everything between the timestamp and the last `-NN-`.
"""

from __future__ import annotations

import re
from pathlib import Path

from tpudiag.model.llo import DumpFile

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
        data = path.read_bytes()
    except OSError as exc:
        warnings.append(f"`{path.name}`: cannot read ({exc.strerror or exc})")
        return None
    text = data.decode("utf-8", errors="replace")
    if "\ufffd" in text:
        warnings.append(f"`{path.name}`: not UTF-8 text; undecodable bytes replaced")
    return text
