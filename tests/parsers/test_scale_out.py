"""Hosts parsed on a Dask cluster or read from an fsspec URL give the same report as local files.

A 3-host capture (2 chips each, async all-gathers, a nested `while`, a synchronous all-reduce)
is written with the project's writer; each alternative path must produce the identical JSON
report, and a damaged host stays a per-host warning on every path.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import small_design
from tpudiag.parsers.capture import largest_first, load_capture
from tpudiag.parsers.capture_files import HostUrl, as_location, find_capture
from tpudiag.pipeline import diagnose
from tpudiag.render.json_format import render_json
from tpudiag.writers.tpu_design import write_capture

RUN = "plugins/profile/2026_01_01_00_00_00"


def _pod(run_dir: Path, broken: bool = False) -> Path:
    for h in range(3):
        write_capture(small_design(hostname=f"host{h}", first_chip=2 * h), run_dir)
    if broken:  # a host file cut short: a per-host warning, the other hosts still reported
        good = (run_dir / "host0.xplane.pb").read_bytes()
        (run_dir / "host9.xplane.pb").write_bytes(good[: len(good) // 2])
    return run_dir


def _comparable(data: dict) -> dict:
    data["summary"].pop("input")  # the one field that names where the files were read from
    data["hosts"] = [{k: v for k, v in h.items() if k != "path"} for h in data["hosts"]]
    data["failed_hosts"] = [str(f).split(": ", 1)[-1] for f in data["failed_hosts"]]
    return data


def _report(path, **kwargs) -> dict:
    """The JSON report of `diagnose(path, **kwargs)`, without the fields naming where files were read."""
    return _comparable(json.loads(render_json(diagnose(path, **kwargs).report)))


@pytest.fixture
def pod_logdir(tmp_path: Path) -> Path:
    _pod(tmp_path / "logdir" / RUN, broken=True)
    return tmp_path / "logdir"


def test_dask_cluster_gives_the_local_report(pod_logdir: Path):
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not installed (the dask extra)")
    from typer.testing import CliRunner

    from tpudiag.cli.app import app

    local = _report(pod_logdir, jobs=1)
    assert len(local["hosts"]) == 3 and len(local["failed_hosts"]) == 1
    assert any(f["rule"] == "exposed-collective" for f in local["findings"])
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        on_dask = _report(pod_logdir, scheduler=client)
        # The workers digest their hosts: no host's events reach the driver.
        hosts = diagnose(pod_logdir, scheduler=client).analysis.profile.hosts
        assert all(h.events is None and h.digest.per_step is None for h in hosts)
        by_address = _report(pod_logdir, scheduler=cluster.scheduler_address)
        cli = CliRunner().invoke(app, ["report", "--format", "json", "--scheduler", cluster.scheduler_address,
                                       str(pod_logdir)])
    assert on_dask == local
    assert by_address == local
    assert cli.exit_code == 0, cli.output
    assert _comparable(json.loads(cli.stdout)) == local


def test_a_bad_host_is_a_per_host_warning_on_dask(pod_logdir: Path):
    distributed = pytest.importorskip("distributed", reason="dask[distributed] is not installed (the dask extra)")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        profile = load_capture(pod_logdir, scheduler=client)
    assert sorted(h.host for h in profile.hosts) == ["host0", "host1", "host2"]
    assert [Path(f.path).name for f in profile.failures] == ["host9.xplane.pb"]
    assert "host9.xplane.pb" in profile.failures[0].message
    assert "corrupt or truncated" in profile.failures[0].message


def test_unreachable_scheduler_is_a_usage_error(small_capture: Path):
    pytest.importorskip("distributed", reason="dask[distributed] is not installed (the dask extra)")
    from tpudiag.errors import UsageError

    with pytest.raises(UsageError, match="cannot reach the Dask scheduler"):
        load_capture(small_capture, scheduler="tcp://127.0.0.1:1")


@pytest.fixture
def memory_fs():
    fsspec = pytest.importorskip("fsspec", reason="fsspec is not installed (the cloud extra)")
    fs = fsspec.filesystem("memory")
    yield fs
    fs.rm("/bucket", recursive=True) if fs.exists("/bucket") else None


def _upload(fs, local_run: Path, url_run: str) -> None:
    for f in sorted(local_run.iterdir()):
        fs.pipe(f"{url_run}/{f.name}", f.read_bytes())


def test_memory_url_logdir_gives_the_local_report(tmp_path: Path, memory_fs):
    run = _pod(tmp_path / "logdir" / RUN, broken=True)
    _upload(memory_fs, run, f"memory://bucket/logdir/{RUN}")
    memory_fs.pipe("memory://bucket/logdir/plugins/profile/2025_01_01_00_00_00/old.xplane.pb", b"old run")
    local = _report(tmp_path / "logdir", jobs=1)
    for url in ("memory://bucket/logdir", f"memory://bucket/logdir/{RUN}"):
        capture = find_capture(url)
        assert capture.run == "2026_01_01_00_00_00"  # the newest run, as for local logdirs
        assert all(isinstance(f, HostUrl) and f.startswith("memory://") for f in capture.files)
        assert _report(url, jobs=1) == local
    one = load_capture(f"memory://bucket/logdir/{RUN}/host1.xplane.pb")
    assert [h.host for h in one.hosts] == ["host1"]


def test_a_url_through_a_path_argument_keeps_its_scheme():
    # typer hands PATH over as a Path, which collapses `memory://b/x` to `memory:/b/x`.
    assert as_location(Path("memory://bucket/logdir")) == "memory://bucket/logdir"
    assert isinstance(as_location("gs://bucket/logdir"), HostUrl)
    assert as_location("file:///tmp/x") == Path("/tmp/x")
    assert as_location(Path("relative/dir")) == Path("relative/dir")


def test_a_url_host_over_the_size_cap_is_a_per_host_warning(tmp_path: Path, memory_fs, monkeypatch):
    run = _pod(tmp_path / "logdir" / RUN)
    _upload(memory_fs, run, f"memory://bucket/cap/{RUN}")
    memory_fs.pipe(f"memory://bucket/cap/{RUN}/huge.xplane.pb", b"\n" * (2 << 20))
    monkeypatch.setenv("TPUDIAG_MAX_INPUT_MB", "1")  # the small hosts fit; the 2 MiB one does not
    profile = load_capture("memory://bucket/cap", jobs=1)
    assert len(profile.hosts) == 3
    assert len(profile.failures) == 1
    assert "over the 1 MiB input size cap" in profile.failures[0].message


def test_missing_url_is_an_input_error(memory_fs):
    from tpudiag.errors import InputError

    with pytest.raises(InputError, match="no such file or directory"):
        find_capture("memory://bucket/nothing-here")
    memory_fs.pipe("memory://bucket/empty/readme.txt", b"not a trace")
    with pytest.raises(InputError, match="no `\\*.xplane.pb` trace files"):
        find_capture("memory://bucket/empty")


def test_report_cli_reads_a_memory_url(tmp_path: Path, memory_fs):
    from typer.testing import CliRunner

    from tpudiag.cli.app import app

    run = _pod(tmp_path / "logdir" / RUN)
    _upload(memory_fs, run, f"memory://bucket/cli/{RUN}")
    result = CliRunner().invoke(app, ["report", "--format", "json", "--jobs", "1", "memory://bucket/cli"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [h["host"] for h in data["hosts"]] == ["host0", "host1", "host2"]


def test_the_largest_hosts_are_handed_out_first(tmp_path: Path):
    # A big host started last keeps one worker busy while the others have nothing left: the pool
    # and the cluster get the hosts largest first (a URL, whose size is not asked, last).
    files = []
    for name, size in (("a", 10), ("b", 30), ("c", 20)):
        (tmp_path / f"{name}.xplane.pb").write_bytes(b"x" * size)
        files.append(tmp_path / f"{name}.xplane.pb")
    files += [HostUrl("memory://run/d.xplane.pb"), tmp_path / "missing.xplane.pb"]
    assert largest_first(tuple(files)) == [1, 2, 0, 3, 4]


def test_the_pool_gives_the_hosts_in_file_order(pod_logdir: Path):
    # Hosts arrive in the order they finish (largest first), and are reported in file order.
    assert _report(pod_logdir, jobs=2) == _report(pod_logdir, jobs=1)
    profile = load_capture(pod_logdir, jobs=2)
    assert [h.host for h in profile.hosts] == ["host0", "host1", "host2"]
