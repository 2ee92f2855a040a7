"""Claims audit: every quantity a finding states is recomputed from the inputs and compared.

For every finding on every bundled example (`examples/`: captures with and without their compiler
dumps, the dumps alone) and every rule scenario (`tests/rules/scenarios.py`):

- a matmul's dims and dtypes (`Finding.quantities`: M, N, K, batch, operand and result dtypes)
  are recomputed by the small HLO reader below, which shares no code with tpudiag: it reads the
  dump's text (or the op's own HLO line in a scenario), checks the instruction named is inside
  the op the finding is about (a fusion's called computations, nested ones included), and works
  K out from the window size rather than from the kernel, as tpudiag does;
- dims and dtypes written in the message and fix (`K = 1000`, `pad K 1000→1024 (+2.4% ...)`,
  `f32 operands (f32 x bf16`) must be the recomputed ones, a padding target the next multiple of
  the chip's MXU width and never an M;
- a FLOP rate is recomputed from the scenario's design (FLOPs x occurrences over the scheduled
  durations) or, for the examples, by the installed xprof (`get_hlo_stats`); no stated
  utilization or share of a peak is above 100 %.

A rule that quotes a shape from the wrong instruction fails here.
"""

from __future__ import annotations

import inspect
import math
import re
import shutil
import subprocess
import sys
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

import pytest

import tpudiag
from tests.rules import scenarios as sc
from tpudiag.writers.tpu_design import CaptureDesign, write_capture

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "examples" / "models"
MXU_WIDTH = {"v4": 128, "v5e": 128, "v5p": 128, "v6e": 256, "TPU7x": 256}
MATMUL_NAMES = ("M", "N", "K", "batch", "lhs dtype", "rhs dtype", "result dtype")


# -- a separate, small HLO text reader ----------------------------------------------------------

_LAYOUT = re.compile(r"(?<=\])\{[\d,]*(?::[^{}]*)?\}")  # a layout follows its shape; `dims={1}` is no layout
_COMMENT = re.compile(r"/\*.*?\*/")
_ARRAY = re.compile(r"([a-z][a-z0-9]*)\[([\d,]*)\]")


@dataclass
class Line:
    name: str
    result: list[tuple[str, tuple[int, ...]]]  # (dtype, dims) per array of the result
    opcode: str
    operands: list[str]  # operand names
    inline: list[tuple[str, tuple[int, ...]]]  # operand shapes printed inline (trace op text)
    attrs: str  # everything after the operand list


