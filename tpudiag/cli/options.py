"""Option types shared by several commands."""

from __future__ import annotations

from enum import Enum

from tpudiag.model.hardware import CHIP_NAMES

SCHEDULER_HELP = ("Dask distributed scheduler address (e.g. tcp://10.0.0.5:8786): parse the hosts as tasks on "
                  "that cluster, whose workers read the files themselves (a shared filesystem or a URL)")


# `--chip`: the TPU generation, where the files do not say it; its choices are the one list of names.
Chip = Enum("Chip", {name: name for name in CHIP_NAMES}, type=str)


class Format(str, Enum):
    """`--format`: every command's output formats; `tpudiag.cli.outputs.emit` writes each."""

    terminal = "terminal"
    json = "json"
    md = "md"


def format_choices(*formats: Format) -> type[Enum]:
    """The `--format` type of a command offering only `formats`, so its help lists and typer checks
    exactly those; its values are `Format` values (`Format(choice)`)."""
    return Enum("Format", {f.name: f.value for f in formats}, type=str)


TerminalOrJson = format_choices(Format.terminal, Format.json)
