"""exposed-collective (TPD101): its wording helpers called directly, every branch, on small tables.

The expected texts are written out whole: which advice holds on which chip comes from the rule's
documentation (XLA leaves collectives synchronous by default on v4, v5p and v6e; all-reduces and
reduce-scatters stay synchronous at entry level even on v5e; the async flags were verified on v6e
only) and the topology from the chip's torus (a 2x2 of a 2D torus on v5e and v6e, 2x2x1 of a 3D
one elsewhere). No capture is built: each test runs in milliseconds.
"""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from tpudiag.model.profile import Platform
from tpudiag.rules.exposed_collective import (ScheduleFacts, _class_counts, _fix, _gpu_fix, _ici_facts, _library,
                                              _names, schedule_facts,
                                              whatif_hint)

FLAGS = ("--xla-flag xla_tpu_enable_async_collective_fusion=true "
         "--xla-flag xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
         "--xla-flag xla_tpu_enable_async_collective_fusion_multiple_steps=true "
         "--xla-flag xla_tpu_overlap_compute_collective_tc=true")
ASYNC = ("--xla_tpu_enable_async_collective_fusion=true --xla_tpu_enable_async_collective_fusion_fuse_all_gather=true "
         "--xla_tpu_enable_async_collective_fusion_multiple_steps=true --xla_tpu_overlap_compute_collective_tc=true")
SHRINK = "shrink them (bf16 gradients, fewer and larger buckets) or reduce less often (accumulate over microbatches)"
GPU_FLAG = "XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true"


def _frame(*rows):
    """Collective ops as the rule's per-op table has them: (name, family, windows with nothing inside)."""
    return pd.DataFrame(rows, columns=["name", "family", "n_adjacent"])


def test_schedule_reasons():
    facts = ScheduleFacts(between={"ag-start.1": 0, "ag-start.2": 1, "ag-start.3": 4}, synchronous={"all-reduce.1"})
    assert facts.reason("ag-start.1", "async") == "adjacent in the schedule"
    assert facts.reason("ag-start.2", "async") == "1 op scheduled inside"
    assert facts.reason("ag-start.3", "async") == "4 ops scheduled inside"
    assert facts.reason("all-reduce.1", "sync") == "synchronous in the compiled program"
    # The kind must match what the program says: an async start read as sync, and the reverse, say nothing.
    assert facts.reason("ag-start.1", "sync") == ""
    assert facts.reason("all-reduce.1", "async") == ""
    assert facts.reason("all-reduce.9", "sync") == ""


def test_names_are_quoted_and_cut_after_three():
    assert _names(["a", "b", "c"]) == "`a`, `b`, `c`"
    assert _names(["a", "b", "c", "d", "e"]) == "`a`, `b`, `c` and 2 more"
    assert _names(["a", "b"], limit=1) == "`a` and 1 more"


def test_class_counts_are_hidden_partial_exposed():
    frame = pd.DataFrame({"n_hidden": [1, 2], "n_partial": [0, 3], "n_exposed": [5, 0]})
    assert _class_counts(frame) == "3/3/5"


def _gpu_analysis(vendor):
    gpu = None if vendor is None else SimpleNamespace(vendor=vendor)
    return SimpleNamespace(profile=SimpleNamespace(hosts=[SimpleNamespace(device=SimpleNamespace(gpu=gpu))]))


def test_collective_library_by_vendor():
    assert _library(_gpu_analysis("AMD")) == "RCCL"
    assert _library(_gpu_analysis("NVIDIA")) == "NCCL"
    assert _library(_gpu_analysis("Intel")) == "NCCL/RCCL"
    assert _library(_gpu_analysis(None)) == "NCCL/RCCL"


def test_whatif_hint_uses_the_smallest_topology_of_the_generation():
    assert whatif_hint("v6e") == f"model it without a TPU: `tpudiag whatif MODULE:FUNCTION --topology v6e:2x2 {FLAGS}`"
    assert whatif_hint("v5e") == f"model it without a TPU: `tpudiag whatif MODULE:FUNCTION --topology v5e:2x2 {FLAGS}`"
    assert whatif_hint("v4") == f"model it without a TPU: `tpudiag whatif MODULE:FUNCTION --topology v4:2x2x1 {FLAGS}`"
    # A generation the table does not know: the 3D form, named after it.
    assert whatif_hint("v9") == f"model it without a TPU: `tpudiag whatif MODULE:FUNCTION --topology v9:2x2x1 {FLAGS}`"


