"""Damaged values inside well-formed files: each is validated where it is parsed.

A bad value drops the event (or the value) with a warning, or fails its host with a one-line
reason; never a traceback, never a nonsense number in the report (issue 13).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, small_design
from tpudiag.errors import InputError
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.device_trace import MAX_EVENT_PS
from tpudiag.parsers.hlo_text import load_hlo_dump, parse_hlo_text
from tpudiag.parsers.layout import MAX_TUPLE_DEPTH, ShapeSyntaxError, parse_shape
from tpudiag.parsers.llo.load import load_llo_dump
from tpudiag.writers.tpu_design import build_capture

HLO_FIXTURE = REPO / "tests" / "fixtures" / "dumps" / "v5e_mlp_train"
LLO_FIXTURE = REPO / "tests" / "fixtures" / "llo" / "v5e_mlp"
SUPERSCRIPT_TWO = "\u00b2"  # `²`: str.isdigit() says yes, int() says no


def write_mutated(run: Path, mutate, **design) -> Path:
    """Write the small design's capture after `mutate(space_proto)` damaged it."""
    space = build_capture(small_design(**{"n_steps": 3, **design}))
    mutate(space.proto)
    run.mkdir(parents=True, exist_ok=True)
    path = run / f"{design.get('hostname', 'host0')}.xplane.pb"
    path.write_bytes(space.proto.SerializeToString())
    return path


def stat_id(plane, name: str) -> int:
    return next(k for k, md in plane.stat_metadata.items() if md.name == name)


def line(plane, name: str):
    return next(ln for ln in plane.lines if ln.name == name)


# -- values in traces ---------------------------------------------------------------------------

def test_superscript_program_id_is_dropped_with_a_warning(tmp_path):
    def mutate(space):
        plane = space.planes[0]
        pid = stat_id(plane, "program_id")
        for md in plane.event_metadata.values():
            for st in md.stats:
                if st.metadata_id == pid:
                    st.str_value = SUPERSCRIPT_TWO
    write_mutated(tmp_path / "run", mutate)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    assert any("ids that are not unsigned 64-bit integers (program_id)" in w for w in host.warnings), host.warnings
    assert len(host.events) > 0  # the events stay; only the bad value is ignored


def test_superscript_step_name_without_group_id_numbers_by_position(tmp_path):
    def mutate(space):
        plane = space.planes[0]
        gid = stat_id(plane, "group_id")
        steps = line(plane, "Steps")
        for ev in steps.events:
            kept = [st for st in ev.stats if st.metadata_id != gid]
            del ev.stats[:]
            ev.stats.extend(kept)
            plane.event_metadata[ev.metadata_id].name = "1" + SUPERSCRIPT_TWO
    write_mutated(tmp_path / "run", mutate)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    marks = host.step_markers[host.step_markers["device"] == "/device:TPU:0"]
    assert marks["step"].tolist() == [0, 1, 2]


def test_negative_and_huge_step_durations_are_dropped(tmp_path):
    def mutate(space):
        for plane in space.planes:
            if plane.name.startswith("/device:TPU:"):
                steps = line(plane, "Steps")
                steps.events[0].duration_ps = -5
                steps.events[1].duration_ps = 1 << 62
    write_mutated(tmp_path / "run", mutate)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    assert (host.step_markers["dur_ps"] > 0).all()
    assert (host.step_markers["dur_ps"] <= MAX_EVENT_PS).all()
    assert len(host.step_markers) == 2  # one good step on each of the 2 chips
    assert any("2 step markers dropped" in w for w in host.warnings), host.warnings


def _cli(capsys, *args) -> tuple[int, str, str]:
    from tpudiag.cli.app import main

    with pytest.raises(SystemExit) as exc:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


@pytest.mark.parametrize("values", [(-5,), (-5,) * 5, (1 << 62,), (-5, 1 << 62), (0,)],
                         ids=["one-negative", "all-negative", "2^62", "both", "zero"])
