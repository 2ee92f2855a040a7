"""A host file's error keeps its hint on the way to the user: alone (the CLI's `hint:` line) and
beside hosts that read (the report's failed hosts). The hint was dropped at the per-host boundary."""

from __future__ import annotations

import gzip
import json

from tests.cli_util import run_tpudiag
from tests.conftest import small_design
from tpudiag.writers.tpu_design import build_capture

GOOD = build_capture(small_design()).serialize()
GUNZIP = "run `gunzip -k` on the file"  # the xspace reader's hint for a gzip file


def test_a_lone_gzip_host_file_says_the_cause_and_the_hint(tmp_path):
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    (run / "h0.xplane.pb").write_bytes(gzip.compress(GOOD))
    r = run_tpudiag("report", run, "--format", "json")
    assert r.returncode == 2 and r.stdout == ""
    lines = r.stderr.splitlines()
    assert len(lines) == 2 and "h0.xplane.pb" in lines[0] and "gzip" in lines[0]
    assert lines[1] == f"hint: {GUNZIP}"


def test_a_gzip_host_beside_a_good_one_is_listed_with_its_hint(tmp_path):
    run = tmp_path / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    (run / "h0.xplane.pb").write_bytes(GOOD)
    (run / "h1.xplane.pb").write_bytes(gzip.compress(GOOD))
    r = run_tpudiag("report", run, "--format", "json")
    assert r.returncode == 0, r.stderr
    [failed] = json.loads(r.stdout)["failed_hosts"]
    assert "h1.xplane.pb" in failed and failed.endswith(f"; hint: {GUNZIP}")
