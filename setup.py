"""Build hook: put the bundled example into the wheel as package data.

The example's capture and dumps live once, in `examples/models/` (where `regenerate.py` writes
them and the tests read them). Building copies them under `tpudiag/_bundled/`, where
`tpudiag.examples_data` finds them in an installed wheel. Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

EXAMPLE = "transformer_train_v5e"
SOURCE = Path(__file__).resolve().parent / "examples" / "models"


class BuildPyWithExample(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads examples/ in place
            return
        target = Path(self.build_lib) / "tpudiag" / "_bundled"
        for kind in ("captures", "dumps"):
            src = SOURCE / kind / EXAMPLE
            if src.is_dir():
                shutil.copytree(src, target / kind / EXAMPLE, dirs_exist_ok=True)


setup(cmdclass={"build_py": BuildPyWithExample})
