"""What a parsed capture holds: per-host tables and device facts, and the multi-host profile."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from tpudiag.model.hardware import ChipSpec


@dataclass(frozen=True)
class DeviceInfo:
    platform: str  # "TPU", "GPU" or "CPU" (no device plane)
    device_type: str  # as the trace names it, e.g. "TPU v6 Lite"; "" when absent
    chip: ChipSpec | None  # matched hardware spec, None when unknown
    peak_flops_per_s: float | None  # per core (plane)
    hbm_bytes_per_s: float | None  # per core (plane)
    peaks_source: str  # "trace", "hardware table" or "none"
    n_cores: int  # TensorCore (or GPU) planes
    n_chips: int
    n_sparse_cores: int = 0

    @property
    def ridge_flops_per_byte(self) -> float | None:
        if self.peak_flops_per_s and self.hbm_bytes_per_s:
            return self.peak_flops_per_s / self.hbm_bytes_per_s
        return None


@dataclass
class HostTrace:
    """One host's capture, parsed. Tables follow `tpudiag.model.schemas`."""

    host: str
    path: str
    device: DeviceInfo
    events: pd.DataFrame
    op_metadata: pd.DataFrame
    step_markers: pd.DataFrame  # columns: device, core, step, start_ps, dur_ps
    modules: pd.DataFrame
    async_windows: pd.DataFrame
    hlo_protos: dict[int, bytes] = field(default_factory=dict)
    programs: dict | None = None  # the hlo_protos parsed, on first use (parsers.hlo_proto.host_programs)
    warnings: list[str] = field(default_factory=list)
    host_threads: int = 0
    modelled: bool = False  # device planes carry `tpudiag_modelled` (written by `tpudiag simulate`)
    # `/host:CPU` TraceMe events (schemas.HOST_EVENTS) on the device time origin; None: no host plane
    host_events: pd.DataFrame | None = None


@dataclass(frozen=True)
class HostFailure:
    """A host file that could not be analysed, with the one-line reason."""

    path: str
    message: str


@dataclass
class Profile:
    """Every host of one capture. `failures` lists host files skipped with their reasons."""

    input_path: str
    run: str
    hosts: list[HostTrace]
    failures: list[HostFailure] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    modelled: bool = False  # True for captures written by `tpudiag simulate`
