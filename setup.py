"""Build hooks: the bundled example as package data, and the optional compiled event reader.

The example's capture and dumps live once, in `examples/models/` (where `regenerate.py` writes
them and the tests read them). Building copies them under `tpudiag/_bundled/`, where
`tpudiag.examples_data` finds them in an installed wheel.

`tpudiag.parsers._wire` (C, no dependencies beyond Python's headers) reads trace events from
their wire bytes, several times faster than protobuf objects. It is optional: where no C
compiler is found the build goes on without it and tpudiag reads events through protobuf
(`tpudiag.parsers.event_wire`). Everything else is in pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import Extension, setup
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


WIRE = Extension("tpudiag.parsers._wire", ["tpudiag/parsers/_wire.c"], optional=True,
                 extra_compile_args=["-O3"])

setup(cmdclass={"build_py": BuildPyWithExample}, ext_modules=[WIRE])
