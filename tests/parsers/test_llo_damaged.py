"""Damaged, partial and foreign LLO dumps: warnings or a clean `InputError`, never a traceback."""

from __future__ import annotations

import shutil
import string
import os
from pathlib import Path

import pandas as pd
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import bounded_examples

from tpudiag.errors import InputError
from tpudiag.model import llo
from tpudiag.parsers.llo import load_llo_dump

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "llo"


@pytest.fixture
def pallas_copy(tmp_path) -> Path:
    """A writable copy of the spilling Pallas dump (small: every file kind, static profile)."""
    target = tmp_path / "dump"
    shutil.copytree(FIXTURES / "v5e_pallas_r512", target)
    return target


def _one(directory: Path, suffix: str) -> Path:
    [path] = [p for p in directory.iterdir() if p.name.endswith(suffix)]
    return path


def _all_tables(dump) -> None:
    """Every table still has its schema, whatever was damaged."""
    for schema, table in ((llo.OPS, dump.ops), (llo.BUNDLE_PROFILE, dump.bundle_profile),
                          (llo.STATIC_PROFILE, dump.static_profile),
                          (llo.SPILL_INSTRUCTIONS, dump.spill_instructions),
                          (llo.SPILL_SLOTS, dump.spill_slots), (llo.SCHEDULE, dump.schedule),
                          (llo.VMEM_ALLOCATIONS, dump.vmem_allocations)):
        schema.require(table)


# ---- the directory itself --------------------------------------------------------------------

def test_missing_directory_is_an_input_error_with_hint(tmp_path):
    with pytest.raises(InputError) as err:
        load_llo_dump(tmp_path / "nope")
    assert err.value.path == str(tmp_path / "nope") and "xla_jf_dump_to" in err.value.hint


def test_a_file_is_not_a_dump_directory(tmp_path):
    path = tmp_path / "x.txt"
    path.write_text("hello")
    with pytest.raises(InputError, match="not a directory"):
        load_llo_dump(path)


def test_directory_without_dump_files_is_an_input_error(tmp_path):
    (tmp_path / "notes.txt").write_text("nothing here")
    with pytest.raises(InputError, match="no LLO dump files"):
        load_llo_dump(tmp_path)


def test_unreadable_directory_is_an_input_error(tmp_path, monkeypatch):
    # Simulated: chmod 0 does not stop root, and CI may run as root.
    def denied(self):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(Path, "iterdir", denied)
    with pytest.raises(InputError, match="cannot list directory") as err:
        load_llo_dump(tmp_path)
    assert isinstance(err.value.__cause__, PermissionError)


def test_unreadable_file_is_a_warning(pallas_copy, monkeypatch):
    """A file that cannot be opened (permissions, vanished) is skipped with a warning."""
    victim = _one(pallas_copy, "-f.1-05-final_bundles.txt")
    real_open = os.open

    def failing(path, *args, **kwargs):
        if Path(path) == victim:
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing)
    dump = load_llo_dump(pallas_copy)
    assert any("permission denied" in w and victim.name in w for w in dump.warnings)
    assert dump.spill_instructions.empty
    assert dump.ops.set_index("name").loc["f.1", "spill_stores"] == 18  # still from the profile


# ---- partial dumps ---------------------------------------------------------------------------

def test_static_profile_alone_is_enough(tmp_path):
    shutil.copytree(FIXTURES / "v5e_mlp" / "static", tmp_path / "static")
    dump = load_llo_dump(tmp_path)
    assert set(dump.ops["name"]) == {"fusion.7", "all-reduce"}
    assert dump.ops.set_index("name").loc["fusion.7", "estimated_cycles"] == 14170


def test_a_missing_static_profile_directory_is_a_warning(tmp_path):
    dump = load_llo_dump(FIXTURES / "v6e_mlp_misc", static_profile_dir=tmp_path / "nope")
    assert dump.warnings == [f"`{tmp_path / 'nope'}`: static profile directory not found; cycle estimates unknown"]
    assert (dump.ops["cycles_status"] == "no-static-profile").all()


