"""The checks on the arguments of `tpudiag.diagnose()`, `compare()`, `profile()` and `gate()`, in one place.

A notebook caller gets a `UsageError` with one sentence naming the argument, what it takes and
what it got, instead of an AttributeError or TypeError from deep inside the pipeline (or, worse,
a silent misreading: a string `dumps=` iterated one character at a time). The command line's
own options arrive here too, already typed by typer, so the same checks hold for both.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterable
from pathlib import Path

from tpudiag.errors import UsageError
from tpudiag.model.hardware import CHIP_NAMES, ChipSpec, chip_for


def _got(value: object) -> str:
    """What the caller passed, short: its repr for small values, its type otherwise."""
    text = repr(value)
    return text if len(text) <= 40 else f"a {type(value).__name__}"


def check_chip(chip: object) -> ChipSpec | None:
    """`chip=` as a ChipSpec: None, a ChipSpec, or one of `CHIP_NAMES` (any case)."""
    if chip is None or isinstance(chip, ChipSpec):
        return chip
    if not isinstance(chip, str):
        raise UsageError(f"chip must be a TPU generation name or a ChipSpec, got {_got(chip)}",
                         hint=f"use one of {', '.join(CHIP_NAMES)}")
    spec = chip_for(chip) if chip.lower() in CHIP_NAMES else None
    if spec is None:
        raise UsageError(f"--chip: unknown TPU generation `{chip}`", hint=f"use one of {', '.join(CHIP_NAMES)}")
    return spec


def check_jobs(jobs: object) -> int | None:
    """`jobs=`: None (every CPU) or a whole number of processes, at least 1."""
    if jobs is None:
        return None
    if isinstance(jobs, bool) or not isinstance(jobs, numbers.Integral):
        raise UsageError(f"jobs must be a whole number of processes, got {_got(jobs)}")
    if jobs < 1:
        raise UsageError(f"jobs must be at least 1, got {jobs}")
    return int(jobs)


def check_progress(progress: object) -> Callable[[str], None] | None:
    """`progress=`: None or a callable taking one string."""
    if progress is not None and not callable(progress):
        raise UsageError(f"progress must be a function taking one string, got {_got(progress)}")
    return progress  # type: ignore[return-value]


def check_clock_ghz(clock_ghz: object) -> float | None:
    """`clock_ghz=`: None or a positive, finite number of GHz."""
    if clock_ghz is None:
        return None
    if isinstance(clock_ghz, bool) or not isinstance(clock_ghz, numbers.Real):
        raise UsageError(f"clock_ghz must be a number of GHz, got {_got(clock_ghz)}")
    value = float(clock_ghz)
    if not math.isfinite(value) or value <= 0:
        raise UsageError(f"clock_ghz must be a positive, finite number of GHz, got {value!r}")
    return value


def _is_path(value: object) -> bool:
    return isinstance(value, (str, os.PathLike))


def check_path(path: object, name: str = "path") -> object:
    """An input path: None (the bundled example), a str (a path or a URL) or a PathLike."""
    if path is not None and not _is_path(path):
        raise UsageError(f"{name} must be a path or a URL, got {_got(path)}")
    return path


def check_dumps(dumps: object, name: str = "dumps") -> list[Path]:
    """`dumps=`: one path (a str or PathLike is one path, never its characters) or an iterable of paths."""
    if dumps is None:
        return []
    if _is_path(dumps):
        return [Path(dumps)]  # type: ignore[arg-type]
    if isinstance(dumps, (bytes, bytearray)) or not isinstance(dumps, Iterable):
        raise UsageError(f"{name} must be a path or an iterable of paths, got {_got(dumps)}")
    items = list(dumps)
    for item in items:
        if not _is_path(item):
            raise UsageError(f"{name} must be a path or an iterable of paths; one item is {_got(item)}")
    return [Path(d) for d in items]


def check_config(config: object, rules_config_type: type) -> object:
    """`config=`: None (the file beside the input), a path to a rule configuration (TOML), or a
    `RulesConfig` (its type passed in: rules sit above this layer)."""
    if config is None or _is_path(config) or isinstance(config, rules_config_type):
        return config
    raise UsageError(f"config must be a path to a rule configuration (TOML) or a RulesConfig, got {_got(config)}",
                     hint="build one with `tpudiag.rules.load_config(None, path)`, or pass the file's path")


def check_rule_names(value: object, name: str) -> list[str] | None:
    """`select=` / `ignore=`: None, one rule name or code, or an iterable of them (a str is one name)."""
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise UsageError(f"{name} must be a rule name or code, or a list of them, got {_got(value)}")
    items = list(value)
    for item in items:
        if not isinstance(item, str):
            raise UsageError(f"{name} must be a rule name or code, or a list of them; one item is {_got(item)}")
    return items


def check_error_text(error: object) -> str | None:
    """`error=`: None or the text of JAX's out-of-memory error (a str)."""
    if error is None or isinstance(error, str):
        return error
    raise UsageError(f"error must be the text of JAX's error (a str), got {_got(error)}",
                     hint="decode bytes first: `data.decode(errors='replace')`" if isinstance(error, bytes) else None)


def check_scheduler(scheduler: object) -> object:
    """`scheduler=`: None, a Dask scheduler address (a str) or a `distributed.Client` (it submits tasks)."""
    if scheduler is None or isinstance(scheduler, str) or callable(getattr(scheduler, "submit", None)):
        return scheduler
    raise UsageError(f"scheduler must be a Dask scheduler address (`tcp://host:8786`) or a distributed.Client, "
                     f"got {_got(scheduler)}")


def check_instance(value: object, name: str, kind: type, what: str) -> object:
    """`name=`: None or an instance of `kind` (described as `what`)."""
    if value is None or isinstance(value, kind):
        return value
    raise UsageError(f"{name} must be {what}, got {_got(value)}")


def check_flag(value: object, name: str) -> bool:
    """`name=`: True or False."""
    if not isinstance(value, bool):
        raise UsageError(f"{name} must be True or False, got {_got(value)}")
    return value


def check_number(value: object, name: str, positive: bool = False) -> float | None:
    """`name=`: None or a finite number, at least 0 (above 0 when `positive`)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise UsageError(f"{name} must be a number, got {_got(value)}")
    result = float(value)
    if not math.isfinite(result) or result < 0 or (positive and result == 0):
        raise UsageError(f"{name} must be a finite number {'above' if positive else 'at least'} 0, got {result!r}")
    return result


def check_keywords(given: Iterable[str], known: Iterable[str], where: str) -> None:
    """Keyword arguments forwarded to `where`: each must be one it takes (checked at the call,
    not when the forwarded call runs, after a block of the caller's code)."""
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise UsageError(f"unknown keyword argument{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(f'`{k}`' for k in unknown)} for {where}",
                         hint=f"it takes {', '.join(sorted(known))}")
