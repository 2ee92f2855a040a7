"""Trace-derived text made safe to print. Every renderer passes input-derived strings through here.

A trace is untrusted: an op, host, module or file name can hold terminal control sequences
(ESC/CSI/OSC: a window-title change, a hyperlink, a cleared screen), C1 controls, bidi overrides
that reorder what the reader sees, or lone surrogates that make the write itself fail. `printable`
shows each of them as a visible escape (`\\x1b`, `\\u202e`), so the text stays readable and inert
in a terminal, in markdown and in `error:` lines alike, with or without colour. The function is
idempotent: its output contains nothing it would escape again.

Markup-specific escaping (rich markup for the TUI, markdown for reports) sits on top of this in
`tpudiag.render.console` and `tpudiag.render.markdown`; JSON escapes by itself.
"""

from __future__ import annotations

import re

# C0 controls, DEL, C1 controls, bidi embeddings/overrides/isolates and marks, line/paragraph
# separators, the BOM, and lone surrogates (from undecodable bytes) that no encoder can write.
_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069\ufeff"
                     "\ud800-\udfff]")
_UNSAFE_KEEP_NEWLINES = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e"
                                   "\u2066-\u2069\ufeff\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    c = ord(match.group(0))
    return f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}"


def printable(value: object, keep_newlines: bool = False) -> str:
    """`value` as text with every control, bidi and unencodable character shown as an escape."""
    pattern = _UNSAFE_KEEP_NEWLINES if keep_newlines else _UNSAFE
    return pattern.sub(_escape, str(value))


def one_line(value: object) -> str:
    """`value` on one line: runs of whitespace (newlines included) become one space, then `printable`."""
    return printable(" ".join(str(value).split()))


def has_unsafe(value: str) -> bool:
    """Whether `value` holds a character `printable` would escape (for tests and assertions)."""
    return _UNSAFE.search(value) is not None


def path_component(value: object, max_len: int = 80) -> str:
    """A name made into one safe path component: letters, digits, `.`, `-` and `_` only, never `.` or `..`.

    For directory names derived from trace text (`lab-<op>`): no separator, no traversal, no hidden
    file, no control character, bounded length.
    """
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", str(value)).strip("._") or "op"
    return s[:max_len]


def short_kernel_name(name: str, limit: int = 60) -> str:
    """A long C++ kernel name (a GPU kernel's demangled signature) as a table cell can hold it:
    `void ns::Kernel<T, U>(int, float*)` -> `ns::Kernel<…>(…)`. The return type goes, every top-level
    template argument list and the parameter list become `…`, and what is still longer than `limit`
    is cut with `…`. Names up to `limit` characters are returned as they are."""
    if len(name) <= limit:
        return name
    text = name[5:] if name.startswith("void ") else name
    out, depth = [], 0
    for ch in text:
        if ch in "<(":
            if depth == 0:
                out.append(ch + "…")
            depth += 1
        elif ch in ">)" and depth:
            depth -= 1
            if depth == 0:
                out.append(ch)
        elif depth == 0:
            out.append(ch)
    short = "".join(out).strip()
    return short if len(short) <= limit else short[:limit - 1] + "…"


def short_names(names: list[str], limit: int = 60) -> list[str]:
    """`short_kernel_name` of each, told apart where two long names shorten alike (` [2]`, ` [3]`, in
    order), so that a table never shows two rows under one name."""
    out, seen = [], {}
    for name in names:
        short = short_kernel_name(name, limit)
        if short != name:
            seen[short] = seen.get(short, 0) + 1
            if seen[short] > 1:
                short = f"{short} [{seen[short]}]"
        out.append(short)
    return out
