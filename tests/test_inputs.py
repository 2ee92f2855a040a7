"""The inputs stage (`tpudiag.inputs.read_inputs`): every input file is read once, the modelled
timeline of static mode stays in memory, and what was read is one frozen value.

Regression: static mode read its dump directory twice (the compiled inputs, then the modelled
program), parsed `compiled.hlo.txt` again for the memory view, and wrote its modelled capture to a
temporary directory only to parse it back.
"""

from __future__ import annotations

import collections
import dataclasses
import sys
import tempfile
from pathlib import Path

import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.inputs import Inputs, read_inputs
from tpudiag.model.hardware import ChipSource
from tpudiag.model.report import Mode

MODELS = REPO / "examples" / "models"
COMPILE_V5E = MODELS / "dumps" / "transformer_train_v5e"  # a `tpudiag compile` output: xla/, llo/, static_profile/
CAPTURE_V5E = MODELS / "captures" / "transformer_train_v5e"

# Files opened while `_OPENED` is recording. An audit hook cannot be removed, so one is installed
# for the session and records only inside `_opens`.
_OPENED: list[collections.Counter] = []


def _audit(event: str, args: tuple) -> None:
    if _OPENED and event == "open" and isinstance(args[0], (str, Path)):
        _OPENED[-1][str(Path(args[0]).resolve())] += 1


sys.addaudithook(_audit)


def _opens(call) -> collections.Counter:
    _OPENED.append(collections.Counter())
    try:
        call()
    finally:
        opened = _OPENED.pop()
    return opened


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no developer config leaks in


@pytest.mark.parametrize("path", [COMPILE_V5E, COMPILE_V5E / "xla"], ids=["compile output", "xla dump"])
def test_static_mode_reads_each_dump_file_once(path):
    opened = _opens(lambda: tpudiag.diagnose(path))
    under = {f: n for f, n in opened.items() if f.startswith(str(path.resolve()))}
    assert len(under) >= 4  # near miss: the dump's files were read at all (HLO, buffers, target, ...)
    assert {f: n for f, n in under.items() if n > 1} == {}


def test_static_mode_models_its_timeline_in_memory(monkeypatch):
    def no_temporary(*args, **kwargs):
        raise AssertionError("static mode wrote a temporary file")

    monkeypatch.setattr(tempfile, "mkdtemp", no_temporary)
    monkeypatch.setattr(tempfile, "mkstemp", no_temporary)
    made = []
    opened = _opens(lambda: made.append(tpudiag.diagnose(COMPILE_V5E)))
    (d,) = made  # the diagnosis whose reads were counted: no second one to make
    assert not any(f.endswith(".xplane.pb") for f in opened)
    assert d.mode is Mode.STATIC and d.analysis is not None and d.analysis.profile.modelled
    host = d.analysis.profile.hosts[0]
    assert host.path == str(COMPILE_V5E) and host.source == ""  # no file to re-read, none named
    assert len(d.report.ops) > 0


def test_a_capture_and_its_dumps_are_read_once_and_its_programs_parsed_once(monkeypatch):
    from tpudiag.parsers import hlo_proto

    parsed = collections.Counter()
    parse = hlo_proto.parse_hlo_proto

    def counting(data, path="<proto>", program_id=None):
        parsed[program_id] += 1
        return parse(data, path, program_id)

    monkeypatch.setattr(hlo_proto, "parse_hlo_proto", counting)
    opened = _opens(lambda: tpudiag.diagnose(CAPTURE_V5E, dumps=[COMPILE_V5E / "xla"]))
    inputs = [f for f in opened if f.startswith((str(CAPTURE_V5E.resolve()), str(COMPILE_V5E.resolve())))]
    assert any(f.endswith(".xplane.pb") for f in inputs) and len(inputs) > 1
    assert {f: opened[f] for f in inputs if opened[f] > 1} == {}
    assert parsed and set(parsed.values()) == {1}  # each embedded program once, not again by the rules


def test_inputs_is_one_frozen_value_with_the_chip_and_its_source():
    from tpudiag.model.hardware import chip_for

    static = read_inputs(COMPILE_V5E / "xla", chip=chip_for("v6e"))
    assert static.mode is Mode.STATIC and static.capture is None and static.program is not None
    assert (static.chip.source, static.chip.spec.generation) == (ChipSource.DUMP, "v5e")
    assert static.compiled.chip is static.chip.spec
    assert "--chip v6e ignored: the dump was compiled for v5e" in static.program.warnings
    with pytest.raises(dataclasses.FrozenInstanceError):
        static.mode = Mode.TRACE  # type: ignore[misc]
    trace = tpudiag.diagnose(CAPTURE_V5E).inputs
    assert isinstance(trace, Inputs) and trace.mode is Mode.TRACE and trace.program is None
    assert trace.capture is not None and trace.chip.source is ChipSource.TRACE
    assert trace.compiled.embedded  # the capture's own programs, parsed while reading


@pytest.mark.parametrize("target", [True, False], ids=["timeline", "no timeline"])
def test_a_damaged_module_file_skipped_in_a_dump_is_warned_with_or_without_a_timeline(tmp_path, target):
    import shutil

    dump = tmp_path / "xla"
    shutil.copytree(COMPILE_V5E / "xla", dump)
    (dump / "module_9999.broken.after_optimizations.txt").write_text("HloModule broken\n\nENTRY %x { garbage")
    if not target:  # the generation is unknown: no timeline can be modelled
        for f in dump.glob("*target_arguments.txt"):
            f.unlink()
    d = tpudiag.diagnose(dump)
    assert (d.analysis is not None) is target
    assert any(w.startswith("skipped `") and "module_9999.broken" in w for w in d.report.warnings)
