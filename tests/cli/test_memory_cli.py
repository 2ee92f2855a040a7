"""`tpudiag memory` and `--error` as a user runs them: the bundled example, the JSON contract,
an OOM dump with its error on stdin, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.memory_dumps import write_adam_dump

OOM_TEXT = ("jax.errors.JaxRuntimeError: RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required "
            "for HLO temporaries (17.00G) exceeds available HBM (15.75G).\n")
PROGRAM_KEYS = {"module", "path", "generation", "hbm_capacity_bytes", "hbm_usable_bytes", "usable_source",
                "hbm_peak_bytes", "does_not_fit", "oom_recorded", "compiler_peak_bytes", "error", "spaces", "levers"}
SPACE_KEYS = {"space", "color", "peak_bytes", "argument_bytes", "output_bytes", "temp_bytes", "constant_bytes",
              "alias_bytes", "peak_position", "live_at_peak"}
BUFFER_KEYS = {"name", "instruction", "kind", "size_bytes", "logical_bytes", "shape", "op_name", "source_file",
               "source_line"}


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "tpudiag", *args], capture_output=True, text=True, timeout=300,
                          input=stdin, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "140"})


def test_memory_runs_on_the_bundled_example():
    out = run("memory")
    assert out.returncode == 0, out.stderr
    assert "jit_train_step" in out.stdout and "Live in HBM at the peak" in out.stdout
    assert "memory_analysis() peak" in out.stdout  # the compile's result.json beside the dump


def test_json_contract_and_the_peak_equals_the_memory_usage_report():
    doc = json.loads(run("memory", "--format", "json").stdout)
    [program] = doc["programs"]
    assert PROGRAM_KEYS <= set(program)
    hbm = next(s for s in program["spaces"] if s["space"] == "hbm")
    assert SPACE_KEYS <= set(hbm) and BUFFER_KEYS <= set(hbm["live_at_peak"][0])
    # The compiler's own memory-usage report of this dump: `Total bytes: 3180032`.
    assert hbm["peak_bytes"] == hbm["reported_total_bytes"] == 3_180_032
    assert hbm["peak_bytes"] == (hbm["argument_bytes"] + hbm["output_bytes"] + hbm["temp_bytes"]
                                 + hbm["constant_bytes"])


def test_oom_dump_with_the_error_on_stdin(tmp_path):
    dump = write_adam_dump(tmp_path / "oom", layers=13, live_activations=2)
    out = run("report", str(dump), "--error", "-", stdin=OOM_TEXT)
    assert out.returncode == 0, out.stderr
    findings = out.stdout.split("Findings", 1)[1]
    first = next(line for line in findings.splitlines() if line.startswith("1. "))
    assert first.startswith("1. [high] TPD109 hbm-pressure `jit_step` does not fit: it needs 17 GiB of HBM, "
                            "1.25 GiB over 15.8 GiB usable (compiler error)")
    mem = run("memory", str(dump), "--error", "-", "--format", "json", stdin=OOM_TEXT)
    program = json.loads(mem.stdout)["programs"][0]
    assert program["does_not_fit"] and program["error"]["kind"] == "hbm-temporaries"
    assert program["levers"][0]["saving_bytes"] >= program["levers"][-1]["saving_bytes"]


def test_an_error_text_without_an_oom_is_a_usage_error(tmp_path):
    bad = tmp_path / "err.txt"
    bad.write_text("INVALID_ARGUMENT: something else\n")
    out = run("memory", "--error", str(bad))
    assert out.returncode == 2 and out.stderr.startswith("error: --error: no out-of-memory message")
    missing = run("memory", "--error", str(tmp_path / "nope.txt"))
    assert missing.returncode == 2 and "nope.txt" in missing.stderr and "Traceback" not in missing.stderr


def test_markdown_report_has_the_memory_section_and_figure(tmp_path):
    import pytest

    pytest.importorskip("matplotlib")
    dump = write_adam_dump(tmp_path / "oom", layers=13, live_activations=2, oom=True)
    out = tmp_path / "out" / "r.md"
    done = run("report", str(dump), "--format", "md", "-o", str(out))
    assert done.returncode == 0, done.stderr
    text = out.read_text()
    section = text.split("## Device memory", 1)[1]
    assert section.lstrip().startswith("**The program does not fit:** it needs 17 GiB of HBM, 1.25 GiB more than "
                                       "the 15.8 GiB usable")
    assert "![Stacked area: HBM held for the whole program" in section and "(r-memory.png)" in section
    png = (tmp_path / "out" / "r-memory.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    # The memory finding's saving is in bytes, never "0 ps per step".
    assert "0 ps per step" not in text and "of device memory" in text
