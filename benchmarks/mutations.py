"""Plant known bugs, one at a time, in a copy of the project and check that a direct test fails.

Issue 32 planted twenty small bugs; six survived every test or were caught only by a golden (the
JSON snapshots), and one by chance. Each is planted again here, by replacing one exact source line
in a temporary copy of the working tree, and the test named beside it (never a golden) is run on
that copy: it must fail. The same test must pass on the unchanged copy first, so a test that
cannot run (a missing tool, an import error) is never counted as a kill.

A line not found exactly once in its file is an error, not a skip: the catalogue must follow the
code (`tests/test_mutations_catalogue.py` checks that in the normal suite, without planting).

Usage: python benchmarks/mutations.py [--only NAME ...] [--list]
Prints one line per bug (killed, SURVIVED, or why it could not be judged); exit 1 unless every
bug is killed. About a minute per bug on two loaded cores.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Mutation:
    name: str
    why: str  # the bug, in words
    path: str  # relative to the repository
    before: str  # the exact source line (without its newline), found exactly once
    after: str
    test: str  # pytest node id or file, relative to the repository: not a golden


MUTATIONS = (
    Mutation("slowest-core-min", "slowest core taken as the one with the least work (idxmin for idxmax)",
             "tpudiag/analysis/core_balance.py",
             "        if best is None or (c.work_ps, c.step_ps) > (best.work_ps, best.step_ps):",
             "        if best is None or (c.work_ps, c.step_ps) < (best.work_ps, best.step_ps):",
             "tests/analysis/test_core_balance.py"),
    Mutation("rates-over-self-time", "FLOP rate and HBM bandwidth divided by self time, not total time",
             "tpudiag/analysis/ops.py",
             '    total_s = df["total_time_ps"].to_numpy(dtype=np.float64) / PS_PER_S',
             '    total_s = df["self_time_ps"].to_numpy(dtype=np.float64) / PS_PER_S',
             "tests/analysis/test_op_rates.py"),
    Mutation("noise-band-without-new-spread", "diff's noise band ignores the new run's spread",
             "tpudiag/analysis/diff.py",
             "    band = max(options.min_relative * abs(base.centre_ps), base.spread_ps, new.spread_ps, min_abs_ps)",
             "    band = max(options.min_relative * abs(base.centre_ps), base.spread_ps, min_abs_ps)",
             "tests/analysis/test_noise_band.py"),
    Mutation("no-int64-end-guard", "the int64 end-of-span guard removed",
             "tpudiag/parsers/device_trace.py",
             "    return (durs >= 0) & (durs <= MAX_EVENT_PS) & (starts <= _INT64_MAX - MAX_EVENT_PS)",
             "    return (durs >= 0) & (durs <= MAX_EVENT_PS)",
             "tests/parsers/test_span_guard.py"),
    Mutation("collective-by-name-only", "a reduce-scatter fusion named fusion.N is no collective window",
             "tpudiag/model/hlo_names.py",
             "    family = np.where(name_decides[name_codes], by_name[name_codes], by_category[category_codes])",
             "    family = by_name[name_codes]",
             "tests/analysis/test_collective_windows_by_category.py"),
    Mutation("every-space-is-hbm", "arrays in VMEM or host memory counted as HBM traffic in the cost model",
             "tpudiag/analysis/cost_model.py",
             "    return sum(a.padded_bytes for a in arrays if a.memory_space == 0)",
             "    return sum(a.padded_bytes for a in arrays)",
             "tests/analysis/test_cost_model_memory_spaces.py"),
    Mutation("gigabytes-as-gibibytes", "GB/s divided by 2^30 (caught only by chance before the literal table)",
             "tpudiag/model/units.py",
             '    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):',
             '    for unit, scale in (("TB/s", 1e12), ("GB/s", 2 ** 30), ("MB/s", 1e6)):',
             "tests/model/test_units_table.py"),
)


class CatalogueError(Exception):
    """A mutation's line is not in its file exactly once: the catalogue no longer follows the code."""


def check_line(root: Path, m: Mutation) -> None:
    lines = (root / m.path).read_text().splitlines()
    count = lines.count(m.before)
    if count != 1:
        raise CatalogueError(f"{m.name}: the line to mutate is found {count} times in {m.path} "
                             f"(exactly once expected): {m.before.strip()!r}")
    if not (root / m.test.split("::")[0]).is_file():
        raise CatalogueError(f"{m.name}: no test file {m.test}")


def plant(root: Path, m: Mutation) -> str:
    """Replace the line in the copy at `root`; returns the original text, to restore it."""
    check_line(root, m)
    path = root / m.path
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    i = next(k for k, line in enumerate(lines) if line.rstrip("\n") == m.before)
    lines[i] = m.after + "\n"
    path.write_text("".join(lines))
    return text


def copy_tree(dest: Path) -> None:
    """The working tree as git sees it (tracked and untracked, not ignored), plus the compiled reader."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = REPO / rel
        if not src.is_file():
            continue  # deleted in the working tree
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)
    for so in (REPO / "tpudiag" / "parsers").glob("_wire*.so"):
        shutil.copy2(so, dest / "tpudiag" / "parsers" / so.name)


_SUMMARY = re.compile(r"=+ (.*) in [\d.]+s")


def run_test(root: Path, test: str) -> tuple[int, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("UPDATE_SNAPSHOTS", "PYTHONPATH")}
    env["PYTHONPATH"] = str(root)
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-x",
                           "-W", "ignore::DeprecationWarning", test],
                          cwd=root, env=env, capture_output=True, text=True, timeout=1800)
    lines = [line for line in proc.stdout.splitlines() if _SUMMARY.search(line) or re.search(
        r"^\d+ (passed|failed)", line)]
    return proc.returncode, lines[-1].strip("= ") if lines else proc.stdout[-300:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="mutation names to run")
    parser.add_argument("--list", action="store_true", help="list the mutations and exit")
    args = parser.parse_args()
    chosen = [m for m in MUTATIONS if not args.only or m.name in args.only]
    if args.list:
        for m in MUTATIONS:
            print(f"{m.name:32} {m.path}  ->  {m.test}\n{'':32} {m.why}")
        return 0
    for m in chosen:
        check_line(REPO, m)  # fail before copying anything
    ok = True
    with tempfile.TemporaryDirectory(prefix="tpudiag-mutations-") as tmp:
        root = Path(tmp)
        copy_tree(root)
        for m in chosen:
            start = time.monotonic()
            rc, summary = run_test(root, m.test)
            if rc != 0 or "skipped" in summary:
                print(f"NOT JUDGED  {m.name}: {m.test} does not pass cleanly unchanged ({summary})")
                ok = False
                continue
            original = plant(root, m)
            try:
                rc, summary = run_test(root, m.test)
            finally:
                (root / m.path).write_text(original)
            killed = rc == 1 and "failed" in summary
            ok &= killed
            verdict = "killed   " if killed else "SURVIVED "
            print(f"{verdict}  {m.name:32} {m.test} ({summary}; {time.monotonic() - start:.0f} s)", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
