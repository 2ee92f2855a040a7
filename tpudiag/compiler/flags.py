"""Where a compiler flag goes: `LIBTPU_INIT_ARGS` or `XLA_FLAGS`, by which registry knows it.

A TPU program reads compiler flags from two places, and each rejects what it does not register
(XLA_FLAGS with `Unknown flag in XLA_FLAGS`, libtpu with `Unknown command line flag`). The name
says little: `xla_enable_async_all_reduce` is libtpu's, `xla_dump_hlo_as_text` XLA's. So both
registries are listed, without a TPU, and each flag goes to the one that registers it:

- libtpu: every flag a deviceless TPU compile writes into its XLA dump's `*.flagfile` (libtpu
  0.0.42.1: 1,356 flags, `xla_tpu_*`, `xla_jf_*`, `xla_sc_*`, `xla_enable_async_all_reduce`, ...;
  libtpu's own `--helpfull` prints nothing, its help text being stripped);
- XLA: the fields of `xla.DebugOptions`, which XLA_FLAGS's parser takes, read from the
  `xla/xla.proto` descriptor compiled into jaxlib (jaxlib 0.10.2: 311 fields).

A name both register (3 on these versions, e.g. `xla_tpu_detect_nan`) goes to LIBTPU_INIT_ARGS:
libtpu is the TPU compiler, and reads it there. A name neither registers is a usage error. The
lists are cached per jaxlib and libtpu version (`TPUDIAG_CACHE_DIR`, else
`$XDG_CACHE_HOME/tpudiag`, else `~/.cache/tpudiag`): the first listing costs one small compile
(a few seconds), later ones a file read.
"""

from __future__ import annotations

import json
import mmap
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from enum import Enum
from importlib import metadata, util
from pathlib import Path

from tpudiag.errors import TpudiagError, UsageError

LIBTPU = "LIBTPU_INIT_ARGS"
XLA = "XLA_FLAGS"
_XLA_PROTO = b"\n\rxla/xla.proto"  # FileDescriptorProto field 1 (name), 13 bytes: where the descriptor starts
_LIST_TIMEOUT_S = 300.0
# A deviceless compile of the smallest program, dumped: its `*.flagfile` lists libtpu's flags.
_LIST_LIBTPU = """
import jax, jax.numpy as jnp, numpy as np
from jax.experimental import topologies
from jax.sharding import Mesh, NamedSharding, PartitionSpec
topo = topologies.get_topology_desc(platform="tpu", topology_name="v5e:2x2")
mesh = Mesh(np.array(list(topo.devices)[:1]), ("x",))
arg = jax.ShapeDtypeStruct((8, 128), jnp.float32, sharding=NamedSharding(mesh, PartitionSpec()))
jax.jit(lambda x: x + 1).lower(arg).compile()
"""


_FLAG = re.compile(r"^(?:--)?([A-Za-z][A-Za-z0-9_]*)=(.*)\Z", re.DOTALL)


def split_flag(text: str, what: str = "--xla-flag") -> tuple[str, str]:
    """`NAME=VALUE` (a leading `--` allowed) -> (NAME, VALUE); a UsageError unless it is one flag:
    a VALUE with whitespace or a second `--` would put more flags in the variable."""
    from tpudiag.model.text import one_line

    m = _FLAG.match(text.strip())
    if m is None or not m.group(2):
        raise UsageError(f"{what} `{one_line(text)}`: expected NAME=VALUE",
                         hint="e.g. --xla-flag xla_tpu_enable_latency_hiding_scheduler=false")
    name, value = m.group(1), m.group(2)
    if re.search(r"\s", value) or "--" in value:
        raise UsageError(f"{what} `{one_line(text)}`: a value with whitespace or `--` would pass more than one flag",
                         hint=f"give each flag its own {what} NAME=VALUE")
    return name, value


class Destination(str, Enum):
    """The environment variable a flag is passed in."""

    LIBTPU = LIBTPU
    XLA = XLA


class FlagListError(TpudiagError):
    """A registry could not be listed (no jax with libtpu, or a layout this code does not know)."""


@dataclass(frozen=True)
class FlagRegistry:
    """The flag names libtpu and XLA each register, and the versions they were listed from."""

    libtpu: frozenset[str]
    xla: frozenset[str]
    versions: str = ""  # `jaxlib X, libtpu Y`

    def destination(self, name: str) -> Destination | None:
        """Where `name` is accepted (libtpu first, for the few both register); None if neither."""
        if name in self.libtpu:
            return Destination.LIBTPU
        if name in self.xla:
            return Destination.XLA
        return None

    def route(self, name: str, what: str = "--xla-flag") -> Destination:
        """`destination`, or a UsageError naming the flag when neither registry knows it."""
        found = self.destination(name)
        if found is None:
            raise UsageError(f"{what} `{name}`: neither libtpu nor XLA registers this flag ({self.versions})",
                             hint="check the name: libtpu's flags are listed in the `*.flagfile` of an XLA dump "
                                  "(`--xla_dump_to`), XLA's are the fields of DebugOptions")
        return found


def _versions() -> tuple[str, str]:
    """jaxlib's version and libtpu's ('' when libtpu is not installed: it then registers nothing)."""
    try:
        jaxlib = metadata.version("jaxlib")
    except metadata.PackageNotFoundError:
        raise FlagListError("cannot list compiler flags: jaxlib is not installed",
                            hint="install jax: XLA's flags are listed from jaxlib") from None
    try:
        return jaxlib, metadata.version("libtpu")
    except metadata.PackageNotFoundError:
        return jaxlib, ""


