"""Option types shared by several commands."""

from __future__ import annotations

from enum import Enum

SCHEDULER_HELP = ("Dask distributed scheduler address (e.g. tcp://10.0.0.5:8786): parse the hosts as tasks on "
                  "that cluster, whose workers read the files themselves (a shared filesystem or a URL)")


class Chip(str, Enum):
    """`--chip`: the TPU generation, where the files do not say it (`tpudiag.pipeline.CHIP_NAMES`)."""

    v4 = "v4"
    v5e = "v5e"
    v5p = "v5p"
    v6e = "v6e"
    tpu7x = "tpu7x"
