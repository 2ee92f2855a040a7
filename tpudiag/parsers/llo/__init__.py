"""Parsers for the TPU compiler's LLO dumps (`--xla_jf_dump_to`) and VMEM OOM error texts."""

from tpudiag.parsers.llo.load import load_llo_dump
from tpudiag.parsers.llo.vmem_oom import parse_vmem_oom

__all__ = ["load_llo_dump", "parse_vmem_oom"]
