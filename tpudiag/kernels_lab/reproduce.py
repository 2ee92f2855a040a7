"""Write a standalone reproduction directory for one op: `repro.py` + `spec.json`.

`repro.py` needs only jax: the tiling rule, the family module and the harness are copied into it
verbatim (module docstrings, `from __future__` and tpudiag imports dropped), so what `lab check`
tests and `lab tune` compiles is exactly the code the unit tests cover. The chosen block sizes sit
between two marker lines that `lab tune` rewrites.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib.util
import re
import sys
import textwrap
from pathlib import Path
from types import ModuleType

from tpudiag.errors import InputError
from tpudiag.kernels_lab.family import family_module
from tpudiag.kernels_lab.problems import problem_fields
from tpudiag.kernels_lab.spec import OpSpec
from tpudiag.kernels_lab.tiling import BlockSizeError
from tpudiag.model.text import printable
from tpudiag.writers.files import write_text as write_atomic

BLOCKS_BEGIN = "# lab: block sizes begin (rewritten by `tpudiag lab tune`)"
BLOCKS_END = "# lab: block sizes end"
_HERE = Path(__file__).resolve().parent


def _inlined(path: Path) -> str:
    """A module's source without its docstring, `from __future__` and tpudiag imports."""
    source = path.read_text()
    tree = ast.parse(source)
    drop: set[int] = set()
    for node in tree.body:
        is_doc = (node is tree.body[0] and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                  and isinstance(node.value.value, str))
        is_local_import = isinstance(node, ast.ImportFrom) and (node.module == "__future__"
                                                                 or (node.module or "").startswith("tpudiag"))
        if is_doc or is_local_import:
            drop.update(range(node.lineno, node.end_lineno + 1))
    lines = [line for i, line in enumerate(source.splitlines(), start=1) if i not in drop]
    return "\n".join(lines).strip("\n") + "\n"


def _comment(text: str, width: int = 100) -> str:
    out = []
    # printable: no NUL (a SyntaxError) and no `\r` (a line break to Python) from trace text in a comment.
    for para in printable(text, keep_newlines=True).splitlines() or [""]:
        out += textwrap.wrap(para, width - 2, subsequent_indent="    ") or [""]
    return "\n".join(f"# {line}".rstrip() for line in out)


def blocks_source(blocks, basis: str) -> str:
    fields = ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(blocks).items())
    return f"{BLOCKS_BEGIN}\n{_comment(basis)}\nBLOCKS = BlockSizes({fields})\n{BLOCKS_END}"


def _header(spec: OpSpec) -> str:
    # A modelled capture (`simulate`, compiler dumps) times its ops by a model: never "measured" there.
    measured = (f"{spec.measured_time_ps / 1e6:,.1f} us per occurrence (mean of {spec.occurrences}, "
                f"{spec.captured_basis} in the capture on {spec.device_type or 'an unknown device'})"
                if spec.measured_time_ps else "unknown")
    lines = [
        f"Op `{spec.op_name}` ({spec.category}) of program `{spec.program}`, from `{spec.capture}`.",
        f"Framework op: {spec.tf_op or 'unknown'}  source: {spec.source or 'unknown'}",
        f"Output shape and layout: {spec.shape_with_layout}",
        "Operand shapes and layouts: " + (", ".join(spec.operands) if spec.operands
                                          else "not in the capture's HLO text"),
        f"HLO: {spec.hlo_text[:400]}",
        f"Time of the op in the capture: {measured}",
        f"Target: {spec.topology} ({spec.generation}), compiled against one device; VMEM "
        f"{spec.vmem_bytes / 2**20:.0f} MiB",
        f"Family: {spec.family}. How each fact was inferred:",
        *[f"  - {b}" for b in spec.basis],
        *[f"Note: {n}" for n in spec.notes],
        f"Full problem (the op as profiled{'' if spec.run_problem != spec.problem else '; the CPU run too'}): "
        f"{problem_fields(spec.problem)}",
    ]
    if spec.run_problem != spec.problem:
        lines.append(f"CPU problem: {problem_fields(spec.run_problem)}"
                     + (f" (every dim / {spec.scale_down})" if spec.scale_down > 1 else ""))
    return "\n".join(_comment(line) for line in lines)


def _device_preamble(spec: OpSpec) -> list[str]:
    """A collective runs over several devices: on a CPU, jax must be told to simulate them before
    it starts (the flag only affects the CPU platform; a TPU run uses its own devices)."""
    if spec.family != "collective":
        return []
    n = int(max(spec.problem.devices, spec.run_problem.devices))
    return ["# ---- simulated CPU devices for the ring (set before jax starts) ----",
            "import os  # noqa: E402",
            "",
            'if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):',
            '    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + '
            f'" --xla_force_host_platform_device_count={n}").strip()',
            ""]