def test_deduplicated_estimates_keep_the_per_instance_cost(tmp_path):
    # Built in code: no fixture compile deduplicated anything. Three identical fusions share one
    # estimate of 500 cycles; a remote-DMA fusion carries a collective and prints 0.
    (tmp_path / "fusion.3_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "fusion.3"\n  estimated_cycles: 500\n  num_equivalent_hlos: 3\n'
        "  dma_instruction_type: DMA_INSTRUCTION_TYPE_NONE\n  hlo_instruction {\n    name: \"fusion.3\"\n  }\n}\n")
    (tmp_path / "fusion.9_static_llo_profile.textproto").write_text(
        'hlo_op_estimate {\n  hlo_op_name: "fusion.9"\n  estimated_cycles: 0\n  num_equivalent_hlos: 1\n'
        "  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE\n}\n")
    ops = load_llo_dump(tmp_path).ops.set_index("name")
    assert (ops.loc["fusion.3", "estimated_cycles"], ops.loc["fusion.3", "cycles_per_instance"]) == (1500, 500)
    assert ops.loc["fusion.3", "num_equivalent_hlos"] == 3 and not ops.loc["fusion.3", "is_collective"]
    assert pd.isna(ops.loc["fusion.9", "estimated_cycles"]) and ops.loc["fusion.9", "is_collective"]


def test_static_profile_elsewhere_is_found_through_the_argument(tmp_path):
    shutil.copytree(FIXTURES / "v5e_mlp", tmp_path / "dump", ignore=shutil.ignore_patterns("static"))
    shutil.copytree(FIXTURES / "v5e_mlp" / "static", tmp_path / "elsewhere")
    assert load_llo_dump(tmp_path / "dump").static_profile.empty
    dump = load_llo_dump(tmp_path / "dump", static_profile_dir=tmp_path / "elsewhere")
    assert dump.ops.set_index("name").loc["fusion.7", "estimated_cycles"] == 14170


@pytest.mark.parametrize("suffix, column", [
    ("-TLP-05-hlo-static-bundle-profile.txt", "mxu_matmul_fraction"),
    ("-f.1-05-final_bundles.txt", None),
    ("-f.1-02-post-ra.txt", "spill_slots"),
    ("-TLP-06-vmem_report.html", "vmem_spill_bytes"),
    ("-f.1-04-schedule-analysis_final_bundles.txt", None),
    ("-f.1-03-final_hlo-static-per-bundle-utilization.txt", "mxu_busy_fraction"),
    ("-f.1-00-register-pressure.txt", "register_pressure"),
])
def test_a_deleted_file_leaves_its_columns_unknown_and_the_rest_intact(pallas_copy, suffix, column):
    _one(pallas_copy, suffix).unlink()
    dump = load_llo_dump(pallas_copy)
    assert dump.warnings == []  # a filter that leaves a file out is normal, not an oddity
    _all_tables(dump)
    kernel = dump.ops.set_index("name").loc["f.1"]
    if column is not None:
        assert pd.isna(kernel[column])
    assert kernel["estimated_cycles"] == 3172
    assert kernel["bundles"] == 261  # schedule analysis, else the utilization row count
    assert kernel["spill_stores"] == 18  # bundle profile, else final_bundles


def test_deleting_the_profile_falls_back_to_final_bundles_counts(pallas_copy):
    _one(pallas_copy, "-TLP-05-hlo-static-bundle-profile.txt").unlink()
    kernel = load_llo_dump(pallas_copy).ops.set_index("name").loc["f.1"]
    assert (kernel["spill_stores"], kernel["spill_fills"]) == (18, 18)
    assert pd.isna(kernel["hbm_to_vmem_starvation"])


# ---- damaged files ---------------------------------------------------------------------------

@pytest.mark.parametrize("suffix", [
    "-TLP-05-hlo-static-bundle-profile.txt", "-f.1-05-final_bundles.txt", "-f.1-02-post-ra.txt",
    "-TLP-06-vmem_report.html", "-f.1-04-schedule-analysis_final_bundles.txt",
    "-f.1-03-final_hlo-static-per-bundle-utilization.txt", "-f.1-00-register-pressure.txt",
    "f.1_static_llo_profile.textproto",
])
@pytest.mark.parametrize("keep", [0.0, 0.37, 0.5, 0.93])
def test_truncated_files_never_crash(pallas_copy, suffix, keep):
    path = _one(pallas_copy / "static", suffix) if suffix.endswith("textproto") else _one(pallas_copy, suffix)
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    _all_tables(load_llo_dump(pallas_copy))


def test_truncated_vmem_report_json_is_a_warning(pallas_copy):
    path = _one(pallas_copy, "-TLP-06-vmem_report.html")
    text = path.read_text()
    path.write_text(text[: text.index('"hlo_breakdowns"') + 40])
    dump = load_llo_dump(pallas_copy)
    assert any("VMEM report JSON unreadable" in w for w in dump.warnings)
    assert dump.vmem_allocations.empty


