"""`tpudiag whatif`: a flag's modelled effect from deviceless compiles.

The libtpu tests share one `whatif()` run on the bundled transformer for v5e:2x2 (three compiles
with the static profile, as the CLI runs it: the session fixture `transformer_whatif` in
tests/conftest.py, shared with tests/analysis/test_diff_recompile.py): the baseline, the
latency-hiding scheduler off (measured here to change the schedule: v5e's async all-gather pairs
become synchronous and the modelled step grows), and the scheduler on, the default (identical
flags: an identical compile and model). Two more on the small MLP fixture check the compiler-option
path: an option and the same libtpu flag compile alike, and an unknown option is one error line.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.cli_util import run_tpudiag
from tests.conftest import REPO, require_libtpu
from tpudiag.render.whatif import render_whatif_terminal, whatif_json
from tpudiag.compiler.driver import compiler_error_line, worker_env
from tpudiag.compiler.flags import LIBTPU, XLA, FlagRegistry
from tpudiag.errors import InputError, UsageError
from tpudiag.rules.exposed_collective import ASYNC_FLAGS, whatif_hint
from tpudiag.whatif import Variant, parse_setting, plan_variants, whatif

LHS = "xla_tpu_enable_latency_hiding_scheduler"
# A registry written by hand, for the routing logic alone (the real one is tested with libtpu below):
# libtpu registers `xla_enable_async_all_reduce` although its name has no `xla_tpu_` prefix.
REGISTRY = FlagRegistry(libtpu=frozenset({LHS, "xla_enable_async_all_reduce", "xla_tpu_detect_nan"}),
                        xla=frozenset({"xla_disable_hlo_passes", "xla_tpu_detect_nan"}), versions="test")


def test_settings_are_routed_to_libtpu_xla_flags_or_compiler_options():
    (variant,) = plan_variants([f"--{LHS}=false", "xla_disable_hlo_passes=foo", "xla_enable_async_all_reduce=true"],
                               ["xla_tpu_x=3"], registry=REGISTRY)
    assert variant.libtpu_flags == (f"--{LHS}=false", "--xla_enable_async_all_reduce=true")
    assert variant.xla_flags == ("--xla_disable_hlo_passes=foo",)
    assert variant.compiler_options == {"xla_tpu_x": 3}
    assert variant.label == (f"--xla-flag {LHS}=false (LIBTPU_INIT_ARGS) --xla-flag xla_disable_hlo_passes=foo "
                             "(XLA_FLAGS) --xla-flag xla_enable_async_all_reduce=true (LIBTPU_INIT_ARGS) "
                             "--option xla_tpu_x=3 (compiler_options)")
    each = plan_variants([f"{LHS}=false", f"{LHS}=true"], [], each=True, registry=REGISTRY)
    assert [v.libtpu_flags for v in each] == [(f"--{LHS}=false",), (f"--{LHS}=true",)]


def test_a_flag_both_register_goes_to_libtpu_and_one_neither_does_is_a_usage_error():
    assert REGISTRY.destination("xla_tpu_detect_nan") is REGISTRY.destination(LHS)
    assert REGISTRY.destination("xla_tpu_detect_nan").value == LIBTPU
    assert REGISTRY.destination("xla_disable_hlo_passes").value == XLA
    with pytest.raises(UsageError, match="`xla_tpu_no_such_flag`: neither libtpu nor XLA registers"):
        plan_variants(["xla_tpu_no_such_flag=1"], [], registry=REGISTRY)


@pytest.mark.parametrize("text", [
    f"{LHS}=false --xla_jf_dump_to=/elsewhere",  # issue 33: the second flag wrote the LLO dump outside -o
    f"{LHS}=false\t--xla_jf_dump_to=/elsewhere",
    f"{LHS}=a--b",
    f"{LHS}=x\ny",
])
def test_a_flag_is_one_flag(text):
    with pytest.raises(UsageError, match="would pass more than one flag"):
        plan_variants([text], [], registry=REGISTRY)
    with pytest.raises(UsageError, match="would pass more than one flag"):
        plan_variants([], [text])


@pytest.mark.parametrize(("flags", "options"), [(["xla_jf_dump_to=/elsewhere"], []), (["xla_dump_hlo_as_text=true"], []),
                                                ([], ["xla_dump_to=/elsewhere"]), (["XLA_MOSAIC_DUMP_TO=/x"], [])])
def test_a_setting_of_the_dumps_is_refused(flags, options):
    with pytest.raises(UsageError, match="sets the dumps of every compile itself"):
        plan_variants(flags, options, registry=REGISTRY)


def test_a_flag_value_with_ordinary_punctuation_is_one_flag():
    (variant,) = plan_variants(["xla_disable_hlo_passes=a,b-c.d=e"], [], registry=REGISTRY)
    assert variant.xla_flags == ("--xla_disable_hlo_passes=a,b-c.d=e",)


def _run(tmp_path, name: str, dump_options: list[str], dumps: tuple[str, ...]):
    from types import SimpleNamespace

    out = tmp_path / name
    for d in dumps:
        (out / d).mkdir(parents=True)
        (out / d / "f.txt").write_text("x")
    return SimpleNamespace(out=out, facts={"dump_options": dump_options})


def test_variants_dumped_otherwise_than_the_baseline_are_not_compared(tmp_path):
    from tpudiag.whatif import check_same_dumps

    opts = ["--xla_dump_to=<out>/xla", "--xla_jf_dump_to=<out>/llo"]
    base = _run(tmp_path, "baseline", opts, ("xla", "llo"))
    check_same_dumps(base, _run(tmp_path, "same", opts, ("xla", "llo")), "variant 1")  # near miss: equal
    with pytest.raises(InputError, match="other dump options than the baseline"):
        check_same_dumps(base, _run(tmp_path, "other-opts", opts[:1], ("xla", "llo")), "variant 1")
    with pytest.raises(InputError, match=r"holds other dumps than the baseline \(xla against xla, llo\)"):
        check_same_dumps(base, _run(tmp_path, "no-llo", opts, ("xla",)), "variant 2")


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
        plan_variants(flags, options, each, registry=REGISTRY)


def test_whatif_command_usage_errors_cost_no_compile():
    for args, message in ((["x.py:f", "-t", "v5e:2x2"], "nothing to compare"),
                          (["x.py:f", "-t", "v9:2x2", "--xla-flag", "a=1"], "unknown TPU generation"),
                          (["nocolon", "-t", "v5e:2x2", "--xla-flag", "a=1"], "MODULE:FUNCTION")):
        proc = run_tpudiag("whatif", *args)
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
    names = frozenset(f.split("=")[0] for f in flags)  # where libtpu registers them: tested with libtpu below
    (variant,) = plan_variants(flags, [], registry=FlagRegistry(libtpu=names, xla=frozenset()))
    assert variant.libtpu_flags == tuple(ASYNC_FLAGS.split())  # exactly the flags the fix proposes
    from tpudiag.compiler.topology import parse_topology

    assert parse_topology(command[4]).generation == generation


# --- real compiles ---


@pytest.fixture(scope="module")
def libtpu():
    require_libtpu()


@pytest.mark.libtpu
def test_the_scheduler_off_changes_the_schedule_and_the_modelled_step(transformer_whatif):
    base, off = transformer_whatif.baseline, transformer_whatif.variants[0]
    assert off.variant == Variant((parse_setting(f"{LHS}=false", "xla-flag", REGISTRY),))
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
    variants = plan_variants([f"{LHS}=false"], [f"{LHS}=false"], each=True, registry=REGISTRY)
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


# --- the real registries (libtpu): listed once per test session into a temporary cache ---


@pytest.fixture(scope="session")
def flag_cache(tmp_path_factory):
    require_libtpu()
    cache = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TPUDIAG_CACHE_DIR", str(cache))
        yield cache


@pytest.fixture(scope="session")
def registry(flag_cache):
    from tpudiag.compiler.flags import flag_registry

    return flag_registry()


@pytest.mark.libtpu
def test_the_registries_are_libtpus_and_xlas_and_cached(registry, flag_cache):
    from tpudiag.compiler.flags import flag_registry

    # libtpu 0.0.42.1 / jaxlib 0.10.2 list 1,356 and 311 names; other versions move them a little.
    assert len(registry.libtpu) > 1000 and len(registry.xla) > 200
    assert registry.destination("xla_enable_async_all_reduce").value == LIBTPU  # issue 35: XLA_FLAGS rejects it
    assert registry.destination(LHS).value == LIBTPU
    assert registry.destination("xla_dump_hlo_as_text").value == XLA
    assert registry.destination("xla_tpu_no_such_flag") is None
    assert list(flag_cache.glob("flags-jaxlib-*-libtpu-*.json"))
    assert flag_registry() == registry  # read back from the cache


@pytest.mark.libtpu
def test_every_flag_tpudiag_sets_itself_is_registered_where_it_puts_it(registry, tmp_path):
    from tpudiag.cli.run_cmd import child_env
    from tpudiag.compiler.driver import libtpu_flags

    def names(flags: str) -> set[str]:
        return {f.removeprefix("--").split("=")[0] for f in flags.split()}

    for name in names(ASYNC_FLAGS) | names(" ".join(libtpu_flags(tmp_path, True))):
        assert registry.destination(name).value == LIBTPU, name
    env, _, _ = child_env({}, tmp_path, tmp_path, tpu=True)
    for name in names(env[LIBTPU]) - names(os.environ.get(LIBTPU, "")):
        assert registry.destination(name).value == LIBTPU, name
    for name in names(env[XLA]) - names(os.environ.get(XLA, "")):
        assert registry.destination(name).value == XLA, name


@pytest.mark.libtpu
def test_a_libtpu_flag_without_the_tpu_prefix_compiles(flag_cache, tmp_path, capsys):
    """Issue 35: `--xla-flag xla_enable_async_all_reduce=true` went to XLA_FLAGS and failed with
    `Unknown flag in XLA_FLAGS`; routed to LIBTPU_INIT_ARGS it compiles (the small MLP, ~15 s)."""
    import json

    from tpudiag.cli.app import main

    mlp = f"{REPO / 'tests' / 'compiler' / 'fixtures' / 'mlp_train.py'}:step"
    with pytest.raises(SystemExit) as info:
        main(["whatif", mlp, "-t", "v5e:2x2", "--xla-flag", "xla_enable_async_all_reduce=true",
              "--no-static-profile", "-o", str(tmp_path), "--format", "json"])
    captured = capsys.readouterr()
    assert info.value.code == 0, captured.err
    assert "--xla-flag xla_enable_async_all_reduce=true (LIBTPU_INIT_ARGS)" in captured.err
    doc = json.loads(captured.out)
    assert doc["variants"][0]["goes_to"] == [LIBTPU]
    facts = json.loads((tmp_path / "variant-1" / "result.json").read_text())
    assert facts["libtpu_flags"] == ["--xla_enable_async_all_reduce=true"] and facts["xla_flags"] == []
    assert facts["dump_options"] == json.loads((tmp_path / "baseline" / "result.json").read_text())["dump_options"]


@pytest.mark.libtpu
def test_a_flag_neither_registers_is_one_line_exit_2(flag_cache, capsys):
    from tpudiag.cli.app import main

    with pytest.raises(SystemExit) as info:
        main(["whatif", "x.py:f", "-t", "v5e:2x2", "--xla-flag", "xla_tpu_no_such_flag=1"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "`xla_tpu_no_such_flag`: neither libtpu nor XLA registers this flag" in err


@pytest.mark.libtpu
def test_compile_routes_its_xla_flags_as_run_and_whatif_do(flag_cache, tmp_path, capsys):
    """`compile --xla-flag` goes where the flag is registered (here LIBTPU_INIT_ARGS, where XLA_FLAGS
    would refuse it) and says so; the compile records it among its libtpu flags."""
    import json

    from tpudiag.cli.app import main

    mlp = f"{REPO / 'tests' / 'compiler' / 'fixtures' / 'mlp_train.py'}:step"
    with pytest.raises(SystemExit) as info:
        main(["compile", mlp, "-t", "v5e:2x2", "--xla-flag", "xla_enable_async_all_reduce=true",
              "--no-static-profile", "-o", str(tmp_path / "out"), "--format", "json"])
    captured = capsys.readouterr()
    assert info.value.code == 0, captured.err
    assert f"--xla_enable_async_all_reduce=true goes to {LIBTPU}" in captured.err
    facts = json.loads((tmp_path / "out" / "result.json").read_text())
    assert facts["libtpu_flags"] == ["--xla_enable_async_all_reduce=true"] and facts["xla_flags"] == []


def test_compile_refuses_a_dump_flag_it_sets_itself(capsys):
    from tpudiag.cli.app import main

    with pytest.raises(SystemExit) as info:
        main(["compile", "x.py:f", "-t", "v5e:2x2", "--xla-flag", "xla_dump_to=/tmp/x"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert "`compile` sets the dumps it joins to the report itself" in err
