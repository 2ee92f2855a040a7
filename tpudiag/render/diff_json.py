"""The diff as JSON: every compared quantity with both runs' centres and spreads, its noise band and verdict."""

from __future__ import annotations

import dataclasses
import json
import math

from tpudiag.version import __version__
from tpudiag.analysis.diff import Attribution, Change, CompiledFacts, Diff, Exposure, NamedChange
from tpudiag.render.diff_format import noise_rule


def _num(x):
    return None if isinstance(x, float) and not math.isfinite(x) else x


def change_to_dict(c: Change | None) -> dict | None:
    if c is None:
        return None
    return {"base": {k: _num(v) for k, v in dataclasses.asdict(c.base).items()},
            "new": {k: _num(v) for k, v in dataclasses.asdict(c.new).items()},
            "delta_ps": c.delta_ps, "relative": _num(c.relative), "noise_band_ps": c.noise_band_ps,
            "ci_low_ps": c.ci_low_ps, "ci_high_ps": c.ci_high_ps, "significant": c.significant,
            "verdict": c.verdict}


def _facts(f: CompiledFacts | None) -> dict | None:
    return None if f is None else {**dataclasses.asdict(f), "padding_bytes": f.padding_bytes}


def _named(rows: tuple[NamedChange, ...]) -> list[dict]:
    return [{"name": r.name, **change_to_dict(r.change)} for r in rows]


def _exposure(e: Exposure | None) -> dict | None:
    if e is None:
        return None
    return {"base": {**dataclasses.asdict(e.base), "label": e.base.label},
            "new": {**dataclasses.asdict(e.new), "label": e.new.label}, "moved": e.moved}


def _attribution(a: Attribution | None) -> dict | None:
    if a is None:
        return None
    return {"total_ps": a.total_ps, "named_ps": a.named_ps, "named_share": a.named_share,
            "unattributed_ps": a.unattributed_ps,
            "parts": [{"kind": p.kind.value, "name": p.name, "base_name": p.base_name, "category": p.category,
                       "delta_ps": p.delta_ps, "matched_by": p.matched_by, "n_ops": list(p.n_ops),
                       "change": change_to_dict(p.change), "exposure": _exposure(p.exposure)} for p in a.parts]}


def diff_to_dict(diff: Diff) -> dict:
    return {
        "tool": {"name": "tpudiag", "version": __version__},
        "base": {"input": diff.base_input, "run": diff.base_run},
        "new": {"input": diff.new_input, "run": diff.new_run},
        "noise": {**dataclasses.asdict(diff.options), "rule": noise_rule(diff)},
        "has_changes": diff.has_changes,
        "step_time": change_to_dict(diff.step_time),
        "op_basis": diff.op_basis,
        "capture_ps": {"base": diff.base_capture_ps, "new": diff.new_capture_ps},
        "attribution": _attribution(diff.attribution),
        "breakdown": _named(diff.breakdown),
        "collectives": _named(diff.collectives),
        "ops": [{"module": o.module, "name": o.name, "base_name": o.base_name, "category": o.category,
                 "shape": o.shape, "matched_by": o.matched_by, **change_to_dict(o.change),
                 "base_compiled": _facts(o.base_compiled), "new_compiled": _facts(o.new_compiled),
                 "compiled_changed": o.compiled_changed, "exposure": _exposure(o.exposure)} for o in diff.ops],
        "appeared": [dataclasses.asdict(o) for o in diff.appeared],
        "disappeared": [dataclasses.asdict(o) for o in diff.disappeared],
        "findings_compared": diff.findings_rules_run,
        "findings_appeared": [dataclasses.asdict(f) for f in diff.findings_appeared],
        "findings_resolved": [dataclasses.asdict(f) for f in diff.findings_resolved],
        "findings_persisting": [{"base": dataclasses.asdict(p.base), "new": dataclasses.asdict(p.new),
                                 "saving_changed": p.saving_changed, "how": p.how}
                                for p in diff.findings_persisting],
        "warnings": list(diff.warnings),
    }


def render_diff_json(diff: Diff) -> str:
    return json.dumps(diff_to_dict(diff), indent=2)
