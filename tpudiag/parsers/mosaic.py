"""A Mosaic TPU kernel's serialised body (a `tpu_custom_call`'s backend_config) -> `MosaicKernel`.

The body is `custom_call_config.body`: base64 of MLIR bytecode holding one `func.func` in the
versioned `stable_mosaic` form. It is read with the MLIR Python bindings jaxlib ships
(`jaxlib.mlir.ir`, with the Mosaic TPU dialect registered as jax registers it), imported only when
a body is there, so a capture without Pallas kernels never loads them. Without jaxlib the kernel
facts are left out with one warning (`MLIR_MISSING`), nothing else changes.

Where the body survives: the compiler drops it once the kernel is compiled, so the program a
runtime keeps (`compiled.as_text()`, the HloProto a capture embeds, `module.pb`) has none; the XLA
dump's `*after_optimizations.txt` (written before the backend runs) has it, and so has a modelled
capture `tpudiag simulate` wrote from a `tpudiag compile` output (`merged_config`).
"""

from __future__ import annotations

import ast
import base64
import binascii
import dataclasses
import functools
import json
import re
from collections import Counter
from pathlib import Path, PurePosixPath

from tpudiag.model.kernels import KernelBlock, MosaicKernel

KERNEL_TARGET = "tpu_custom_call"
MLIR_MISSING = ("the Pallas kernels' grids and blocks are not shown: reading a Mosaic kernel needs jaxlib's "
                "MLIR bindings (`pip install 'tpudiag[tpu]'`)")


class KernelUnreadable(ValueError):
    """The body is there but is not a Mosaic kernel this reader understands; the message says why."""


class MlirMissing(ImportError):
    """jaxlib (its MLIR bindings and the Mosaic TPU dialect) cannot be imported."""


def body_of(backend_config: str) -> bytes | None:
    """The kernel's MLIR bytecode in a `tpu_custom_call` backend_config; None when it has none."""
    if "custom_call_config" not in backend_config:
        return None
    try:
        config = json.loads(backend_config)
        body = config["custom_call_config"]["body"]
        return base64.b64decode(body, validate=True) if isinstance(body, str) and body else None
    except (ValueError, KeyError, TypeError, binascii.Error):
        return None


def merged_config(compiled: str, with_body: str) -> str:
    """The compiled custom call's backend_config (scoped VMEM used, cycles) with the kernel body of
    the same call before the backend ran (`with_body`, the XLA dump's): what `simulate` embeds.
    `compiled` unchanged when `with_body` has no body or either is not a JSON object."""
    try:
        out, before = json.loads(compiled or "{}"), json.loads(with_body)
    except ValueError:
        return compiled
    if not (isinstance(out, dict) and isinstance(before, dict) and isinstance(before.get("custom_call_config"), dict)):
        return compiled
    out["custom_call_config"] = before["custom_call_config"]
    return json.dumps(out, separators=(",", ":"))


@functools.cache
def _context():
    try:
        from jaxlib.mlir import ir
        from jaxlib.mosaic.python import tpu
    except ImportError as exc:
        raise MlirMissing(MLIR_MISSING) from exc
    ctx = ir.Context()
    tpu.register_dialect(ctx)
    ctx.allow_unregistered_dialects = True  # the other `stable_mosaic.*` ops are read generically
    return ir, ctx


_SEMANTICS = re.compile(r"<(\w+)>")
_MEMORY_SPACE = re.compile(r"memory_space<(\w+)>")
_LOCATION = re.compile(r'"([^"]+)":(\d+):\d+')
_INTERNAL = ("/jax/_src/", "/jax/experimental/", "site-packages/", "<frozen")


def _dtype(mlir_type: str) -> str:
    """MLIR element type -> HLO spelling: i1 pred, i32 s32, ui8 u8, f8E4M3FN f8e4m3fn; semaphores `semaphore`."""
    if "semaphore" in mlir_type:
        return "semaphore"
    if mlir_type == "i1":
        return "pred"
    if re.fullmatch(r"i\d+", mlir_type):
        return "s" + mlir_type[1:]
    if re.fullmatch(r"ui\d+", mlir_type):
        return "u" + mlir_type[2:]
    return mlir_type.lower()


