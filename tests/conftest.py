"""Shared fixtures: small TPU captures built in code, with known values."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tpudiag.writers.tpu_design import CaptureDesign, OpDef, Placed, write_capture

US = 1_000_000  # ps per µs

# A 2-chip "TPU v6 Lite" step of 10 ms, after the verified design in
# shared/reference/xprof-trace-format.md §9: known FLOPs, bytes and durations per op.
SMALL_OPS = (
    OpDef("fusion.1", "convolution fusion", flops=1.377e12, bytes_accessed=2.4e9,
          shape="bf16[1024,4096]{1,0:T(8,128)(2,1)}", source="model.py:10"),  # 3,000 µs at 50 % of 918 TF/s
    OpDef("fusion.3", "loop fusion", flops=2.0e9, bytes_accessed=1.312e9,
          shape="f32[3,1000]{1,0:T(4,128)}"),  # 1,000 µs at 80 % of 1,640 GB/s
    OpDef("while.1", "while"),  # a loop whose body op nests inside it
    OpDef("fusion.5", "convolution fusion", flops=1.0e12, bytes_accessed=1.0e9),
    OpDef("all-gather-start.1", "all-gather", bytes_accessed=1.0e8),
    OpDef("all-gather-done.1", "all-gather", bytes_accessed=1.0e8),
    OpDef("all-reduce.2", "all-reduce", bytes_accessed=4.0e7),
    OpDef("copy.1", "copy", bytes_accessed=1.0e8),
)


def small_schedule(chip: int, step: int) -> list[Placed]:
    sync_allreduce = 500 * US if chip == 0 else 800 * US  # chip 1 waits longer in the sync collective
    return [
        Placed("fusion.1", 0, 3000 * US),
        Placed("all-gather-start.1", 3000 * US, 10 * US),
        Placed("fusion.3", 3010 * US, 1000 * US),  # hides part of the all-gather
        Placed("all-gather-done.1", 4010 * US, 300 * US),  # exposed tail of the all-gather
        Placed("while.1", 4400 * US, 1000 * US),
        Placed("fusion.5", 4405 * US, 990 * US),  # nested in while.1: its self time is 10 µs
        Placed("all-reduce.2", 5500 * US, sync_allreduce),
        Placed("copy.1", 7000 * US, 200 * US),
    ]


def small_design(**overrides) -> CaptureDesign:
    fields = dict(hostname="host0", device_type="TPU v6 Lite", peak_tflops=918.0, peak_hbm_gbs=1640.0,
                  module="jit_train_step", program_id=4242, ops=SMALL_OPS, n_chips=2, n_steps=5,
                  step_ps=10_000 * US, schedule=small_schedule)
    fields.update(overrides)
    return CaptureDesign(**fields)


@pytest.fixture
def small_capture(tmp_path: Path) -> Path:
    """A logdir with one run holding the small 2-chip design."""
    write_capture(small_design(), tmp_path / "logdir" / "plugins" / "profile" / "2026_01_01_00_00_00")
    return tmp_path / "logdir"


@pytest.fixture
def write_design(tmp_path: Path):
    def _write(design: CaptureDesign, run: str = "run") -> Path:
        write_capture(design, tmp_path / "logdir" / "plugins" / "profile" / run)
        return tmp_path / "logdir" / "plugins" / "profile" / run
    return _write


REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"

# The slowest property tests run a bounded number of examples by default, so that the README's
# test command fits in 10 minutes on two cores; under CI (`CI` set) or `TPUDIAG_FULL_EXAMPLES=1`
# they run their full count (`.ci/run` does, after timing the README's command). docs/testing.md.
FULL_EXAMPLES = bool(os.environ.get("CI")) or os.environ.get("TPUDIAG_FULL_EXAMPLES") == "1"


def bounded_examples(full: int, default: int) -> int:
    """Hypothesis's `max_examples` for a slow property test: `full` under CI, else `default`."""
    return full if FULL_EXAMPLES else min(full, default)


# Modules whose module- or session-scoped fixture costs tens of seconds of CPU (libtpu compiles,
# xprof runs): every test of one group runs on the same xdist worker, so its fixture is built
# once per run, not once on each worker that draws one of its tests; modules sharing a session
# fixture are one group. Other tests are spread one by one, as `--dist load` spreads them. (xdist's
# own `xdist_group` marks do nothing with pytest 9, whose node ids xdist can no longer suffix.)
ONE_WORKER_GROUPS = {
    "tests/analysis/test_diff_recompile.py": "transformer_whatif",  # the session fixture's compiles
    "tests/test_whatif.py": "transformer_whatif",  # the same, the MLP's whatif compiles, the flag registry
    "tests/compiler/test_memory_libtpu.py": "adam",  # seven Adam compiles in one process
    "tests/kernels_lab/test_kernel_tune.py": "tune",  # a deviceless tuning sweep
    "tests/parsers/test_hlo_sparsecore.py": "sparsecore",  # a SparseCore-offloaded compile
    "tests/rules/test_claims_audit.py": "claims",  # xprof on every audited capture
    "tests/test_xprof_agreement.py": "xprof",  # xprof's tools on the designed capture
}


