"""Static mode estimates each op once: the static report and the modelled timeline share one
`ProgramEstimate` (issue 32 §2: both computed `op_estimates` before)."""

from __future__ import annotations

from pathlib import Path

import tpudiag
from tpudiag.analysis import cost_model

DUMPS = Path(__file__).resolve().parents[2] / "examples" / "models" / "dumps" / "transformer_train_v5e"


def test_a_static_diagnosis_estimates_the_program_once(monkeypatch):
    calls = []
    real = cost_model.op_estimates

    def counted(*args, **kwargs):
        calls.append(args[0].module)
        return real(*args, **kwargs)

    monkeypatch.setattr(cost_model, "op_estimates", counted)
    d = tpudiag.diagnose(DUMPS)
    assert d.mode == "static" and len(d.static.ops) > 0
    assert len(calls) == 1
    # The timeline was laid from the same estimates the static report shows.
    assert set(d.static.ops["name"]) >= set(d.analysis.ops["name"].astype(str))
