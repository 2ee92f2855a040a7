"""The real GPU captures in ../shared/data/real-captures, read as a GPU diagnosis should read them.

Expected numbers come from `xprof get_hlo_stats` (run here on a copy: xprof writes cache files
next to the trace) and from facts established by hand from the files (comments say how). The
captures are not in a bare clone: the tests skip, with the reason, when ../shared is absent.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import SHARED
from tpudiag.analysis.profile_analysis import analyze
from tpudiag.parsers.capture import load_capture
from tpudiag.parsers.device_trace import NON_XLA_KERNEL

REAL = SHARED / "data" / "real-captures"
GPU_CAPTURES = {"jax-gpu-conv3d-8gpu": "", "jax-gpu-te-fused-attn": "", "tf-gpu-v100-multiworker-bert": "trace"}
GIB = 1 << 30
US = 1_000_000


def capture(name: str) -> Path:
    path = REAL / name / GPU_CAPTURES[name]
    if not path.exists():
        pytest.skip(f"the real GPU captures are in ../shared, absent here ({REAL})")
    return path


@pytest.fixture(scope="module")
def analyses():
    cache: dict[str, object] = {}

    def get(name: str):
        if name not in cache:
            cache[name] = analyze(load_capture(capture(name)))
        return cache[name]
    return get


def _hlo_stats(name: str, tmp: Path) -> dict[str, dict]:
    copy = tmp / name
    for trace in capture(name).rglob("*.xplane.pb"):
        copy.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(trace, copy / trace.name)
    exe = Path(sys.executable).with_name("xprof")
    if not exe.exists():
        pytest.skip("xprof (the test extra) is not installed")
    proc = subprocess.run([str(exe), "get_hlo_stats", str(copy), "--limit", "1000"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {r["op_name"]: r for r in json.loads(proc.stdout).get("records", [])}


# xprof's `bound_by` that tpudiag does not reproduce, by design (docs/xprof-differences.md).
# xprof judges HBM against the plane's `memory_bandwidth`, half AMD's datasheet peak (4.1 of 8 TB/s
# on te-fused-attn's MI355X): there the four GEMM fusions' HBM utilization (34.6-44.9 %) beats their
# FLOP utilization (23.9-34.5 %); against 8 TB/s it is 17.7-23.0 %, and compute binds them.
BOUND_BY_DIFFERS = {("jax-gpu-conv3d-8gpu", "cudnn-conv.1"): ("HBM", "Compute"),
                    **{("jax-gpu-te-fused-attn", f"gemm_fusion_dot{s}"): ("Compute", "HBM")
                       for s in ("", ".3", ".6", ".7")}}


@pytest.mark.xprof
@pytest.mark.parametrize("name", ["jax-gpu-conv3d-8gpu", "jax-gpu-te-fused-attn"])
def test_per_op_numbers_equal_xprof_get_hlo_stats(name, analyses, tmp_path):
    ops = analyses(name).ops.set_index("name")
    stats = _hlo_stats(name, tmp_path)
    assert stats, "xprof found no HLO ops"
    # The op set: xprof's, plus kernels no HLO op launched (documented), nothing else.
    extra = set(ops.index) - set(stats)
    assert set(stats) <= set(ops.index)
    assert all(ops.loc[n, "category"] == NON_XLA_KERNEL for n in extra), extra
    for op_name, rec in stats.items():
        op = ops.loc[op_name]
        assert op["occurrences"] == rec["occurrences"], op_name
        assert op["total_time_ps"] / US == pytest.approx(rec["total_time_us"], rel=1e-9), op_name
        # 6 kernels on te-fused-attn's stream overlap their predecessor by a few hundred ns: tpudiag
        # counts the overlap as nested (docs/xprof-differences.md), so self time differs by up to 0.2 %
        assert op["self_time_ps"] / US == pytest.approx(rec["total_self_time_us"], rel=2e-3), op_name
        assert op["category"] == rec["category"], op_name
        if op["bound_by"] == "no cost data":  # a custom call XLA's cost analysis does not cost (documented)
            assert rec["measured_flop_rate"] == 0 and rec["measured_memory_bw_gbs"] == 0, op_name
            assert math.isnan(op["flop_rate"]) and math.isnan(op["hbm_bw"]), op_name
            assert rec["bound_by"] == "Unknown", op_name
            continue
        # Every rate is below AMD's datasheet HBM peak (5.3 and 8 TB/s), so every rate is shown.
        assert op["hbm_bw"] / GIB == pytest.approx(rec["measured_memory_bw_gbs"], rel=1e-6, abs=1e-6), op_name
        rate = op["flop_rate"] / 1e9
        if rate > 0 or op["category"] in ("custom fusion", "custom-call"):  # dots and convolutions
            assert rate == pytest.approx(rec["measured_flop_rate"], rel=1e-6, abs=1e-6), op_name
        else:  # elementwise FLOPs: xprof's per-device op profiles, not counted here (documented)
            assert rate == 0.0
        expected = {"Unknown": "latency"}.get(rec["bound_by"], rec["bound_by"])  # documented
        if op["family"]:
            expected = "collective"
        ours, theirs = BOUND_BY_DIFFERS.get((name, op_name), (expected, rec["bound_by"]))
        assert (op["bound_by"], rec["bound_by"]) == (ours, theirs), op_name


@pytest.mark.xprof
def test_tensorflow_capture_has_no_hlo_ops_for_xprof(tmp_path):
    # TensorFlow's kernels carry no `hlo_op`: xprof's hlo_stats has nothing, tpudiag lists the kernels.
    assert _hlo_stats("tf-gpu-v100-multiworker-bert", tmp_path) == {}


def test_conv3d_device_is_an_mi300_and_busy_3_4_percent(analyses):
    analysis = analyses("jax-gpu-conv3d-8gpu")
    device = analysis.profile.hosts[0].device
    # Plane stats: device_vendor AMD, compute_cap 9.4, 304 CUs, clock_rate 2,100,000 kHz.
    assert device.device_type.startswith("AMD") and "gfx942" in device.device_type
    assert device.peak_flops_per_s == pytest.approx(2048 * 304 * 2.1e9)  # xprof: 1,307,440 GFLOP/s
    # The plane's memory_bandwidth, 2,662,400,000,000 B/s, is half AMD's datasheet figure for an
    # MI300X (5.3 TB/s): ROCm's profiler counts HBM3 at two transfers per memory clock.
    assert device.gpu.plane_hbm_bytes_per_s == 2_662_400_000_000
    assert device.hbm_bytes_per_s == 5.3e12
    # Kernels cover 28.1 ms of 8 GPUs' spans (xprof's hlo_stats: 27.55 ms of XLA ops in 832 ms).
    from tpudiag.report_builder import build_report

    report = build_report(analysis)
    assert report.summary.busy_share == pytest.approx(0.034, abs=0.002)


def test_conv3d_reports_device_idle(tmp_path):
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("jax-gpu-conv3d-8gpu"))
    idle = [f for f in d.findings if f.rule == "device-idle"]
    assert idle and "GPUs idle" in idle[0].message and "no steps" in idle[0].message
    # Each GPU's own first-to-last-op window, by hand (the union of each GPU plane's `Stream #N(Kernel)`
    # events, read with protobuf alone): GPU 7, the least idle,
    # spans 90.56 ms with 87.06 ms uncovered (96.1 %); every GPU is 96-97 % idle. The share must be
    # over that GPU's window, not over GPU 0's longer 138.47 ms (which gave a false 62.9 %).
    assert "87.06 ms of 90.56 ms (96.1%" in idle[0].message
    assert idle[0].saving.per == "capture" and idle[0].saving.ps == 87_060_894_000
    # No steps: the capture is one window, never "steps 1" in the evidence
    assert all(label != "steps" for e in idle[0].evidence for label, _ in e.values)
    # TPU-only rules collapse into one reason, not a line each
    reasons = {s.reason for s in d.skipped if s.rule in ("padding-waste", "spill", "vmem-pressure")}
    assert len(reasons) == 1 and "TPU hardware" in reasons.pop()


def test_tensorflow_v100_kernels_and_idle(analyses):
    analysis = analyses("tf-gpu-v100-multiworker-bert")
    device = analysis.profile.hosts[0].device
    # Plane stats: compute_cap 7.0, 80 SMs, no device_vendor (older CUPTI captures record none).
    assert "V100" in device.device_type and "compute capability 7.0" in device.device_type
    ops = analysis.ops
    # The `Stream #N(Compute)` lines of GPUs 4 and 6 hold 665 kernels each, 11 distinct names,
    # 29.69 ms in all; the `TensorFlow Ops`/`TensorFlow Name Scope` lines are derived, not kernels.
    assert len(ops) == 11
    assert ops["self_time_ps"].sum() / 1e9 == pytest.approx(29.690748, abs=1e-6)
    assert "dropout" not in set(ops["name"])
    # Idle inside the one step: GPU 4 19.87 ms step, 14.83 ms of kernels (25.4 %); GPU 6 21.31 ms
    # and 14.87 ms (30.2 %).
    from tpudiag.report_builder import build_report

    breakdown = build_report(analysis).summary.breakdown
    share = breakdown.idle_ps / breakdown.step_ps
    assert 0.25 <= share <= 0.31, share


def test_kernels_without_an_hlo_op_claim_no_rate_and_no_bound(analyses):
    # No TensorFlow kernel carries an `hlo_op` stat, so no cost analysis covers them (xprof's hlo_stats
    # lists none of them): a zero FLOP rate or "latency" would be a claim nothing measured.
    ops = analyses("tf-gpu-v100-multiworker-bert").ops
    assert (ops["category"] == NON_XLA_KERNEL).all()
    assert set(ops["bound_by"]) == {"no cost data"}
    for column in ("flop_rate", "hbm_bw", "flop_utilization", "hbm_utilization"):
        assert ops[column].isna().all(), column


def test_check_on_a_gpu_capture_says_which_rules_ran():
    from tpudiag.gate import gate

    verdict = gate(capture("tf-gpu-v100-multiworker-bert"))
    (findings,) = [c for c in verdict.checks if c.name == "findings"]
    assert "rules run: " in findings.detail and "device-idle" in findings.detail.split("not run:")[0]
    assert "padding-waste, spill, vmem-pressure (about TPU hardware" in findings.detail
    assert any("could not run" in w and "padding-waste" in w for w in verdict.warnings)


def test_conv3d_gpu0_works_more_in_kernels_only_it_runs():
    from tpudiag.pipeline import diagnose

    # By hand: summing the event durations of each `/device:GPU:N` plane's `Stream #…(Kernel)` lines in
    # tw003.xplane.pb (the proto read directly, no tpudiag code) gives GPU 0 4,000.165 µs over 4
    # streams and GPUs 1-7 3,345.845 / 3,524.285 / 3,403.364 / 3,493.365 / 3,464.884 / 3,403.004 /
    # 3,502.165 µs (median 3,464.884): GPU 0 works 535.281 µs more. Its extra kernels are ones no
    # other GPU runs: 35 `__amd_rocclr_copyBuffer.kd` (563.521 µs), `Im3d2Col.kd` (16.08 µs),
    # `input_transpose_fusion_1.kd` (6.8 µs); the shared ops take as long as elsewhere. The capture
    # has no steps and no collective: no GPU waits for GPU 0, so nothing is saved.
    d = diagnose(capture("jax-gpu-conv3d-8gpu"), jobs=1)
    (f,) = [f for f in d.findings if f.rule == "straggler-core"]
    q = {(x.subject, x.name): x.value for x in f.quantities}
    assert q[("/device:GPU:0", "extra work per step (ps)")] == pytest.approx(535_281_000, abs=1_000)
    assert q[("/device:GPU:0", "others' median work per step (ps)")] == pytest.approx(3_464_884_000, abs=1_000)
    assert f.ops == ("__amd_rocclr_copyBuffer.kd", "Im3d2Col.kd", "input_transpose_fusion_1.kd")
    assert q[("__amd_rocclr_copyBuffer.kd", "extra per step (ps)")] == pytest.approx(563_521_000, abs=1_000)
    assert "runs work the other GPUs do not" in f.fix and f.saving.ps == 0
    assert "no collective in the capture" in f.message


def test_v100_idle_share_is_over_the_step_the_header_gives():
    """With a Steps line the rule's period is the step's (21.31 ms, its longest GPU's, as in the
    header), and the finding's share and its step row agree (5.04 ms idle: 23.7 %)."""
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("tf-gpu-v100-multiworker-bert"))
    [idle] = [f for f in d.findings if f.rule == "device-idle"]
    assert "of each 21.31 ms step (23.7%" in idle.message
    [step] = [e for e in idle.evidence if e.subject == "step 0"]
    assert dict(step.values)["share"] == "23.7%"


