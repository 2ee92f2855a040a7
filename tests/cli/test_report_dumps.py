"""`tpudiag report` with compiler dumps: the join's columns in JSON and the terminal, warnings for
dumps of another compilation, and `report DIR` on a dump directory alone (the static report)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess

import pytest

from tests.cli_util import run_tpudiag
from tests.conftest import REPO
from tpudiag.parsers.hlo_program import instruction_bytes
from tpudiag.parsers.hlo_text import load_hlo_dump

MODELS = REPO / "examples" / "models"
CAPTURE = MODELS / "captures" / "transformer_train_v5e"
DUMPS = MODELS / "dumps" / "transformer_train_v5e"  # the `tpudiag compile` output the capture was simulated from
FIXTURES = REPO / "tests" / "fixtures"
JOINED_KEYS = ("logical_bytes", "padded_bytes", "spill_stores", "spill_fills", "estimated_cycles")


def run(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return run_tpudiag(*args, env={"NO_COLOR": "1"}, cwd=cwd)


@pytest.fixture(scope="module")
def joined_json(tmp_path_factory):
    cwd = tmp_path_factory.mktemp("empty")  # no developer config leaks in
    proc = run("report", str(CAPTURE), "--dumps", str(DUMPS), "--format", "json", cwd=cwd)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_json_ops_carry_the_joined_facts(joined_json):
    ops = joined_json["ops"]
    assert all(key in op for op in ops for key in JOINED_KEYS)
    expected = instruction_bytes(load_hlo_dump(DUMPS / "xla").programs[0]).set_index("name")
    for op in ops:
        assert op["padded_bytes"] == expected.loc[op["name"], "padded_bytes"], op["name"]
        assert op["logical_bytes"] == expected.loc[op["name"], "logical_bytes"], op["name"]
    by_name = {op["name"]: op for op in ops}
    assert by_name["fusion.150"]["spill_stores"] == 573  # the bundle profile's VMEM_SPILL_COUNT
    assert by_name["dynamic-slice.11"]["estimated_cycles"] == 2413  # its static-profile textproto
    assert by_name["all-gather.44"]["estimated_cycles"] is None  # remote DMA: no estimate, not 0


def test_json_summary_names_the_dumps_and_the_match(joined_json):
    s = joined_json["summary"]
    assert s["dumps"] == [f"{DUMPS} (LLO + XLA)"]
    join = s["compiled_join"]
    assert join["n_ops"] == len(joined_json["ops"]) == join["with_layout"] == join["from_dumps"] == 140
    assert join["with_llo"] == 92
    assert 0 < join["with_cycles"] < 140  # collectives and remote-DMA fusions have no estimate
    assert set(join["sources"]) == {str(DUMPS / "xla"), str(DUMPS / "llo")}
    assert not any("match" in w for w in joined_json["warnings"])


def test_trace_alone_gives_layouts_from_its_embedded_hlo(tmp_path):
    proc = run("report", str(CAPTURE), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["dumps"] == []
    assert doc["summary"]["compiled_join"]["sources"] == ["capture"]
    assert all(op["padded_bytes"] is not None and op["spill_stores"] is None for op in doc["ops"])


def test_terminal_shows_compiled_columns_only_when_present(tmp_path):
    with_dumps = run("report", str(CAPTURE), "--dumps", str(DUMPS), "--top", "40", cwd=tmp_path)
    assert with_dumps.returncode == 0, with_dumps.stderr
    header = _ops_header(with_dumps.stdout)
    assert header[-3:] == ["padded", "spills", "cycles"]
    assert "Compiled facts joined to 140 of 140 ops" in with_dumps.stdout
    assert any(line.split("│")[1].strip() == "fusion.150" and "573/573" in line and "3,889" in line
               for line in with_dumps.stdout.splitlines() if line.count("│") > 5)
    plain = run("report", str(REPO / "examples" / "captures" / "train_v6e_4chip"), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    assert _ops_header(plain.stdout)[-1] == "bound by"  # no compiled facts: no extra columns


def _ops_header(stdout: str) -> list[str]:
    line = next(line for line in stdout.splitlines() if "bound by" in line and "┃" in line)
    return [cell.strip() for cell in line.split("┃")]


def test_dumps_of_another_compilation_warn(tmp_path):
    proc = run("report", str(CAPTURE), "--dumps", str(FIXTURES / "dumps" / "v5e_mlp_train"),
               "--dumps", str(FIXTURES / "llo" / "v5e_mlp"), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    warnings = "\n".join(doc["warnings"])
    assert "none matched any of the 140 trace ops" in warnings
    assert "`jit_step`" in warnings and "`jit_mlp`" in warnings
    assert doc["summary"]["compiled_join"]["from_dumps"] == 0
    assert all(op["spill_stores"] is None for op in doc["ops"])


def test_same_module_other_generation_is_not_joined(tmp_path):
    proc = run("report", str(CAPTURE), "--dumps", str(MODELS / "dumps" / "transformer_train_v6e"),
               "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    dumps = MODELS / "dumps" / "transformer_train_v6e"
    assert f"compiler dump `{dumps / 'xla'}` was compiled for v6e, the trace ran on v5e: its facts are not joined" \
        in doc["warnings"]
    assert any(f"`{dumps / 'llo'}` was compiled for v6e" in w for w in doc["warnings"])
    assert doc["summary"]["compiled_join"]["from_dumps"] == 0


def test_report_on_a_compile_output_directory_is_the_static_report(tmp_path):
    proc = run("report", str(DUMPS), "--top", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "Ops by estimated time" in proc.stdout and "`jit_train_step`" in proc.stdout
    proc = run("report", str(DUMPS), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["kind"] == "tpudiag.static_report" and doc["module"] == "jit_train_step"
    assert len(doc["ops"]) == 140


def test_report_on_a_bare_xla_dump(tmp_path):
    proc = run("report", str(FIXTURES / "dumps" / "v5e_mlp_train"), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["module"], doc["generation"], doc["n_devices"]) == ("jit_step", "v5e", 4)
    program = load_hlo_dump(FIXTURES / "dumps" / "v5e_mlp_train").programs[0]
    expected = instruction_bytes(program).set_index("name")
    for op in doc["ops"]:
        assert op["padded_bytes"] == expected.loc[op["name"], "padded_bytes"], op["name"]


def test_report_on_xla_and_llo_dumps_in_one_directory(tmp_path):
    """A bare XLA dump has no cycles in its text; an LLO dump beside it gives cycles and spills."""
    mixed = tmp_path / "mixed"
    mixed.mkdir()
    for f in [*(DUMPS / "xla").iterdir(), *(DUMPS / "llo").iterdir()]:
        shutil.copy(f, mixed / f.name)
    proc = run("report", str(mixed), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    xla_only = {op["name"]: op for op in json.loads(proc.stdout)["ops"]}
    assert all(op["estimated_cycles"] is None for op in xla_only.values())
    assert xla_only["fusion.150"]["spill_stores"] == 573
    shutil.copytree(DUMPS / "static_profile", mixed / "static_profile")
    proc = run("report", str(mixed), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    ops = {op["name"]: op for op in doc["ops"]}
    assert ops["dynamic-slice.11"]["estimated_cycles"] == 2413  # static-profile textproto, per instance
    assert doc["static_profile"] is True and doc["generation"] == "v5e"


def test_report_on_an_llo_dump_alone_reads_its_tlp_hlo(tmp_path):
    """No XLA dump: the HLO is `TLP-hlo.txt`, the generation the one chip with its MXUs and VMEM."""
    llo = FIXTURES / "llo" / "v5e_mlp"
    proc = run("report", str(llo), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert (doc["module"], doc["generation"], doc["n_devices"]) == ("jit_mlp", "v5e", 4)
    assert any("inferred from the LLO dump" in w for w in doc["warnings"])
    ops = {op["name"]: op for op in doc["ops"]}
    text = (llo / "static" / "fusion.7_static_llo_profile.textproto").read_text()
    cycles = int(re.search(r"^  estimated_cycles: (\d+)", text, flags=re.M).group(1))
    assert ops["fusion.7"]["estimated_cycles"] == cycles == 14_170  # the reference's MLP figure
    assert ops["all-reduce"]["estimated_cycles"] == 0 and ops["all-reduce"]["cycles_source"] == "bundle_analysis_data"


def _tlp_hlo_only(tmp_path):
    bare = tmp_path / "tlp-only"
    bare.mkdir()
    tlp = next((FIXTURES / "llo" / "v5e_mlp").glob("*-TLP-hlo.txt"))
    shutil.copy(tlp, bare / tlp.name)
    return bare


def test_llo_dump_without_its_hlo_still_reports_spills(tmp_path):
    """Partial dumps degrade, never refuse: spills need no timeline, the rest is skipped with the reason."""
    proc = run("report", str(DUMPS / "llo"), "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["summary"]["mode"] == "static" and doc["ops"] == []
    assert {f["rule"] for f in doc["findings"]} == {"spill"}
    assert all(f["saving_basis"] == "compiler estimate" for f in doc["findings"])
    assert any("an LLO dump without its HLO" in w for w in doc["warnings"])
    assert {s["rule"]: s["reason"] for s in doc["rules_skipped"]}["padding-waste"].startswith("needs a timeline, modelled from the compiled HLO")


def test_dump_without_a_generation_is_modelled_with_chip(tmp_path):
    target = _tlp_hlo_only(tmp_path)
    unknown = json.loads(run("report", str(target), "--format", "json", cwd=tmp_path).stdout)
    assert unknown["summary"]["mode"] == "static"
    assert any("cannot tell the TPU generation" in w and "--chip" in w for w in unknown["warnings"])
    proc = run("report", str(target), "--chip", "v5e", "--format", "json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["generation"] == "v5e" and doc["summary"]["generation"] == "v5e"
    assert any("TPU generation v5e from --chip" in w for w in doc["warnings"])


def test_dump_directory_with_nothing_readable_is_one_line_exit_2(tmp_path):
    bare = tmp_path / "half"
    bare.mkdir()
    (bare / "module_0001.jit_f.after_optimizations.txt").write_text("not HLO at all\n")
    proc = run("report", str(bare), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert lines[0].startswith(f"error: `{bare}")
    assert "Traceback" not in proc.stderr


def test_markdown_of_a_dump_directory_is_the_modelled_report(tmp_path):
    proc = run("report", str(DUMPS), "--format", "md", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "**Compiler estimate, not measured.**" in proc.stdout


def test_bad_dumps_directory_is_one_line_exit_2(tmp_path):
    empty = tmp_path / "not-a-dump"
    empty.mkdir()
    proc = run("report", str(CAPTURE), "--dumps", str(empty), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.splitlines()[0].startswith(f"error: `{empty}`: neither an LLO dump")
    assert "Traceback" not in proc.stderr


def test_an_empty_directory_is_still_not_a_capture(tmp_path):
    proc = run("report", str(tmp_path), cwd=tmp_path)
    assert proc.returncode == 2 and "xplane.pb" in proc.stderr


def test_dumps_with_a_dump_directory_as_path_is_a_usage_error(tmp_path):
    proc = run("report", str(DUMPS), "--dumps", str(DUMPS), cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith(f"error: `{DUMPS}`: `--dumps` joins compiled programs to a trace")


def test_static_report_of_a_dump_directory_to_a_file(tmp_path):
    out = tmp_path / "static.json"
    proc = run("report", str(DUMPS), "--format", "json", "-o", str(out), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and f"wrote `{out}`" in proc.stderr
    assert json.loads(out.read_text())["kind"] == "tpudiag.static_report"
