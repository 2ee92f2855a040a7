"""Load the user's `MODULE:FUNCTION` and its example arguments (inside the compile worker).

The contract, also in `tpudiag compile --help` and docs/compile.md:

- MODULE is a dotted module name importable from the current directory, or a path to a `.py`
  file. FUNCTION is a name in it: a plain function (tpudiag wraps it in `jax.jit`) or an already
  jitted one.
- The module defines `example_args(mesh)`, returning a tuple (or list) of positional arguments:
  usually `jax.ShapeDtypeStruct(shape, dtype, sharding=NamedSharding(mesh, P(...)))` pytrees.
  `mesh` is a `jax.sharding.Mesh` over every device of the topology, axes `("data", "model")`
  with `model` = 2 (`data` = all devices when the count is odd). It is also the context mesh
  (`jax.set_mesh`) while the function is lowered, so `jax.shard_map(..., mesh=None)` works.
- Optional: `mesh_shape(n_devices)` returning an ordered `{axis: size}` dict to use instead;
  `JIT_KWARGS`, a dict passed to `jax.jit` (e.g. `static_argnums`, `donate_argnums`).

Every failure is a `TargetError` with a one-line message; the worker reports it and exits.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType


class TargetError(Exception):
    """The user's module cannot be used: message and optional hint, both one line."""

    def __init__(self, message: str, hint: str = ""):
        super().__init__(message)
        self.message = message
        self.hint = hint


@dataclass(frozen=True)
class TargetSpec:
    module: str  # dotted name or path to a .py file
    function: str

    @property
    def is_path(self) -> bool:
        return self.module.endswith(".py") or "/" in self.module


def parse_target(text: str) -> TargetSpec:
    """Split `MODULE:FUNCTION` (the last colon splits, so Windows-free paths with colons are rare)."""
    module, sep, function = text.rpartition(":")
    if not sep or not module or not function:
        raise TargetError(f"target {text!r} is not MODULE:FUNCTION",
                          hint="e.g. `examples/models/transformer_train.py:train_step` or `mypkg.model:step`")
    if not function.isidentifier():
        raise TargetError(f"function name {function!r} in {text!r} is not a Python identifier")
    return TargetSpec(module=module, function=function)


def _user_frame(exc: BaseException, path: str | None) -> str:
    """` (file.py:12)` for the innermost frame in the user's file, else ''."""
    frames = traceback.extract_tb(exc.__traceback__)
    for frame in reversed(frames):
        if path is None or Path(frame.filename).resolve() == Path(path).resolve():
            return f" ({Path(frame.filename).name}:{frame.lineno})"
    return ""


def load_module(spec: TargetSpec) -> ModuleType:
    if spec.is_path:
        path = Path(spec.module)
        if not path.is_file():
            raise TargetError(f"no such file `{spec.module}`")
        name = f"tpudiag_user_{path.stem}"
        mod_spec = importlib.util.spec_from_file_location(name, path)
        if mod_spec is None or mod_spec.loader is None:
            raise TargetError(f"cannot import `{spec.module}` as a Python module")
        module = importlib.util.module_from_spec(mod_spec)
        sys.modules[name] = module
        sys.path.insert(0, str(path.resolve().parent))
        loader_path = str(path)
        try:
            mod_spec.loader.exec_module(module)
        except SyntaxError as exc:
            raise TargetError(f"syntax error in `{spec.module}` line {exc.lineno}: {exc.msg}") from None
        except Exception as exc:  # the user's module failed at import: report its own error
            raise TargetError(f"importing `{spec.module}` failed{_user_frame(exc, loader_path)}: "
                              f"{type(exc).__name__}: {exc}") from None
        return module
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))
    try:
        return importlib.import_module(spec.module)
    except SyntaxError as exc:
        raise TargetError(f"syntax error in module `{spec.module}` ({Path(exc.filename or '').name} line "
                          f"{exc.lineno}): {exc.msg}") from None
    except ModuleNotFoundError as exc:
        if exc.name and spec.module.startswith(exc.name):
            raise TargetError(f"no module named `{spec.module}`",
                              hint="run from the directory that holds it, or pass a path to the .py file") from None
        raise TargetError(f"importing `{spec.module}` failed: {type(exc).__name__}: {exc}") from None
    except Exception as exc:
        raise TargetError(f"importing `{spec.module}` failed{_user_frame(exc, None)}: "
                          f"{type(exc).__name__}: {exc}") from None


def resolve(module: ModuleType, spec: TargetSpec):
    """(function, example_args, mesh_shape or None, jit kwargs) from the loaded module."""
    fn = getattr(module, spec.function, None)
    if fn is None:
        public = sorted(n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                        and getattr(v, "__module__", None) == module.__name__)
        raise TargetError(f"`{spec.module}` has no function `{spec.function}`",
                          hint=f"functions defined there: {', '.join(public) or 'none'}")
    if not callable(fn):
        raise TargetError(f"`{spec.module}:{spec.function}` is not callable ({type(fn).__name__})")
    example_args = getattr(module, "example_args", None)
    if example_args is None or not callable(example_args):
        raise TargetError(f"`{spec.module}` defines no `example_args(mesh)`",
                          hint="add `def example_args(mesh): return (jax.ShapeDtypeStruct(...), ...)`, "
                               "see `tpudiag compile --help`")
    mesh_shape = getattr(module, "mesh_shape", None)
    jit_kwargs = getattr(module, "JIT_KWARGS", {}) or {}
    if not isinstance(jit_kwargs, dict):
        raise TargetError(f"`JIT_KWARGS` in `{spec.module}` must be a dict, not {type(jit_kwargs).__name__}")
    return fn, example_args, mesh_shape, jit_kwargs


def call_example_args(example_args, mesh, spec: TargetSpec) -> tuple:
    try:
        args = example_args(mesh)
    except Exception as exc:
        raise TargetError(f"`example_args(mesh)` in `{spec.module}` raised{_user_frame(exc, None)}: "
                          f"{type(exc).__name__}: {exc}") from None
    if not isinstance(args, (tuple, list)):
        raise TargetError(f"`example_args(mesh)` in `{spec.module}` returned {type(args).__name__}; "
                          "it must return a tuple of positional arguments",
                          hint="for one argument return `(arg,)`")
    return tuple(args)
