"""`tpudiag memory` and `--error` as a user runs them: the bundled example, the JSON contract,
an OOM dump with its error on stdin, and bad input (exit 2, one line)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.cli_util import run_tpudiag
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
    return run_tpudiag(*args, stdin=stdin, env={"NO_COLOR": "1", "COLUMNS": "140"})


def test_memory_runs_on_the_bundled_example():
    out = run("memory")
    assert out.returncode == 0, out.stderr
    assert "jit_train_step" in out.stdout and "Live in HBM at the peak" in out.stdout
    assert "memory_analysis() peak" in out.stdout  # the compile's result.json beside the dump
    # 19.1 MiB against 3.03 MiB: memory_analysis counts the VMEM heap (13.5 MiB) beside HBM's
    # arguments and outputs (measured on one-chip compiles, docs/xprof-differences.md).
    assert "it counts the 13.5 MiB VMEM heap beside HBM's arguments and outputs" in out.stdout


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


OOM_DIR = __import__("pathlib").Path(__file__).resolve().parent.parent / "fixtures" / "oom"


def test_the_users_oom_stands_alone():
    """`memory --error FILE` with no PATH: the text's own overrun, list and levers; no bundled program."""
    out = run("memory", "--error", str(OOM_DIR / "tf_tpu_v3_onehot.txt"))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "1.6 GiB over" in text and "read as the TensorFlow TPU runtime's compile report" in text
    assert "472 MiB (12.6x)" in text and "f32[4,128,128,9,18]" in text
    assert "dim 4 (18 → 128): make it a multiple of 128" in text  # the padding fix names the dim
    assert "← first" not in text.split("Levers", 1)[1]  # 472 MiB alone does not cover a 1.6 GiB overrun
    assert "jit_train_step" not in text and "params[" not in text and "v5e" not in text
    doc = json.loads(run("memory", "--error", str(OOM_DIR / "tf_tpu_v3_onehot.txt"), "-f", "json").stdout)
    assert doc["programs"] == [] and doc["errors"][0]["form"] == "tf-tpu-compile"
    [alone] = doc["standalone_errors"]
    assert alone["levers"][0]["key"] == "padding" and alone["levers"][0]["saving_bytes"] == round(471.5 * 2**20)
    assert alone["error"]["allocations"][0]["expansion"] == 12.6


def test_report_error_alone_names_no_bundled_program():
    out = run("report", "--error", str(OOM_DIR / "tf_tpu_v3_onehot.txt"))
    assert out.returncode == 0, out.stderr
    line = next(x for x in out.stdout.splitlines() if "TPD109" in x)
    assert "jit_train_step" not in line and "the program does not fit" in line
    assert "the bundled example is not the program that ran out of memory" in out.stdout


def test_an_error_naming_another_program_is_not_joined(tmp_path):
    dump = write_adam_dump(tmp_path / "oom", layers=13, live_activations=2)
    doc = json.loads(run("memory", str(dump), "--error", str(OOM_DIR / "libtpu_jax_onehot.txt"), "-f", "json").stdout)
    assert doc["programs"][0]["error"] is None and doc["standalone_errors"]
    assert any("`jit_seg_step`, which is not a program of the input" in w for w in doc["warnings"])


def test_the_bundled_example_has_headroom_and_no_lever():
    out = run("memory")
    assert "Levers" not in out.stdout and "no lever needed" in out.stdout and "of headroom" in out.stdout
    [program] = json.loads(run("memory", "-f", "json").stdout)["programs"]
    assert program["levers"] == [] and program["first_lever"] == "" and program["headroom_bytes"] > 15 * 2**30
    assert program["workload"] == "training" and program["mesh_devices"] == 4


def test_stdin_has_the_file_cap_and_decoding():
    big = "x" * (1 << 20) + OOM_TEXT  # the OOM line lies past the 1 MiB cap: not read
    out = run("memory", "--error", "-", stdin=big)
    assert out.returncode == 2 and "no out-of-memory message" in out.stderr and "Traceback" not in out.stderr
    raw = subprocess.run([sys.executable, "-m", "tpudiag", "memory", "--error", "-"], capture_output=True,
                         input=b"\xff\xfe\x80 " + OOM_TEXT.encode(), timeout=300,
                         env={**os.environ, "NO_COLOR": "1", "LC_ALL": "C", "PYTHONIOENCODING": "utf-8:strict",
                              "PYTHONUTF8": "0"})
    assert raw.returncode == 0 and b"Traceback" not in raw.stderr and b"1.25 GiB over" in raw.stdout


def test_a_size_past_float_range_is_one_line():
    out = run("memory", "--error", "-", stdin=f"Ran out of memory in memory space hbm. Used 1{'0' * 309}G of 16.00G hbm.")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert out.stderr.startswith("error: --error: size `") and "past any device's memory" in out.stderr


def test_a_gpu_capture_takes_its_hbm_size_from_the_allocator_and_lists_largest_first():
    import pytest

    from tests.conftest import REPO

    capture = REPO.parent / "shared" / "data" / "real-captures" / "jax-gpu-te-fused-attn"
    if not capture.exists():
        pytest.skip("the shared real captures are not beside the repository")
    out = run("memory", str(capture))
    assert out.returncode == 0, out.stderr
    # The allocator's capacity (in use + free at its peak, 279 GiB in the same output's measured
    # table) is the usable HBM; the GPU plane's memory_size (288 GiB) its size: never "HBM size unknown".
    assert "HBM size unknown" not in out.stdout
    assert "288 GiB HBM (the GPU's memory_size in the trace), 279 GiB usable (the allocator's measured" in out.stdout
    programs = [line.split()[1] for line in out.stdout.splitlines() if line.startswith("Program ")]
    assert programs[0] == "jit_loss_fn"  # 497 MiB, the largest; 8-byte conversions fold into one line
    assert "jit_convert_element_type" not in programs and "more programs of at most" in out.stdout
    doc = json.loads(run("memory", str(capture), "-f", "json").stdout)
    peaks = [p["hbm_peak_bytes"] for p in doc["programs"]]
    assert peaks == sorted(peaks, reverse=True) and "jit_convert_element_type" in doc["folded_programs"]
