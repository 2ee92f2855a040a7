"""Parsers for the TPU compiler's LLO dumps (`--xla_jf_dump_to`) and VMEM OOM error texts.

    from tpudiag.parsers.llo import load_llo_dump, parse_vmem_oom

    dump = load_llo_dump("/tmp/jf")                    # newest compile in the directory
    dump = load_llo_dump("/tmp/jf", module="jit_step")  # or one HLO module's
    dump.ops                  # one row per HLO op (schema `tpudiag.model.llo.OPS`), key `name`
    dump.warnings             # what was odd, one line each
    budget = parse_vmem_oom(str(error))  # VmemBudget | None

Modules, one per dump file kind: `files` (names, compiles), `bundle_profile`, `utilization`,
`schedule`, `register_pressure`, `spills` (final_bundles, post-ra), `static_profile`,
`vmem_report`, `vmem_oom`; `ops` joins them, `load` walks the directory.
"""

from tpudiag.parsers.llo.load import load_llo_dump
from tpudiag.parsers.llo.vmem_oom import parse_vmem_oom

__all__ = ["load_llo_dump", "parse_vmem_oom"]