def test_every_saving_on_a_stepless_capture_is_over_the_capture():
    """te-fused-attn has no steps: the capture counts as one step for every rule (`step_basis`), so
    no saving may read "per step" (low-mxu-utilization's did, beside device-idle's "over the capture")."""
    from tpudiag.model.findings import saving_amount
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("jax-gpu-te-fused-attn"))
    timed = [f for f in d.findings if f.saving.ps > 0]
    assert {f.rule for f in timed} >= {"device-idle", "low-mxu-utilization"}
    assert all(f.saving.per == "capture" and saving_amount(f.saving).endswith("over the capture") for f in timed)
    # ... nor its explanation ("self time per step x (1 - ...)" beside "over the capture" was false)
    assert all("per step" not in f.saving.explanation for f in timed)
    # The header's busy share is over the spans of the one GPU that ran kernels, and says so
    import io

    from rich.console import Console

    from tpudiag.render.terminal import render_terminal

    out = io.StringIO()
    render_terminal(d.report, Console(file=out, width=400, no_color=True, color_system=None))
    header = " ".join(out.getvalue().split())
    assert "span of each GPU's first to last op, summed over 1 GPU that ran ops)" in header


def test_amd_hbm_peak_is_the_datasheets_not_half_of_it(analyses):
    """ROCm's profiler writes `memory_bandwidth` as 2 x the maximum memory clock x bus width / 8,
    counting HBM3/HBM3E at two transfers per clock where they make four. By hand from the planes'
    stats (read with protobuf alone): te-fused-attn is gfx950 (compute_cap 9.5), 256 CUs at
    2.4 GHz, memory_size 309,220,868,096 B = 288 GiB, memory_bandwidth 4,096,000,000,000: an
    MI355X, whose datasheet says 8 TB/s. Its reductions move 6.1-7.1 TB/s (xprof's get_hlo_stats:
    `loop_reduce_fusion.1` 6,571.7 GiB/s), which is under 8 TB/s, not "above the peak"."""
    analysis = analyses("jax-gpu-te-fused-attn")
    device = analysis.profile.hosts[0].device
    assert device.gpu.plane_hbm_bytes_per_s == 4_096_000_000_000 and device.hbm_bytes_per_s == 8e12
    ops = analysis.ops.set_index("name")
    assert ops.loc["loop_reduce_fusion.1", "hbm_bw"] / GIB == pytest.approx(6571.716, rel=1e-5)
    assert ops.loc["loop_reduce_fusion.1", "hbm_utilization"] == pytest.approx(0.882, abs=0.001)
    from tpudiag.report_builder import build_report

    assert not [w for w in build_report(analysis).warnings if "above the core's peak" in str(w)]


