"""An `.xplane.pb` file's bytes checked and its protobuf messages decoded, and XStat values read.

The capture reader (`tpudiag.parsers.capture`) splits a file plane by plane and decodes each
message through here: every failure names the file and its cause; protobuf's own exceptions
never escape.
"""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import DecodeError

from tpudiag.errors import InputError
from tpudiag.parsers.input_files import default_limits, inflate_bounded, read_input_bytes

# An XSpace's first field is `planes` (1, length-delimited) or, rarely, one of the string lists
# (2-4). Any other first byte means the file is not an XSpace at all, which gives a clearer
# message than protobuf's parse error.
_FIRST_TAGS = {0x0A, 0x12, 0x1A, 0x22}


def read_trace_bytes(path: Path) -> bytes:
    """The file's bytes: a regular file only, within the size cap; failures are InputError."""
    return read_input_bytes(path)


def check_trace_bytes(data: bytes, path: Path | str) -> None:
    """Reject what cannot be an XSpace before handing it to protobuf, with a precise cause."""
    if not data:
        raise InputError("empty file, not an XProf trace", path=path)
    if data[:2] == b"\x1f\x8b":
        raise InputError("gzip-compressed; decompress it first (XProf writes plain .xplane.pb)", path=path,
                         hint="run `gunzip -k` on the file")
    if data[0] not in _FIRST_TAGS:
        raise InputError("not an XProf trace (does not start like an XSpace protobuf)", path=path)


def decode_error(exc: Exception, path: Path | str) -> InputError:
    cause = str(exc).split(": ")[-1].strip() or "unreadable wire format"
    return InputError(f"corrupt or truncated XSpace protobuf ({cause.lower()})", path=path)


def parse_message(message, data: bytes, path: Path | str):
    """Parse `data` into `message`, turning protobuf's failures into InputError."""
    try:
        message.ParseFromString(data)
    except DecodeError as exc:
        raise decode_error(exc, path) from exc
    except (ValueError, RuntimeError, TypeError) as exc:  # upb reports some malformed input this way
        raise InputError(f"corrupt XSpace protobuf ({exc})", path=path) from exc
    return message


def stat_value(stat, stat_names: dict[int, str]):
    """The Python value of an XStat: number, str or bytes; ref values resolve to their name."""
    kind = stat.WhichOneof("value")
    if kind is None:
        return None
    if kind == "ref_value":
        return stat_names.get(stat.ref_value, "")
    if kind == "compressed_str_value":
        # Damaged compressed text reads as "" (XProf shows nothing either); a bomb is an error.
        text = inflate_bounded(stat.compressed_str_value, default_limits().max_inflated_bytes,
                               "a gzip-compressed stat value")
        return "" if text is None else text.decode("utf-8", "replace")
    return getattr(stat, kind)


def stats_dict(stats, stat_names: dict[int, str]) -> dict[str, object]:
    """Stats by name; unknown stat ids are kept under `#<id>` so nothing is silently dropped."""
    out: dict[str, object] = {}
    for st in stats:
        out[stat_names.get(st.metadata_id, f"#{st.metadata_id}")] = stat_value(st, stat_names)
    return out
