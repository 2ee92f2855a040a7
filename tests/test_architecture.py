"""The import layers of docs/architecture.md, enforced over every import in the package.

Module-level and function-level imports count alike (a lazy import is still a dependency), and
so do `if TYPE_CHECKING:` imports. A module may import its own package, any lower layer and, in
the foundation layer only, its siblings; nothing imports upward, and no modules import in a circle.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

from tests.conftest import REPO

PACKAGE = REPO / "tpudiag"

# Top-level module or subpackage of `tpudiag` -> its layer (docs/architecture.md).
LAYERS = {
    "errors": 0, "arguments": 0, "proto": 0, "model": 0, "version": 0, "examples_data": 0,
    "parsers": 1, "writers": 1,
    "analysis": 2, "compiler": 2.5,  # compiles and simulates; lays programs out with analysis's cost model
    "rules": 3, "render": 3,
    "report_builder": 3,  # analysis, findings and the join -> the `Report`; every warning gathered once
    "inputs": 3.5,  # the pipeline's first stage: read every input once, decide the chip once
    "pipeline": 4,
    "profiling": 4.2,  # `tpudiag.profile()`: traces with jax.profiler, then calls the pipeline's `diagnose`
    "kernels_lab": 4.2,  # Pallas reproductions of a diagnosis's ops (`spec_from_diagnosis`)
    "whatif": 4.2,  # deviceless compiles of flag variants, compared through the pipeline
    "gate": 4.2,  # the CI gate's policy (`tpudiag check`): a verdict from `diagnose` / `compare`
    "__init__": 4.5,  # the package root re-exports the pipeline's `diagnose` and `compare`, lazily
    "tui": 5,
    "cli": 6,
    "__main__": 7,  # `python -m tpudiag` runs the CLI
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _resolve(name: str, modules: set[str]) -> str:
    """The package module an imported name lands in: the longest known module prefix."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path, module: str, modules: set[str]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base[:len(base) - node.level + (1 if is_package else 0)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            # `from tpudiag.x import y` names a submodule y, or an attribute of x. (The parent
            # package a submodule import runs first is not counted, as import-linter does not.)
            names = [f"{prefix}.{a.name}" if f"{prefix}.{a.name}" in modules else prefix for a in node.names]
        else:
            continue
        for name in names:
            if name == "tpudiag" or name.startswith("tpudiag."):
                target = _resolve(name, modules)
                if target and target != module:
                    found.add(target)
    return found


def _graph() -> dict[str, set[str]]:
    files = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    modules = set(files)
    return {m: _imports(p, m, modules) for m, p in files.items()}


def _top(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


GRAPH = _graph()


def test_every_top_level_module_has_a_layer():
    assert {_top(m) for m in GRAPH} <= set(LAYERS), "add new top-level modules to LAYERS and the docs"


def test_the_docs_layer_table_is_layers():
    """docs/architecture.md's table names each top-level module in the layer LAYERS gives it."""
    documented = {}
    for row in (REPO / "docs" / "architecture.md").read_text(encoding="utf-8").splitlines():
        cells = row.split("|")
        if len(cells) < 4 or not re.match(r"\s*\d", cells[1]):
            continue
        layer = float(re.match(r"\s*([\d.]+)", cells[1]).group(1))
        for name in re.findall(r"`([^`]+)`", cells[2]):
            if name == "tpudiag/__init__.py":
                name = "__init__"
            if "." not in name and "/" not in name:  # not `tpudiag.diagnose`, the API a module offers
                documented[name] = layer
    assert documented == {name: float(layer) for name, layer in LAYERS.items()}


def test_no_upward_or_sideways_import():
    bad = []
    for module, targets in sorted(GRAPH.items()):
        src = _top(module)
        for target in sorted(targets):
            dst = _top(target)
            if dst == src:
                continue
            if LAYERS[dst] > LAYERS[src] or (LAYERS[dst] == LAYERS[src] and LAYERS[src] != 0):
                bad.append(f"{module} -> {target}")
    assert bad == []


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one node (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: list[list[str]] = []
    counter = 0
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in graph:
                    continue
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    top = stack.pop()
                    on_stack.discard(top)
                    component.append(top)
                    if top == node:
                        break
                if len(component) > 1:
                    out.append(sorted(component))
    return out


def test_no_import_circles_between_packages():
    packages: dict[str, set[str]] = defaultdict(set)
    for module, targets in GRAPH.items():
        packages[_top(module)].update(_top(t) for t in targets if _top(t) != _top(module))
    assert _cycles(dict(packages)) == []


def test_no_import_circles_between_modules():
    assert _cycles(GRAPH) == []


@pytest.mark.parametrize("graph, expected", [
    ({"a": {"b"}, "b": {"a"}, "c": set()}, [["a", "b"]]),  # a circle is found
    ({"a": {"b"}, "b": {"c"}, "c": set()}, []),  # a chain is not (near miss)
])
def test_cycle_finder(graph, expected):
    assert _cycles(graph) == expected


def test_the_import_scan_sees_function_level_imports():
    """`tpudiag.cli.app` imports the pipeline only inside `report`: the scan must still see it."""
    assert "tpudiag.pipeline" in GRAPH["tpudiag.cli.app"]


DUMP_READERS = {"tpudiag.parsers.dump_dir", "tpudiag.parsers.compile_output", "tpudiag.parsers.hlo_text",
                "tpudiag.parsers.llo.load"}


def test_dump_directories_are_read_in_parsers_alone():
    """Dump directories are discovered and read under `parsers/` (`parsers.dump_dir`), and the read
    goes down only: a dump reader imports nothing above the foundation beside other parsers."""
    for module in DUMP_READERS:
        assert module in GRAPH, f"{module} moved: update DUMP_READERS and docs/architecture.md"
        assert {_top(t) for t in GRAPH[module]} <= {"parsers", "errors", "model"}, module
    # `compiler/` compiles and simulates; it reads no dump directory itself.
    readers = {"tpudiag.parsers.dump_dir", "tpudiag.parsers.compile_output", "tpudiag.parsers.llo.load"}
    assert not [m for m in GRAPH if _top(m) == "compiler" and GRAPH[m] & readers]


def test_compiler_only_compiles_and_simulates():
    """Cost and memory models live in `analysis` (`cost_model`, `device_memory`), readers in `parsers`:
    `compiler/` holds the deviceless compile and the modelled timeline, nothing else (issue 32)."""
    held = {p.stem for p in (REPO / "tpudiag" / "compiler").glob("*.py")} - {"__init__"}
    assert held == {"driver", "worker", "target", "topology", "flags", "simulate", "static_report"}