def test_uncosted_custom_calls_claim_no_utilization_and_gemms_are_not_memory_bound():
    """The embedded HLO (read with protobuf alone) names `custom-call.1` a `__cublas$gemm` and the
    `te_fused_attn_*_ffi` calls Transformer Engine's attention: xprof's get_hlo_stats gives them 0
    FLOPs and 0 bytes (`Unknown`). A 2.33 ms attention kernel at "0.0 % FLOP util, latency" was a
    claim nothing measured. The GEMM fusions run at 384-647 FLOP/B, above the 315 FLOP/B ridge of
    2.52 PFLOP/s over 8 TB/s: no finding may call them memory-bound."""
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("jax-gpu-te-fused-attn"))
    ops = d.analysis.ops.set_index("name")
    for name in ("custom-call.1", "te_fused_attn_backward_ffi.18", "te_fused_attn_forward_ffi.10"):
        assert ops.loc[name, "bound_by"] == "no cost data" and math.isnan(ops.loc[name, "flop_utilization"])
    low = [f for f in d.findings if f.rule == "low-mxu-utilization"]
    assert low and not any("memory-bound" in f.message for f in low)
    assert {ops.loc[n, "bound_by"] for n in ("gemm_fusion_dot", "gemm_fusion_dot.3", "gemm_fusion_dot.6")} == {"Compute"}


