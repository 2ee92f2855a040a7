"""`tpudiag.diagnose()` / `compare()`: the one pipeline behind every command.

- the CLI's JSON is `diagnose(...)` serialised, for every bundled example (captures and dumps);
- compiler dumps alone get the rules they have inputs for, labelled `compiler estimate` (but a
  saving in bytes, modelled from the buffers);
- the same inputs give the same warnings in `report` and `diff` (regression: mismatched dumps).
"""

from __future__ import annotations

import json

import pytest

import tpudiag
from tests.conftest import REPO
from tpudiag.cli.app import main
from tpudiag.errors import UsageError
from tpudiag.render.json_format import report_to_dict
from tpudiag.render.static_report import static_diagnosis_dict

MODELS = REPO / "examples" / "models"
CAPTURES = sorted(p for p in (MODELS / "captures").iterdir() if p.is_dir())
DUMP_DIRS = sorted(p for p in (MODELS / "dumps").iterdir() if p.is_dir())
FIXTURES = REPO / "tests" / "fixtures"


def cli_json(capsys, *args: str) -> dict:
    try:
        main(["report", *args, "--format", "json"])
    except SystemExit as exc:
        assert not exc.code, capsys.readouterr().err
    return json.loads(capsys.readouterr().out)


def serialised(d) -> dict:
    doc = static_diagnosis_dict(d.report, d.static) if d.mode == "static" else report_to_dict(d.report)
    return json.loads(json.dumps(doc))


@pytest.fixture(autouse=True)
def _no_config(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no developer config leaks in
    monkeypatch.setenv("NO_COLOR", "1")


def test_import_is_lazy():
    import subprocess
    import sys

    code = "import sys, tpudiag; print(sorted(m for m in sys.modules if m.startswith(('pandas', 'tpudiag.'))))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "['tpudiag.version']"  # no pandas, no parsers, no pipeline until first use
    assert callable(tpudiag.diagnose) and callable(tpudiag.compare)


def test_cli_start_loads_no_pandas():
    import subprocess
    import sys

    # What `tpudiag --help` loads: every command's module, none of the pipeline or its tables.
    code = "import sys, tpudiag.cli.app; print(sorted(m for m in sys.modules if m.split('.')[0] == 'pandas'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONPATH": str(REPO)}).stdout
    assert out.strip() == "[]"


def test_cli_json_is_diagnose_serialised_for_the_default_example(capsys):
    assert cli_json(capsys) == serialised(tpudiag.diagnose())


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda p: p.name)
def test_cli_json_is_diagnose_serialised_for_each_capture(capsys, capture):
    assert cli_json(capsys, str(capture)) == serialised(tpudiag.diagnose(capture))


@pytest.mark.parametrize("dumps", DUMP_DIRS, ids=lambda p: p.name)
def test_dumps_alone_are_static_and_labelled_compiler_estimate(capsys, dumps):
    d = tpudiag.diagnose(dumps)
    assert cli_json(capsys, str(dumps)) == serialised(d)
    doc = serialised(d)
    assert doc["summary"]["mode"] == "static"
    assert {"summary", "ops", "findings", "warnings"} <= set(doc)
    assert d.analysis is not None and d.analysis.profile.modelled
    assert all(f.saving.basis == "compiler estimate" for f in d.findings if not f.saving.bytes)
    assert all(f.saving.basis != "measured" for f in d.findings)
    assert {s.rule for s in d.skipped} <= {"low-mxu-utilization", "spill"}  # Pallas: no FLOPs; v6e: no LLO


