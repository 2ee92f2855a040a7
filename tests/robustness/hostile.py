"""Captures whose trace text attacks the terminal, markdown and rich markup, built with the writers."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import US, small_design
from tpudiag.writers.tpu_design import OpDef, Placed, build_capture

# Each piece attacks one output: an OSC window-title change, an OSC 8 hyperlink, a CSI clear screen,
# a C1 CSI, a right-to-left override, rich markup that does not parse, markdown HTML and an image.
TITLE = "\x1b]0;pwned\x07"
LINK = "\x1b]8;;http://evil\x1b\\click\x1b]8;;\x1b\\"
CLEAR = "\x1b[2J"
C1 = "\x9b31m"
BIDI = "\u202egnp.exe"
MARKUP = "[/x]"
HTML = "<img src=x onerror=alert(1)>![i](http://evil/i.png)"

OP = f"fusion.1{TITLE}{CLEAR}{MARKUP}{HTML}"
OP2 = f"copy.7{LINK}{C1}{BIDI}"
HOST = f"host{MARKUP}{TITLE}"
DEVICE = f"TPU v6 Lite{CLEAR}"
FILE_HOST = f"host{TITLE}{BIDI}"
MODULE = f"jit_step{BIDI}[/bold]"

# What must never reach a terminal or a file raw.
RAW = ("\x1b", "\x07", "\x9b", "\u202e")


def hostile_design(**overrides):
    ops = (OpDef(OP, "convolution fusion", flops=1.0e12, bytes_accessed=1.0e9, shape="bf16[1024,1024]{1,0}",
                 source=f"model.py:3 {TITLE}", tf_op=f"jit(step)/{HTML}`{LINK}"),  # a matmul-like fusion: most of the step
           OpDef(OP2, "copy", bytes_accessed=1.0e8))  # a small copy after it
    fields = dict(hostname=HOST, device_type=DEVICE, module=MODULE, ops=ops, n_chips=1, n_steps=4,
                  step_ps=5000 * US,
                  schedule=lambda chip, step: [Placed(OP, 0, 3000 * US), Placed(OP2, 3100 * US, 400 * US)])
    fields.update(overrides)
    return small_design(**fields)


def write_hostile(root: Path, **overrides) -> Path:
    """A logdir run holding one hostile host file; returns the run directory."""
    run = root / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00"
    # The host name in the trace holds `/`; the file name cannot, so it carries the other attacks.
    build_capture(hostile_design(**overrides)).write(run / f"{FILE_HOST}.xplane.pb")
    return run


def assert_inert(text: str) -> None:
    """No raw control, C1 or bidi character: each attack shows as a visible escape."""
    for raw in RAW:
        assert raw not in text, f"raw {raw!r} in output"
