"""`analysis.device_memory`'s parts on small programs built from `BufferAllocation`s in the test:
the heap timeline and the buffers at its peak, one program's memory, the errors' warnings, and
`_grows_back`, how much the temporaries' heap grows back when outputs are donated.

For `_grows_back` the heap timeline is written in the test. The expected growth is worked by hand position by position, and, for random programs, by a
reference that follows the function's docstring one position at a time (no difference arrays):
a donated output's buffer no longer lends its space, so the values it held before the output was
written need room in the heap; a value the compiler rematerialised (`X.remat`) is kept from its
last use until the copy's last use, and the copy is no longer made."""

from __future__ import annotations

import re
from types import SimpleNamespace

from hypothesis import given, settings
from hypothesis import strategies as st

from tpudiag.analysis.device_memory import MIN_LIVE_BYTES, _grows_back
from tpudiag.model.compiled import BufferAllocation, BufferValue, CompiledProgram, Computation

KIB = 1024


def _alloc(index: int, values: list[tuple[str, int]], color: int = 0, kind: str = "temporary") -> BufferAllocation:
    return BufferAllocation(index, max((s for _, s in values), default=0), color=color,
                            parameter_number=0 if kind == "argument" else None, is_output=False,
                            maybe_live_out=kind == "output", is_thread_local=False, is_temp=kind == "temporary",
                            is_constant=False, values=tuple(BufferValue(0, n, s, 0, "f32[8]{0}") for n, s in values))


def _program(allocations: list[BufferAllocation], ranges: dict[str, tuple[int, int]], positions: int):
    main = Computation("main", True, (), "")
    return CompiledProgram("jit_g", "g.txt", "hlo_text", "main", True, {"main": main}, {},
                           allocations=tuple(allocations), live_ranges={f"{n}{{}}": r for n, r in ranges.items()},
                           live_range_positions=positions)


def _heap(timeline: list[int]):
    return SimpleNamespace(timeline_bytes=tuple(timeline))


def test_the_new_peak_inside_a_rematerialised_copy():
    # Positions 0..9. The heap (one temporary allocation): x (4 KiB, 0-2), y (8 KiB, 4-5), and x.remat
    # (4 KiB, 6-7), the copy the compiler made so as not to keep x: today 4, 4, 4, 0, 8, 8, 4, 4, 0, 0 KiB,
    # peak 8 KiB. An output buffer holds `out` (donated) and, before it is written, t (12 KiB, 6) and
    # `tiny` (100 bytes, under the 4 KiB floor). Another output buffer, not donated, holds u (8 KiB, 6);
    # a VMEM output buffer holding a donated `vout` lends vt (8 KiB, 6) to VMEM, not to the heap.
    temps = _alloc(0, [("x", 4 * KIB), ("y", 8 * KIB), ("x.remat", 4 * KIB)])
    donated = _alloc(1, [("t", 12 * KIB), ("tiny", 100), ("out", 8 * KIB)], kind="output")
    kept_out = _alloc(2, [("u", 8 * KIB), ("o2", 8 * KIB)], kind="output")
    vmem = _alloc(3, [("vt", 8 * KIB), ("vout", 4 * KIB)], color=1, kind="output")
    ranges = {"x": (0, 2), "y": (4, 5), "x.remat": (6, 7), "t": (6, 6), "tiny": (6, 6), "out": (8, 9),
              "u": (6, 6), "o2": (8, 9), "vt": (6, 6), "vout": (8, 9)}
    program = _program([temps, donated, kept_out, vmem], ranges, 9)
    now = [4 * KIB] * 3 + [0] + [8 * KIB] * 2 + [4 * KIB] * 2 + [0] * 2
    # Donated: x is kept from 3 to 7 (4 KiB), the copy at 6-7 is no longer made (-4 KiB), t needs 12 KiB
    # at 6: at 6 the heap is 4 - 4 + 4 + 12 = 16 KiB, at 4-5 8 + 4 = 12 KiB: 8 KiB over today's peak
    assert _grows_back(program, _heap(now), {"out", "vout"}) == 8 * KIB
    # nothing of the heap's donated (vout's buffer is VMEM): no value borrowed, and keeping x alone makes
    # 4, 4, 4, 4, 12, 12, 4, 4, 0, 0 KiB, 4 KiB over today's peak
    assert _grows_back(program, _heap(now), {"vout"}) == 4 * KIB


