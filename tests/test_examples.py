"""The bundled examples are what their scripts make, and the report runs on them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from tests.conftest import REPO


def load_script(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_example_capture_equals_a_fresh_one(tmp_path):
    script = load_script(REPO / "examples" / "make_example_capture.py")
    fresh = script.main(tmp_path)
    committed = next((REPO / "examples" / "captures" / "train_v6e_4chip" / "plugins" / "profile").glob(
        "*/host0.xplane.pb"))
    assert fresh.read_bytes() == committed.read_bytes()