def read_kernel(body: bytes, n_inputs: int) -> MosaicKernel:
    """The kernel in `body` (MLIR bytecode), whose custom call has `n_inputs` operands (scalar-prefetch
    operands included, as the HLO lists them). KernelUnreadable when it is not one; MlirMissing
    without jaxlib."""
    ir, ctx = _context()
    with ctx:
        try:
            module = ir.Module.parse(body)
        except ir.MLIRError as exc:
            why = "; ".join(str(d.message) for d in exc.error_diagnostics) or str(exc).splitlines()[0]
            raise KernelUnreadable(f"its serialised kernel ({len(body)} bytes) does not parse as MLIR: {why}") from None
        except (ValueError, RuntimeError) as exc:
            raise KernelUnreadable(f"its serialised kernel ({len(body)} bytes) does not parse as MLIR: {exc}") from None
        # The kernel, and one function per BlockSpec index map (`transform_N`): the kernel is the one
        # with the grid's attributes.
        funcs = [op.operation for op in module.body.operations if op.operation.name.endswith("func.func")]
        kernels = [f for f in funcs if "window_params" in f.attributes or "iteration_bounds" in f.attributes]
        if len(kernels) != 1:
            raise KernelUnreadable(f"the kernel body holds {len(kernels)} kernel functions, not one")
        func = kernels[0]
        attrs = func.attributes
        maps = {ir.StringAttr(f.attributes["sym_name"]).value: f for f in funcs
                if f is not func and "sym_name" in f.attributes}
        try:
            name = ir.StringAttr(attrs["sym_name"]).value
            inputs = list(ir.FunctionType(ir.TypeAttr(attrs["function_type"]).value).inputs)
            grid = tuple(int(x) for x in ir.DenseI64ArrayAttr(attrs["iteration_bounds"])) \
                if "iteration_bounds" in attrs else ()
            semantics = tuple(_SEMANTICS.search(str(a)).group(1) for a in ir.ArrayAttr(attrs["dimension_semantics"])) \
                if "dimension_semantics" in attrs else ()
            prefetch = ir.IntegerAttr(attrs["scalar_prefetch"]).value if "scalar_prefetch" in attrs else 0
            scratch = ir.IntegerAttr(attrs["scratch_operands"]).value if "scratch_operands" in attrs else 0
            windows = [ir.DictAttr(a) for a in ir.ArrayAttr(attrs["window_params"])] if "window_params" in attrs else []
        except (KeyError, ValueError, AttributeError) as exc:
            raise KernelUnreadable(f"the kernel's attributes are not as Mosaic writes them ({exc})") from None
        memrefs = inputs[len(grid) + prefetch:]
        n_windows = len(memrefs) - scratch
        if n_windows < 0 or (windows and len(windows) != n_windows):
            raise KernelUnreadable(f"the kernel has {len(memrefs)} buffer arguments for {len(windows)} windows "
                                   f"and {scratch} scratch buffers")
        n_in = max(0, min(n_windows, n_inputs - prefetch))
        blocks = []
        for i, t in enumerate(memrefs):
            memref = ir.MemRefType(t)
            space = _MEMORY_SPACE.search(str(memref.memory_space)) if memref.memory_space is not None else None
            bounds, index_map, why = None, None, ""
            if i < n_windows and windows and "window_bounds" in windows[i]:
                bounds = tuple(int(x) for x in ir.DenseI64ArrayAttr(windows[i]["window_bounds"]))
                index_map, why = _index_map(ir, windows[i], maps, len(grid))
            role, index = (("input", i) if i < n_in else ("output", i - n_in)) if i < n_windows \
                else ("scratch", i - n_windows)
            blocks.append(KernelBlock(role=role, index=index, shape=bounds if bounds is not None else tuple(memref.shape),
                                      dtype=_dtype(str(memref.element_type)),
                                      memory_space=space.group(1) if space else "any", windowed=bounds is not None,
                                      index_map=index_map, index_map_note=why))
        source, first, last, matmuls = _walk(func)
    return MosaicKernel(name=name, grid=grid, dimension_semantics=semantics, blocks=tuple(blocks),
                        scalar_prefetch=prefetch, source_file=source, first_line=first, last_line=last,
                        matmul_ops=matmuls)


