"""Read JAX's device memory profile (`jax.profiler.save_device_memory_profile`), a pprof protobuf.

The file is pprof's `Profile` message, gzip-compressed as pprof stores it (a plain one is read
too). JAX writes two sample types, `allocations`/`count` and `space`/`bytes`, and labels each
sample with `kind` (`buffer`, `executable`) and, for buffers, `device` (`cpu:0`, `tpu:3`). The
message is decoded by protobuf (`proto.PprofProfile`); what it refers to (strings, locations,
functions) is checked here, so a damaged or foreign file is one InputError naming it.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import DecodeError

from tpudiag.errors import InputError
from tpudiag.model.live_buffers import BufferSample, DeviceMemoryProfile, SourceFrame, StackLocation
from tpudiag.parsers.input_files import default_limits, inflate_bounded, read_input_bytes
from tpudiag.proto import PprofProfile

_GZIP_MAGIC = b"\x1f\x8b"


def read_device_memory_profile(path: Path | str) -> DeviceMemoryProfile:
    """The profile at `path`; InputError naming the file and the cause on anything unreadable."""
    return parse_device_memory_profile(read_input_bytes(path), path)


def parse_device_memory_profile(data: bytes, path: Path | str = "<bytes>") -> DeviceMemoryProfile:
    if not data:
        raise InputError("empty file, not a pprof profile", path=path)
    if data[:2] == _GZIP_MAGIC:
        cap = default_limits().max_inflated_bytes
        inflated = inflate_bounded(data, cap, "a gzip-compressed pprof profile", path=path)
        if inflated is None:
            raise InputError("damaged gzip data (not a readable pprof profile)", path=path)
        data = inflated
    profile = PprofProfile()
    try:
        profile.ParseFromString(data)
    except (DecodeError, ValueError, RuntimeError) as exc:
        raise InputError("not a pprof profile (the protobuf does not parse)", path=path) from exc
    return DeviceMemoryProfile(str(path), tuple(_samples(profile, path)))


def _samples(profile, path) -> list[BufferSample]:
    strings = profile.string_table
    if not strings or strings[0] != "":
        raise InputError("not a pprof profile (no string table)", path=path)

    def text(index: int) -> str:
        if not 0 <= index < len(strings):
            raise InputError(f"damaged pprof profile (string index {index} out of range)", path=path)
        return strings[index]

    units = [(text(t.type), text(t.unit)) for t in profile.sample_type]
    bytes_at = next((i for i, (_, unit) in enumerate(units) if unit == "bytes"), None)
    if bytes_at is None:
        raise InputError("a pprof profile without a bytes sample type: not a device memory profile "
                         f"(its types: {', '.join(f'{t}/{u}' for t, u in units) or 'none'})", path=path,
                         hint="write one with `jax.profiler.save_device_memory_profile(path)`")
    count_at = next((i for i, (_, unit) in enumerate(units) if unit == "count"), None)
    functions = {f.id: (text(f.name), text(f.filename)) for f in profile.function}
    # Each location's frames are made once and shared by the samples naming it: a location of N
    # lines named N times by one sample is N frames and N references, not N * N frames.
    frames_of: dict[int, StackLocation] = {}
    for loc in profile.location:
        frames = []
        for line in loc.line:  # inlined callees first, the caller last: innermost first, as the stack
            if line.function_id not in functions:
                raise InputError(f"damaged pprof profile (location {loc.id} names no function "
                                 f"{line.function_id})", path=path)
            name, file = functions[line.function_id]
            frames.append(SourceFrame(name, file, line.line))
        frames_of[loc.id] = StackLocation(tuple(frames))
    out: list[BufferSample] = []
    for sample in profile.sample:
        values = list(sample.value)
        if len(values) != len(units):
            raise InputError(f"damaged pprof profile (a sample has {len(values)} values for "
                             f"{len(units)} sample types)", path=path)
        labels = {text(lb.key): text(lb.str) for lb in sample.label if lb.str}
        kind = labels.get("kind", "")
        size = values[bytes_at]
        # An executable's size is its generated code's, -1 per executable where the backend does not
        # say (PJRT's SizeOfGeneratedCodeInBytes); any other negative value is damage.
        unknown_size = kind == "executable" and size < 0
        if (count_at is not None and values[count_at] < 0) or (size < 0 and not unknown_size):
            raise InputError("damaged pprof profile (a negative count or size)", path=path)
        stack: list[StackLocation] = []
        for lid in sample.location_id:
            if lid not in frames_of:
                raise InputError(f"damaged pprof profile (a sample names no location {lid})", path=path)
            stack.append(frames_of[lid])
        out.append(BufferSample(kind=kind, device=labels.get("device", ""),
                                buffers=values[count_at] if count_at is not None else 0,
                                bytes=0 if unknown_size else size, stack=tuple(stack), size_known=not unknown_size))
    return out
