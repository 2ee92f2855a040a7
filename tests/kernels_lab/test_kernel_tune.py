"""`tpudiag lab tune MODULE:FN --param ...`: the user's own kernel, compiled deviceless per candidate."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tpudiag.cli.app import main
from tpudiag.errors import UsageError
from tpudiag.kernels_lab.kernel_tune import TUNE_LIBTPU_FLAGS, cache_key, candidates_of, parse_params

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "tune_matmul.py"
TARGET = f"{FIXTURE}:tiled_matmul"


def run_cli(capsys, *args: str) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(list(args))
    out, err = capsys.readouterr()
    return exc.value.code or 0, out, err


def test_params_are_a_cartesian_product_of_typed_values():
    params = parse_params(["bm=128,256,128", "bk=512", "mode=fast"])
    assert params == {"bm": [128, 256], "bk": [512], "mode": ["fast"]}
    assert candidates_of(params) == [{"bm": 128, "bk": 512, "mode": "fast"}, {"bm": 256, "bk": 512, "mode": "fast"}]
    for bad in (["bm"], ["bm="], ["1x=2"]):
        with pytest.raises(UsageError):
            parse_params(bad)
    with pytest.raises(UsageError, match="twice"):
        parse_params(["bm=1", "bm=2"])


def test_cache_key_changes_with_function_parameters_and_flags():
    versions = {"tpudiag": "0", "jaxlib": "1", "libtpu": "2"}
    base = cache_key("m.py:f", "src", {"bm": 128}, "v5e:1x1", TUNE_LIBTPU_FLAGS, versions)
    assert base == cache_key("m.py:f", "src", {"bm": 128}, "v5e:1x1", TUNE_LIBTPU_FLAGS, versions)
    assert len({base, cache_key("m.py:g", "src", {"bm": 128}, "v5e:1x1", TUNE_LIBTPU_FLAGS, versions),
                cache_key("m.py:f", "src2", {"bm": 128}, "v5e:1x1", TUNE_LIBTPU_FLAGS, versions),
                cache_key("m.py:f", "src", {"bm": 256}, "v5e:1x1", TUNE_LIBTPU_FLAGS, versions),
                cache_key("m.py:f", "src", {"bm": 128}, "v6e:1x1", TUNE_LIBTPU_FLAGS, versions),
                cache_key("m.py:f", "src", {"bm": 128}, "v5e:1x1", (), versions)}) == 6


def test_bad_param_is_a_one_line_usage_error(capsys):
    code, out, err = run_cli(capsys, "lab", "tune", TARGET, "--param", "bm")
    assert code == 2 and "NAME=V1,V2" in err and "Traceback" not in err


@pytest.fixture(scope="session")
def tuned(tmp_path_factory):
    """Three candidates of the example's kernel at 512^3 on v5e:1x1: two that compile (bm 128, 256) and one
    Mosaic refuses at lowering (bm=100: not a multiple of 8). About 25 s on 2 cores."""
    from tests.conftest import require_libtpu
    from tpudiag.kernels_lab.kernel_tune import tune_kernel

    require_libtpu()
    cache = tmp_path_factory.mktemp("tune-cache")
    return cache, tune_kernel(TARGET, parse_params(["bm=100,128,256", "bk=512"]), topology="v5e:1x1", cache=cache)


@pytest.mark.libtpu
def test_candidates_are_ranked_by_estimated_cycles(tuned):
    _, result = tuned
    ok = [c for c in result.candidates if c.status == "ok"]
    assert [c.params["bm"] for c in ok] and len(ok) == 2
    assert all(c.est_cycles and c.est_cycles > 0 for c in ok)
    assert [c.est_cycles for c in ok] == sorted(c.est_cycles for c in ok)
    assert result.best is ok[0]
    # VMEM from the compiler's VMEM report: larger blocks take more of it, both within v5e's 16 MiB scoped limit
    by_bm = {c.params["bm"]: c for c in ok}
    assert 0 < by_bm[128].vmem_bytes < by_bm[256].vmem_bytes <= 16 * 2**20
    for c in ok:
        assert c.vmem_limit_bytes == 16 * 2**20 and c.vmem_fits is True
        assert c.spill_stores is not None and c.spill_fills is not None
        assert Path(c.dump, "result.json").is_file()


@pytest.mark.libtpu
def test_a_rejected_candidate_gives_its_one_line_reason(tuned):
    _, result = tuned
    (bad,) = [c for c in result.candidates if c.status != "ok"]
    assert bad.params == {"bm": 100, "bk": 512} and bad.status == "rejected"
    assert "divisible by 8" in bad.reason and "\n" not in bad.reason
    assert result.candidates[-1] is bad  # refused candidates rank last


@pytest.mark.libtpu
def test_json_from_the_cache(tuned, capsys):
    cache, result = tuned
    code, out, err = run_cli(capsys, "lab", "tune", TARGET, "--param", "bm=100,128,256", "--param", "bk=512",
                             "--topology", "v5e:1x1", "--cache-dir", str(cache), "--format", "json")
    assert code == 0, err
    data = json.loads(out)
    assert {"target", "topology", "generation", "clock_hz", "basis", "figures", "candidates", "best", "cache_dir",
            "jobs"} <= set(data)
    assert data["figures"] == "modelled" and "modelled" in data["basis"]
    assert all(c["cached"] for c in data["candidates"])  # nothing compiled again: read from the cache
    assert "compiling" not in err
    assert [c["est_cycles"] for c in data["candidates"]] == [c.est_cycles for c in result.candidates]
    assert {"params", "status", "reason", "est_cycles", "est_us", "spill_stores", "spill_fills", "vmem_bytes",
            "vmem_limit_bytes", "vmem_fits", "dump"} <= set(data["candidates"][0])
    best = data["best"]
    assert best["params"] == result.best.params
    assert best["command"] == (f"tpudiag lab tune {TARGET} --topology v5e:1x1 --param bm={best['params']['bm']} "
                               "--param bk=512")


def test_table_labels_every_figure_modelled_and_notes_each_reason_once():
    from rich.console import Console

    from tpudiag.kernels_lab.kernel_tune import KernelCandidate, KernelTuneResult
    from tpudiag.kernels_lab.render import render_kernel_tune

    limit = 16 * 2**20
    why = "scoped VMEM OOM (CompileTimeScopedVmemOom): 18.36 MiB needed, limit 16.00 MiB"
    result = KernelTuneResult("k.py:f", "v5e:1x1", "v5e", 1.5e9, "ranked by estimated cycles: modelled", (
        KernelCandidate({"bm": 256}, "ok", "", 1500, 0, 0, 2**20, limit),
        KernelCandidate({"bm": 128}, "ok", "", 3000, 2, 5, 2**19, limit, cached=True),
        KernelCandidate({"bm": 1024}, "rejected", why, vmem_limit_bytes=limit),
        KernelCandidate({"bm": 2048}, "rejected", why, vmem_limit_bytes=limit)), "/c", 2)
    console = Console(width=200, record=True)
    render_kernel_tune(result, console)
    text = console.export_text()
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["1"], ["2"], ["-"])]
    assert [r[:3] for r in rows[:2]] == [["1", "256", "1,500"], ["2", "128", "3,000"]]
    assert "1.0" in rows[0] and "2/5" in rows[1] and "(cached)" in rows[1]
    assert all("[1]" in r for r in rows[2:]) and text.count(why) == 1
    assert text.count("(modelled)") >= 4
    assert "reproduce: `tpudiag lab tune k.py:f --topology v5e:1x1 --param bm=256`" in text


@pytest.mark.libtpu
def test_a_topology_libtpu_rejects_is_one_error_not_a_refused_candidate(capsys, tmp_path):
    from tests.conftest import require_libtpu

    require_libtpu()
    # tpudiag's parser accepts any grid; libtpu 0.10.2 refuses this one ("not divisible by the given
    # (or default) chips_per_host_bounds 2x2x1"). (`v5e:1` is now spelled `v5e:1x1` before libtpu sees it.)
    # One candidate is enough (it would be a refused candidate, exit 0, if the error were taken as its
    # fault); each candidate starts a libtpu process.
    code, out, err = run_cli(capsys, "lab", "tune", TARGET, "--param", "bm=128", "--topology", "v5e:3x3",
                             "--cache-dir", str(tmp_path))
    assert code == 2 and "libtpu rejected topology v5e:3x3" in err
    assert not list(tmp_path.rglob("candidate.json"))  # nothing cached: the candidates were never judged


@pytest.mark.libtpu
def test_a_timed_out_compile_is_aborted_and_not_cached(capsys, tmp_path):
    from tests.conftest import require_libtpu

    require_libtpu()
    code, out, err = run_cli(capsys, "lab", "tune", TARGET, "--param", "bm=128", "--topology", "v5e:1x1",
                             "--cache-dir", str(tmp_path), "--timeout", "0.5", "--format", "json")
    assert code == 2 and "Traceback" not in err
    (cand,) = json.loads(out)["candidates"]
    assert cand["status"] == "aborted" and "did not finish within" in cand["reason"]
    assert not list(tmp_path.rglob("candidate.json"))
