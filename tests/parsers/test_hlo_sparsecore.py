"""HLO text as current XLA prints it for TPU: attributes over several lines, async ops on the
SparseCore thread with `PrepareAsyncCallStart`/`PrepareAsyncCallDone`, nested async wrappers, and
starts and dones in different computations.

Two inputs:

- a live deviceless compile (v6e:2x2, libtpu) of an FSDP step with the SparseCore collective
  offload flags of public TPU recipes (`make_fixtures.SC_OFFLOAD_FLAGS`) and a Pallas kernel whose
  `kernel_metadata` jax writes as JSON over several lines (`json.dumps(indent=0)`);
- `tests/fixtures/dumps/v6e_sparsecore_loop`, written by hand from that compile's syntax (its
  `target_arguments.txt` is the compile's) because no deviceless compile tried here put a start and
  its done in different computations: a weight all-gather started before a `while` and awaited in
  its body, the next one started in the body (awaited in the next iteration, and after the loop),
  each an `async-start` on `async_execution_thread="sparsecore"` calling a wrapper that `call`s the
  all-gather (nested), and a Pallas custom call with its metadata over three lines.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import REPO, require_libtpu
from tpudiag.parsers.hlo_text import load_hlo_dump, parse_hlo_text

LOOP = REPO / "tests" / "fixtures" / "dumps" / "v6e_sparsecore_loop"
BAD = ("not an instruction", "has no done", "has no start")


def _pairs(program) -> set[tuple]:
    return {(p.computation, p.start, p.done_in, p.done, p.thread) for p in program.async_pairs}


def test_a_start_and_its_done_in_different_computations_pair():
    dump = load_hlo_dump(LOOP)
    (program,) = dump.programs
    # the fixture's Pallas call keeps 9 bytes of its kernel body (trimmed): that kernel is not shown
    assert [w for w in program.warnings if "Pallas kernel" not in w] == [] and dump.warnings == []
    entry = program.entry
    assert _pairs(program) == {
        # before the loop -> its first iteration
        (entry, "all-gather.6.cloned.1.call-start", "body", "all-gather.6.cloned.1.call-done", "sparsecore"),
        # one iteration -> the next
        ("body", "all-gather.7.cloned.1.call-start", "body", "all-gather.6.cloned.1.call-done", "sparsecore"),
        # the last iteration -> after the loop
        ("body", "all-gather.7.cloned.1.call-start", entry, "all-gather.7.cloned.1.call-done", "sparsecore"),
    }
    first = next(p for p in program.async_pairs if p.computation == entry)
    # What runs at least once between: the entry's work up to the loop, the body's before the done.
    assert first.scheduled_between == ("fusion.3", "fusion.4", "while.1")
    # PrepareAsyncCallStart/Done only prepare the next offloaded call: they hide no transfer.
    assert not [n for p in program.async_pairs for n in p.scheduled_between if n.startswith("prepare_")]
    assert all(p.family == "all-gather" for p in program.async_pairs)  # through async -> call -> all-gather


def test_an_attribute_over_several_lines_is_one_instruction():
    (program,) = load_hlo_dump(LOOP).programs
    kernel = program.instructions[("body", "_lambda_.1")]
    assert kernel.custom_call_target == "tpu_custom_call" and kernel.op_name == "jit(layers)/while/body/pallas_call"
    assert json.loads(dict(kernel.frontend_attributes)["kernel_metadata"]) == {"block": "512", "kernel": "post_norm"}
    assert program.computations["body"].root == "tuple.1"  # the lines after it are read too


def test_the_loop_collectives_are_modelled_as_overlapped():
    """The compiler started each all-gather a loop iteration ahead: the modelled step waits on none
    (before, the start before the loop was timed as a synchronous 37 µs all-gather and the done
    after it as 11.5 µs of collective time)."""
    from tpudiag.pipeline import diagnose

    d = diagnose(LOOP, clock_ghz=1.0)
    assert not [w for w in d.warnings if any(b in w for b in BAD)]
    steps = d.steps_frame()
    assert (steps["collective_ps"] < 1_000_000).all()  # two waits of the minimum op time, under 1 µs
    assert "exposed-collective" not in {f.rule for f in d.findings}
    from tpudiag.analysis.cost_model import entry_partners

    (program,) = load_hlo_dump(LOOP).programs
    partners = entry_partners(program)
    assert partners["all-gather.6.cloned.1.call-start"] == ("while.1", "collective")
    assert partners["all-gather.7.cloned.1.call-done"] == ("while.1", "collective")


HEAD = "HloModule m, is_scheduled=true\n\n"


def test_a_done_whose_value_comes_from_no_start_still_warns():
    # Near miss: the done reads an entry parameter; nothing leads back to a start.
    text = HEAD + """ENTRY %main (p: ((f32[8], token[]), f32[32])) -> f32[32] {
  %p = ((f32[8]{0}, token[]), f32[32]{0}) parameter(0)
  ROOT %all-gather.1.call-done = f32[32]{0} async-done(%p)
}
"""
    program = parse_hlo_text(text)
    assert any("`all-gather.1.call-done` in `main` has no start it depends on" in w for w in program.warnings)


def test_an_attribute_never_closed_is_one_bad_line_and_the_next_instruction_is_read():
    text = HEAD + """ENTRY %main (p: f32[8]) -> f32[8] {
  %p = f32[8]{0} parameter(0)
  %c = f32[8]{0} custom-call(%p), custom_call_target="x", frontend_attributes={kernel_metadata={
"a":"b",
  ROOT %n = f32[8]{0} negate(%c)
}
"""
    program = parse_hlo_text(text)
    assert [i.name for i in program.computation_instructions(program.entry)] == ["p", "c", "n"]
    assert any("line 6: not an instruction" in w for w in program.warnings)  # the orphan JSON line


# --- a live deviceless compile with the SparseCore offload on (libtpu) ---


@pytest.fixture(scope="session")
def sc_offload_dump():
    require_libtpu()
    sys.path.insert(0, str(REPO / "tests" / "fixtures" / "dumps"))
    try:
        from make_fixtures import SC_OFFLOAD_FLAGS, compile_in_subprocess
    finally:
        sys.path.pop(0)
    with tempfile.TemporaryDirectory(prefix="tpudiag-sc-") as tmp:
        dump = Path(tmp) / "xla"
        dump.mkdir()
        compile_in_subprocess("v6e:2x2", "sc_offload", dump, SC_OFFLOAD_FLAGS)
        yield load_hlo_dump(dump)


@pytest.mark.libtpu
def test_a_sparsecore_offloaded_step_reads_without_a_warning(sc_offload_dump):
    program = next(p for p in sc_offload_dump.programs if p.module == "jit_step")
    warnings = [*sc_offload_dump.warnings, *program.warnings]
    assert not [w for w in warnings if any(b in w for b in BAD)], warnings
    offloaded = [p for p in program.async_pairs if p.thread == "sparsecore"]
    starts = [i for i in program.instructions.values()
              if i.async_role == "start" and i.async_execution_thread == "sparsecore"]
    assert offloaded and len({p.start for p in offloaded}) == len(starts)  # every offloaded start is paired
    assert {p.family for p in offloaded} >= {"all-gather"}
    prepared = {i.custom_call_target for i in program.instructions.values() if i.opcode == "custom-call"}
    assert {"PrepareAsyncCallStart", "PrepareAsyncCallDone"} <= prepared
    kernel = next(i for i in program.instructions.values() if i.custom_call_target == "tpu_custom_call")
    assert json.loads(dict(kernel.frontend_attributes)["kernel_metadata"]) == {"block": "whole", "kernel": "double"}