def test_the_new_peak_right_after_a_rematerialised_copy_and_values_past_the_last_position():
    # Positions 0..9; the heap: x (4 KiB, 0-1), x.remat (4 KiB, 5-6), y (8 KiB, 3-3): today 4, 4, 0, 8,
    # 0, 4, 4, 0, 0, 0 KiB, peak 8 KiB. The donated output's buffer lends t (12 KiB) at 7 and w (4 KiB)
    # from 8 to 12, past the last position 9 (counted to 9 only).
    temps = _alloc(0, [("x", 4 * KIB), ("x.remat", 4 * KIB), ("y", 8 * KIB)])
    donated = _alloc(1, [("t", 12 * KIB), ("w", 4 * KIB), ("out", 8 * KIB)], kind="output")
    ranges = {"x": (0, 1), "x.remat": (5, 6), "y": (3, 3), "t": (7, 7), "w": (8, 12), "out": (9, 9)}
    program = _program([temps, donated], ranges, 9)
    now = [4 * KIB, 4 * KIB, 0, 8 * KIB, 0, 4 * KIB, 4 * KIB, 0, 0, 0]
    # Donated: x kept from 2 to 6 (its copy's end), the copy gone at 5-6; the heap becomes 4, 4, 4, 12,
    # 4, 4, 4, 12, 4, 4 KiB: a peak of 12 KiB at 3 and at 7, 4 KiB over today's
    assert _grows_back(program, _heap(now), {"out"}) == 4 * KIB


def test_with_live_ranges_but_no_heap_every_borrowed_value_counts():
    # no temporary allocation, so no heap timeline: t and w (12 + 4 KiB) need room of their own
    donated = _alloc(1, [("t", 12 * KIB), ("w", 4 * KIB), ("out", 8 * KIB)], kind="output")
    program = _program([donated], {"t": (0, 0), "w": (1, 1), "out": (2, 2)}, 2)
    assert _grows_back(program, _heap([]), {"out"}) == 16 * KIB


def test_a_borrowed_value_that_is_a_rematerialised_copy_keeps_its_original():
    # The heap: a (8 KiB, 0-1) and b (4 KiB, 3-3): today 8, 8, 0, 4, 0, 0 KiB (positions 0..5). The donated
    # output's buffer lent its space to a.remat (8 KiB, 4-5), a copy of a: donated, a is kept from 2
    # to 5 instead (8 KiB), and the copy is not counted again: 8, 8, 8, 12, 8, 8 KiB, 4 KiB over 8.
    temps = _alloc(0, [("a", 8 * KIB), ("b", 4 * KIB)])
    donated = _alloc(1, [("a.remat", 8 * KIB), ("out", 8 * KIB)], kind="output")
    program = _program([temps, donated], {"a": (0, 1), "b": (3, 3), "a.remat": (4, 5), "out": (5, 5)}, 5)
    assert _grows_back(program, _heap([8 * KIB, 8 * KIB, 0, 4 * KIB, 0, 0]), {"out"}) == 4 * KIB
    # a borrowed value whose original is borrowed too: the original's own span grows to the copy's end
    donated = _alloc(1, [("c", 8 * KIB), ("c.remat2", 8 * KIB), ("out", 8 * KIB)], kind="output")
    program = _program([temps, donated], {"a": (0, 1), "b": (3, 3), "c": (1, 1), "c.remat2": (3, 4),
                                          "out": (5, 5)}, 5)
    # c lives 1..4 (8 KiB): 8, 16, 8, 12, 8, 0 KiB, 8 KiB over today's 8
    assert _grows_back(program, _heap([8 * KIB, 8 * KIB, 0, 4 * KIB, 0, 0]), {"out"}) == 8 * KIB


# ---- random programs against a position-by-position reference ---------------------------------