def cache_dir() -> Path:
    """Where tpudiag caches what it lists once per installed version."""
    if os.environ.get("TPUDIAG_CACHE_DIR"):
        return Path(os.environ["TPUDIAG_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "tpudiag"


def flag_registry(*, refresh: bool = False) -> FlagRegistry:
    """Both registries of the installed jaxlib and libtpu, from the cache or listed now (and cached)."""
    jaxlib, libtpu = _versions()
    versions = f"jaxlib {jaxlib}, " + (f"libtpu {libtpu}" if libtpu else "no libtpu installed")
    path = cache_dir() / f"flags-jaxlib-{jaxlib}-libtpu-{libtpu or 'none'}.json"
    if not refresh:
        try:
            cached = json.loads(path.read_text(encoding="utf-8"))
            return FlagRegistry(frozenset(cached["libtpu"]), frozenset(cached["xla"]), versions)
        except (OSError, ValueError, KeyError, TypeError):
            pass  # absent or damaged: list again
    registry = FlagRegistry(list_libtpu_flags() if libtpu else frozenset(), list_xla_flags(), versions)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"libtpu": sorted(registry.libtpu), "xla": sorted(registry.xla)}), encoding="utf-8")
        tmp.replace(path)
    except OSError:
        pass  # a read-only home: list again next time
    return registry


def parse_flagfile(text: str) -> frozenset[str]:
    """The flag names of a `*.flagfile` (`--name=value`, one a line)."""
    return frozenset(line[2:].split("=", 1)[0] for line in text.splitlines()
                     if line.startswith("--") and "=" in line)


def list_libtpu_flags(timeout_s: float = _LIST_TIMEOUT_S) -> frozenset[str]:
    """libtpu's flags: a deviceless compile of `x + 1` in a fresh process (libtpu reads its flags
    once per process), dumped, and its `*.flagfile` read. The user's XLA_FLAGS and
    LIBTPU_INIT_ARGS are left out, so a bad one cannot hide the list."""
    env = {k: v for k, v in os.environ.items() if k not in ("JAX_PLATFORMS", LIBTPU)}
    with tempfile.TemporaryDirectory(prefix="tpudiag-flags-") as tmp:
        env.update(TPU_SKIP_MDS_QUERY="1", ALLOW_MULTIPLE_LIBTPU_LOAD="1", XLA_FLAGS=f"--xla_dump_to={tmp}")
        try:
            proc = subprocess.run([sys.executable, "-c", _LIST_LIBTPU], env=env, capture_output=True, text=True,
                                  timeout=timeout_s, errors="replace")
        except subprocess.TimeoutExpired as exc:
            raise FlagListError(f"listing libtpu's flags took over {timeout_s:.0f} s") from exc
        names: frozenset[str] = frozenset()
        for flagfile in Path(tmp).glob("*.flagfile"):
            names |= parse_flagfile(flagfile.read_text(encoding="utf-8", errors="replace"))
    if not names:
        tail = [ln for ln in (proc.stderr or "").strip().splitlines() if ln.strip()][-1:] or ["(no stderr)"]
        raise FlagListError(f"cannot list libtpu's flags: the listing compile wrote no flag file "
                            f"(exit status {proc.returncode}: {tail[0].strip()})",
                            hint="deviceless TPU compiles need jax with libtpu: `pip install -e \".[tpu]\"`")
    return names


def list_xla_flags() -> frozenset[str]:
    """XLA's flags: the fields of `xla.DebugOptions`, from the `xla/xla.proto` descriptor that
    jaxlib's shared library embeds (found by its name, read up to the first byte that cannot
    continue a FileDescriptorProto, then parsed by protobuf)."""
    from google.protobuf import descriptor_pb2
    from google.protobuf.message import DecodeError

    spec = util.find_spec("jaxlib")
    roots = list(spec.submodule_search_locations or []) if spec is not None else []
    for lib in sorted((p for root in roots for p in Path(root).rglob("*.so")), key=lambda p: -p.stat().st_size):
        with lib.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            start = data.find(_XLA_PROTO)
            if start < 0:
                continue
            try:
                proto = descriptor_pb2.FileDescriptorProto.FromString(data[start:_descriptor_end(data, start)])
            except (DecodeError, IndexError):
                continue
        for message in proto.message_type:
            if message.name == "DebugOptions":
                return frozenset(f.name for f in message.field)
    raise FlagListError("cannot list XLA's flags: no `xla/xla.proto` descriptor with DebugOptions in jaxlib",
                        hint="an unknown jaxlib layout: pass the flag in XLA_FLAGS or LIBTPU_INIT_ARGS yourself")


def _descriptor_end(data, start: int) -> int:
    """Where the serialized FileDescriptorProto at `start` ends: after its last field (numbers 1 to
    14, varint or length-delimited), before the first bytes that are not one."""
    def varint(at: int) -> tuple[int, int]:
        value = shift = 0
        while True:
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            shift += 7
            if not byte & 0x80:
                return value, at
            if shift > 63:
                raise IndexError("varint too long")

    at = start
    while at < len(data):
        tag, after = varint(at)
        field, wire = tag >> 3, tag & 7
        if not 1 <= field <= 14 or wire not in (0, 2):
            break
        if wire == 0:
            _, after = varint(after)
        else:
            length, after = varint(after)
            after += length
        if after > len(data):
            break
        at = after
    return at