def _close(text: str, at: int) -> int:
    depth = 0
    for i in range(at, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return i
    return len(text) - 1


def _arrays(text: str) -> list[tuple[str, tuple[int, ...]]]:
    return [(d, tuple(int(x) for x in dims.split(",") if x)) for d, dims in _ARRAY.findall(text)]


def read_line(line: str) -> Line | None:
    head = re.match(r"\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*", line)
    if head is None:
        return None
    rest = _LAYOUT.sub("", _COMMENT.sub("", line[head.end():]))
    if rest.startswith("("):
        end = _close(rest, 0)
        result_text, rest = rest[:end + 1], rest[end + 1:]
    else:
        result_text, _, rest = rest.partition(" ")
    op = re.match(r"\s*([a-z][a-z0-9\-]*)\(", rest)
    if op is None:
        return None
    end = _close(rest, op.end() - 1)
    args = rest[op.end():end]
    return Line(head.group(1), _arrays(result_text), op.group(1), re.findall(r"%([\w.\-]+)", args),
                _arrays(args), rest[end + 1:])


class Hlo:
    """Computations of an HLO text: name -> {instruction name: Line}."""

    def __init__(self, text: str):
        self.comps: dict[str, dict[str, Line]] = {}
        current = None
        for raw in text.splitlines():
            if raw.startswith("}"):
                current = None
                continue
            header = re.match(r"^(?:ENTRY\s+)?%?([\w.\-]+)\s+\(.*\{\s*$", raw)
            if header and not raw.startswith(" "):
                current = self.comps.setdefault(header.group(1), {})
                continue
            if current is not None:
                parsed = read_line(raw)
                if parsed is not None:
                    current[parsed.name] = parsed

    def find(self, name: str) -> tuple[str, Line] | None:
        for comp, lines in self.comps.items():
            if name in lines:
                return comp, lines[name]
        return None

    def inside(self, op: str, instruction: str) -> tuple[str, Line] | None:
        """`instruction` when it is `op` itself or in a computation `op` calls, at any depth."""
        found = self.find(op)
        if found is None:
            return None
        if op == instruction:
            return found
        todo = re.findall(r"(?:calls|to_apply|called_computations)=\{?%([\w.\-]+)", found[1].attrs)
        seen = set()
        while todo:
            comp = todo.pop()
            if comp in seen or comp not in self.comps:
                continue
            seen.add(comp)
            if instruction in self.comps[comp]:
                return comp, self.comps[comp][instruction]
            for line in self.comps[comp].values():
                todo.extend(re.findall(r"(?:calls|to_apply)=%([\w.\-]+)", line.attrs))
        return None


def _attr(attrs: str, key: str) -> str | None:
    m = re.search(rf"\b{key}=(\{{[^}}]*\}}|[^,\s]+)", attrs)
    return m.group(1) if m else None


def _dims(text: str | None) -> list[int]:
    return [int(x) for x in re.findall(r"\d+", text or "")]


def recompute(comp: str, line: Line, hlo: Hlo | None) -> dict[str, object]:
    """M, N, K, batch and dtypes of one dot, convolution or matmul-shaped op line."""
    if hlo is not None and len(line.operands) >= 2:
        shapes = []
        for name in line.operands[:2]:
            operand = hlo.comps[comp].get(name)
            assert operand is not None and len(operand.result) == 1, f"operand `{name}` of `{line.name}`"
            shapes.append(operand.result[0])
    else:
        shapes = line.inline[:2]
    (ldt, lhs), (rdt, rhs) = shapes
    rdtype, out = line.result[0]
    if line.opcode == "dot":
        lc, rc = _dims(_attr(line.attrs, "lhs_contracting_dims")), _dims(_attr(line.attrs, "rhs_contracting_dims"))
        lb, rb = _dims(_attr(line.attrs, "lhs_batch_dims")), _dims(_attr(line.attrs, "rhs_batch_dims"))
        m = math.prod(d for i, d in enumerate(lhs) if i not in lc + lb)
        n = math.prod(d for i, d in enumerate(rhs) if i not in rc + rb)
        k, batch = math.prod(lhs[i] for i in lc), math.prod(lhs[i] for i in lb)
    elif line.opcode == "convolution":
        labels = _attr(line.attrs, "dim_labels")
        lhs_l, rest = labels.split("_")
        _, out_l = rest.split("->")
        groups = int(_attr(line.attrs, "feature_group_count") or 1)
        bgroups = int(_attr(line.attrs, "batch_group_count") or 1)
        size = re.search(r"size=([\dx]+)", line.attrs)
        dilate = re.search(r"lhs_dilate=([\dx]+)", line.attrs)
        sizes = [int(x) for x in size.group(1).split("x")] if size else []
        dilations = [int(x) for x in dilate.group(1).split("x")] if dilate else [1] * len(sizes)
        m = out[out_l.index("b")]
        k = lhs[lhs_l.index("f")] // groups
        batch = groups * bgroups
        for digit, (w, d) in enumerate(zip(sizes, dilations)):
            positions = out[out_l.index(str(digit))]
            if d == w > 1:  # every tap on its own dilated input: XLA's batched dot
                batch *= positions
            else:
                m *= positions
                k *= -(-w // d)
        n = out[out_l.index("f")] // (groups * bgroups)
    else:  # a fusion or custom call whose two operands compose as [B,]M,K x [B,]K,N -> [B,]M,N
        m, n = out[-2:]
        batch = math.prod(out[:-2])
        k = math.prod(lhs) // (m * batch)
    return {"M": m, "N": n, "K": k, "batch": batch, "lhs dtype": ldt, "rhs dtype": rdt, "result dtype": rdtype}


# -- the runs audited ----------------------------------------------------------------------------

@dataclass
class Case:
    label: str
    diagnosis: object
    hlo: Hlo | None  # the program's text; None for scenarios (their op lines are in `lines`)
    lines: dict[str, Line]  # scenario ops' own HLO lines
    rates: dict[tuple[str, str], float]  # (FLOP/s or HBM bytes/s, op) -> the rate, recomputed without tpudiag
    generation: str


def _dump_text(dumps: Path) -> Hlo:
    return Hlo("\n".join(p.read_text() for p in sorted((dumps / "xla").glob("*.after_optimizations.txt"))))


def _declared_flops(line: Line | None, comp: str, hlo: Hlo | None) -> float:
    """FLOPs per occurrence of an op the trace gives none for (a Pallas call): its declared
    `cost_estimate`, else 2 x batch x M x N x K when its operands compose as a matmul."""
    if line is None:
        return 0.0
    declared = re.search(r'cost_estimate\\?"?\s*:\s*\{[^}]*?flops\\?"?\s*:\s*([\d.eE+]+)', line.attrs)
    if declared:
        return float(declared.group(1))
    try:
        mm = recompute(comp, line, hlo)
    except (AssertionError, ValueError, IndexError, ZeroDivisionError):
        return 0.0
    return 2.0 * mm["batch"] * mm["M"] * mm["N"] * mm["K"]


def _xprof_rates(capture: Path, tmp: Path, hlo: Hlo | None) -> dict[str, float]:
    exe = Path(sys.executable).with_name("xprof")
    # The test extra installs xprof: without it the audit's rates would check nothing, silently.
    assert exe.exists(), f"xprof, the reference the audit recomputes rates with, is not installed beside {sys.executable}"
    run = next(capture.glob("plugins/profile/*/"))
    copy = tmp / capture.name
    shutil.copytree(run, copy)  # xprof writes cache files beside the trace
    proc = subprocess.run([str(exe), "get_hlo_stats", str(copy), "--limit", "100000"], capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rates = {}
    for r in json.loads(proc.stdout)["records"]:
        # `gbs` is GiB/s in XProf's CLI (shared/reference/xprof-trace-format.md, per-op rates)
        rates[("HBM bytes/s", r["op_name"])] = r["measured_memory_bw_gbs"] * 2 ** 30
        rate = r["measured_flop_rate"] * 1e9
        if rate == 0 and r["category"] == "custom-call" and hlo is not None and hlo.find(r["op_name"]):
            comp, line = hlo.find(r["op_name"])
            rate = _declared_flops(line, comp, hlo) * r["occurrences"] / (r["total_time_us"] * 1e-6)
        rates[("FLOP/s", r["op_name"])] = rate
    return rates


def _scenario_designs() -> dict[str, list[CaptureDesign]]:
    out = {}
    for name, fn in inspect.getmembers(sc, inspect.isfunction):
        if fn.__module__ != sc.__name__ or name in ("design", "write_run", "analyse", "analyse_hosts", "matmul",
                                                     "with_device", "pallas_matmul_op"):
            continue
        params = inspect.signature(fn).parameters.values()
        if any(p.default is inspect.Parameter.empty and p.kind is p.POSITIONAL_OR_KEYWORD for p in params):
            continue
        made = fn()
        if isinstance(made, CaptureDesign):
            out[name] = [made]
        elif isinstance(made, list) and made and all(isinstance(d, CaptureDesign) for d in made):
            out[name] = made
    out["idle_training"] = [sc.idle_training(1500 * sc.US, "TransferFromDevice")]
    out["dot_v6e"] = [_dot_design()]
    out["low_mxu_v5e"] = [sc.with_device(sc.low_mxu(), "TPU v5 lite", 197.0, 819.0)]
    return out


def _dot_design() -> CaptureDesign:
    """A plain `dot` (not a fusion) on v6e whose K = 1100 pads to 1152 on a 128-wide MXU and to 1280 on
    v6e's 256-wide one, so a padding target taken from the wrong MXU width fails the audit. M 32768 and
    N 4096 keep it compute-bound (intensity 845 FLOP/B against a ridge of 560) at 20 % of peak."""
    from tpudiag.writers.tpu_design import OpDef, Placed

    m, k, n = 32768, 1100, 4096
    flops = 2.0 * m * k * n
    text = (f"%dot.7 = bf16[{m},{n}]{{1,0}} dot(bf16[{m},{k}]{{1,0}} %p0, bf16[{k},{n}]{{1,0}} %p1), "
            "lhs_contracting_dims={1}, rhs_contracting_dims={0}")
    op = OpDef("dot.7", "convolution", flops=flops, bytes_accessed=float((m * k + k * n + m * n) * 2),
               shape=f"bf16[{m},{n}]{{1,0:T(8,128)(2,1)}}", hlo_text=text)
    dur = round(flops / (0.2 * sc.PEAK) * 1e12)
    return sc.design((op,), lambda chip, step: [Placed("dot.7", 0, dur)])


def _design_rates(designs: list[CaptureDesign], lines: dict[str, Line]) -> dict[str, float]:
    flops = {op.name: op.flops or _declared_flops(lines.get(op.name), "", None) for d in designs for op in d.ops}
    total_flops: dict[str, float] = defaultdict(float)
    total_ps: dict[str, int] = defaultdict(int)
    for d in designs:
        for chip in range(d.n_chips):
            for step in range(1, d.n_steps + 1):
                for placed in d.schedule(chip, step):
                    total_flops[placed.op] += flops.get(placed.op, 0.0)
                    total_ps[placed.op] += placed.dur_ps
    rates = {("FLOP/s", n): total_flops[n] / (total_ps[n] / 1e12) for n in total_ps if total_ps[n] > 0}
    hbm = {op.name: (op.bytes_accessed / 2 if op.hbm_read_bytes is None else op.hbm_read_bytes)
           + (op.bytes_accessed / 2 if op.hbm_write_bytes is None else op.hbm_write_bytes)
           for d in designs for op in d.ops}
    occurrences: dict[str, int] = defaultdict(int)
    for d in designs:
        for chip in range(d.n_chips):
            for step in range(1, d.n_steps + 1):
                for placed in d.schedule(chip, step):
                    occurrences[placed.op] += 1
    rates.update({("HBM bytes/s", n): hbm.get(n, 0.0) * occurrences[n] / (total_ps[n] / 1e12)
                  for n in total_ps if total_ps[n] > 0})
    return rates


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> list[Case]:
    tmp = tmp_path_factory.mktemp("claims")
    out = []
    for capture in sorted((MODELS / "captures").iterdir()):
        dumps = MODELS / "dumps" / capture.name
        generation = capture.name.rsplit("_", 1)[1]
        hlo = _dump_text(dumps)
        rates = _xprof_rates(capture, tmp, hlo)
        out.append(Case(f"{capture.name} + dumps", tpudiag.diagnose(capture, dumps=[dumps]), hlo, {}, rates,
                        generation))
        out.append(Case(f"{capture.name} alone", tpudiag.diagnose(capture), hlo, {}, rates, generation))
        out.append(Case(f"{capture.name} dumps alone", tpudiag.diagnose(dumps), hlo, {}, {}, generation))
    for capture in sorted((REPO / "examples" / "captures").iterdir()):
        out.append(Case(capture.name, tpudiag.diagnose(capture), None, {}, _xprof_rates(capture, tmp, None),
                        "v6e" if "v6e" in capture.name else ""))
    for name, designs in _scenario_designs().items():
        run = tmp / name / "plugins" / "profile" / "run"
        for d in designs:
            write_capture(d, run)
        lines = {op.name: line for d in designs for op in d.ops if op.hlo_text and (line := read_line(op.text()))}
        generation = {"TPU v6 Lite": "v6e", "TPU v5 lite": "v5e", "TPU v5p": "v5p"}.get(designs[0].device_type, "")
        out.append(Case(f"scenario {name}", tpudiag.diagnose(run), None,
                        lines, _design_rates(designs, lines), generation))
    return out


def _findings(cases: list[Case]):
    for case in cases:
        for f in case.diagnosis.findings:
            yield case, f


# -- the audit -------------------------------------------------------------------------------------

@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_the_audit_covers_findings_with_matmul_claims(cases):
    with_matmuls = [f for _, f in _findings(cases) if any(q.name == "K" for q in f.quantities)]
    assert len(with_matmuls) >= 10  # the low-mxu findings of the examples and scenarios


@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_matmul_dims_and_dtypes_are_those_of_an_instruction_inside_the_op(cases):
    checked = 0
    for case, f in _findings(cases):
        claims: dict[tuple[str, str], dict[str, object]] = defaultdict(dict)
        for q in f.quantities:
            if q.name in MATMUL_NAMES:
                claims[(q.subject, q.instruction or q.subject)][q.name] = q.value
        for (op, instruction), stated in claims.items():
            where = f"{case.label}: {f.rule} on `{op}`"
            if case.hlo is not None and case.hlo.find(op) is not None:
                found = case.hlo.inside(op, instruction)
                assert found is not None, f"{where} quotes `{instruction}`, which is not inside `{op}`"
                actual = recompute(*found, case.hlo)
            else:
                assert instruction == op and op in case.lines, f"{where}: no HLO text to check `{instruction}`"
                actual = recompute("", case.lines[op], None)
            assert stated == {k: actual[k] for k in stated}, f"{where}: stated {stated}, the HLO says {actual}"
            checked += 1
    assert checked >= 10


_DIM = re.compile(r"\b([MNK]) = (\d+)")
_PAD = re.compile(r"\b([A-Za-z]+) (\d+)→(\d+) \(\+([\d.]+)% ")
_DTYPES = re.compile(r"f32 operands \((\w+) x (\w+)")


@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_the_audit_meets_a_dot_and_a_padding_the_mxu_width_decides(cases):
    """Without these, a reader that only knows convolutions, or pads to 128 on a 256-wide MXU, passes."""
    dots = [(case, f) for case, f in _findings(cases) if f.rule == "low-mxu-utilization"
            and any(line.opcode == "dot" for name, line in case.lines.items() if name in f.ops)]
    assert dots, "no low-mxu finding on a `dot` instruction"
    width_decides = [(case, f) for case, f in _findings(cases) if f.rule == "low-mxu-utilization"
                     for _, d, _, _ in _PAD.findall(f.fix) if -(-int(d) // 128) != 2 * -(-int(d) // 256)]
    assert width_decides, "no padding in the audit whose target differs between 128- and 256-wide MXUs"


@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_dims_dtypes_and_padding_in_the_text_are_the_matmul_s(cases):
    for case, f in _findings(cases):
        if f.rule != "low-mxu-utilization":
            continue
        values = {q.name: q.value for q in f.quantities}
        where = f"{case.label}: `{f.ops[0]}`"
        text = f.message + " " + f.fix
        if _DIM.search(text) or _PAD.search(text) or _DTYPES.search(text):
            assert "K" in values, f"{where} states dims without its matmul's quantities: {text}"
        for letter, value in _DIM.findall(f.message):
            assert values[letter] == int(value), f"{where}: {letter} = {value} but its matmul has {values[letter]}"
        width = MXU_WIDTH[case.generation]
        for letter, d, padded, added in _PAD.findall(f.fix):
            assert letter in ("N", "K"), f"{where}: pads {letter} ({f.fix})"  # M is a batch: never padded
            assert values[letter] == int(d), f"{where}: pads {letter} {d}, its matmul has {values[letter]}"
            assert int(padded) == -(-int(d) // width) * width, f"{where}: {d}→{padded} on a {width} MXU"
            assert float(added) == pytest.approx(100 * (int(padded) / int(d) - 1), abs=0.06), where
        for lhs, rhs in _DTYPES.findall(f.message):
            assert (lhs, rhs) == (values["lhs dtype"], values["rhs dtype"]), where
        assert "dims not multiples" not in text  # the old cause, read off every shape in sight


@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_rates_match_an_independent_recomputation(cases):
    checked: dict[str, int] = defaultdict(int)
    for case, f in _findings(cases):
        for q in f.quantities:
            key = (q.name, q.subject)
            if key not in case.rates:
                continue
            assert q.value == pytest.approx(case.rates[key], rel=1e-3), f"{case.label}: `{q.subject}` {q.name}"
            checked[q.name] += 1
    assert checked["FLOP/s"] >= 5 and checked["HBM bytes/s"] >= 2, dict(checked)


_SHARE_OF_PEAK = re.compile(r"([\d.]+)% of (?:peak|[\d.]+ [KMGT]?B/s)")


@pytest.mark.xprof  # the `cases` fixture runs xprof's tools
def test_no_rate_above_the_peak_is_stated(cases):
    for case, f in _findings(cases):
        for q in f.quantities:
            if q.name.endswith("utilization"):
                assert 0.0 <= q.value <= 1.0, f"{case.label}: `{q.subject}` {q.name} {q.value}"
        for ev in f.evidence:
            for _, value in ev.values:
                for pct in re.findall(r"\(([\d.]+)%\)", value) if "B/s" in value else ():
                    assert float(pct) <= 100.0, f"{case.label}: {f.rule} evidence {ev.subject}: {value}"
        for pct in _SHARE_OF_PEAK.findall(f.message):
            assert float(pct) <= 100.0, f"{case.label}: {f.rule}: {f.message}"


def test_the_reader_agrees_with_the_issue_s_hand_reading():
    """fusion.198's matmul is convolution.55: bf16 x bf16, M 512, N 256, K 8 x 128 (issue 20)."""
    hlo = _dump_text(MODELS / "dumps" / "transformer_train_v5e")
    found = hlo.inside("fusion.198", "convolution.55")
    assert found is not None
    assert recompute(*found, hlo) == {"M": 512, "N": 256, "K": 1024, "batch": 1, "lhs dtype": "bf16",
                                      "rhs dtype": "bf16", "result dtype": "bf16"}
    assert hlo.inside("fusion.198", "convolution.27") is None


def test_the_reader_reads_an_attention_dot_written_as_a_dilated_convolution():
    """`bqhd,bkhd->bhqk` (b 8, h 2, q = k = d = 128) as XLA writes it: a window of size 8x2 that is all lhs dilation."""
    hlo = _dump_text(MODELS / "dumps" / "transformer_train_v5e")
    found = hlo.find("convolution-base-dilated.12")
    assert recompute(*found, hlo) == {"M": 128, "N": 128, "K": 128, "batch": 16, "lhs dtype": "bf16",
                                      "rhs dtype": "bf16", "result dtype": "bf16"}