def _reference(temps: dict[str, tuple[int, int, int]], borrowed: dict[str, tuple[int, int, int]],
               positions: int) -> int:
    """The growth, one position at a time: name -> (size, start, end) of the heap's temporaries and
    of the values the donated outputs' buffers lent."""
    def live(start: int, end: int, p: int) -> bool:
        return 0 <= start <= positions and start <= p <= end

    now = [sum(s for s, a, b in temps.values() if live(a, b, p)) for p in range(positions + 1)]
    after = list(now)
    copies = {n for n in (*temps, *borrowed) if re.search(r"\.remat\d*$", n)}
    for n, (s, a, b) in borrowed.items():
        if n not in copies or re.sub(r"\.remat\d*$", "", n) not in {**temps, **borrowed}:
            for p in range(positions + 1):
                after[p] += s * live(a, b, p)
    kept: dict[str, tuple[int, int, int]] = {}  # original -> (size, from, to)
    for n in sorted(copies, key=lambda c: c in borrowed):  # the heap's copies first, as they are met
        original = re.sub(r"\.remat\d*$", "", n)
        whole = {**temps, **borrowed}
        if original not in whole:
            continue
        s, a, b = whole[n]
        if n in temps:
            for p in range(positions + 1):
                after[p] -= s * (a <= p <= b)
        if original in borrowed:
            o_size, o_from, o_to = kept.get(original, borrowed[original])
        else:
            o_size, o_from, o_to = kept.get(original, (s, whole[original][2] + 1, whole[original][2]))
        kept[original] = (o_size, o_from, max(o_to, b))
    for original, (s, a, b) in kept.items():
        if original in borrowed:  # its own span was counted above: count only the extension
            _, oa, ob = borrowed[original]
            for p in range(positions + 1):
                after[p] += s * (live(a, b, p) and not live(oa, ob, p))
        else:
            for p in range(positions + 1):
                after[p] += s * (0 <= a <= positions and a <= p <= b)
    return max(0, max(after) - max(now))


_NAMES = ["a", "b", "c", "a.remat", "b.remat", "a.remat2", "c.remat"]


@st.composite
def _programs(draw):
    positions = draw(st.integers(1, 7))
    spans = st.tuples(st.sampled_from([4 * KIB, 8 * KIB, 12 * KIB]), st.integers(0, positions + 1),
                      st.integers(-1, 3))
    names = draw(st.lists(st.sampled_from(_NAMES), unique=True, max_size=6))
    values = {n: draw(spans) for n in names}
    values = {n: (s, a, a + d) for n, (s, a, d) in values.items()}
    in_heap = {n for n in names if draw(st.booleans())}
    return positions, {n: v for n, v in values.items() if n in in_heap}, {
        n: v for n, v in values.items() if n not in in_heap}


@settings(max_examples=300, deadline=None)
@given(_programs())
def test_the_growth_is_the_new_heaps_peak_less_todays_position_by_position(case):
    positions, temps, borrowed = case
    # a copy and its original are the same array: one size for both
    size_of = {n: v[0] for n, v in {**temps, **borrowed}.items() if ".remat" not in n}
    temps = {n: (size_of.get(re.sub(r"\.remat\d*$", "", n), s), a, b) for n, (s, a, b) in temps.items()}
    borrowed = {n: (size_of.get(re.sub(r"\.remat\d*$", "", n), s), a, b) for n, (s, a, b) in borrowed.items()}
    allocations = [_alloc(1, [*((n, s) for n, (s, _, _) in borrowed.items()), ("out", 4 * KIB)], kind="output")]
    if temps:
        allocations.insert(0, _alloc(0, [(n, s) for n, (s, _, _) in temps.items()]))
    ranges = {n: (a, b) for n, (_, a, b) in {**temps, **borrowed}.items()}
    program = _program(allocations, {**ranges, "out": (positions, positions)}, positions)
    now = [sum(s for s, a, b in temps.values() if 0 <= a <= positions and a <= p <= b) for p in range(positions + 1)]
    timeline = now if temps else []
    expected = _reference(temps, borrowed, positions) if temps else sum(s for s, _, _ in borrowed.values())
    assert _grows_back(program, _heap(timeline), {"out"}) == expected
    assert MIN_LIVE_BYTES == 4 * KIB  # every value drawn is at the floor or above