def test_lab_ops_says_a_gpu_op_is_not_a_tpu_kernel_not_that_it_has_no_shape():
    """`lab ops` said every fusion of the GPU captures "has no array output shape the lab can read",
    but the embedded HLO gives each one (read with protobuf alone: `input_transpose_fusion` is
    bf16[55862,5120]); the lab's kernels are Pallas TPU kernels, which is why nothing is reproducible."""
    from tpudiag.kernels_lab.spec import survey
    from tpudiag.pipeline import diagnose

    rows = survey(diagnose(capture("jax-gpu-conv3d-8gpu")))
    assert rows and all(r.family == "" and "ran on a GPU" in r.reason for r in rows)
    assert not any("no array output shape" in r.reason for r in rows)


@pytest.mark.parametrize("name, text", [
    # By hand (planes and lines read with protobuf alone): te-fused-attn has 8 `/device:GPU:N` planes,
    # only GPU:0 with lines (one `Stream #2`, 150 events); the V100 capture has 8, kernels (`Stream
    # #N(Compute)`) on GPUs 4 and 6 only (GPU:1 holds host-to-device copies, 5 planes are empty).
    ("jax-gpu-te-fused-attn", "8 GPUs (1 ran kernels)"),
    ("tf-gpu-v100-multiworker-bert", "8 GPUs (2 ran kernels)"),
    ("jax-gpu-conv3d-8gpu", "8 GPUs"),
])
def test_a_gpu_capture_counts_gpus_not_chips_and_says_how_many_ran_kernels(name, text):
    from tpudiag.pipeline import diagnose
    from tpudiag.render.markdown import render_markdown

    d = diagnose(capture(name))
    assert d.report.summary.devices_text() == text
    md = render_markdown(d.report)
    assert " chips of " not in md and "chip time" not in md and "GPU time" in md