def test_sync_fix_on_v6e_names_the_verified_flags():
    fix = _fix("sync", "all-gather", _frame(("all-gather.1", "all-gather", 0)), "v6e")
    assert fix == (f"make the all-gathers asynchronous: compile with `{ASYNC}` (in LIBTPU_INIT_ARGS; verified to turn "
                   f"v6e all-gathers into async collective fusions; {whatif_hint('v6e')})")


def test_sync_fix_on_another_sync_by_default_generation_says_verified_on_v6e_only():
    fix = _fix("sync", "all-gather", _frame(("all-gather.1", "all-gather", 0)), "v5p")
    assert fix == (f"XLA leaves all-gathers synchronous on v5p by default: try `{ASYNC}` (verified on v6e only; "
                   f"{whatif_hint('v5p')})")


def test_sync_fix_on_v5e_overlaps_and_names_every_family():
    frame = _frame(("all-gather.1", "all-gather", 0), ("all-to-all.2", "all-to-all", 0),
                   ("collective-permute.3", "collective-permute", 0), ("all-reduce.4", "all-reduce", 0),
                   ("reduce-scatter.5", "reduce-scatter", 0))
    fix = _fix("sync", "all-gather, all-reduce", frame, "v5e")
    assert fix == ("overlap the all-gathers with independent compute (async collectives or a collective matmul); "
                   "overlap the all-to-alls and collective-permutes with independent compute or make them smaller; "
                   "all-reduces and reduce-scatters stay synchronous at entry level even on v5e, where all-gathers "
                   f"are async: {SHRINK}")


def test_sync_fix_with_only_reductions():
    fix = _fix("sync", "all-reduce", _frame(("all-reduce.4", "all-reduce", 0)), "v6e")
    assert fix == ("all-reduces stay synchronous at entry level even on v5e, where all-gathers are async: " + SHRINK)


def test_sync_fix_off_a_tpu_has_no_tpu_flags():
    fix = _fix("sync", "all-reduce", _frame(("all-reduce.4", "all-reduce", 0)), "", Platform.CPU)
    assert fix == f"overlap the all-reduce with independent compute or make them smaller: {SHRINK}"


def test_async_fix_counts_adjacent_windows():
    frame = _frame(("ag-start.1", "all-gather", 1), ("ag-start.2", "all-gather", 0))
    assert _fix("async", "all-gather", frame, "v6e") == (
        "no compute is scheduled between start and done in 1 window: start the all-gather earlier or give the "
        "scheduler independent work to place inside (e.g. prefetch the next layer's weights)")
    frame = _frame(("ag-start.1", "all-gather", 2), ("ag-start.2", "all-gather", 1))
    assert _fix("async", "all-gather", frame, "v6e").startswith(
        "no compute is scheduled between start and done in 3 windows: ")
    frame = _frame(("ag-start.1", "all-gather", 0))
    assert _fix("async", "all-gather", frame, "v6e") == (
        "start the all-gather earlier or split it so more compute overlaps it")


def test_gpu_sync_fix_names_the_scheduler_flag_and_the_reductions():
    fix = _gpu_fix("sync", "all-gather", _frame(("all-gather.1", "all-gather", 0)))
    assert fix == ("let XLA run the all-gather collectives asynchronously, on a stream of their own beside compute: "
                   f"compile with `{GPU_FLAG}` and without `--xla_gpu_disable_async_collectives`")
    frame = _frame(("all-reduce.1", "all-reduce", 0), ("reduce-scatter.2", "reduce-scatter", 0))
    assert _gpu_fix("sync", "all-reduce, reduce-scatter", frame) == (
        "let XLA run the all-reduce, reduce-scatter collectives asynchronously, on a stream of their own beside "
        f"compute: compile with `{GPU_FLAG}` and without `--xla_gpu_disable_async_collectives`; all-reduces and "
        f"reduce-scatters: {SHRINK}")
    # Through `_fix` on a GPU the same text comes back.
    assert _fix("sync", "all-gather", _frame(("all-gather.1", "all-gather", 0)), "", Platform.GPU) == \
        _gpu_fix("sync", "all-gather", _frame(("all-gather.1", "all-gather", 0)))


