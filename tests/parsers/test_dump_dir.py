"""Dump directories as XLA and libtpu write them today: an XLA dump and an LLO dump in sibling or
nested folders of any names are read as one compilation (`parsers.dump_dir.dump_parts`).

The fixture `tests/fixtures/dumps/v5e_pallas_split` is a real deviceless compile of the bundled
Pallas matmul (`examples/models/pallas_matmul.py`, `tiled_matmul`, 512^3 blocks) on one v5e device
with `--xla_dump_to=D/xla --xla_jf_dump_to=D/jf` (`make_fixtures.py`). Its LLO bundle profile
counts the spills by hand: `grep VMEM_ jf/*-hlo-static-bundle-profile.txt` under the
`%tiled_matmul.1` header reads `VMEM_SPILL_COUNT: (87/...)` and `VMEM_FILL_COUNT: (257/...)`,
the 512^3 figures of shared/reference/tpu-compiler-dumps.md §7.1; its `target_arguments.txt`
names `TPU_VERSION_VIPERFISH` `lite`, v5e.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO
from tpudiag.parsers.dump_dir import dump_parts, is_dump_directory
from tpudiag.pipeline import diagnose

SPLIT = REPO / "tests" / "fixtures" / "dumps" / "v5e_pallas_split"


def _spills(path: Path) -> tuple[list[tuple], str]:
    """(op, spills, fills) of every spill finding's evidence, and the chip the diagnosis decided."""
    d = diagnose(path)
    rows = sorted((e.subject, dict(e.values)["spills"], dict(e.values)["fills"])
                  for f in d.findings if f.rule == "spill" for e in f.evidence)
    return rows, d.chip.spec.generation if d.chip.spec is not None else ""


def test_the_split_fixture_is_what_its_docstring_says():
    parts = dump_parts(SPLIT)
    assert (parts.xla, parts.llo, parts.static_profile) == (SPLIT / "xla", SPLIT / "jf", None)
    assert parts.found and parts.notes == ()


def test_xla_and_jf_siblings_give_the_spills_of_jf_alone():
    both, chip = _spills(SPLIT)
    alone, _ = _spills(SPLIT / "jf")
    assert both == alone == [("tiled_matmul.1", "87", "257")]
    assert chip == "v5e"  # from the XLA part's target_arguments.txt; the `misc` LLO dump names none


def test_nested_folders_of_any_names_are_one_compilation(tmp_path):
    root = tmp_path / "dumps"
    shutil.copytree(SPLIT / "xla", root / "run-1" / "hlo")
    shutil.copytree(SPLIT / "jf", root / "libtpu" / "deep" / "jf_dump")
    assert is_dump_directory(root)
    parts = dump_parts(root)
    assert (parts.xla, parts.llo) == (root / "run-1" / "hlo", root / "libtpu" / "deep" / "jf_dump")
    assert _spills(root) == ([("tiled_matmul.1", "87", "257")], "v5e")


def test_several_candidates_read_the_shallowest_and_say_so(tmp_path):
    shutil.copytree(SPLIT / "xla", tmp_path / "a" / "xla")
    shutil.copytree(SPLIT / "xla", tmp_path / "b" / "c" / "xla")
    shutil.copytree(SPLIT / "jf", tmp_path / "jf")
    parts = dump_parts(tmp_path)
    assert parts.xla == tmp_path / "a" / "xla"
    assert len(parts.notes) == 1 and "2 directories hold XLA dumps" in parts.notes[0]
    assert any("2 directories hold XLA dumps" in w for w in diagnose(tmp_path).warnings)


def test_a_trace_below_makes_it_no_dump_directory(tmp_path):
    # A near miss: dumps beside a capture are `--dumps` of that capture, not a dump directory.
    shutil.copytree(SPLIT, tmp_path / "dumps")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "host.xplane.pb").write_bytes(b"")
    assert not is_dump_directory(tmp_path)
    assert is_dump_directory(tmp_path / "dumps")


def test_dumps_deeper_than_the_limit_are_not_looked_for(tmp_path):
    from tpudiag.parsers.dump_dir import MAX_DEPTH

    deep = tmp_path.joinpath(*[f"d{i}" for i in range(MAX_DEPTH + 1)])
    shutil.copytree(SPLIT / "xla", deep)
    assert not is_dump_directory(tmp_path)
    assert is_dump_directory(deep.parent)


@pytest.mark.parametrize("name", ["xla", "jf"])
def test_a_symlinked_folder_is_not_followed(tmp_path, name):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "loop").symlink_to(tmp_path)  # a cycle: never followed
    (tmp_path / "d" / name).symlink_to(SPLIT / name)
    assert not is_dump_directory(tmp_path / "d")