# ---- the heap timeline, the value a buffer holds, a buffer without its instruction ---------------

def test_the_timeline_counts_values_from_a_start_at_or_before_the_last_position():
    from tpudiag.analysis.device_memory import _space

    # positions 0..3: a (4 KiB, 0-1), e (8 KiB, 2 to 9: counted to 3), d (4 KiB, exactly at the last
    # position 3), b (12 KiB, from 5: past the last position, never counted)
    heap = _alloc(0, [("a", 4 * KIB), ("e", 8 * KIB), ("d", 4 * KIB), ("b", 12 * KIB)])
    program = _program([heap], {"a": (0, 1), "e": (2, 9), "d": (3, 3), "b": (5, 5)}, 3)
    hbm = _space(program, 0, [heap], None)
    assert hbm.timeline_bytes == (4 * KIB, 4 * KIB, 8 * KIB, 12 * KIB) and hbm.peak_position == 3
    assert [b.name for b in hbm.live_at_peak] == ["e", "d"]  # by size; b's range never reaches 3
    assert (hbm.space, hbm.temp_bytes, hbm.constant_bytes) == ("hbm", 12 * KIB, 0)


def test_a_space_of_an_unknown_color_and_its_constants():
    from tpudiag.analysis.device_memory import _space

    constant = BufferAllocation(0, 8 * KIB, color=9, parameter_number=None, is_output=False, maybe_live_out=False,
                                is_thread_local=False, is_temp=False, is_constant=True,
                                values=(BufferValue(0, "c", 8 * KIB, 0, "f32[2048]{0}"),))
    heap = _alloc(1, [("t", 4 * KIB)], color=9)
    program = _program([constant, heap], {"c": (0, 1), "t": (1, 1)}, 1)
    space = _space(program, 9, [constant, heap], None)
    assert (space.space, space.color, space.constant_bytes, space.temp_bytes, space.peak_bytes) == (
        "color 9", 9, 8 * KIB, 4 * KIB, 12 * KIB)
    assert _space(program, 5, [], None).space == "host"  # a color the compiler names


def test_an_output_buffer_holds_the_value_live_last_and_an_argument_buffer_its_parameter():
    from tpudiag.analysis.device_memory import _held_value

    ranges = {"out{}": (3, 5), "t{}": (0, 2), "early{}": (0, 0)}
    # listed first but live last: the output itself, not the temporary it lent its space to before
    out = _alloc(0, [("out", 8 * KIB), ("t", 8 * KIB)], kind="output")
    assert _held_value(out, ranges).name == "out"
    out = _alloc(0, [("t", 8 * KIB), ("out", 8 * KIB), ("early", 8 * KIB)], kind="output")
    assert _held_value(out, ranges).name == "out"
    # without live ranges, the last listed; a value without a range ranks below any that has one
    assert _held_value(out, {}).name == "early"
    assert _held_value(_alloc(0, [("early", 8 * KIB), ("x", 8 * KIB)], kind="output"), ranges).name == "early"
    # an argument buffer: its parameter, listed first, whatever lives later
    arg = _alloc(0, [("p0", 8 * KIB), ("out", 8 * KIB)], kind="argument")
    assert _held_value(arg, ranges).name == "p0"
    assert _held_value(_alloc(0, [], kind="output"), ranges) is None


def test_a_buffer_whose_instruction_the_program_lacks_has_no_source():
    from tpudiag.analysis.device_memory import _buffer

    alloc = _alloc(0, [("fusion.3{1}", 8 * KIB)])
    program = _program([alloc], {}, 4)  # no instructions at all
    b = _buffer(program, alloc.values[0], "temporary", alloc, {"fusion.3{1}": (2, 4)})  # a tuple element's key
    assert (b.name, b.instruction, b.op_name, b.source_file, b.source_line) == ("fusion.3{1}", "fusion.3", "", "", 0)
    assert (b.live_from, b.live_to, b.logical_bytes, b.aliased) == (2, 4, 8 * 4, False)  # f32[8]