def test_gpu_async_fix_for_library_kernels_adjacent_windows_and_the_rest():
    nccl = _frame(("ncclDevKernel_AllGather_RING_LL(ncclDevComm*)", "all-gather", 3))
    assert _gpu_fix("async", "all-gather", nccl) == (
        "start the all-gather earlier, while compute kernels still run on the other streams (e.g. reduce gradients in "
        "buckets as the backward pass produces them)")
    xla = _frame(("all-gather-start.1", "all-gather", 2), ("ncclDevKernel_AllGather_RING_LL", "all-gather", 0))
    assert _gpu_fix("async", "all-gather", xla) == (
        "no compute kernel starts on another stream during 2 of the collective kernels left exposed: give XLA's "
        f"scheduler measured costs and room to overlap them (`{GPU_FLAG}`, `JAX_ENABLE_PGLE=yes`), or start the "
        "all-gather earlier")
    none_adjacent = _frame(("all-gather-start.1", "all-gather", 0))
    assert _gpu_fix("async", "all-gather", none_adjacent) == (
        f"start the all-gather earlier or split it so more compute kernels overlap it (`{GPU_FLAG}`)")


def _collective_ops(*rows):
    """Rows of `analysis.ops` as `_ici_facts` reads them (one per op and host)."""
    cols = ["name", "family", "occurrences", "group_size", "group_source", "ici_bytes", "ici_bw", "ici_utilization",
            "ici_latency_bound"]
    return pd.DataFrame(rows, columns=cols)


def test_ici_facts_per_collective_op():
    ops = _collective_ops(
        ("all-gather.0", "all-gather", 0, 4, "replica_groups", 0.0, float("nan"), float("nan"), False),  # never ran
        ("fusion.1", "", 3, 0, "", 0.0, float("nan"), float("nan"), False),  # not a collective
        # 8 MiB over 4 runs: 2 MiB per device; 45 GB/s of a 180 GB/s peak is 25 %.
        ("all-gather.1", "all-gather", 4, 4, "replica_groups", 8 * 2**20, 45e9, 0.25, False),
        ("all-gather.1", "all-gather", 4, 4, "replica_groups", 1.0, 1e9, 0.5, False),  # another host: first kept
        ("all-reduce.2", "all-reduce", 2, 8, "assumed", 2048.0, float("nan"), float("nan"), True),
    )
    facts = _ici_facts(ops)
    assert facts == {
        "all-gather.1": (("bytes/device", "2 MiB"), ("group", "4"), ("ICI", "45 GB/s (25.0% of ICI peak)")),
        "all-reduce.2": (("bytes/device", "1 KiB"), ("group", "8 (assumed)"), ("ICI", "n/a (n/a of ICI peak)"),
                         ("latency-bound", "yes: its bytes cross in under the fixed latency at peak; fewer, larger "
                                           "collectives help, not bandwidth"))}


def test_ici_facts_off_a_tpu_keep_only_known_bytes_and_the_group():
    ops = _collective_ops(
        ("all-reduce.0", "all-reduce", 1, 2, "replica_groups", 0.0, float("nan"), float("nan"), False),
        ("all-reduce.1", "all-reduce", 2, 2, "replica_groups", 4 * 2**20, float("nan"), float("nan"), False))
    assert _ici_facts(ops, tpu=False) == {"all-reduce.1": (("bytes/device", "2 MiB"), ("group", "2"))}


def test_no_ici_facts_without_ops_or_ici_columns():
    assert _ici_facts(_collective_ops()) == {}
    assert _ici_facts(pd.DataFrame({"name": ["all-reduce.1"], "family": ["all-reduce"]})) == {}


def _instruction(family="", role=None, continuation=False):
    return SimpleNamespace(collective_family=family, async_role=role, is_continuation=continuation)


def test_schedule_facts_from_compiled_programs():
    assert schedule_facts(()) is None
    program = SimpleNamespace(
        entry="main",
        async_pairs=[SimpleNamespace(kind="collective", start="all-gather-start.1", scheduled_between=()),
                     SimpleNamespace(kind="collective", start="all-gather-start.2", scheduled_between=("fusion.1", "fusion.2")),
                     SimpleNamespace(kind="copy", start="copy-start.1", scheduled_between=())],
        instructions={
            ("main", "all-reduce.1"): _instruction("all-reduce"),  # synchronous at entry level
            ("main", "all-gather-start.1"): _instruction("all-gather", role="start"),  # async
            ("main", "all-gather-done.1"): _instruction("all-gather", role="done"),
            ("main", "fusion.1"): _instruction(),  # not a collective
            ("main", "all-reduce.2"): _instruction("all-reduce", continuation=True),  # continues an async one
            ("body", "all-reduce.3"): _instruction("all-reduce"),  # inside a loop body, not at entry level
            ("body", "fusion.9"): _instruction(),
        })
    facts = schedule_facts((program,))
    assert facts.between == {"all-gather-start.1": 0, "all-gather-start.2": 2}
    assert facts.synchronous == {"all-reduce.1"}
