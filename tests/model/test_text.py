"""Trace text made safe (`model.text`): a literal table of what each unsafe character becomes (its
code point as a Python escape, `\\xNN` below 0x100, `\\uNNNN` above), and safe path components."""

from __future__ import annotations

import pytest

from tpudiag.model.text import has_unsafe, one_line, path_component, printable, short_kernel_name, short_names


@pytest.mark.parametrize(("raw", "shown"), [
    ("fusion.1", "fusion.1"),
    ("\x1b[2J", "\\x1b[2J"),          # ESC: a cleared screen
    ("a\x00b", "a\\x00b"),            # NUL
    ("tab\there", "tab\\x09here"),
    ("new\nline", "new\\x0aline"),
    ("del\x7f", "del\\x7f"),
    ("c1\x9b", "c1\\x9b"),            # CSI as one C1 character
    ("\x9f\xa0", "\\x9f\xa0"),        # the last C1 control, then a no-break space (printable)
    ("\u202eevil", "\\u202eevil"),    # right-to-left override
    ("\u2066x\u2069", "\\u2066x\\u2069"),
    ("\u061c\u200e\u200f", "\\u061c\\u200e\\u200f"),
    ("\u2028\u2029", "\\u2028\\u2029"),
    ("\ufeffbom", "\\ufeffbom"),
    ("\ud800", "\\ud800"),            # a lone surrogate
    ("é ü 中", "é ü 中"),
])
def test_printable_escapes_each_unsafe_character(raw, shown):
    assert printable(raw) == shown
    assert has_unsafe(raw) == (raw != shown)
    assert printable(printable(raw)) == printable(raw)  # idempotent


def test_newlines_kept_when_asked_and_other_controls_still_escaped():
    assert printable("a\nb\x1b\tc\rd", keep_newlines=True) == "a\nb\\x1b\\x09c\\x0dd"
    assert printable(12) == "12"


def test_one_line_joins_whitespace_then_escapes():
    assert one_line("  a \n\t b\x1bc  ") == "a b\\x1bc"


@pytest.mark.parametrize(("raw", "component"), [
    ("fusion.1", "fusion.1"), ("../../etc/passwd", "etc_passwd"), ("..", "op"), (".hidden", "hidden"),
    ("a b/c", "a_b_c"), ("", "op"), ("__x__", "x"), ("a\x1bb", "a_b"), ("ok-name_1", "ok-name_1")])
def test_path_component(raw, component):
    assert path_component(raw) == component


def test_path_component_is_bounded():
    assert path_component("x" * 100) == "x" * 80
    assert path_component("x" * 100, max_len=5) == "xxxxx"


def test_short_names_tell_apart_names_that_shorten_alike():
    a = "void ns::Kernel<" + "int, " * 20 + "float>(int)"
    b = "void ns::Kernel<" + "float, " * 20 + "int>(int)"
    assert short_names([a, "fusion.1", b, a], limit=30) == ["ns::Kernel<…>(…)", "fusion.1", "ns::Kernel<…>(…) [2]",
                                                            "ns::Kernel<…>(…) [3]"]


@pytest.mark.parametrize(("name", "limit", "short"), [
    ("k<int>", 6, "k<int>"),                          # exactly the limit: as it is
    ("void ab<x>(y)", 8, "ab<…>(…)"),                 # shortened to exactly the limit: not cut
    ("abcdefgh<int>", 10, "abcdefgh<…"),              # no `void ` to drop; cut with an ellipsis
    ("void XlaKernel<Xy>(float)", 15, "XlaKernel<…>(…)"),
])
def test_short_kernel_name_edges(name, limit, short):
    assert short_kernel_name(name, limit) == short


def test_short_names_use_their_limit_and_path_components_keep_case():
    assert short_names(["void k<" + "a" * 35 + ">(int)"], limit=30) == ["k<…>(…)"]
    assert path_component("Fusion.1") == "Fusion.1" and path_component("Xla_X") == "Xla_X"