def test_damaged_step_durations_through_report_and_check(capsys, tmp_path, values):
    """Was: "step time mean -5 ps", and a 2^62 ps step raising a high finding that failed `check`;
    a 0 ps step (found by Hypothesis) made device-idle divide by zero.
    Now the damaged markers are dropped with a warning, and report and check say what they say for
    the undamaged capture."""
    def mutate(space):
        for plane in space.planes:
            if plane.name.startswith("/device:TPU:"):
                for ev, value in zip(line(plane, "Steps").events, values):
                    ev.duration_ps = value
    write_mutated(tmp_path / "bad" / "plugins" / "profile" / "run", mutate, n_steps=5)
    write_mutated(tmp_path / "clean" / "plugins" / "profile" / "run", lambda space: None, n_steps=5)
    reports = {}
    for name in ("bad", "clean"):
        code, out, err = _cli(capsys, "report", tmp_path / name, "-f", "json")
        assert code == 0 and "Traceback" not in err, err
        reports[name] = json.loads(out)
    step = reports["bad"]["summary"]["step_time"]
    assert step is not None and 0 < step["min_ps"] and step["max_ps"] <= MAX_EVENT_PS
    assert step["mean_ps"] == pytest.approx(reports["clean"]["summary"]["step_time"]["mean_ps"], rel=0.5)
    assert any("step markers dropped" in w for w in reports["bad"]["warnings"])

    def severe(doc):
        return sorted((f["rule"], f["severity"]) for f in doc["findings"] if f["severity"] in ("high", "medium"))
    assert severe(reports["bad"]) == severe(reports["clean"])
    codes = {}
    for name in ("bad", "clean"):
        codes[name], out, err = _cli(capsys, "check", tmp_path / name)
        assert "Traceback" not in err, err
    assert codes["bad"] == codes["clean"]
    code, out, err = _cli(capsys, "report", tmp_path / "bad")  # the terminal report: no negative step time
    [steps_line] = [ln for ln in out.splitlines() if ln.startswith("Steps:")]
    assert code == 0 and "step time mean" in steps_line and not re.search("[-\u2212]\\d", steps_line), steps_line


def test_negative_and_huge_op_durations_are_dropped_near_miss_kept(tmp_path):
    def mutate(space):
        plane = space.planes[0]
        dur = stat_id(plane, "device_duration_ps")
        ops = line(plane, "XLA Ops")
        for ev, value in zip(ops.events, (-5, 1 << 62, MAX_EVENT_PS)):  # the last is the near miss
            st = next(s for s in ev.stats if s.metadata_id == dur)
            st.int64_value = value
    write_mutated(tmp_path / "run", mutate)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    chip0 = host.events[host.events["device"] == "/device:TPU:0"]
    chip1 = host.events[host.events["device"] == "/device:TPU:1"]
    assert len(chip0) == len(chip1) - 2
    assert chip0["dur_ps"].min() >= 0 and chip0["dur_ps"].max() == MAX_EVENT_PS
    assert any("2 events on a `XLA Ops` line dropped" in w for w in host.warnings), host.warnings


@pytest.mark.parametrize("peak", [float("nan"), float("inf"), -918.0, 1e12])
def test_implausible_trace_peaks_fall_back_to_the_hardware_table(tmp_path, peak):
    write_mutated(tmp_path / "run", lambda space: None, peak_tflops=peak)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    assert host.device.peaks_source == "hardware table"
    assert host.device.peak_flops_per_s is not None and 0 < host.device.peak_flops_per_s < 1e16
    assert any("implausible peak" in w for w in host.warnings)


def test_plausible_trace_peaks_are_used(tmp_path):
    write_mutated(tmp_path / "run", lambda space: None, peak_tflops=918.0)
    host = load_capture(tmp_path / "run", jobs=1).hosts[0]
    assert host.device.peaks_source == "trace" and host.device.peak_flops_per_s == 918e12
    assert not any("implausible peak" in w for w in host.warnings)


def test_timestamp_beyond_int64_drops_only_its_event(tmp_path):
    def mutate(space):
        plane = space.planes[0]
        off = stat_id(plane, "device_offset_ps")
        st = next(s for s in line(plane, "XLA Ops").events[0].stats if s.metadata_id == off)
        st.uint64_value = (1 << 64) - 1
    write_mutated(tmp_path / "run", mutate, hostname="bad")
    write_mutated(tmp_path / "run", lambda space: None, hostname="good")
    profile = load_capture(tmp_path / "run", jobs=1)
    bad, good = profile.hosts
    assert (bad.host, good.host) == ("bad", "good") and not profile.failures
    assert len(bad.events) == len(good.events) - 1
    assert any("1 events on a `XLA Ops` line dropped" in w and "int64" in w for w in bad.warnings)


# -- recursion and overflow in compiler dumps ----------------------------------------------------

def test_deep_tuple_shape_is_a_shape_error_near_miss_parses():
    deep = "(" * 5000 + "f32[2]{0}" + ")" * 5000
    with pytest.raises(ShapeSyntaxError, match="nested over"):
        parse_shape(deep)
    ok = "(" * MAX_TUPLE_DEPTH + "f32[2]{0}" + ")" * MAX_TUPLE_DEPTH
    assert parse_shape(ok) is not None


@pytest.mark.parametrize("dims", ["9" * 20, f"1{SUPERSCRIPT_TWO}"])
def test_absurd_or_unicode_dims_are_shape_errors(dims):
    with pytest.raises(ShapeSyntaxError):
        parse_shape(f"f32[{dims},128]{{1,0}}")