def _index_map(ir, window, maps: dict, n_grid: int) -> tuple[tuple[str, ...] | None, str]:
    """A window's index map (`transform_indices`, one `transform_N` function of the grid indices) as
    terms `g<axis>` (that grid index) or an integer literal, when every block index it returns is
    one of those; else (None, why): a computed index (`i * 2`, a scalar-prefetch ref's value) is not
    rewritten into Python by guessing."""
    if "transform_indices" not in window:
        return None, "the window names no index map"
    try:
        symbol = ir.FlatSymbolRefAttr(window["transform_indices"]).value
    except (ValueError, TypeError):
        return None, "its index map is not a function reference"
    func = maps.get(symbol)
    if func is None or not func.regions or not func.regions[0].blocks:
        return None, f"its index map `{symbol}` is not in the body"
    ops = list(func.regions[0].blocks[0].operations)
    if not ops or not ops[-1].operation.name.endswith("func.return"):
        return None, f"its index map `{symbol}` does not end in a return"
    terms = []
    for value in ops[-1].operation.operands:
        if isinstance(value, ir.BlockArgument) and value.arg_number < n_grid:
            terms.append(f"g{value.arg_number}")
            continue
        owner = value.owner if isinstance(value, ir.OpResult) else None
        if owner is not None and owner.name.endswith("arith.constant") and "value" in owner.attributes:
            try:
                terms.append(str(int(ir.IntegerAttr(owner.attributes["value"]).value)))
                continue
            except (ValueError, TypeError):
                pass
        what = "a scalar-prefetch operand" if isinstance(value, ir.BlockArgument) else (
            f"computed by `{owner.name.rsplit('.', 1)[-1]}`" if owner is not None else "not a grid index")
        return None, f"its index map `{symbol}` returns a block index {what}, not a grid index or a constant"
    return tuple(terms), ""


def _walk(func) -> tuple[str, int, int, int]:
    """The user's file the body's ops come from (the most frequent one outside jax), the range of
    its lines (('', 0, 0) when the body carries no locations), and the body's MXU matmuls."""
    lines: Counter[str] = Counter()
    seen: dict[str, list[int]] = {}

    def visit(op) -> None:
        for region in op.regions:
            for block in region.blocks:
                for inner in block.operations:
                    if inner.operation.name.endswith("tpu.matmul"):
                        nonlocal_count[0] += 1
                    for path, line in _LOCATION.findall(str(inner.location)):
                        if not any(mark in path for mark in _INTERNAL):
                            lines[path] += 1
                            seen.setdefault(path, []).append(int(line))
                    visit(inner.operation)

    nonlocal_count = [0]
    visit(func)
    matmuls = nonlocal_count[0]
    if not lines:
        return "", 0, 0, matmuls
    path = lines.most_common(1)[0][0]
    return local_source(path), min(seen[path]), max(seen[path]), matmuls


def local_source(recorded: str, cwd: Path | None = None) -> str:
    """The kernel's source file as this machine has it, relative to the working directory: the
    recorded path when it lies under it; else the longest trailing part of it (two components at
    least, `models/kernel.py`) that names a file here (the same project checked out elsewhere than
    where it was compiled); else the path as the body records it. Reports and goldens then do not
    depend on where the capture was compiled or the checkout sits."""
    path = PurePosixPath(recorded)
    if not path.is_absolute():
        return recorded
    base = Path.cwd() if cwd is None else cwd
    try:
        return Path(recorded).relative_to(base).as_posix()
    except ValueError:
        pass
    parts = path.parts[1:]
    if ".." in parts:
        return recorded
    for start in range(len(parts) - 1):
        tail = PurePosixPath(*parts[start:])
        try:
            if (base / tail).is_file():
                return tail.as_posix()
        except (OSError, ValueError):  # a name too long for this file system, a NUL byte
            continue
    return recorded


_MAX_SOURCE_BYTES = 2 * 2**20


@dataclasses.dataclass(frozen=True)
class Caller:
    """The module-level function around a `pallas_call` site, as `lab tune MODULE:FN` names it."""

    target: str  # `examples/models/pallas_matmul.py:tiled_matmul` (the file as `local_source` shows it)
    params: tuple[str, ...]  # its keyword parameters (those with defaults, keyword-only ones)
    example_args: bool  # the module defines `example_args` (what `lab tune` compiles it on)


def caller_of(source_file: str, line: int) -> Caller | None:
    """The top-level function of `source_file` whose body holds `line` (the custom call's source
    line, i.e. the `pallas_call`), read with `ast` (never imported); None when the file is not here,
    does not parse, or no top-level function holds the line."""
    if not source_file or line <= 0:
        return None
    shown = local_source(source_file)
    try:
        path = Path(shown)
        if not path.is_file() or path.stat().st_size > _MAX_SOURCE_BYTES:
            return None
        tree = ast.parse(path.read_bytes())
    except (OSError, ValueError, SyntaxError):
        return None
    top = [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    fn = next((n for n in top if n.lineno <= line <= (n.end_lineno or n.lineno)), None)
    if fn is None:
        return None
    args = fn.args
    positional = args.posonlyargs + args.args
    params = tuple(a.arg for a in positional[len(positional) - len(args.defaults):]) + tuple(
        a.arg for a in args.kwonlyargs)
    has_example_args = any(isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name == "example_args"
                           for n in tree.body)
    return Caller(f"{shown}:{fn.name}", params, has_example_args)