def test_json_summary_counts_the_gpus_that_ran_kernels_and_the_busy_share():
    # te-fused-attn: 8 GPU planes, kernels on GPU:0 only (by hand, as above); no steps, so the busy
    # share is over that GPU's span: 93.6 % (the terminal header's figure: 823.6 µs idle of 12.96 ms)
    from tpudiag.pipeline import diagnose
    from tpudiag.render.json_format import report_to_dict

    summary = report_to_dict(diagnose(capture("jax-gpu-te-fused-attn")).report)["summary"]
    assert (summary["n_cores"], summary["n_cores_with_ops"]) == (8, 1)
    assert summary["busy_share"] == pytest.approx(1 - 823.6 / 12_960, abs=0.001)


def test_report_memory_states_the_gpus_memory_size_it_names_in_the_header():
    """The report's header named 288 GiB (the plane's memory_size, 309,220,868,096 B, read with
    protobuf alone) while its memory section said "the chip's HBM size is unknown"."""
    from tpudiag.pipeline import diagnose
    from tpudiag.render.markdown import render_markdown

    d = diagnose(capture("jax-gpu-te-fused-attn"))
    [p] = [p for p in d.report.memory if p.module == "jit_loss_fn"]
    assert p.hbm_capacity_bytes == 309_220_868_096
    md = render_markdown(d.report)
    assert "HBM size is unknown" not in md and "0.2% of the 288 GiB of HBM (the GPU's memory\\_size" in md


def test_memory_bound_bytes_are_the_one_gpus_that_ran_them_over_the_capture(tmp_path):
    """te-fused-attn has no steps and one GPU of 8 with events: the rule divided the reductions'
    bytes by 8 planes and called it "per step" (180 MiB for `loop_reduce_fusion`). The bytes are
    xprof's bandwidth times its total time for the op: 6,312.82 GiB/s x 223.3 µs = 1.41 GiB, all on GPU:0."""
    from tpudiag.pipeline import diagnose
    from tpudiag.render.markdown import render_markdown

    stats = _hlo_stats("jax-gpu-te-fused-attn", tmp_path)
    rec = stats["loop_reduce_fusion"]
    by_hand = rec["measured_memory_bw_gbs"] * GIB * rec["total_time_us"] / US
    d = diagnose(capture("jax-gpu-te-fused-attn"))
    [f] = [f for f in d.findings if f.rule == "memory-bound"]
    assert "per GPU over the capture" in f.message and "per step" not in f.message
    [row] = [e for e in f.evidence if e.subject == "loop_reduce_fusion"]
    assert dict(row.values)["HBM bytes"] == "1.41 GiB" and by_hand / GIB == pytest.approx(1.41, abs=0.005)
    md = render_markdown(d.report)
    # No TPU memory levels in a GPU report's prose, and the methods say where GPU costs come from
    assert "VMEM (`S(1)`" not in md and "copies brought into VMEM" not in md
    assert "XLA's cost analysis, recorded in the trace" not in md and "Hardware peaks per GPU" in md


