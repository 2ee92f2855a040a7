"""tpudiag: performance diagnosis for TPU workloads from XProf captures and compiler dumps."""

__version__ = "0.1.0"
