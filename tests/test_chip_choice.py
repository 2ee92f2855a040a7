"""The chip is decided once (`model.hardware.decide_chip`), and every place that says where it came
from says the same: the static header, the warnings, the join and the rules.

Regression: `--chip v5e` on an LLO dump that names no chip said "inferred from the LLO dump" in the
header and "from --chip" in the warnings; a capture with a disagreeing `--chip` ignored it silently.
"""

from __future__ import annotations

import shutil

import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.cli.app import main
from tpudiag.model.hardware import CHIP_NAMES, CHIPS, ChipSource, chip_for, decide_chip

V5E, V6E = chip_for("v5e"), chip_for("v6e")
LLO_V5E = REPO / "tests" / "fixtures" / "llo" / "v5e_mlp"  # an LLO dump with TLP-hlo.txt, no target file
CAPTURE_V6E = REPO / "examples" / "models" / "captures" / "transformer_train_v6e"


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no developer config leaks in
    monkeypatch.setenv("NO_COLOR", "1")


@pytest.fixture
def unnamed_llo(tmp_path):
    """The v5e LLO dump without its VMEM report: MXUs per core alone fit v4, v5e and v5p, so no
    file names the chip."""
    dump = tmp_path / "llo"
    shutil.copytree(LLO_V5E, dump)
    for report in dump.glob("*vmem_report*"):
        report.unlink()
    return dump