def test_idle_counts_the_overhang_of_a_partially_overlapping_kernel_as_busy():
    """By hand (the union of GPU:0's 150 `Stream #2` events, read with protobuf alone): the span is
    12,956.751 µs, busy 12,133.127 µs (= the ops' summed self time), idle 823.624 µs (6.4 %). The
    6 kernels that start before their predecessor ends were read as nested and left out of the busy
    union, so their overhang (60.7 µs) counted as idle: 884.3 µs, and busy + idle > the span."""
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("jax-gpu-te-fused-attn"))
    [steps] = [dg.idle_steps for dg in d.analysis.digests.values()]
    assert int(steps["idle_ps"].sum()) == 823_624_000
    assert int(steps["period_ps"].sum()) - int(d.analysis.ops["self_time_ps"].sum()) == 823_624_000
    [idle] = [f for f in d.findings if f.rule == "device-idle"]
    assert "823.6 µs of 12.96 ms (6.4%" in idle.message


def test_terminal_header_gives_peaks_per_gpu_and_their_sources():
    """conv3d's planes: gfx942, 304 CUs at 2.1 GHz, 192 GiB (an MI300X), memory_bandwidth 2.66 TB/s."""
    from rich.console import Console

    from tpudiag.pipeline import diagnose
    from tpudiag.render.terminal import render_terminal

    console = Console(width=200, record=True, no_color=True)
    render_terminal(diagnose(capture("jax-gpu-conv3d-8gpu")).report, console)
    out = console.export_text()
    assert "8 GPUs" in out and "chips" not in out.split("Steps")[0]
    assert "Peaks per GPU" in out and "MI300X datasheet (the plane records 2.66 TB/s" in out and "HBM 5.3 TB/s" in out


def test_diff_per_core_times_count_only_the_gpus_that_ran_ops():
    """te-fused-attn's ops all ran on GPU:0 (1 of 8 planes has events): `te_fused_attn_backward_ffi.18`
    took 2,330.62 µs there (xprof's get_hlo_stats), not 291.3 µs "per core" (/8), and the one GPU's
    span is 12.96 ms, not 1.62 ms. conv3d's 8 GPUs all ran ops: their mean span, 104.02 ms, stands."""
    from tests.conftest import REPO

    out = subprocess.run([sys.executable, "-m", "tpudiag", "diff", str(capture("jax-gpu-conv3d-8gpu")),
                          str(capture("jax-gpu-te-fused-attn"))], capture_output=True, text=True, timeout=600,
                         cwd=REPO, env={**__import__("os").environ, "COLUMNS": "200"})
    assert out.returncode in (0, 1), out.stderr[-2000:]
    text = " ".join(out.stdout.split())
    assert "(104.02 ms base, 12.96 ms new)" in text
    assert "te_fused_attn_backward_ffi.18 (custom-call) 2.33 ms per core" in text
    # An MI300X (gfx942) against an MI355X (gfx950): GPUs, not chips, and both named
    assert "the GPUs differ: base AMD Instinct MI300 (gfx942)" in text and "new AMD Instinct MI350 (gfx950)" in text


def test_tui_overview_of_a_gpu_capture_counts_gpus():
    from types import SimpleNamespace

    from tpudiag.pipeline import diagnose
    from tpudiag.tui.views import OverviewView

    report = diagnose(capture("jax-gpu-te-fused-attn")).report
    view = SimpleNamespace(session=SimpleNamespace(report=report))
    text = OverviewView._summary(view).plain
    assert "8 GPUs (1 ran kernels)" in text and "chips" not in text and "peaks per GPU" in text


def test_v100_low_mxu_skip_names_the_missing_flops_not_the_peak():
    # The V100's peak comes from the hardware table (125 TFLOP/s in the methods); what the capture
    # lacks is FLOPs: no TensorFlow kernel carries an HLO op, so nothing records any.
    from tpudiag.pipeline import diagnose

    d = diagnose(capture("tf-gpu-v100-multiworker-bert"))
    (reason,) = [s.reason for s in d.skipped if s.rule == "low-mxu-utilization"]
    assert reason.startswith("needs per-op FLOPs: no op in the trace records any"), reason