def test_one_programs_memory_names_its_usable_hbm_and_where_each_figure_comes_from():
    from tpudiag.analysis.device_memory import program_memory
    from tpudiag.model.hardware import chip_for
    from tpudiag.model.inputs import HloInput
    from tpudiag.model.memory import OomError

    heap = _alloc(0, [("t", 8 * KIB)])
    program = _program([heap], {"t": (0, 0)}, 0)
    v6e = chip_for("v6e")  # no compiler figure of its usable HBM: the public capacity stands in
    p = program_memory(HloInput(program, "nowhere/xla"), v6e)
    assert (p.module, p.path, p.generation) == ("jit_g", "g.txt", "v6e")
    assert (p.hbm_capacity_bytes, p.hbm_usable_bytes) == (v6e.hbm_capacity_bytes, v6e.hbm_capacity_bytes)
    assert (p.usable_source, p.capacity_source) == ("public capacity", "public v6e figure")
    # a run-time allocation failure's sizes are one buffer's: the usable HBM stays the chip's
    failed = OomError("hbm", "hbm-allocation", 4 * KIB, 2 * KIB, "RESOURCE_EXHAUSTED: ...")
    p = program_memory(HloInput(program, "nowhere/xla"), v6e, [failed])
    assert (p.hbm_usable_bytes, p.usable_source, p.error) == (v6e.hbm_capacity_bytes, "public capacity", failed)
    # a VMEM-only program (no HBM allocation): no HBM space, no chip, nothing to read a capacity from
    vmem = _program([_alloc(0, [("v", 4 * KIB)], color=1)], {"v": (0, 0)}, 0)
    p = program_memory(HloInput(vmem, "nowhere/xla"), None)
    assert p.hbm is None and [s.space for s in p.spaces] == ["vmem"] and p.generation == ""
    assert (p.hbm_capacity_bytes, p.hbm_usable_bytes, p.usable_source, p.capacity_source) == (None, None, "", "")


def test_an_error_joined_to_a_program_does_not_stop_the_warnings_of_the_errors_after_it():
    from tpudiag.analysis.device_memory import error_report, join_warnings
    from tpudiag.model.memory import OomError

    joined = OomError("hbm", "hbm-temporaries", 20 * KIB, 16 * KIB, "m1")
    other = OomError("hbm", "hbm-temporaries", 20 * KIB, 16 * KIB, "m2", programs=("jit_x",))
    programs = (SimpleNamespace(error=joined, hbm_peak_bytes=12 * KIB, module="jit_g", does_not_fit=True),)
    assert join_warnings([joined, other], programs) == [
        "--error: the text names `jit_x`, which is not a program of the input: not joined"]
    # the report keeps every error given, and analyses alone only the one joined to no program
    report = error_report("in.pb", (joined, other), programs)
    assert report.errors == (joined, other) and [a.error for a in report.standalone] == [other]


def _llo_vmem(module: str, blocks: list[tuple[str, int, int]], capacity: int | None = None, report: bool = True):
    """An LLO dump's VMEM report: (hlo op, block index, block bytes) SCOPED blocks of `module`."""
    import pandas as pd

    table = pd.DataFrame({"hlo": [h for h, _, _ in blocks], "block": [b for _, b, _ in blocks],
                          "block_type": ["SCOPED"] * len(blocks), "block_bytes": [s for _, _, s in blocks]})
    return SimpleNamespace(vmem_report=SimpleNamespace(module_name=module, capacity_bytes=capacity) if report else None,
                           vmem_allocations=table)