@pytest.hookimpl(tryfirst=True)
def pytest_xdist_make_scheduler(config, log):
    """`-n N` with the default `--dist load`: tests spread one by one, each group of
    `ONE_WORKER_GROUPS` kept together."""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerModules(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return ONE_WORKER_GROUPS.get(nodeid.split("::", 1)[0], nodeid)

    return OneWorkerModules(config, log)

def pytest_configure(config):
    """Byte-compile `tpudiag/` once, before any worker starts (the controller only).

    The editable install leaves the package uncompiled, and where PYTHONDONTWRITEBYTECODE is set
    (these machines' shells set it) no import ever writes its bytecode: each of the hundreds of
    processes the suite starts (CLI runs, compile workers, repro scripts) compiled the package from
    source again, about 0.35 s of CPU each. `compileall` writes the caches whatever that variable
    says; a source newer than its cache is compiled again on import, so a stale cache is never used.
    Measured on `tests/cli`, `tests/robustness`, `tests/kernels_lab/test_lab_cli.py` and
    `tests/test_readme.py` at `-n 2`: 194 -> 167 s of CPU, 120 -> 101 s of wall time."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller compiled already
        return
    import compileall

    compileall.compile_dir(str(REPO / "tpudiag"), quiet=2)  # a read-only checkout just goes uncompiled


# `TPUDIAG_TEST_CPU=FILE`: each test's CPU seconds (user + system of its process and of the child
# processes it waited for; setup, call and teardown) appended to FILE as `seconds<TAB>node id`, one
# line per test, from every xdist worker. Wall durations mislead on a loaded machine; CPU ranks the
# tests by what they cost (docs/testing.md): `sort -rn FILE | head -40`.
CPU_LOG = os.environ.get("TPUDIAG_TEST_CPU")


def _cpu_seconds() -> float:
    import resource

    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not CPU_LOG:
        yield
        return
    before = _cpu_seconds()
    yield
    with open(CPU_LOG, "a", encoding="utf-8") as log:  # one short line per write: workers' lines stay whole
        log.write(f"{_cpu_seconds() - before:.2f}\t{item.nodeid}\n")


# The real v6e capture mangled in transit lives in ../shared, which a bare clone does not have.
REAL_MANGLED = SHARED / "data" / "bad-inputs" / "tpu-v6e-inference-mangled.xplane.pb"


def mangle_like_transit(data: bytes) -> bytes:
    """What happened to the real v6e capture in transit: read as UTF-8 text, written back out.

    Every byte sequence that is not valid UTF-8 became U+FFFD (`ef bf bd`), which breaks the
    protobuf's varints and lengths the way the real file is broken.
    """
    return data.decode("utf-8", errors="replace").encode("utf-8")


@pytest.fixture(params=["project-made", "real-v6e"])
def mangled_capture(request, tmp_path: Path) -> Path:
    """A mangled `.xplane.pb`: one the project makes (always), and the real one from ../shared."""
    if request.param == "real-v6e":
        if not REAL_MANGLED.exists():
            pytest.skip(f"the real mangled capture is in ../shared, absent here ({REAL_MANGLED})")
        return REAL_MANGLED
    from tpudiag.writers.tpu_design import build_capture

    path = tmp_path / "mangled" / "host9.xplane.pb"
    path.parent.mkdir()
    path.write_bytes(mangle_like_transit(build_capture(small_design()).serialize()))
    return path


@pytest.fixture(scope="session")
def transformer_whatif(tmp_path_factory):
    """`tpudiag whatif` of the bundled transformer on v5e:2x2, as the CLI runs it (static profile on):
    the baseline, the latency-hiding scheduler off (`variant-1`) and on, its default (`variant-2`:
    identical flags), the compile outputs kept for `diff`. Three compiles, built once per session for
    tests/test_whatif.py and tests/analysis/test_diff_recompile.py (one worker group below; they
    made five compiles between them before). Tests using it are marked `libtpu`."""
    from tpudiag.whatif import plan_variants, whatif

    require_libtpu()
    target = f"{REPO / 'examples' / 'models' / 'transformer_train.py'}:train_step"
    lhs = "xla_tpu_enable_latency_hiding_scheduler"
    variants = plan_variants([f"{lhs}=false", f"{lhs}=true"], [], each=True)
    return whatif(target, "v5e:2x2", variants, tmp_path_factory.mktemp("transformer-whatif"))


CPU_EXAMPLE = REPO / "examples" / "captures" / "cpu_jax_profiler"


def host_only_capture(tmp_path: Path) -> Path:
    """The real CPU example without its XLA CPU ops: the `hlo_op` stat renamed, so `/host:CPU` holds
    TraceMe spans only (a host-only capture, e.g. jax.profiler around Python that ran no XLA op)."""
    from tpudiag.proto import XSpace

    (trace,) = CPU_EXAMPLE.rglob("*.xplane.pb")
    space = XSpace()
    space.ParseFromString(trace.read_bytes())
    for plane in space.planes:
        for md in plane.stat_metadata.values():
            if md.name == "hlo_op":
                md.name = "not_an_hlo_op"
    run = tmp_path / "host_only" / "plugins" / "profile" / "run"
    run.mkdir(parents=True)
    (run / trace.name).write_bytes(space.SerializeToString())
    return run


def require_libtpu() -> None:
    """Fail a libtpu test where libtpu is missing (skip it instead with TPUDIAG_ALLOW_NO_LIBTPU=1)."""
    import importlib.util
    import os

    import pytest

    if importlib.util.find_spec("libtpu") is None:
        if os.environ.get("TPUDIAG_ALLOW_NO_LIBTPU") == "1":
            pytest.skip("libtpu is not installed (TPUDIAG_ALLOW_NO_LIBTPU=1)")
        pytest.fail("libtpu is not installed: install the tpu extra or set TPUDIAG_ALLOW_NO_LIBTPU=1 to skip")
