"""Make decorated functions mutable by mutmut: a source transform for mutmut's scratch tree only.

mutmut 3.8.1 makes no mutants in a function under a decorator (`@property`, `@cached_property`,
`@lru_cache`, ...), except a lone `@staticmethod` or `@classmethod`. This script rewrites

    @lru_cache(maxsize=N)                  def _f_undecorated(name):
    def f(name):                    into       body
        body                               _f_undecorated.__name__ = 'f'
                                           _f_undecorated.__qualname__ = ...  # as `f` had
                                           f = lru_cache(maxsize=N)(_f_undecorated)
                                           del _f_undecorated

in a module, a class body or a function body alike: the decorators are applied in the same
order to the same function, under the same name and qualified name, and the temporary name is
deleted, so the module's and the class's namespaces hold what they held before (`__set_name__`
of a `cached_property` still runs, as it does for any assigned attribute). What differs: the
decorator expressions are evaluated after the `def` instead of before it, and the code object
is named `_f_undecorated` (seen in tracebacks only).

Left alone: a lone `@staticmethod` or `@classmethod` (mutmut mutates those itself) and
`@overload` stubs. mutmut names the mutants after the temporary name:
`tpudiag.model.matmuls.xǁMatmulǁ_m_undecorated__mutmut_1`,
`tpudiag.model.hlo_names.x__async_role_undecorated__mutmut_1`.

An `lru_cache` over mutmut's trampoline would hide a mutant behind a result cached before the
mutant was switched on (by the fork server's collection, or by an earlier test); `--conftest`
appends to a conftest an autouse fixture that clears every `lru_cache` of the package before each
test.

Usage, in the scratch tree before `mutmut run` (see docs/testing.md):

    python tests/mutmut_undecorate.py tpudiag/model tpudiag/analysis tpudiag/rules --conftest tests/conftest.py

Standard library only; never run it on a checkout.
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from pathlib import Path

#: Decorators mutmut 3.8.1 already mutates under, when alone.
MUTMUT_HANDLES = frozenset({"staticmethod", "classmethod"})

CLEAR_CACHES_FIXTURE = '''

@pytest.fixture(autouse=True)
def _mutmut_undecorate_clear_caches():
    """Added by tests/mutmut_undecorate.py: a result cached before the mutant was switched on
    would hide it, so every `lru_cache` of the package starts empty in each test."""
    import functools
    import sys
    for name, module in list(sys.modules.items()):
        if not name.startswith("{package}."):
            continue
        for value in list(vars(module).values()):
            for candidate in (value, *(vars(value).values() if isinstance(value, type) else ())):
                if isinstance(candidate, functools._lru_cache_wrapper):
                    candidate.cache_clear()
'''


def _name_of(decorator: ast.expr) -> str:
    """`property` for `@property`, `lru_cache` for `@functools.lru_cache(maxsize=8)`."""
    if isinstance(decorator, ast.Call):
        decorator = decorator.func
    if isinstance(decorator, ast.Attribute):
        return decorator.attr
    if isinstance(decorator, ast.Name):
        return decorator.id
    return ""


def _needs_transform(node: ast.AST) -> bool:
    if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not node.decorator_list:
        return False
    names = [_name_of(d) for d in node.decorator_list]
    if "overload" in names:
        return False
    return not (len(names) == 1 and isinstance(node.decorator_list[0], ast.Name) and names[0] in MUTMUT_HANDLES)


def decorated_functions(source: str) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    """The functions `undecorate` rewrites, in source order."""
    found = [node for node in ast.walk(ast.parse(source)) if _needs_transform(node)]
    return sorted(found, key=lambda n: n.lineno)


def _temporary_name(name: str, source: str) -> str:
    base = f"_{name}_undecorated"
    candidate, n = base, 1
    while re.search(rf"\b{re.escape(candidate)}\b", source):
        n += 1
        candidate = f"{base}_{n}"
    return candidate


def _undecorate_one(source: str, node: ast.FunctionDef | ast.AsyncFunctionDef) -> str:
    lines = source.splitlines(keepends=True)
    first = min(d.lineno for d in node.decorator_list) - 1  # 0-based line of the first decorator
    def_line = node.lineno - 1
    indent = lines[def_line][: len(lines[def_line]) - len(lines[def_line].lstrip())]
    if lines[first][: len(indent)] != indent or not lines[first][len(indent):].startswith("@"):
        raise ValueError(f"line {first + 1}: a decorator not on a line of its own")
    name = node.name
    temporary = _temporary_name(name, source)
    header, n = re.subn(rf"^(\s*(?:async\s+)?def\s+){re.escape(name)}\b", rf"\g<1>{temporary}", lines[def_line])
    if n != 1:
        raise ValueError(f"line {def_line + 1}: no `def {name}` to rename")
    applied = temporary
    for decorator in reversed(node.decorator_list):
        text = ast.get_source_segment(source, decorator)
        if text is None:
            raise ValueError(f"line {decorator.lineno}: cannot read the decorator")
        if "\n" in text:
            text = f"({text})"
        applied = f"{text}({applied})"
    after = [
        f"{indent}{temporary}.__name__ = {name!r}\n",
        f"{indent}{temporary}.__qualname__ = {temporary}.__qualname__[: -len({temporary!r})] + {name!r}\n",
        f"{indent}{name} = {applied}\n",
        f"{indent}del {temporary}\n",
    ]
    end = node.end_lineno
    return "".join(lines[:first] + [header] + lines[def_line + 1:end] + after + lines[end:])


def undecorate(source: str) -> tuple[str, list[str]]:
    """`source` with every decorated function rewritten as above, and the names rewritten."""
    done: list[str] = []
    if source and not source.endswith("\n"):
        source += "\n"
    while found := decorated_functions(source):
        last = found[-1]  # the last one first: an inner function before the one holding it
        source = _undecorate_one(source, last)
        done.append(last.name)
    compile(source, "<undecorated>", "exec")
    return source, done[::-1]


def undecorate_file(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    new, done = undecorate(text)
    if done:
        path.write_text(new, encoding="utf-8")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", type=Path, help="files or directories to rewrite in place")
    parser.add_argument("--conftest", type=Path, help="a conftest.py to append the cache-clearing fixture to")
    parser.add_argument("--package", default="tpudiag", help="whose lru_caches the fixture clears")
    args = parser.parse_args(argv)
    total = 0
    for path in args.paths:
        for file in sorted(path.rglob("*.py")) if path.is_dir() else [path]:
            done = undecorate_file(file)
            total += len(done)
            if done:
                print(f"{file}: {len(done)} ({', '.join(done)})")
    if args.conftest is not None:
        with args.conftest.open("a", encoding="utf-8") as f:
            f.write(CLEAR_CACHES_FIXTURE.replace("{package}", args.package))
    print(f"{total} decorated functions rewritten")
    return 0


if __name__ == "__main__":
    sys.exit(main())