def test_scoped_vmem_per_op_comes_from_the_llo_dumps_of_the_program_else_its_backend_configs():
    from tpudiag.analysis.device_memory import program_memory
    from tpudiag.model.hardware import chip_for
    from tpudiag.model.inputs import HloInput

    from tpudiag.parsers.hlo_text import parse_hlo_text

    MIB = 1 << 20
    # fusion.1 a Pallas kernel named by JAX; fusion.4 states 4 KiB of scoped VMEM in its backend config
    program = parse_hlo_text("""HloModule jit_g

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  %fusion.1 = f32[8]{0} custom-call(%a), custom_call_target="tpu_custom_call", metadata={op_name="jit(g)/pallas_call"}
  ROOT %fusion.4 = f32[8]{0} negate(%fusion.1), backend_config={"used_scoped_memory_configs":[{"memory_space":"1","size":"4096"}]}
}
""")
    program.allocations, program.live_ranges, program.live_range_positions = (_alloc(0, [("t", 8 * KIB)]),), {}, 0
    v5e = chip_for("v5e")
    dumps = (
        _llo_vmem("jit_other", [("fusion.9", 0, 9 * MIB)], capacity=1 * MIB),  # another module's: left out
        _llo_vmem("", [("fusion.1", 0, 2 * MIB), ("fusion.1", 1, 3 * MIB)]),  # names no module: this one's
        _llo_vmem("jit_g", [("fusion.2", 0, 1 * MIB)], capacity=64 * MIB),
        _llo_vmem("jit_g", [("fusion.3", 0, 5 * MIB)], report=False),  # no VMEM report: left out
    )
    p = program_memory(HloInput(program, "nowhere/xla"), v5e, llo=dumps)
    # per op its largest block, largest first; the program has no instruction of either name
    assert [(v.op, v.scoped_bytes, v.source, v.op_name, v.kernel) for v in p.vmem_ops] == [
        ("fusion.1", 3 * MIB, "LLO VMEM report", "jit(g)/pallas_call", True),
        ("fusion.2", 1 * MIB, "LLO VMEM report", "", False)]  # the program has no fusion.2
    # the first report that states a capacity (jit_other's is not this program's); v5e's default limit
    assert (p.vmem_capacity_bytes, p.vmem_scoped_limit_bytes, p.vmem_limit_source) == (
        64 * MIB, 16 * MIB, "default for v5e, measured")
    # without a report of this program: its backend configs, and the chip's capacity
    p = program_memory(HloInput(program, "nowhere/xla"), v5e, llo=dumps[:1])
    assert [(v.op, v.scoped_bytes, v.source) for v in p.vmem_ops] == [("fusion.4", 4096, "HLO backend_config")]
    assert p.vmem_capacity_bytes == v5e.vmem_bytes


def test_every_program_of_the_inputs_once_with_the_chip_the_llo_dumps_and_the_near_fraction():
    from tpudiag.analysis.device_memory import program_memories
    from tpudiag.model.hardware import chip_for
    from tpudiag.model.inputs import CompiledInputs, HloInput

    MIB = 1 << 20
    dumped = _program([_alloc(0, [("t", 8 * KIB)])], {"t": (0, 0)}, 0)  # jit_g, 8 KiB, from the XLA dump
    copy = _program([_alloc(0, [("t", 4 * KIB)])], {"t": (0, 0)}, 0)  # the capture's own jit_g: left out
    other = _program([_alloc(0, [("u", 12 * KIB)])], {"u": (0, 0)}, 0)
    other.module = "jit_h"  # only in the capture
    inputs = CompiledInputs(hlo=(HloInput(dumped, "d/xla"),),
                            embedded=(HloInput(copy, "capture"), HloInput(other, "capture")),
                            chip=chip_for("v6e"), llo=(_llo_vmem("jit_g", [("fusion.1", 0, 2 * MIB)]),))
    programs = program_memories(inputs, near_fraction=0.5)
    # largest HBM peak first
    assert [(p.module, p.hbm_peak_bytes, p.generation, p.near_fraction) for p in programs] == [
        ("jit_h", 12 * KIB, "v6e", 0.5), ("jit_g", 8 * KIB, "v6e", 0.5)]
    assert [v.op for v in programs[1].vmem_ops] == ["fusion.1"] and programs[0].vmem_ops == ()


