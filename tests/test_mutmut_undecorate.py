"""tests/mutmut_undecorate.py keeps behaviour: what mutmut's scratch tree runs is the same code."""

from __future__ import annotations

import importlib.util
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
_SPEC = importlib.util.spec_from_file_location("mutmut_undecorate", REPO / "tests" / "mutmut_undecorate.py")
undecorate = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(undecorate)  # a script, not a package module: load it without touching sys.path

SAMPLE = '''\
from dataclasses import dataclass
from functools import cached_property, lru_cache

CALLS = []


@dataclass(frozen=True)
class Box:
    """A frozen dataclass with every kind of decorated method the packages use."""
    side: int

    @property
    def area(self) -> int:
        """Side squared."""
        return self.side * self.side

    @cached_property
    def volume(self) -> int:
        CALLS.append(self.side)
        return self.side ** 3

    @property
    def _hidden(self) -> int:
        return -self.side

    @_hidden.setter
    def _hidden(self, value):
        raise AttributeError("read only")

    @staticmethod
    def unit() -> "Box":
        return Box(1)

    @classmethod
    @lru_cache(maxsize=4)
    def of(cls, side: int) -> "Box":
        return cls(side)


@lru_cache(maxsize=2)
def square(
    x: int,
) -> int:
    CALLS.append(x)

    def inner():
        @lru_cache(maxsize=None)
        def twice(y):
            return 2 * y
        return twice
    return inner()(x) * x // 2


def undecorated(x):
    return x'''


def _load(source: str, name: str, monkeypatch):
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(name, loader=None))
    monkeypatch.setitem(sys.modules, name, module)  # pickle looks functions up by module and qualified name
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


def _behaviour(module) -> dict:
    module.CALLS.clear()
    box = module.Box(3)
    seen = dict(area=box.area, volume=(box.volume, box.volume), hidden=box._hidden, unit=module.Box.unit().side,
                of=module.Box.of(2).side, of_cached=module.Box.of(2) is module.Box.of(2),
                square=(module.square(4), module.square(4), module.square(5)), calls=list(module.CALLS),
                area_doc=module.Box.area.__doc__, cache=module.square.cache_info().maxsize,
                names=(module.square.__name__, module.square.__qualname__, module.Box.area.fget.__qualname__,
                       module.Box.of.__qualname__),
                members=sorted(k for k in vars(module.Box) if not k.startswith("__")),
                globals=sorted(k for k in vars(module) if not k.startswith("__")),
                pickled=pickle.loads(pickle.dumps(module.square)) is module.square)
    with pytest.raises(AttributeError, match="read only"):  # the setter the class wrote
        module.Box._hidden.fset(box, 1)
    return seen


def test_the_sample_behaves_the_same_before_and_after(monkeypatch):
    after, done = undecorate.undecorate(SAMPLE)
    assert done == ["area", "volume", "_hidden", "_hidden", "of", "square", "twice"]  # not unit: mutmut takes it
    assert "@" not in after.replace("@dataclass", "").replace("@staticmethod", "")
    before = _behaviour(_load(SAMPLE, "sample_before", monkeypatch))
    assert before["volume"] == (27, 27) and before["calls"] == [3, 4, 5]  # cached once, as written
    assert _behaviour(_load(after, "sample_after", monkeypatch)) == before


def test_the_temporary_name_does_not_clash():
    source = "_f_undecorated = 1\n@property\ndef f(self):\n    return _f_undecorated"
    after, _ = undecorate.undecorate(source)
    assert "def _f_undecorated_2(self)" in after and "f = property(_f_undecorated_2)" in after


def test_overload_stubs_and_plain_functions_are_left_alone():
    source = "from typing import overload\n@overload\ndef f(x: int) -> int: ...\ndef f(x):\n    return x\n"
    assert undecorate.undecorate(source) == (source, [])


PACKAGE_MODULES = sorted(p for package in ("model", "analysis", "rules")
                         for p in (REPO / "tpudiag" / package).rglob("*.py"))


def test_every_module_of_the_three_packages_transforms_compiles_and_imports(tmp_path):
    tree = tmp_path / "tpudiag"
    rewritten = 0
    for path in REPO.joinpath("tpudiag").rglob("*"):
        if path.is_dir() or "__pycache__" in path.parts:
            continue
        target = tree / path.relative_to(REPO / "tpudiag")
        target.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_bytes()
        if path in PACKAGE_MODULES:
            new, done = undecorate.undecorate(text.decode())
            rewritten += len(done)
            text = new.encode()
        target.write_bytes(text)
    assert rewritten >= 100  # 94 properties, 2 cached properties, 5 lru_caches on 2026-12-02
    names = [".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__") for p in PACKAGE_MODULES]
    check = (f"import importlib\nfor name in {names!r}:\n"
             f"    assert importlib.import_module(name).__file__.startswith({str(tmp_path)!r}), name\n"
             "from tpudiag.model import hlo_names, matmuls\n"
             "assert hlo_names.async_role('all-gather-start.1') == ('start', 'all-gather')\n"  # the name says so
             "assert matmuls.Matmul.m.fget.__qualname__ == 'Matmul.m'\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", check], env=env, cwd=tmp_path, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
