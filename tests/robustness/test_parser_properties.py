"""Property tests: whatever the bytes or text, a parser gives a valid result or a `TpudiagError`.

Mutations follow the proto schema (stat values of every type, event times, plane and line names,
compressed values) on captures built with the project's writers, so most examples are nearly
valid and reach deep into the parsers and the analysis, not just the protobuf decoder (which
`tests/parsers/test_xspace_bad_input.py` covers with random, truncated and flipped bytes).
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import REPO, bounded_examples, small_design
from tests.rules.scenarios import run_rules
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.report_builder import build_report
from tpudiag.errors import TpudiagError
from tpudiag.parsers import capture
from tpudiag.parsers.device_trace import MAX_EVENT_PS
from tpudiag.parsers.hlo_text import parse_hlo_text
from tpudiag.parsers.layout import ShapeSyntaxError, parse_shape
from tpudiag.parsers.llo.bundle_profile import parse_bundle_profile
from tpudiag.parsers.llo.register_pressure import parse_register_pressure
from tpudiag.parsers.llo.schedule import parse_schedule
from tpudiag.parsers.llo.spills import parse_final_bundles, parse_post_ra
from tpudiag.parsers.llo.static_profile import parse_static_profile
from tpudiag.parsers.llo.utilization import parse_utilization
from tpudiag.parsers.llo.vmem_report import parse_vmem_report
from tpudiag.render.json_format import render_json
from tpudiag.writers.tpu_design import build_capture

SETTINGS = settings(max_examples=bounded_examples(60, 20), deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
GOOD = build_capture(small_design(n_steps=2)).proto.SerializeToString()
HLO_TEXT = next((REPO / "tests" / "fixtures" / "dumps" / "v5e_mlp_train").glob("*after_optimizations.txt")).read_text()
LLO_DIR = REPO / "tests" / "fixtures" / "llo" / "v5e_pallas_r64"

# Values a damaged or hostile producer might write, chosen to hit every decoding branch.
NASTY_INTS = st.sampled_from([0, -1, -5, 1, (1 << 62), (1 << 63) - 1, -(1 << 63)])
NASTY_UINTS = st.sampled_from([0, 1, (1 << 62), (1 << 63), (1 << 64) - 1])
NASTY_FLOATS = st.sampled_from([0.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e300, 918.0])
NASTY_STRS = st.sampled_from(["", "\u00b2", "12", " 7 ", "-3", "9" * 25, "\x1b]0;x\x07", "nan", "(" * 200])
GZIP_VALUES = st.sampled_from([b"", b"\x1f\x8b", gzip.compress(b"fine"), gzip.compress(b"fine")[:-4],
                               b"garbage"])


READ_BY_NAME = ("program_id", "symbol_id", "flops", "model_flops", "bytes_accessed", "group_id",
                "device_offset_ps", "device_duration_ps", "peak_teraflops_per_second",
                "peak_hbm_bw_gigabytes_per_second", "hlo_category", "hlo_op", "core_details",
                "memory_access_breakdown", "device_type_string")


@st.composite
def stat_values(draw):
    kind = draw(st.sampled_from(["int64_value", "uint64_value", "double_value", "str_value", "bytes_value",
                                 "ref_value", "compressed_str_value"]))
    value = {"int64_value": NASTY_INTS, "uint64_value": NASTY_UINTS, "double_value": NASTY_FLOATS,
             "str_value": NASTY_STRS, "bytes_value": st.binary(max_size=16),
             "ref_value": NASTY_UINTS, "compressed_str_value": GZIP_VALUES}[kind]
    return kind, draw(value)


def _stat_groups(space):
    """The capture's XStats by where they live; mutations pick a group first, so the few plane
    and metadata stats (ids, peaks, names) are hit as often as the many event stats."""
    groups = {"plane": [], "metadata": [], "event": []}
    for plane in space.planes:
        groups["plane"] += list(plane.stats)
        for md in plane.event_metadata.values():
            groups["metadata"] += list(md.stats)
        for line in plane.lines:
            for ev in line.events:
                groups["event"] += list(ev.stats)
    return {k: v for k, v in groups.items() if v}


@st.composite
def mutated_captures(draw):
    """A valid small capture with a few schema-aware mutations applied."""
    from tpudiag.proto import XSpace

    space = XSpace()
    space.ParseFromString(GOOD)
    stats = _stat_groups(space)
    events = [ev for p in space.planes for ln in p.lines for ev in ln.events]
    for _ in range(draw(st.integers(1, 6))):
        what = draw(st.sampled_from(["stat", "stat", "named_stat", "named_stat", "event", "plane_name", "line_name",
                                     "drop_events", "metadata_name", "timestamp"]))
        if what == "stat":
            group = stats[draw(st.sampled_from(sorted(stats)))]
            target = group[draw(st.integers(0, len(group) - 1))]
            kind, value = draw(stat_values())
            setattr(target, kind, value)
        elif what == "named_stat":  # a stat the parser reads by name: ids, costs, peaks, steps
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            names = {md.name: k for k, md in plane.stat_metadata.items()}
            wanted = [names[n] for n in READ_BY_NAME if n in names]
            pool = [x for md in plane.event_metadata.values() for x in md.stats if x.metadata_id in wanted]
            pool += [x for x in plane.stats if x.metadata_id in wanted]
            pool += [x for ln in plane.lines for ev in ln.events[:3] for x in ev.stats if x.metadata_id in wanted]
            if pool:
                kind, value = draw(stat_values())
                setattr(pool[draw(st.integers(0, len(pool) - 1))], kind, value)
        elif what == "event" and events:
            ev = events[draw(st.integers(0, len(events) - 1))]
            setattr(ev, draw(st.sampled_from(["offset_ps", "duration_ps"])), draw(NASTY_INTS))
        elif what == "plane_name":
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            plane.name = draw(st.sampled_from(["/device:TPU:0", "/device:TPU:99999999999999999999",
                                               "/device:TPU:0 SparseCore 1", "/device:GPU:0", "/host:CPU", ""]))
        elif what == "line_name":
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            if plane.lines:
                plane.lines[draw(st.integers(0, len(plane.lines) - 1))].name = draw(
                    st.sampled_from(["Steps", "XLA Ops", "XLA Modules", "Async XLA Ops", "?"]))
        elif what == "drop_events":
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            for line in plane.lines:
                del line.events[draw(st.integers(0, len(line.events))):]
            events = [ev for p in space.planes for ln in p.lines for ev in ln.events]
        elif what == "metadata_name":
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            if plane.event_metadata:
                key = draw(st.sampled_from(sorted(plane.event_metadata)))
                plane.event_metadata[key].name = draw(NASTY_STRS)
        elif what == "timestamp":
            plane = space.planes[draw(st.integers(0, len(space.planes) - 1))]
            if plane.lines:
                plane.lines[draw(st.integers(0, len(plane.lines) - 1))].timestamp_ns = draw(NASTY_INTS)
    return space.SerializeToString()


def _full_pipeline(run: Path) -> None:
    """Parse, analyse, run every rule and render: each stage must accept what the previous gave."""
    from tpudiag.parsers.capture import load_capture

    profile = load_capture(run, jobs=1)
    for host in profile.hosts:  # what was kept is plausible: no negative or absurd times
        assert host.events["dur_ps"].between(0, MAX_EVENT_PS).all()
        assert host.step_markers["dur_ps"].between(0, MAX_EVENT_PS).all()
        assert (host.async_windows["end_ps"] >= host.async_windows["start_ps"]).all()
    analysis = analyze(profile)
    findings, skipped = run_rules(analysis)
    render_json(build_report(analysis, tuple(findings), rules_skipped=tuple(skipped)))


@SETTINGS
@given(mutated_captures())
def test_mutated_capture_is_analysed_or_a_clean_error(tmp_path_factory, data):
    run = tmp_path_factory.mktemp("run")
    (run / "host0.xplane.pb").write_bytes(data)
    try:
        _full_pipeline(run)
    except TpudiagError:
        pass


@SETTINGS
@given(mutated_captures())
def test_mutated_host_never_hides_a_good_host(tmp_path_factory, data):
    run = tmp_path_factory.mktemp("run")
    (run / "bad.xplane.pb").write_bytes(data)
    (run / "good.xplane.pb").write_bytes(build_capture(small_design(hostname="good", n_steps=2)).proto
                                         .SerializeToString())
    try:
        profile = capture.load_capture(run, jobs=1)
    except TpudiagError as exc:
        pytest.fail(f"the good host was lost: {exc.one_line()}")
    # The mutant may keep the hostname `host0` or be renamed; the good host is always there.
    assert any(h.host.startswith("good") for h in profile.hosts)
    for failure in profile.failures:
        assert "bad.xplane.pb" in failure.message and "\n" not in failure.message


@settings(max_examples=100, deadline=None)
@given(st.integers(min_value=1, max_value=len(GOOD) - 1))
def test_truncated_capture_through_the_whole_pipeline(tmp_path_factory, cut):
    run = tmp_path_factory.mktemp("run")
    (run / "host0.xplane.pb").write_bytes(GOOD[:cut])
    try:
        _full_pipeline(run)
    except TpudiagError:
        pass


# -- HLO text -----------------------------------------------------------------------------------

HLO_LINES = HLO_TEXT.splitlines()
NASTY_FRAGMENTS = st.sampled_from(["(", ")", "{", "}", "[", "]", ",", "=", "\u00b2", "9" * 20, "-1", "\x00",
                                   "(" * 3000, "{" * 3000, "%", "ROOT ", "/*", "*/", '"', "\\", "\n"])


@st.composite
def mutated_hlo(draw):
    lines = list(HLO_LINES)
    for _ in range(draw(st.integers(1, 5))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["insert", "delete", "cut", "duplicate"]))
        text = lines[i]
        pos = draw(st.integers(0, len(text)))
        if op == "insert":
            lines[i] = text[:pos] + draw(NASTY_FRAGMENTS) + text[pos:]
        elif op == "delete":
            lines[i] = text[:pos] + text[pos + draw(st.integers(1, 20)):]
        elif op == "cut":
            lines = lines[: i + 1]
            lines[i] = text[:pos]
        else:
            lines.insert(i, text)
    return "\n".join(lines)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_hlo())
def test_mutated_hlo_text_parses_or_is_a_clean_error(text):
    try:
        program = parse_hlo_text(text, "mutant.txt")
    except TpudiagError:
        return
    assert all("\n" not in w for w in program.warnings)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet="()[]{},:TESf32bu8token0123456789<=*#- \u00b2", max_size=80))
def test_random_shape_text_is_a_shape_or_a_shape_error(text):
    try:
        parse_shape(text)
    except ShapeSyntaxError:
        pass


# -- LLO text -----------------------------------------------------------------------------------

def _llo_text(label: str) -> str:
    return next(LLO_DIR.glob(f"*-f.1-*-{label}.*")).read_text() if label != "vmem_report" else \
        next(LLO_DIR.glob("*-TLP-*-vmem_report.html")).read_text()


LLO_PARSERS = {
    "final_hlo-static-per-bundle-utilization": lambda t, w: parse_utilization(t, "f.1", "u.txt", w),
    "schedule-analysis_final_bundles": lambda t, w: parse_schedule(t, "f.1", "s.txt", w),
    "final_bundles": lambda t, w: parse_final_bundles(t, "f.1", "b.txt", w),
    "post-ra": lambda t, w: parse_post_ra(t, "f.1"),
    "vmem_report": lambda t, w: parse_vmem_report(t, "v.html", w),
}
LLO_TEXTS = {label: _llo_text(label) for label in LLO_PARSERS}
TLP_PROFILE = next(LLO_DIR.glob("*-TLP-*-hlo-static-bundle-profile.txt")).read_text()
STATIC_TEXT = next((LLO_DIR / "static").rglob("*.textproto")).read_text()
OTHER_PARSERS = {
    "bundle-profile": (TLP_PROFILE, lambda t, w: parse_bundle_profile(t, "TLP", "p.txt", w)),
    "static-profile": (STATIC_TEXT, lambda t, w: parse_static_profile(t, "s.textproto", w)),
    "register-pressure": (next((LLO_DIR.parent / "v5e_pallas_r512").glob("*-register-pressure.txt")).read_text(),
                          lambda t, w: parse_register_pressure(t, "f.1", "r.txt", w, 100)),
}


@st.composite
def mutated_text(draw, text: str):
    chars = list(text)
    for _ in range(draw(st.integers(1, 6))):
        pos = draw(st.integers(0, len(chars)))
        op = draw(st.sampled_from(["insert", "delete", "cut"]))
        if op == "insert":
            chars[pos:pos] = list(draw(NASTY_FRAGMENTS))
        elif op == "delete":
            del chars[pos:pos + draw(st.integers(1, 40))]
        else:
            del chars[pos:]
    return "".join(chars)


# Every LLO text parser with the real file it is mutated from: (base text, parser).
MUTATED_CASES = {**{label: (LLO_TEXTS[label], parser) for label, parser in LLO_PARSERS.items()}, **OTHER_PARSERS}


@pytest.mark.parametrize("name", sorted(MUTATED_CASES))
def test_mutated_llo_files_parse_or_warn(name):
    base, parser = MUTATED_CASES[name]
    assert base

    @settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(mutated_text(base))
    def check(text):
        try:
            parser(text, [])
        except TpudiagError:
            pass

    check()
