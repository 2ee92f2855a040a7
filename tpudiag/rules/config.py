"""Rule configuration: which rules run and their options, from TOML and the command line.

Sources, first found wins: `--config FILE`; a `tpudiag.toml` next to the input (its directory or
any parent); a `pyproject.toml` with a `[tool.tpudiag]` table there; the same two files in the
working directory or its parents. Keys:

    [tool.tpudiag]                      # top level in tpudiag.toml
    select = ["exposed-collective", "TPD102"]   # names or codes; default: every rule
    ignore = ["padding-waste"]
    [tool.tpudiag.rules.exposed-collective]
    min_exposed_fraction = 0.2

Unknown keys, rule names or option names, NaN, infinite or negative thresholds, and a file that
does not parse are usage errors (exit 2) naming the file. A `pyproject.toml` found by the search
that does not parse is skipped with a warning: it belongs to the project, not to tpudiag.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tpudiag.errors import UsageError

if TYPE_CHECKING:
    from tpudiag.rules.base import Rule

TOP_KEYS = ("select", "ignore", "rules")
CONFIG_FILE = "tpudiag.toml"


@dataclass(frozen=True)
class RulesConfig:
    select: tuple[str, ...] | None = None  # rule names; None = every rule
    ignore: tuple[str, ...] = ()
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)  # rule name -> overrides
    source: str = ""  # the file it came from, "" for defaults
    warnings: tuple[str, ...] = ()  # config files skipped while searching (shown with the run's warnings)

    def resolve(self) -> list[tuple[Rule, Any]]:
        """(rule, options) for every selected, non-ignored rule, in registry order."""
        from tpudiag.rules.registry import RULES

        out = []
        for rule in RULES:
            if self.select is not None and rule.name not in self.select:
                continue
            if rule.name in self.ignore:
                continue
            try:
                options = rule.options_with(self.options.get(rule.name, {}))
            except (ValueError, TypeError) as exc:
                raise UsageError(str(exc), path=self.source or None,
                                 hint=f"see `tpudiag rule {rule.name}` for its options") from exc
            out.append((rule, options))
        return out

    def with_cli(self, select: Sequence[str] | None = None, ignore: Sequence[str] | None = None) -> RulesConfig:
        """Command-line `--select` replaces the file's selection; `--ignore` adds to its ignores."""
        new_select = _rule_names(select, "--select") if select else self.select
        new_ignore = self.ignore + _rule_names(ignore, "--ignore") if ignore else self.ignore
        return RulesConfig(new_select, new_ignore, self.options, self.source, self.warnings)


def split_names(values: Sequence[str] | None) -> list[str]:
    """`--select a,b --select c` -> [a, b, c]."""
    out = []
    for v in values or ():
        out.extend(p.strip() for p in v.split(",") if p.strip())
    return out


def _rule_names(values: Sequence[str] | None, where: str, source: str | None = None) -> tuple[str, ...]:
    from tpudiag.rules.registry import RULES, get_rule

    names = []
    for value in split_names(values):
        if value.upper() == "ALL":
            names.extend(r.name for r in RULES)
            continue
        rule = get_rule(value)
        if rule is None:
            raise UsageError(f"unknown rule `{value}` in {where}", path=source,
                             hint="`tpudiag rules` lists the rules")
        names.append(rule.name)
    return tuple(dict.fromkeys(names))


def parse_config(data: Mapping[str, Any], source: str = "") -> RulesConfig:
    """A `RulesConfig` from the `[tool.tpudiag]` table (or a tpudiag.toml's top level)."""
    from tpudiag.rules.registry import get_rule

    path = source or None
    unknown = [k for k in data if k not in TOP_KEYS]
    if unknown:
        raise UsageError(f"unknown key `{unknown[0]}` in the tpudiag config", path=path,
                         hint=f"known keys: {', '.join(TOP_KEYS)}")
    for key in ("select", "ignore"):
        value = data.get(key)
        if value is not None and not (isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise UsageError(f"`{key}` must be a list of rule names or codes", path=path)
    select = _rule_names(data["select"], "`select`", path) if "select" in data else None
    ignore = _rule_names(data.get("ignore", []), "`ignore`", path)
    rules = data.get("rules", {})
    if not isinstance(rules, Mapping):
        raise UsageError("`rules` must be a table of rule tables", path=path)
    options: dict[str, dict[str, Any]] = {}
    for key, table in rules.items():
        rule = get_rule(key)
        if rule is None:
            raise UsageError(f"unknown rule `{key}` in `rules`", path=path, hint="`tpudiag rules` lists the rules")
        if not isinstance(table, Mapping):
            raise UsageError(f"`rules.{key}` must be a table of options", path=path)
        try:
            rule.options_with(table)  # validate now, with the file named
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc), path=path, hint=f"see `tpudiag rule {rule.name}` for its options") from exc
        options.setdefault(rule.name, {}).update(table)
    return RulesConfig(select, ignore, options, source)