def test_truncated_utilization_rows_are_counted_and_warned(pallas_copy):
    path = _one(pallas_copy, "-f.1-03-final_hlo-static-per-bundle-utilization.txt")
    text = path.read_text()
    path.write_text(text[:-3])  # cut inside the last row: `0 0 0 0 0 0 0 0` has 8 of 10 values
    dump = load_llo_dump(pallas_copy)
    assert any("utilization row(s) not understood" in w for w in dump.warnings)
    assert dump.utilization_for("f.1").bundles == 260


def test_unknown_units_and_columns_are_warned_and_kept(pallas_copy):
    profile = _one(pallas_copy, "-TLP-05-hlo-static-bundle-profile.txt")
    profile.write_text(profile.read_text() + " - QUANTUM_UNIT: (3/10) - 0.3\n")
    util = _one(pallas_copy, "-f.1-03-final_hlo-static-per-bundle-utilization.txt")
    util.write_text(util.read_text().replace("VSTORE:SPILL, SALU", "VSTORE:SPILL, WARP"))
    dump = load_llo_dump(pallas_copy)
    assert any("unknown bundle-profile units ['QUANTUM_UNIT']" in w for w in dump.warnings)
    assert any("unknown utilization columns ['WARP']" in w for w in dump.warnings)
    assert dump.bundle_profile["unit"].eq("QUANTUM_UNIT").sum() == 1
    assert dump.utilization_for("f.1").column("WARP") is not None


def test_unknown_files_and_pass_labels_are_one_warning_each(pallas_copy):
    (pallas_copy / "README").write_text("notes")
    (pallas_copy / "123-f.1-09-some-new-pass.txt").write_text("?")
    (pallas_copy / "123-f.1-10-another-pass.txt").write_text("?")
    dump = load_llo_dump(pallas_copy)
    assert sum("not named like jf dump files" in w for w in dump.warnings) == 1
    assert sum("pass labels not parsed: another-pass, some-new-pass" in w for w in dump.warnings) == 1


def test_binary_garbage_is_a_warning(pallas_copy):
    _one(pallas_copy, "-f.1-05-final_bundles.txt").write_bytes(bytes(range(256)) * 4)
    dump = load_llo_dump(pallas_copy)
    assert any("not UTF-8" in w for w in dump.warnings)


def _later_compile(source: Path, target: Path, shift_ns: int) -> None:
    """Copy a fixture's jf files into `target` as if compiled `shift_ns` later in the same process."""
    for p in source.iterdir():
        if p.is_file():
            stamp, rest = p.name.split("-", 1)
            shutil.copy(p, target / f"{int(stamp) + shift_ns}-{rest}")


def test_two_compiles_of_one_module_read_the_newest_and_warn(tmp_path):
    shutil.copytree(FIXTURES / "v5e_pallas_r64", tmp_path / "d")
    _later_compile(FIXTURES / "v5e_pallas_r512", tmp_path / "d", 10**12)
    dump = load_llo_dump(tmp_path / "d")
    assert any("2 compiles in this directory (`jit_f`, `jit_f`)" in w for w in dump.warnings)
    assert dump.ops.set_index("name").loc["f.1", "spill_stores"] == 18
    assert len(dump.other_compiles) == 1 and dump.compile.timestamp_ns > dump.other_compiles[0].timestamp_ns


def test_a_module_is_chosen_by_name_among_several_compiles(tmp_path):
    """A process that compiled `jit_mlp` and then `jit_f` (Pallas) into one directory."""
    shutil.copytree(FIXTURES / "v5e_mlp", tmp_path / "d")
    _later_compile(FIXTURES / "v5e_pallas_r512", tmp_path / "d", 10**12)
    shutil.copytree(FIXTURES / "v5e_pallas_r512" / "static", tmp_path / "d" / "static", dirs_exist_ok=True)
    newest = load_llo_dump(tmp_path / "d")
    assert newest.compile.module_name == "jit_f" and set(newest.ops["name"]) == {"f.1"}
    assert [c.module_name for c in newest.other_compiles] == ["jit_mlp"]
    mlp = load_llo_dump(tmp_path / "d", module="jit_mlp")
    assert set(mlp.ops["name"]) == {"fusion.7", "all-reduce", "copy-start", "copy-done"}
    assert mlp.ops.set_index("name").loc["fusion.7", "spill_stores"] == 107
    assert set(mlp.static_profile["hlo"]) == {"fusion.7", "all-reduce"}  # f.1's estimate left out
    with pytest.raises(InputError, match="no compile of module `jit_nope`") as err:
        load_llo_dump(tmp_path / "d", module="jit_nope")
    assert err.value.hint == "modules here: jit_f, jit_mlp"


