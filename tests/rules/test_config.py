"""Rule configuration from TOML: discovery, selection, per-rule options and clean usage errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from tpudiag.errors import UsageError
from tpudiag.rules import RULES
from tpudiag.rules.config import RulesConfig, find_config, load_config, parse_config


def test_options_and_selection_from_a_pyproject(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.tpudiag]\nselect = ["exposed-collective", "TPD102"]\n'
        'ignore = ["low-mxu-utilization"]\n\n'
        "[tool.tpudiag.rules.exposed-collective]\nmin_exposed_fraction = 0.2\n")
    capture = tmp_path / "logdir"
    capture.mkdir()
    config = load_config(capture, cwd=tmp_path)
    assert config.source == str(tmp_path / "pyproject.toml")
    resolved = config.resolve()
    assert [r.name for r, _ in resolved] == ["exposed-collective"]
    assert resolved[0][1].min_exposed_fraction == 0.2


def test_tpudiag_toml_next_to_the_input_wins_over_the_working_directory(tmp_path: Path):
    run = tmp_path / "captures" / "run"
    run.mkdir(parents=True)
    (tmp_path / "captures" / "tpudiag.toml").write_text('ignore = ["spill"]\n')
    (tmp_path / "pyproject.toml").write_text('[tool.tpudiag]\nignore = ["padding-waste"]\n')
    assert find_config(run, cwd=tmp_path) == tmp_path / "captures" / "tpudiag.toml"
    assert load_config(run, cwd=tmp_path).ignore == ("spill",)


def test_no_config_means_every_rule_with_defaults(tmp_path: Path):
    config = load_config(tmp_path, cwd=tmp_path)
    assert config == RulesConfig()
    assert len(config.resolve()) == len(RULES)


def test_pyproject_without_a_tpudiag_table_is_not_a_config(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    assert find_config(tmp_path, cwd=tmp_path) is None


@pytest.mark.parametrize(("text", "message"), [
    ('colour = "red"\n', "unknown key `colour`"),
    ('select = ["no-such-rule"]\n', "unknown rule `no-such-rule` in `select`"),
    ('[rules.exposed-collective]\nmin_exposed_fractoin = 0.2\n', "unknown option `min_exposed_fractoin`"),
    ('[rules.exposed-collective]\nmin_exposed_fraction = "high"\n', "must be float"),
    ('[rules.exposed-collective]\nhidden_threshold = 0.05\n', "thresholds must satisfy"),
    ('[rules.nope]\nx = 1\n', "unknown rule `nope` in `rules`"),
    ('select = "exposed-collective"\n', "must be a list"),
    ("select = [\n", "invalid TOML"),
])
def test_bad_configs_are_usage_errors(tmp_path: Path, text: str, message: str):
    path = tmp_path / "tpudiag.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        load_config(config_file=path)
    assert info.value.exit_code == 2 and info.value.path == str(path)


def test_command_line_select_replaces_and_ignore_adds():
    config = parse_config({"select": ["TPD101", "TPD102"], "ignore": ["TPD104"]})
    cli = config.with_cli(select=["low-mxu-utilization,padding-waste"], ignore=["padding-waste"])
    assert [r.name for r, _ in cli.resolve()] == ["low-mxu-utilization"]
    with pytest.raises(UsageError, match="unknown rule `bogus` in --select"):
        config.with_cli(select=["bogus"])


def test_integer_options_accept_integral_floats_only():
    config = parse_config({"rules": {"low-mxu-utilization": {"max_findings": 3.0}}})
    assert config.resolve()[1][1].max_findings == 3
    with pytest.raises(UsageError, match="must be int"):
        parse_config({"rules": {"low-mxu-utilization": {"max_findings": 2.5}}})


@pytest.mark.parametrize(("text", "message"), [
    ('[project]\nname = "x"\n', "no `\\[tool.tpudiag\\]` table"),   # no tool table at all
    ('[tool.black]\nline-length = 1\n', "no `\\[tool.tpudiag\\]` table"),
    ('tool = "x"\n', "`tool` is not a table"),
    ('[tool]\ntpudiag = 3\n', "the tpudiag config is not a table"),
])
def test_a_named_pyproject_must_hold_a_tpudiag_table(tmp_path: Path, text: str, message: str):
    path = tmp_path / "pyproject.toml"
    path.write_text(text)
    with pytest.raises(UsageError, match=message) as info:
        load_config(config_file=path)
    assert info.value.exit_code == 2 and info.value.path == str(path)
    assert str(info.value) == message.replace("\\", "")  # the whole message, not only a part of it


@pytest.mark.parametrize(("data", "message", "hint"), [
    ({"colour": 1}, "unknown key `colour` in the tpudiag config", "known keys: select, ignore, rules"),
    ({"ignore": "exposed-collective"}, "`ignore` must be a list of rule names or codes", None),
    ({"ignore": ["no-such-rule"]}, "unknown rule `no-such-rule` in `ignore`", None),
    ({"rules": 3}, "`rules` must be a table of rule tables", None),
    ({"rules": {"nope": {}}}, "unknown rule `nope` in `rules`", "`tpudiag rules` lists the rules"),
    ({"rules": {"exposed-collective": 3}}, "`rules.exposed-collective` must be a table of options", None),
    ({"rules": {"exposed-collective": {"min_exposed_fraction": "high"}}}, "must be float",
     "see `tpudiag rule exposed-collective` for its options"),
])
def test_each_config_error_names_the_file_and_its_hint(data, message, hint):
    from tpudiag.rules.config import parse_config
    with pytest.raises(UsageError) as info:
        parse_config(data, "team.toml")
    assert message in str(info.value) and info.value.path == "team.toml"
    if message != "must be float":  # the whole line as printed, not only a part of it
        assert str(info.value) == message
    if hint is not None:
        assert info.value.hint == hint


def test_ignore_is_read_and_defaults_to_nothing():
    from tpudiag.rules.config import parse_config
    with pytest.raises(UsageError) as info:
        parse_config({"colour": 1})
    assert info.value.path is None  # no source given: no file named
    assert parse_config({}).ignore == ()
    assert parse_config({"ignore": ["exposed-collective"]}).ignore == ("exposed-collective",)


# -- the search, the file reader and the command line, each message whole ---------------------------

def test_a_pyproject_that_does_not_parse_is_skipped_with_a_warning_and_the_search_goes_on(tmp_path: Path):
    # The project's own pyproject.toml (broken) sits between the input and a tpudiag.toml further up.
    (tmp_path / "tpudiag.toml").write_text('ignore = ["spill"]\n')
    project = tmp_path / "project"
    (project / "run").mkdir(parents=True)
    (project / "pyproject.toml").write_text("[tool\n")
    warnings: list[str] = []
    assert find_config(project / "run", cwd=tmp_path, warnings=warnings) == tmp_path / "tpudiag.toml"
    [warning] = warnings
    assert warning.startswith(f"config: skipped `{project / 'pyproject.toml'}`: invalid TOML: ")
    # load_config keeps the warning (once, though the input's and the working directory's searches both meet it).
    config = load_config(project / "run", cwd=project)
    assert config.ignore == ("spill",) and config.warnings == (warning,)


def test_a_pyproject_whose_tool_is_not_a_table_is_skipped(tmp_path: Path):
    (tmp_path / "pyproject.toml").write_text('tool = 3\n')
    warnings: list[str] = []
    assert find_config(tmp_path, cwd=tmp_path, warnings=warnings) is None
    assert warnings == [f"config: skipped `{tmp_path / 'pyproject.toml'}`: `tool` is not a table"] * 2
    assert find_config(tmp_path, cwd=tmp_path) is None  # no list given: nothing to append to


def test_a_file_as_input_is_searched_from_its_directory(tmp_path: Path):
    (tmp_path / "tpudiag.toml").write_text("")
    trace = tmp_path / "host0.xplane.pb"
    trace.write_bytes(b"")
    elsewhere = tmp_path.parent
    assert find_config(trace, cwd=elsewhere) == tmp_path / "tpudiag.toml"
    assert find_config(None, cwd=tmp_path) == tmp_path / "tpudiag.toml"


@pytest.mark.parametrize(("content", "message"), [
    (b"select = [\xff]\n", "invalid TOML: not UTF-8 (byte 10)"),
    (b"x = " + b"[" * 2000 + b"]" * 2000 + b"\n", "invalid TOML: nested too deeply"),
])
def test_unreadable_toml_is_a_usage_error_naming_the_file(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "tpudiag.toml"
    path.write_bytes(content)
    with pytest.raises(UsageError) as info:
        load_config(config_file=path)
    assert str(info.value) == message and info.value.path == str(path)


def test_a_missing_or_unreadable_config_file(tmp_path: Path):
    with pytest.raises(UsageError) as info:
        load_config(config_file=tmp_path / "nope.toml")
    assert str(info.value) == "config file not found" and info.value.path == str(tmp_path / "nope.toml")
    with pytest.raises(UsageError) as info:
        load_config(config_file=tmp_path)  # a directory
    assert str(info.value).startswith("cannot read config: ") and info.value.path == str(tmp_path)


def test_a_config_with_only_options_names_no_rule_and_keeps_the_rest():
    config = parse_config({"rules": {"TPD101": {"min_exposed_fraction": 0.2}}}, "team.toml")
    assert config.select is None and config.ignore == () and config.source == "team.toml"
    # A code names the rule: its options are keyed by the rule's name.
    assert config.options == {"exposed-collective": {"min_exposed_fraction": 0.2}}


def test_the_command_line_expands_all_splits_commas_and_drops_repeats():
    from tpudiag.rules.config import split_names

    assert split_names(["a, b", " ,c", ""]) == ["a", "b", "c"]
    assert split_names(None) == []
    every = RulesConfig().with_cli(select=["ALL"])
    assert every.select == tuple(r.name for r in RULES)
    config = RulesConfig(ignore=("spill",), options={"spill": {}}, source="t.toml", warnings=("w",))
    cli = config.with_cli(select=["TPD101,exposed-collective"], ignore=["tpd104", "padding-waste"])
    assert cli == RulesConfig(("exposed-collective",), ("spill", "spill", "padding-waste"), {"spill": {}}, "t.toml",
                              ("w",))
    assert config.with_cli() == config


def test_an_option_refused_at_resolve_names_the_config_file_and_the_rule():
    with pytest.raises(UsageError) as info:
        RulesConfig(options={"spill": {"min_spills": 0}}, source="team.toml").resolve()
    assert str(info.value) == "min_spills must be at least 1, got 0"
    assert info.value.path == "team.toml" and info.value.hint == "see `tpudiag rule spill` for its options"
    with pytest.raises(UsageError) as info:
        RulesConfig(options={"spill": {"min_spills": 0}}).resolve()
    assert info.value.path is None


def test_an_ignored_rule_leaves_the_rules_after_it():
    # exposed-collective is the registry's first rule: ignoring it keeps every other, in registry order.
    assert [r.name for r, _ in RulesConfig(ignore=("exposed-collective",)).resolve()] == [
        r.name for r in RULES if r.name != "exposed-collective"]