def _hlo_dump_with(tmp_path: Path, old: str, new: str, count: int = 3) -> Path:
    dump = tmp_path / "xla"
    shutil.copytree(HLO_FIXTURE, dump)
    for f in dump.glob("*after_optimizations.txt"):
        text = f.read_text()
        assert old in text
        f.write_text(text.replace(old, new, count))
    return dump


@pytest.mark.parametrize("bad", ["(" * 5000 + "f32[2]{0}" + ")" * 5000, "bf16[" + "9" * 20 + ",1024]{1,0}"])
def test_hlo_dump_with_deep_or_huge_shapes_skips_the_instruction_with_a_warning(tmp_path, bad):
    dump = load_hlo_dump(_hlo_dump_with(tmp_path, "bf16[128,1024]{1,0:T(8,128)(2,1)}", bad))
    [program] = dump.programs
    assert any("instruction skipped" in w for w in program.warnings), program.warnings


def test_hlo_recursion_anywhere_is_an_input_error(monkeypatch):
    from tpudiag.parsers import hlo_text

    def boom(program):
        raise RecursionError("maximum recursion depth exceeded")
    monkeypatch.setattr(hlo_text, "finish_program", boom)
    text = (HLO_FIXTURE / next(p.name for p in HLO_FIXTURE.glob("*after_optimizations.txt"))).read_text()
    with pytest.raises(InputError, match="nesting too deep"):
        parse_hlo_text(text, "m.txt")


def test_llo_dump_with_20_digit_numbers_is_a_clean_error(tmp_path):
    dump = tmp_path / "llo"
    shutil.copytree(LLO_FIXTURE, dump)
    for f in dump.rglob("*"):
        if f.is_file():
            f.write_text(re.sub(r"(?<![\w.])(\d{2,})(?![\w.])", "9" * 20, f.read_text(errors="replace")))
    with pytest.raises(InputError, match="beyond int64"):
        load_llo_dump(dump)


def test_hlo_proto_with_absurd_dims_is_parsed_with_the_shape_set_aside():
    from tpudiag.parsers.hlo_proto import parse_hlo_proto
    from tpudiag.proto import HloModuleProto

    module = HloModuleProto()
    module.ParseFromString((HLO_FIXTURE / "module.pb").read_bytes())
    inst = next(i for c in module.computations for i in c.instructions if len(i.shape.dimensions) >= 2)
    inst.shape.dimensions[0] = (1 << 62)  # 2^62 rows: past any memory, past int64 bytes
    try:
        program = parse_hlo_proto(module.SerializeToString(), "m.pb")
    except InputError as exc:
        assert "m.pb" in exc.one_line()
        return
    assert program.instructions


@pytest.mark.parametrize("bad", ["(" * 5000 + "f32[2]{0}" + ")" * 5000, "bf16[" + "9" * 20 + ",1024]{1,0}"],
                         ids=["5000-deep-tuple", "20-digit-dim"])
def test_damaged_hlo_dumps_through_the_cli(capsys, small_capture, tmp_path, bad):
    """Was RecursionError / OverflowError tracebacks. Now the instruction is skipped with a warning,
    whether the dump joins a capture (`--dumps`) or stands alone (the static report, `check`)."""
    dump = _hlo_dump_with(tmp_path, "bf16[128,1024]{1,0:T(8,128)(2,1)}", bad)
    for args in (["report", small_capture, "--dumps", dump, "-f", "json"], ["report", dump, "-f", "json"]):
        code, out, err = _cli(capsys, *args)
        assert code == 0 and "Traceback" not in err, err
        assert any("instruction skipped" in w for w in json.loads(out)["warnings"]), args
    code, out, err = _cli(capsys, "check", dump, "-f", "json")
    assert code in (0, 1) and any("instruction skipped" in w for w in json.loads(out)["warnings"])


def test_llo_dump_with_20_digit_numbers_through_the_cli_names_the_cause(capsys, small_capture, tmp_path):
    dump = tmp_path / "llo"
    shutil.copytree(LLO_FIXTURE, dump)
    for f in dump.rglob("*"):
        if f.is_file():
            f.write_text(re.sub(r"(?<![\w.])(\d{2,})(?![\w.])", "9" * 20, f.read_text(errors="replace")))
    for args in (["report", small_capture, "--dumps", dump], ["report", dump]):
        code, out, err = _cli(capsys, *args)
        assert code == 2 and "Traceback" not in err, err
        first = err.splitlines()[0]
        assert first.startswith(f"error: `{dump}`") and "beyond int64" in first, first