# Regressions: lines that match a pattern's shape but not a number's grammar.
@pytest.mark.parametrize("suffix, line", [
    ("-TLP-05-hlo-static-bundle-profile.txt", "HLO: %f.1 = f32[] custom-call()\n - VECTOR_ALU: (1/2) - e"),
    ("-TLP-05-hlo-static-bundle-profile.txt", "HLO: %f.1 = f32[] custom-call()\n - VECTOR_ALU: (1/2) - +-"),
    ("-f.1-05-final_bundles.txt", "   007 LB: > { %1 = vst [vmem:[#allocation1_spill] sm:$0xff] }"),
    ("-f.1-02-post-ra.txt", "  #allocation1_spill [shape = 'u32[8,128]', space=vmem, size = 0100, scoped, tag = 'spilled']"),
])
def test_number_like_tokens_do_not_crash(pallas_copy, suffix, line):
    _one(pallas_copy, suffix).write_text(line + "\n")
    _all_tables(load_llo_dump(pallas_copy))


def test_superscript_digits_in_the_static_profile_are_a_warning(pallas_copy):
    _one(pallas_copy / "static", ".textproto").write_text('hlo_op_estimate {\n  hlo_op_name: "f.1"\n'
                                                         "  estimated_cycles: \u00b2\n}\n")
    dump = load_llo_dump(pallas_copy)
    assert dump.static_profile.empty and any("without hlo_op_name or estimated_cycles" in w for w in dump.warnings)


# ---- random text in place of each file (property test) ---------------------------------------

_LINES = st.lists(st.one_of(
    st.text(alphabet=string.printable, max_size=80),
    st.sampled_from([" - MXU_0 matmul: (1/0) - nan", " - VMEM_SPILL_COUNT: (5/2) - 2.5", "HLO: <no-hlo-instruction>",
                     "HLO: %x = f32[] custom-call(", "== CAPACTIY:", "MXU, VALU", "1 2", "== UTILIZATION:", "1 2 3",
                     "Register pressure for vregs is 9", "len=1 lr=[5, 2) wt=0 users=0 :: %v",
                     "   0x1 LB: > { %1 = vst [vmem:[#allocation1_spill] sm:$0xff] }",
                     "$region3: #{f.1} parent=3", "$region3: parent=4", "$region4: parent=3",
                     "hlo_op_estimate {", '  hlo_op_name: "f.1"', "  estimated_cycles: 12",
                     "  num_equivalent_hlos: x", "  dma_instruction_type: DMA_INSTRUCTION_TYPE_LOCAL_AND_REMOTE",
                     "const DATA = {\"hlo_breakdowns\": {\"a\": {\"blocks\": [1, {\"allocations\": [2]}]}}};",
                     "const DATA = [1, 2];", "const DATA = {\"global_info\": 3, \"hlo_breakdowns\": []};",
                     "\ttotal scheduled bundles:    x", "  1.5 scheduled bundles ( 50.00%): <no hlo>",
                     " - VECTOR_ALU: (1/2) - e", "   007 : { %2 = vld [vmem:[#allocation2_spill] sm:$0x1] }",
                     "  estimated_cycles: \u00b2", "  #allocation2_spill [shape = 'u32', space=vmem, size = 09"])),
    max_size=30).map("\n".join)

_TARGETS = ["-TLP-05-hlo-static-bundle-profile.txt", "-f.1-05-final_bundles.txt", "-f.1-02-post-ra.txt",
            "-TLP-06-vmem_report.html", "-f.1-04-schedule-analysis_final_bundles.txt",
            "-f.1-03-final_hlo-static-per-bundle-utilization.txt", "-f.1-00-register-pressure.txt",
            "f.1_static_llo_profile.textproto"]


@settings(max_examples=bounded_examples(150, 50), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(target=st.sampled_from(_TARGETS), text=_LINES, raw=st.binary(max_size=200), use_raw=st.booleans())
def test_random_content_gives_warnings_or_tables_never_a_traceback(pallas_copy, target, text, raw, use_raw):
    path = _one(pallas_copy / "static", target) if target.endswith("textproto") else _one(pallas_copy, target)
    original = path.read_bytes()
    try:
        path.write_bytes(raw if use_raw else text.encode())
        dump = load_llo_dump(pallas_copy)
        _all_tables(dump)
        assert all(isinstance(w, str) and w for w in dump.warnings)
    finally:
        path.write_bytes(original)