def test_the_compiled_text_of_a_compile_output_is_the_one_beside_its_xla_dump(tmp_path):
    from tpudiag.analysis.device_memory import _compiled_text
    from tpudiag.model.inputs import HloInput

    program = _program([_alloc(0, [("t", 8 * KIB)])], {"t": (0, 0)}, 0)
    hlo = HloInput(program, str(tmp_path / "out" / "xla"))
    # an output read already: its program when it is the `compiled.hlo.txt` beside this dump
    read = SimpleNamespace(program=SimpleNamespace(path=str(tmp_path / "out" / "compiled.hlo.txt")))
    assert _compiled_text(hlo, read) is read.program
    elsewhere = SimpleNamespace(program=SimpleNamespace(path=str(tmp_path / "other" / "compiled.hlo.txt")))
    assert _compiled_text(hlo, elsewhere) is None
    # none read: the file beside the dump, parsed, or None when there is none
    assert _compiled_text(hlo, None) is None
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "compiled.hlo.txt").write_text(
        "HloModule jit_g\n\nENTRY %main (a: f32[8]) -> f32[8] {\n  ROOT %a = f32[8]{0} parameter(0)\n}\n")
    text = _compiled_text(hlo, None)
    assert (text.module, text.find("a").opcode) == ("jit_g", "parameter")


def test_donating_two_arguments_names_both_when_the_program_does_not_number_them():
    from tpudiag.analysis.device_memory import _levers, _space

    allocations = [_alloc(0, [("p0", 8 * KIB)], kind="argument"), _alloc(1, [("p1", 8 * KIB)], kind="argument"),
                   _alloc(2, [("out0", 8 * KIB)], kind="output"), _alloc(3, [("out1", 8 * KIB)], kind="output"),
                   _alloc(4, [("t", 8 * KIB)])]
    allocations[1] = BufferAllocation(1, 8 * KIB, 0, 1, False, False, False, False, False, allocations[1].values)
    program = _program(allocations, {"p0": (0, 3), "p1": (0, 3), "out0": (2, 3), "out1": (2, 3), "t": (1, 1)}, 3)
    hbm = _space(program, 0, allocations, None)
    [donation] = _levers(program, hbm, SimpleNamespace(workload="inference", mesh_devices=1))
    # both outputs have an argument's shape (f32[8]); no instruction names the arguments' positions
    assert (donation.key, donation.saving_bytes, donation.buffers) == ("donation", 16 * KIB, ("out0", "out1"))
    assert donation.fix == "donate the arguments p0, p1 (`donate_argnums`)"
    assert donation.title.startswith("donate p0, p1: 2 outputs ")


def test_a_compile_outputs_compiled_text_gives_the_scoped_vmem_only_where_nothing_else_does():
    from pathlib import Path

    from tpudiag.analysis.device_memory import program_memory
    from tpudiag.model.inputs import HloInput
    from tpudiag.parsers.hlo_text import parse_hlo_text

    MIB = 1 << 20
    # the XLA dump's program states no scoped VMEM (an after-optimizations dump); the output's
    # `compiled.hlo.txt` does, for fusion.4 (4 KiB)
    dumped = _program([_alloc(0, [("t", 8 * KIB)])], {"t": (0, 0)}, 0)
    text = parse_hlo_text("""HloModule jit_g

ENTRY %main (a: f32[8]) -> f32[8] {
  %a = f32[8]{0} parameter(0)
  ROOT %fusion.4 = f32[8]{0} negate(%a), backend_config={"used_scoped_memory_configs":[{"memory_space":"1","size":"4096"}]}
}
""")
    text.path = "out/compiled.hlo.txt"
    output = SimpleNamespace(facts={"module": "jit_g", "status": "ok"}, program=text)
    hlo = HloInput(dumped, "out/xla")
    p = program_memory(hlo, None, outputs={Path("out"): output})
    assert [(v.op, v.scoped_bytes, v.source) for v in p.vmem_ops] == [("fusion.4", 4096, "HLO backend_config")]
    # with an LLO dump's VMEM report of the program, the report's figures stand
    p = program_memory(hlo, None, outputs={Path("out"): output}, llo=(_llo_vmem("jit_g", [("fusion.1", 0, 2 * MIB)]),))
    assert [(v.op, v.scoped_bytes, v.source) for v in p.vmem_ops] == [("fusion.1", 2 * MIB, "LLO VMEM report")]
