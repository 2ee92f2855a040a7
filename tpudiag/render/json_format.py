"""The report as JSON. Keys under `summary`, `ops`, `findings` and `warnings` named in docs/json.md's
contract stay stable; the rest may grow."""

from __future__ import annotations

import dataclasses
import json
import math
import secrets
from collections.abc import Iterator

from tpudiag.version import __version__
from tpudiag.model.findings import Finding
from tpudiag.model.report import Distribution, Report


def _finite(value):
    return None if isinstance(value, float) and not math.isfinite(value) else value


def _clean(value):
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return _finite(value)


_FIELDS: dict[type, tuple[str, ...]] = {}


def _flat_row(row) -> dict:
    """A dataclass of plain values (an `OpRow`) as a dict, non-finite floats as None: what
    `_clean(dataclasses.asdict(row))` gives, without its deep copy (pods have tens of thousands of
    op rows)."""
    names = _FIELDS.get(type(row))
    if names is None:
        names = _FIELDS[type(row)] = tuple(f.name for f in dataclasses.fields(row))
    return {name: _finite(getattr(row, name)) for name in names}


def _distribution(d: Distribution | None) -> dict | None:
    return None if d is None else dataclasses.asdict(d)


def finding_to_dict(f: Finding) -> dict:
    return {
        "rule": f.rule,
        "code": f.code,
        "severity": f.severity.label(),
        "message": f.message,
        "saving_ps": f.saving.ps,
        "saving_basis": f.saving.basis,
        "saving_explanation": f.saving.explanation,
        # Deprecated aliases of the three keys above, the contract's older names: kept while
        # readers move to `saving_*` (the name `Finding.saving` and `findings_frame()` use).
        "savings_ps": f.saving.ps,
        "savings_basis": f.saving.basis,
        "savings_explanation": f.saving.explanation,
        "fix": f.fix,
        "host": f.host,
        "ops": list(f.ops),
        "sites": [{"op": s.op, "source": s.source, "tf_op": s.tf_op} for s in f.sites],
        "evidence": [{"subject": e.subject, "values": dict(e.values)} for e in f.evidence],
        "quantities": [dataclasses.asdict(q) for q in f.quantities],
    }


def report_to_dict(report: Report) -> dict:
    """The whole report as plain values (the ops table included)."""
    doc = _head(report)
    doc["ops"] = [_flat_row(o) for o in report.ops]
    return doc


def _head(report: Report) -> dict:
    """Everything but the op rows, whose place `ops` holds empty."""
    s = report.summary
    summary = {
        "input": s.input_path,
        "mode": s.mode,
        "run": s.run,
        "platform": s.platform,
        "device_type": s.device_type,
        "generation": s.generation,
        "hosts": list(s.hosts),
        "n_hosts": len(s.hosts),
        "n_chips": s.n_chips,
        "n_cores": s.n_cores,
        # cores (GPUs) that ran at least one op: a GPU plane without kernels is common; null: not counted
        "n_cores_with_ops": s.n_cores_with_ops,
        "peak_flops_per_s": s.peak_flops_per_s,  # per core, as `Summary` and the static JSON name it
        "hbm_bytes_per_s": s.hbm_bytes_per_s,
        # Deprecated aliases of the two keys above (their older names), kept while readers move.
        "peak_flops_per_s_per_core": s.peak_flops_per_s,
        "hbm_bytes_per_s_per_core": s.hbm_bytes_per_s,
        "peaks_source": s.peaks_source,
        "vmem_read_bytes_per_s": s.vmem.read_bytes_per_s if s.vmem else None,  # per core; null: no VMEM roof
        "vmem_write_bytes_per_s": s.vmem.write_bytes_per_s if s.vmem else None,
        "vmem_source": s.vmem.source if s.vmem else "",
        "step_source": s.step_source,
        "step_program": s.step_program,
        "steps_analysed": s.step_time.count if s.step_time else 0,
        "step_time_ps": s.step_time.mean_ps if s.step_time else None,
        "step_time": _distribution(s.step_time),
        "host_spread_ps": s.host_spread_ps,
        "busy_share": s.busy_share,  # without steps: Σ busy / Σ span of the cores that ran ops; null with steps
        "slowest_host": s.slowest_host,
        "breakdown": None if s.breakdown is None else {
            **dataclasses.asdict(s.breakdown), "duty_cycle": s.breakdown.duty_cycle},
        "modelled": s.modelled,
        "dumps": list(s.dumps),
        "compiled_join": None if s.compiled is None else dataclasses.asdict(s.compiled),
        "host_transfers": [dataclasses.asdict(t) for t in s.host_transfers],
    }
    hosts = [{
        "host": h.host, "path": h.path, "device_type": h.device_type, "n_chips": h.n_chips, "n_cores": h.n_cores,
        "n_events": h.n_events, "step_time": _distribution(h.step_time), "slowest_core": h.slowest_core,
        "step_numbers": list(h.step_numbers), "step_times_ps": list(h.step_times_ps),
        "breakdown": None if h.breakdown is None else {**dataclasses.asdict(h.breakdown),
                                                       "duty_cycle": h.breakdown.duty_cycle},
    } for h in report.hosts]
    doc = _clean({
        "tool": {"name": "tpudiag", "version": __version__},
        "summary": summary,
        "hosts": hosts,
        "ops": [],
        "categories": [dataclasses.asdict(c) for c in report.categories],
        "programs": [dataclasses.asdict(p) for p in report.programs],
        "kernels": [k.to_json() for k in report.kernels],
        "findings": [finding_to_dict(f) for f in report.findings],
        "rules_run": True,  # always: kept for the JSON contract (earlier builds could lack the rule engine)
        "rules_skipped": [dataclasses.asdict(r) for r in report.rules_skipped],
        "warnings": list(report.warnings),
        "failed_hosts": list(report.failures),
    })
    return doc


def render_json(report: Report) -> str:
    """The report as indented JSON, each op row on one line (`json_pieces`, joined)."""
    return "".join(json_pieces(report))


def json_pieces(report: Report) -> Iterator[str]:
    """The report's JSON document in pieces, each op row on one line: json's C encoder writes those,
    where indenting them takes its pure-Python one (seconds on a pod's tens of thousands of rows).

    The rows are encoded one at a time and handed on as they are made, never all held as dicts or
    as one text: a pod's report has tens of thousands (about 0.6 MB of JSON per host), and the
    driver's memory must not grow with the number of hosts for them (`cli.outputs.emit` writes the
    pieces as they come)."""
    doc = _head(report)
    marker = f"tpudiag-ops-{secrets.token_hex(16)}"  # no trace string can be this value
    doc["ops"] = marker
    before, after = json.dumps(doc, indent=2).split(json.dumps(marker), 1)
    yield before
    if not report.ops:
        yield "[]"
    else:
        yield "[\n"
        for i, o in enumerate(report.ops):
            yield ("    " if not i else ",\n    ") + json.dumps(_flat_row(o))
        yield "\n  ]"
    yield after