CONFIG_MAX_BYTES = 16 << 20  # a config is a few KB; the cap keeps `--config /dev/zero`-like mistakes cheap


def _read_toml(path: Path) -> dict[str, Any]:
    from tpudiag.errors import InputError
    from tpudiag.parsers.input_files import ReadLimits, read_input_bytes

    try:
        # A regular file, read with a cap: a FIFO or a link to a device given as `--config` would
        # otherwise block or never end.
        raw = read_input_bytes(path, ReadLimits(max_file_bytes=CONFIG_MAX_BYTES))
    except InputError as exc:
        if not os.path.lexists(path):
            raise UsageError("config file not found", path=path) from exc
        raise UsageError(f"cannot read config: {exc.message}", path=path) from exc
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise UsageError(f"invalid TOML: {exc}", path=path) from exc
    except UnicodeDecodeError as exc:
        raise UsageError(f"invalid TOML: not UTF-8 (byte {exc.start})", path=path) from exc
    except RecursionError as exc:  # tomllib recurses into nested arrays and inline tables
        raise UsageError("invalid TOML: nested too deeply", path=path) from exc


def load_file(path: Path) -> RulesConfig:
    """Read a config file: a pyproject.toml's `[tool.tpudiag]` table, or any other file's top level."""
    data = _read_toml(path)
    if path.name == "pyproject.toml":
        tool = data.get("tool", {})
        if not isinstance(tool, Mapping):
            raise UsageError("`tool` is not a table", path=path)
        table = tool.get("tpudiag")
        if table is None:
            raise UsageError("no `[tool.tpudiag]` table", path=path)
        data = table
    if not isinstance(data, Mapping):
        raise UsageError("the tpudiag config is not a table", path=path)
    return parse_config(data, str(path))


def _search_dirs(start: Path) -> list[Path]:
    start = start.resolve()
    return [start, *start.parents]


def find_config(input_path: Path | None, cwd: Path | None = None,
                warnings: list[str] | None = None) -> Path | None:
    """The config file that applies to `input_path`, or None; a skipped pyproject.toml is appended to
    `warnings` (when given) as one line naming it."""
    warnings = warnings if warnings is not None else []
    roots = []
    if input_path is not None:
        p = Path(input_path)
        roots.append(p if p.is_dir() else p.parent)
    roots.append(cwd if cwd is not None else Path.cwd())
    for root in roots:
        for d in _search_dirs(root):
            candidate = d / CONFIG_FILE
            if candidate.is_file():
                return candidate
            pyproject = d / "pyproject.toml"
            if pyproject.is_file():
                # A project's own pyproject.toml, found by walking up: when it does not parse, it is
                # not ours to fail on. Skip it with a warning; `--config` names a file and fails hard.
                try:
                    data = _read_toml(pyproject)
                except UsageError as exc:
                    warnings.append(f"config: skipped {exc.one_line()}")
                    continue
                tool = data.get("tool", {})
                if not isinstance(tool, Mapping):
                    warnings.append(f"config: skipped `{pyproject}`: `tool` is not a table")
                    continue
                if "tpudiag" in tool:
                    return pyproject
    return None


def load_config(input_path: Path | None = None, config_file: Path | None = None,
                cwd: Path | None = None) -> RulesConfig:
    """The configuration for a run: `config_file` when given, else the one found, else defaults.

    It prints nothing: a pyproject.toml skipped on the way is in the result's `warnings`, which
    `tpudiag.pipeline.diagnose` returns with the run's other warnings.
    """
    if config_file is not None:
        return load_file(Path(config_file))
    skipped: list[str] = []
    found = find_config(input_path, cwd, skipped)
    config = load_file(found) if found is not None else RulesConfig()
    return replace(config, warnings=tuple(dict.fromkeys(skipped)))