def test_llm_decode_dumps_alone_get_padding_spill_and_mxu_findings():
    """v5e decode: `f32[3,50257]`-style arrays tiled (4,128)/(8,128), M = 3 matmuls, LLO spills."""
    d = tpudiag.diagnose(MODELS / "dumps" / "llm_decode_v5e")
    by_rule = {}
    for f in d.findings:
        by_rule.setdefault(f.rule, []).append(f)
    assert {"padding-waste", "spill", "low-mxu-utilization"} <= set(by_rule)
    assert all(f.saving.basis == "compiler estimate" for fs in by_rule.values() for f in fs if not f.saving.bytes)
    # the concrete dim change, for array tiles and for the MXU
    assert any(dict(f.evidence[0].values).get("padded dims") == "dim 2: 4 → 128" for f in by_rule["padding-waste"])
    # M = 4 is the decode batch: a batch cause, never "pad 4→128" (a 32x waste)
    assert any("small batch (M = 4 rows" in f.message for f in by_rule["low-mxu-utilization"])
    assert not any("4→128" in f.fix for f in by_rule["low-mxu-utilization"])
    assert all(f.saving.ps > 0 for f in by_rule["padding-waste"] + by_rule["low-mxu-utilization"])
    frame = d.findings_frame()
    assert list(frame["rule"]) == [f.rule for f in d.findings]
    assert set(frame["saving_basis"]) == {"compiler estimate"}


def test_llo_dump_without_target_reports_spills_and_skips_the_rest():
    d = tpudiag.diagnose(MODELS / "dumps" / "transformer_train_v5e" / "llo")
    assert d.mode == "static" and d.analysis is None and d.static is None
    assert d.findings and {f.rule for f in d.findings} == {"spill"}
    from tpudiag.rules.registry import RULES

    assert {s.rule for s in d.skipped} == {r.name for r in RULES} - {"spill"}
    memory = {"hbm-pressure", "vmem-pressure"}  # they need the HLO's buffers, not a timeline
    assert all(s.reason.startswith("needs a timeline, modelled from the compiled HLO") for s in d.skipped
               if s.rule not in memory)
    assert all(s.reason.startswith("needs the compiled HLO") for s in d.skipped if s.rule in memory)
    assert d.ops_frame().empty and d.steps_frame().empty


def test_one_hlo_file_picked_out_of_a_dump_is_diagnosed_with_its_directory_target():
    """A partial dump: one module's `after_optimizations.txt`; its sibling target file names v5e."""
    xla = MODELS / "dumps" / "llm_decode_v5e" / "xla"
    d = tpudiag.diagnose(next(xla.glob("*.after_optimizations.txt")))
    assert d.mode == "static" and d.analysis is not None
    assert {"exposed-collective", "memory-bound"} <= {f.rule for f in d.findings}
    # The decode waits on its weight copies: their dones are on the HBM roof at a rate no core exceeds
    # (each carries the bytes its DMA moves while it waits), so no warning and a stated rate.
    assert not any("above the core's peak" in w for w in d.warnings)
    (bound,) = [f for f in d.findings if f.rule == "memory-bound"]
    assert "`copy-done`" in bound.fix and "of 819 GB/s" in bound.message and "no rate" not in bound.message
    assert any(s.rule == "spill" and "--xla_jf_dump_to" in s.reason for s in d.skipped)


def test_hlo_text_without_a_target_skips_with_the_reason_and_runs_with_chip(tmp_path):
    """`compiled.as_text()` saved alone names no chip: exit 0 with the reason; --chip models it."""
    text = tmp_path / "step.hlo.txt"
    text.write_text((MODELS / "dumps" / "llm_decode_v5e" / "compiled.hlo.txt").read_text())
    alone = tpudiag.diagnose(text)
    assert alone.mode == "static" and alone.analysis is None and not alone.findings
    assert any("pass --chip" in w for w in alone.warnings)
    assert all("pass --chip" in s.reason for s in alone.skipped if s.rule != "spill")
    with_chip = tpudiag.diagnose(text, chip="v5e")
    assert {"padding-waste", "low-mxu-utilization"} <= {f.rule for f in with_chip.findings}