def _header(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exited:
        main(["report", *args])
    assert exited.value.code == 0
    return capsys.readouterr().out.splitlines()[0]


def test_files_win_over_the_user_and_the_user_fills_in():
    assert decide_chip(trace=V6E, user=V5E, what="capture").spec is V6E
    assert decide_chip(trace=V6E, user=V5E, what="capture").warnings == ("--chip v5e ignored: the capture ran on v6e",)
    assert decide_chip(target="v5e", llo="v6e").source is ChipSource.DUMP  # the target file before the inference
    assert decide_chip(llo="v5e", user=V5E).source is ChipSource.LLO
    assert decide_chip(user=V5E).source is ChipSource.USER
    assert decide_chip(user=V5E, what="capture").warnings == ("TPU generation v5e from --chip: the capture does not name it",)
    # near miss: a user chip that agrees with the files is no warning, and nothing at all is no chip
    assert decide_chip(target="v5e", user=V5E).warnings == ()
    assert decide_chip() == decide_chip(user=None)
    assert decide_chip().spec is None and decide_chip().source is ChipSource.UNKNOWN


def test_chip_names_are_the_hardware_table():
    from tpudiag import arguments, pipeline
    from tpudiag.cli.options import Chip

    assert CHIP_NAMES == tuple(c.generation.lower() for c in CHIPS)
    assert arguments.CHIP_NAMES is CHIP_NAMES and pipeline.CHIP_NAMES is CHIP_NAMES
    assert tuple(c.value for c in Chip) == CHIP_NAMES


def test_an_llo_dump_names_its_chip_by_inference(capsys):
    d = tpudiag.diagnose(LLO_V5E)
    assert d.chip.spec is V5E and d.chip.source is ChipSource.LLO
    assert d.compiled.chip is V5E
    assert any("inferred from the LLO dump" in w for w in d.warnings)
    assert "for v5e (inferred from the LLO dump" in _header(capsys, str(LLO_V5E))


def test_a_chip_the_llo_dump_contradicts_is_ignored_and_said(capsys):
    d = tpudiag.diagnose(LLO_V5E, chip="v6e")
    assert d.chip.spec is V5E and d.chip.source is ChipSource.LLO
    assert "--chip v6e ignored: the dump was compiled for v5e" in d.warnings
    assert "for v5e (inferred from the LLO dump" in _header(capsys, str(LLO_V5E), "--chip", "v6e")


def test_chip_from_the_user_is_said_so_in_the_header_and_the_warnings(capsys, unnamed_llo):
    d = tpudiag.diagnose(unnamed_llo, chip="v5e")
    assert d.chip.spec is V5E and d.chip.source is ChipSource.USER
    assert d.compiled.chip is V5E
    assert "TPU generation v5e from --chip: the dump does not name it" in d.warnings
    assert not any("inferred" in w for w in d.warnings)
    header = _header(capsys, str(unnamed_llo), "--chip", "v5e")
    assert "for v5e (from --chip" in header and "inferred" not in header


def test_without_a_chip_nothing_is_modelled(unnamed_llo):
    d = tpudiag.diagnose(unnamed_llo)
    assert d.chip.spec is None and d.chip.source is ChipSource.UNKNOWN and d.analysis is None
    assert any("pass --chip" in w for w in d.warnings)


def test_a_capture_keeps_its_chip_and_says_the_user_chip_was_ignored():
    d = tpudiag.diagnose(CAPTURE_V6E, chip="v5e")
    assert d.chip.spec is V6E and d.chip.source is ChipSource.TRACE
    assert d.compiled.chip is V6E  # what the rules are given
    assert "--chip v5e ignored: the capture ran on v6e" in d.warnings
    # near miss: the same chip as the capture's is no warning
    assert not any("--chip" in w for w in tpudiag.diagnose(CAPTURE_V6E, chip="v6e").warnings)


# What each source's wording is in the header and the warnings. A header or a warning that uses
# another source's wording than the chip's own contradicts where the chip came from.
CLAIMS = {ChipSource.LLO: "inferred from the LLO dump", ChipSource.USER: "from --chip",
          ChipSource.TRACE: "ran on"}
XLA_V5E = REPO / "examples" / "models" / "dumps" / "transformer_train_v5e" / "xla"
COMPILE_V5E = REPO / "examples" / "models" / "dumps" / "transformer_train_v5e"


@pytest.fixture
def untargeted_xla(tmp_path):
    """The v5e XLA dump without `target_arguments.txt`: nothing in it names the chip."""
    dump = tmp_path / "xla"
    shutil.copytree(XLA_V5E, dump)
    for target in dump.glob("*target_arguments.txt"):
        target.unlink()
    return dump


# (input, --chip, the chip's source, its generation, what the header says of it)
PROVENANCE_CASES = {
    "llo dump": (lambda f: LLO_V5E, None, ChipSource.LLO, "v5e", "for v5e (inferred from the LLO dump"),
    "llo dump, same --chip": (lambda f: LLO_V5E, "v5e", ChipSource.LLO, "v5e", "for v5e (inferred from the LLO dump"),
    "llo dump, other --chip": (lambda f: LLO_V5E, "v6e", ChipSource.LLO, "v5e", "for v5e (inferred from the LLO dump"),
    "unnamed llo dump, --chip": (lambda f: f["unnamed_llo"], "v5e", ChipSource.USER, "v5e", "for v5e (from --chip"),
    "xla dump, other --chip": (lambda f: XLA_V5E, "v6e", ChipSource.DUMP, "v5e", "for v5e (TPU_VERSION_VIPERFISH lite"),
    "untargeted xla dump, --chip": (lambda f: f["untargeted_xla"], "v6e", ChipSource.USER, "v6e", "for v6e (from --chip"),
    "compile output, other --chip": (lambda f: COMPILE_V5E, "v6e", ChipSource.DUMP, "v5e", "for v5e:2x2 (TPU v5 lite"),
    "capture, other --chip": (lambda f: CAPTURE_V6E, "v5e", ChipSource.TRACE, "v6e", "Device: TPU v6 Lite (v6e)"),
    "capture": (lambda f: CAPTURE_V6E, None, ChipSource.TRACE, "v6e", "Device: TPU v6 Lite (v6e)"),
}


@pytest.mark.parametrize("case", list(PROVENANCE_CASES))
def test_the_header_and_the_warnings_agree_on_where_the_chip_came_from(case, capsys, unnamed_llo, untargeted_xla):
    from tpudiag.cli.outputs import emit

    make_path, chip, source, generation, said = PROVENANCE_CASES[case]
    d = tpudiag.diagnose(make_path({"unnamed_llo": unnamed_llo, "untargeted_xla": untargeted_xla}), chip=chip)
    assert (d.chip.source, d.chip.spec.generation) == (source, generation)
    assert d.compiled.chip is d.chip.spec  # what the join and the rules were given
    capsys.readouterr()
    emit(d, "terminal", None)
    header = "\n".join(capsys.readouterr().out.splitlines()[:3])
    assert said in header
    chip_warnings = [w for w in d.warnings if "--chip" in w or "TPU generation" in w]
    for other, wording in CLAIMS.items():
        if other is not source:  # near miss: no line claims another source than the chip's own
            assert wording not in header and not any(wording in w for w in chip_warnings), (other, chip_warnings)
    if chip is not None and chip != generation:  # the ignored --chip is said, against the same chip
        assert any(w.startswith(f"--chip {chip} ignored") and w.endswith(generation) for w in chip_warnings)
    if source is ChipSource.USER:
        assert f"TPU generation {generation} from --chip: the dump does not name it" in chip_warnings
    elif chip == generation or chip is None:
        assert not any("--chip" in w for w in chip_warnings)
