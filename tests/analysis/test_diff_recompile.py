"""`diff` of two compiles of one program: the bundled transformer with the latency-hiding scheduler
on (the baseline) and off, from `tpudiag whatif` (the session fixture `transformer_whatif`).

Facts established by hand from the two `compiled.hlo.txt` files: without the scheduler, v5e's
async all-gathers fused into `fusion.203` and `fusion.198` (tuple results carrying the collective's
buffers) become synchronous `all-gather` ops, and the matmuls left alone are renamed
`subtract_convert_fusion.2` (bf16[256,512]) and `subtract_convert_fusion.3` (bf16[512,256]), at the
same source line (`transformer_train.py:43`) and JAX op (`transpose(jvp())/dot_general`). Their
LLO dumps spill 959 / 1,035 (`fusion.203` and `subtract_convert_fusion.2` alike).
"""

from __future__ import annotations


import pytest

from tests.cli_util import run_tpudiag
from tpudiag.analysis.diff import PartKind
from tpudiag.render.whatif import whatif_json

pytestmark = pytest.mark.libtpu


@pytest.fixture(scope="module")
def lhs_diff(transformer_whatif):
    return transformer_whatif.variants[0].diff


def test_the_step_change_is_attributed_to_named_ops_and_families(lhs_diff):
    a = lhs_diff.attribution
    assert a.total_ps == lhs_diff.step_time.delta_ps > 0  # the scheduler off makes the step slower
    assert sum(p.delta_ps for p in a.parts) == pytest.approx(a.total_ps, abs=1)
    assert a.named_share >= 0.9
    lead = a.parts[0]  # the all-gathers now run synchronously: the largest part by far
    assert (lead.kind, lead.name) == (PartKind.FAMILY, "all-gather") and lead.delta_ps > a.total_ps


def test_renamed_fusions_pair_across_the_recompile(lhs_diff):
    by_base = {o.base_name: o for o in lhs_diff.ops}
    assert by_base["fusion.203"].name == "subtract_convert_fusion.2"
    assert by_base["fusion.198"].name == "subtract_convert_fusion.3"
    assert by_base["fusion.203"].matched_by in ("structure", "source line")
    gone = {o.name for o in lhs_diff.disappeared}
    assert not gone & {"fusion.203", "fusion.198"}


def test_an_async_collective_made_synchronous_shows_as_exposed(lhs_diff):
    moved = [o for o in lhs_diff.ops if o.exposure is not None and o.exposure.moved]
    assert moved and all(o.exposure.new.label == "exposed" for o in moved)
    assert all(o.exposure.base.label in ("hidden", "partly hidden") for o in moved)


def test_the_spill_findings_on_renamed_fusions_pair_up(transformer_whatif, lhs_diff):
    spills = {p.base.ops: p for p in lhs_diff.findings_persisting if p.base.rule == "spill"}
    for base, new in ((("fusion.203",), ("subtract_convert_fusion.2",)),
                      (("fusion.198",), ("subtract_convert_fusion.3",))):
        # paired as one finding on renamed ops (not one gone, one new); its saving (self time x (spills +
        # fills) / bundles, the bundles from the bundle profile) follows the op's modelled time, which the
        # scheduler change moves, so it may change
        assert spills[base].new.ops == new and spills[base].how == "renamed ops"
    appeared = {f.ops for f in lhs_diff.findings_appeared}
    assert not appeared & {("subtract_convert_fusion.2",), ("subtract_convert_fusion.3",)}
    variant = whatif_json(transformer_whatif)["variants"][0]
    paired = {(tuple(u["base_ops"]), tuple(u["variant_ops"]))
              for key in ("findings_unchanged", "findings_changed") for u in variant[key]}
    assert (("fusion.203",), ("subtract_convert_fusion.2",)) in paired


def test_diff_of_the_kept_compile_outputs_explains_the_change(transformer_whatif):
    out = transformer_whatif.out
    r = run_tpudiag("diff", out / "baseline", out / "variant-1", "--format", "md", env={"NO_COLOR": "1"})
    assert r.returncode == 0, r.stderr
    assert "## Where the change comes from" in r.stdout
    assert "| `fusion.203 → subtract_convert_fusion.2` |" in r.stdout