def test_the_largest_module_of_a_many_module_dump_is_the_one_reported(tmp_path):
    """A real `--xla_dump_to` holds small jits beside the step; file order must not pick one."""
    src = MODELS / "dumps" / "llm_decode_v5e" / "xla"
    dump = tmp_path / "dump"
    dump.mkdir()
    for f in src.iterdir():
        (dump / f.name).write_bytes(f.read_bytes())
    tiny = ("HloModule jit_convert_element_type, is_scheduled=true\n\n"
            "ENTRY %main (p: f32[8]) -> bf16[8] {\n  %p = f32[8]{0} parameter(0)\n"
            "  ROOT %c = bf16[8]{0} convert(f32[8]{0} %p)\n}\n")
    (dump / "module_9999.jit_convert_element_type.cl_1.after_optimizations.txt").write_text(tiny)
    d = tpudiag.diagnose(dump)
    assert d.static.module == "jit_decode_step"
    assert any("the largest (others: jit_convert_element_type)" in w for w in d.warnings)


def test_chip_must_be_a_known_generation():
    with pytest.raises(UsageError, match="unknown TPU generation `v9z`"):
        tpudiag.diagnose(MODELS / "dumps" / "llm_decode_v5e", chip="v9z")


def test_frames_of_a_capture():
    d = tpudiag.diagnose(MODELS / "captures" / "llm_decode_v5e")
    ops = d.ops_frame()
    assert len(ops) == len(d.report.ops) and {"name", "self_time_ps", "padded_bytes"} <= set(ops.columns)
    steps = d.steps_frame()
    assert not steps.empty and (steps["dur_ps"] > 0).all()


def test_diff_shows_the_warnings_report_shows_for_mismatched_dumps(capsys):
    """Regression: `diff --new-dumps` of another program printed none of `report`'s mismatch warnings."""
    capture = MODELS / "captures" / "transformer_train_v5e"
    other = FIXTURES / "dumps" / "v5e_mlp_train"
    report_doc = cli_json(capsys, str(capture), "--dumps", str(other))
    assert any("none matched any of the 140 trace ops" in w for w in report_doc["warnings"])
    try:
        main(["diff", str(capture), str(capture), "--new-dumps", str(other), "--format", "json"])
    except SystemExit as exc:
        assert not exc.code
    diff_doc = json.loads(capsys.readouterr().out)
    for w in report_doc["warnings"]:
        assert f"new: {w}" in diff_doc["warnings"]
    assert not any(w.startswith("base: ") and "matched" in w for w in diff_doc["warnings"])


def test_check_gates_compiler_dumps_alone(capsys):
    """`check` takes the same inputs as `report`: dumps alone are gated on their compiler-estimate findings."""
    with pytest.raises(SystemExit) as exc:
        main(["check", str(MODELS / "dumps" / "llm_decode_v5e"), "--fail-on", "high", "--format", "json"])
    doc = json.loads(capsys.readouterr().out)
    assert exc.value.code == 1 and doc["result"] == "fail"
    assert doc["findings"] and {f["saving_basis"] for f in doc["findings"]} == {"compiler estimate"}


def test_dumps_alone_give_a_markdown_report_labelled_compiler_estimate(capsys, tmp_path):
    out = tmp_path / "out" / "report.md"
    out.parent.mkdir()
    with pytest.raises(SystemExit) as exc:
        main(["report", str(MODELS / "dumps" / "llm_decode_v5e"), "--format", "md", "-o", str(out)])
    assert not exc.value.code, capsys.readouterr().err
    text = out.read_text()
    assert "**Compiler estimate, not measured.**" in text and "Modelled, not measured" not in text
    assert "compiler estimate" in text.split("### Top problems", 1)[1]  # each saving says its basis
    with pytest.raises(SystemExit) as exc:  # no timeline from an LLO dump without its HLO: one line, exit 2
        main(["report", str(MODELS / "dumps" / "transformer_train_v5e" / "llo"), "--format", "md"])
    assert exc.value.code == 2
    assert "no markdown report: no timeline could be modelled" in capsys.readouterr().err
