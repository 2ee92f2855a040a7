"""`tpudiag whatif`: a flag's modelled effect from deviceless compiles.

The libtpu tests share one `whatif()` run on the bundled transformer for v5e:2x2 (three compiles
without the static profile, about a minute on a quiet 2-core machine): the baseline, the
latency-hiding scheduler off (measured here to change the schedule: v5e's async all-gather pairs
become synchronous and the modelled step grows), and the scheduler on, the default (identical
flags: an identical compile and model). Two more on the small MLP fixture check the compiler-option
path: an option and the same libtpu flag compile alike, and an unknown option is one error line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from tpudiag.render.whatif import render_whatif_terminal, whatif_json
from tpudiag.compiler.driver import compiler_error_line, worker_env
from tpudiag.errors import UsageError
from tpudiag.rules.exposed_collective import ASYNC_FLAGS, whatif_hint
from tpudiag.whatif import Variant, parse_setting, plan_variants, whatif

TRANSFORMER = f"{REPO / 'examples' / 'models' / 'transformer_train.py'}:train_step"
LHS = "xla_tpu_enable_latency_hiding_scheduler"


def test_settings_are_routed_to_libtpu_xla_flags_or_compiler_options():
    (variant,) = plan_variants([f"--{LHS}=false", "xla_disable_hlo_passes=foo"], ["xla_tpu_x=3"])
    assert variant.libtpu_flags == (f"--{LHS}=false",)
    assert variant.xla_flags == ("--xla_disable_hlo_passes=foo",)
    assert variant.compiler_options == {"xla_tpu_x": 3}
    assert variant.label == f"--xla-flag {LHS}=false --xla-flag xla_disable_hlo_passes=foo --option xla_tpu_x=3"
    each = plan_variants([f"{LHS}=false", f"{LHS}=true"], [], each=True)
    assert [v.libtpu_flags for v in each] == [(f"--{LHS}=false",), (f"--{LHS}=true",)]


@pytest.mark.parametrize(("text", "value"), [("a=true", True), ("a=False", False), ("a=12", 12), ("a=0.5", 0.5),
                                             ("a=x,y", "x,y")])
def test_option_values_take_the_type_they_read_as(text, value):
    got = parse_setting(text, "option").option_value
    assert got == value and type(got) is type(value)


@pytest.mark.parametrize(("flags", "options", "each", "message"), [
    ([], [], False, "nothing to compare"),
    (["novalue"], [], False, "expected NAME=VALUE"),
    (["a="], [], False, "expected NAME=VALUE"),
    (["a=1", "a=2"], [], False, "given twice"),
])
def test_bad_settings_are_usage_errors(flags, options, each, message):
    with pytest.raises(UsageError, match=message):
        plan_variants(flags, options, each)


def test_whatif_command_usage_errors_cost_no_compile():
    for args, message in ((["x.py:f", "-t", "v5e:2x2"], "nothing to compare"),
                          (["x.py:f", "-t", "v9:2x2", "--xla-flag", "a=1"], "unknown TPU generation"),
                          (["nocolon", "-t", "v5e:2x2", "--xla-flag", "a=1"], "MODULE:FUNCTION")):
        proc = subprocess.run([sys.executable, "-m", "tpudiag", "whatif", *args], capture_output=True, text=True,
                              env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)
        assert proc.returncode == 2 and message in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_xla_flags_reach_the_workers_xla_flags(tmp_path):
    env = worker_env(tmp_path, False, ("--xla_tpu_a=1",), ("--xla_b=2",))
    assert env["XLA_FLAGS"] == f"--xla_dump_to={tmp_path / 'xla'} --xla_b=2"
    assert env["LIBTPU_INIT_ARGS"].endswith("--xla_tpu_a=1")


def test_an_unknown_libtpu_flag_is_named_before_the_init_noise():
    stderr = ("E0000 00:00:1.2 1 common_lib.cc:554] INVALID_ARGUMENT: Error: unexpected worker hostname\n"
              "ERROR: Unknown command line flag 'xla_tpu_no_such_flag'\n")
    assert compiler_error_line(stderr) == "ERROR: Unknown command line flag 'xla_tpu_no_such_flag'"


@pytest.mark.parametrize("generation", ["v6e", "v5p"])
def test_the_exposed_collective_fix_names_a_whatif_command_that_parses(generation):
    hint = whatif_hint(generation)
    command = hint[hint.index("`") + 1:hint.rindex("`")].split()
    assert command[:4] == ["tpudiag", "whatif", "MODULE:FUNCTION", "--topology"]
    flags = [command[i + 1] for i, word in enumerate(command) if word == "--xla-flag"]
    (variant,) = plan_variants(flags, [])
    assert variant.libtpu_flags == tuple(ASYNC_FLAGS.split())  # exactly the flags the fix proposes
    from tpudiag.compiler.topology import parse_topology

    assert parse_topology(command[4]).generation == generation


# --- real compiles ---


@pytest.fixture(scope="module")
def libtpu():
    if importlib.util.find_spec("libtpu") is None:
        if os.environ.get("TPUDIAG_ALLOW_NO_LIBTPU") == "1":
            pytest.skip("libtpu is not installed (TPUDIAG_ALLOW_NO_LIBTPU=1)")
        pytest.fail("libtpu is not installed: install the tpu extra or set TPUDIAG_ALLOW_NO_LIBTPU=1 to skip")


@pytest.fixture(scope="module")
def transformer_whatif(libtpu, tmp_path_factory):
    variants = plan_variants([f"{LHS}=false", f"{LHS}=true"], [], each=True)
    return whatif(TRANSFORMER, "v5e:2x2", variants, tmp_path_factory.mktemp("whatif"), static_profile=False)


@pytest.mark.libtpu
def test_the_scheduler_off_changes_the_schedule_and_the_modelled_step(transformer_whatif):
    base, off = transformer_whatif.baseline, transformer_whatif.variants[0]
    assert off.variant == Variant((parse_setting(f"{LHS}=false", "xla-flag"),))
    assert off.compiled.schedule_sha != base.schedule_sha
    # v5e issues async all-gather pairs by default; without the scheduler none stays async
    assert base.async_collectives > 0 and off.compiled.async_collectives < base.async_collectives
    assert off.diff.step_time.significant and off.diff.step_time.delta_ps > 0
    assert off.compiled.step_ps > base.step_ps
    assert off.compiled.exposed_collective_ps > base.exposed_collective_ps
    assert base.diagnosis.mode == off.compiled.diagnosis.mode == "static"  # modelled, never measured
    assert base.hbm_peak_bytes and off.compiled.hbm_peak_bytes


@pytest.mark.libtpu
def test_identical_flags_give_an_identical_result(transformer_whatif):
    base, same = transformer_whatif.baseline, transformer_whatif.variants[1]
    assert same.compiled.schedule_sha == base.schedule_sha
    assert same.compiled.step_ps == base.step_ps and same.diff.step_time.delta_ps == 0
    assert same.compiled.exposed_collective_ps == base.exposed_collective_ps
    assert same.compiled.hbm_peak_bytes == base.hbm_peak_bytes
    assert not same.diff.findings_appeared and not same.diff.findings_resolved


@pytest.mark.libtpu
def test_whatif_renders_every_figure_as_modelled(transformer_whatif, capsys):
    doc = whatif_json(transformer_whatif)
    assert doc["kind"] == "tpudiag.whatif" and doc["modelled"] is True and doc["topology"] == "v5e:2x2"
    off, same = doc["variants"]
    assert off["schedule_changed"] is True and same["schedule_changed"] is False
    assert off["step_time_change_ps"] == off["step_time_ps"] - doc["baseline"]["step_time_ps"]
    from tpudiag.cli.console import stdout_console

    render_whatif_terminal(transformer_whatif, stdout_console())
    out = capsys.readouterr().out
    assert "every figure is modelled, none measured" in out
    assert "schedule changed" in out and "same schedule" in out
    assert f"tpudiag diff {transformer_whatif.baseline.out} {transformer_whatif.variants[0].compiled.out}" in out


@pytest.mark.libtpu
def test_a_compiler_option_and_the_same_libtpu_flag_compile_alike(libtpu, tmp_path):
    """The per-compile option path (`lowered.compile(compiler_options=...)`) reaches the compiler.

    On the small MLP fixture (three compiles, ~15 s): the scheduler off as a flag and as an option
    give the same scheduled HLO, and not the baseline's (its async all-gather becomes synchronous).
    """
    mlp = f"{REPO / 'tests' / 'compiler' / 'fixtures' / 'mlp_train.py'}:step"
    variants = plan_variants([f"{LHS}=false"], [f"{LHS}=false"], each=True)
    result = whatif(mlp, "v5e:2x2", variants, tmp_path, static_profile=False)
    flag, option = (v.compiled for v in result.variants)
    assert option.schedule_sha == flag.schedule_sha != result.baseline.schedule_sha
    assert result.baseline.async_collectives == 1 and flag.async_collectives == option.async_collectives == 0
    assert option.step_ps == flag.step_ps > result.baseline.step_ps


@pytest.mark.libtpu
def test_an_unknown_compiler_option_is_one_error_line(libtpu, tmp_path, capsys):
    from tpudiag.cli.app import main

    mlp = f"{REPO / 'tests' / 'compiler' / 'fixtures' / 'mlp_train.py'}:step"
    with pytest.raises(SystemExit) as info:
        main(["whatif", mlp, "-t", "v5e:2x2", "--option", "xla_no_such_option=1", "--no-static-profile",
              "-o", str(tmp_path)])
    assert info.value.code == 2
    assert "No such compile option: 'xla_no_such_option'" in capsys.readouterr().err