def render(spec: OpSpec, blocks, basis: str) -> str:
    """The text of `repro.py`."""
    parts = [
        "#!/usr/bin/env python3",
        # The op name comes from the trace: it appears only as the `OP_NAME` literal (repr) and in
        # comments, never inside this docstring, where a `"""` in it would end the string.
        '"""Reproduction of one profiled op (`OP_NAME` below) as a Pallas TPU kernel beside its XLA reference.\n\n'
        "Written by `tpudiag lab extract`. Run `python repro.py`: on a TPU it runs the full problem,\n"
        "compiled; elsewhere the CPU problem in Pallas interpret mode. It prints a numerics check and\n"
        'exits 1 on a mismatch. Needs only jax.\n"""',
        "",
        _header(spec),
        "",
        "from __future__ import annotations",
        "",
        "# ---- tiling rule (from tpudiag/kernels_lab/tiling.py) ----",
        _inlined(_HERE / "tiling.py"),
        *_device_preamble(spec),
        f"# ---- problem (from tpudiag/kernels_lab/problems/{spec.family}.py) ----",
        _inlined(_HERE / "problems" / f"{spec.family}.py"),
        f"# ---- kernel family (from tpudiag/kernels_lab/{spec.family}.py) ----",
        _inlined(_HERE / f"{spec.family}.py"),
        "# ---- harness (from tpudiag/kernels_lab/harness.py) ----",
        _inlined(_HERE / "harness.py"),
        "# ---- this op ----",
        f"OP_NAME = {spec.op_name!r}",
        # repr of plain fields (str, int, bool, lists): trace text in them, e.g. a mesh axis name, is a
        # Python string literal with its quotes and control characters escaped
        f"PROBLEM = Problem(**{problem_fields(spec.problem)!r})",
        f"RUN_PROBLEM = Problem(**{problem_fields(spec.run_problem)!r})",
        f"VMEM_BYTES = {spec.vmem_bytes}  # {spec.generation}",
        "",
        blocks_source(blocks, basis),
        "",
        "",
        "def main(argv=None) -> int:",
        "    return run_main(sys.modules[__name__], op_name=OP_NAME, problem=PROBLEM, run_problem=RUN_PROBLEM,",
        f"                    blocks=BLOCKS, vmem_bytes=VMEM_BYTES, scale_down={spec.scale_down}, argv=argv)",
        "",
        "",
        'if __name__ == "__main__":',
        "    sys.exit(main())",
        "",
    ]
    return "\n".join(parts)


def write_pallas_repro(spec: OpSpec, out_dir: Path):
    """Write `spec.json` and the `repro.py` that calls the user's own Pallas kernel as captured
    (`kernels_lab.pallas_repro`); returns (repro path, `PallasRepro`)."""
    from tpudiag.kernels_lab.pallas_repro import render_pallas

    recorded = spec.problem.kernel.source_file
    found = Path(recorded) if recorded else None
    source = str(found.resolve()) if found is not None and found.is_file() else recorded
    made = render_pallas(op_name=spec.op_name, header=_header(spec), problem=spec.problem, topology=spec.topology,
                         source_file=source)
    out_dir.mkdir(parents=True, exist_ok=True)
    write_atomic(out_dir / "spec.json", spec.to_json())
    repro = out_dir / "repro.py"
    write_atomic(repro, made.text)
    return repro, made


def write_repro(spec: OpSpec, out_dir: Path) -> tuple[Path, object]:
    """Write `spec.json` and `repro.py` with the family's default blocks for the target generation."""
    fam = family_module(spec.family)
    problem = spec.problem
    blocks = fam.default_blocks(problem, spec.generation)
    basis = (f"Default block sizes for {spec.generation} (the family's tuned table or its safe default), "
             "not yet swept for this op")
    try:
        blocks.validate(problem, spec.vmem_bytes)
    except BlockSizeError as exc:
        if spec.run_problem == spec.problem:
            # The problem comes from trace numbers, and nothing smaller is run: an implausible one
            # is an input error.
            raise InputError(f"no block sizes of the {spec.family} family fit `{printable(spec.op_name)}`: {exc}",
                             hint="check the op's shapes in the capture, or pass --dump with its compiled HLO") from exc
        # e.g. a collective that holds its whole shard in VMEM: the CPU run (smaller) still checks the
        # kernel's numerics, and `tune` records the full problem as invalid with this reason
        basis += f". The full problem does not fit: {exc}"
    out_dir.mkdir(parents=True, exist_ok=True)
    # Atomic: `lab check` and `lab tune` execute repro.py, so a half-written one must never exist.
    write_atomic(out_dir / "spec.json", spec.to_json())
    repro = out_dir / "repro.py"
    write_atomic(repro, render(spec, blocks, basis))
    return repro, blocks


def set_blocks(repro: Path, blocks, basis: str) -> None:
    """Replace the block sizes between the markers of an existing `repro.py`."""
    text = repro.read_text()
    pattern = re.compile(re.escape(BLOCKS_BEGIN) + r".*?" + re.escape(BLOCKS_END), re.S)
    if not pattern.search(text):
        raise InputError("no block-size markers in the reproduction", path=repro,
                         hint="re-run `tpudiag lab extract` to regenerate it")
    write_atomic(repro, pattern.sub(lambda _: blocks_source(blocks, basis), text, count=1))


def load_repro(out_dir: Path) -> ModuleType:
    """Import `DIR/repro.py` as a module (it runs nothing at import)."""
    path = out_dir / "repro.py"
    if not path.is_file():
        raise InputError("no repro.py here", path=out_dir, hint="create it with `tpudiag lab extract`")
    name = f"tpudiag_lab_repro_{abs(hash(str(path.resolve())))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    module_spec.loader.exec_module(module)
    return module
