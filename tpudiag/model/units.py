"""Human-readable numbers with their units, for every output: renderers, rule messages, the TUI.

In the model package because rules may not import renderers, yet their messages must read the
same as the report around them."""

from __future__ import annotations

# No memory space of any device or host holds a pebibyte: a byte count read from a file past this
# is damage, refused or dropped where it is read, so sums of a few stay far inside int64.
MAX_PLAUSIBLE_BYTES = 1 << 50
MAX_PLAUSIBLE_TEXT = "1 PiB"  # as messages say it (fmt_bytes stops at GiB)


def fmt_time(ps: float | None) -> str:
    if ps is None:
        return "n/a"
    a = abs(ps)
    if a >= 1e12:
        return f"{ps / 1e12:.3g} s"
    if a >= 1e9:
        return f"{ps / 1e9:.2f} ms"
    if a >= 1e6:
        return f"{ps / 1e6:.1f} µs"
    if a >= 1e3:
        return f"{ps / 1e3:.1f} ns"
    return f"{ps:.0f} ps"


def fmt_pct(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def fmt_flops(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}FLOP/s"
    return f"{x:.3g} FLOP/s"


def fmt_bandwidth(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.3g} B/s"


def fmt_bytes(x: float | None) -> str:
    if x is None:
        return "n/a"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if abs(x) >= scale:
            return f"{x / scale:.3g} {unit}"
    return f"{x:.0f} B"


def number_problem(value: float, positive: bool = False) -> str | None:
    """Why `value` cannot be a threshold (NaN, infinite, negative, or zero when `positive`), or None."""
    import math

    if not math.isfinite(value):
        return f"must be a finite number, got {value!r}"
    if value < 0 or (positive and value == 0):
        return f"must be {'>' if positive else '>='} 0, got {value:g}"
    return None


# Bytes per element for the dtypes rules meet; other dtypes count as 4 (f32-sized), f8 variants as 1.
DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s4": 0.5, "u4": 0.5, "bf16": 2, "f16": 2, "s16": 2, "u16": 2,
               "f32": 4, "s32": 4, "u32": 4, "f64": 8, "s64": 8, "u64": 8, "c64": 8}


# The `jax.numpy` name of each HLO element type the kernels lab writes into code (a fixed table:
# nothing from a trace reaches generated code otherwise). Each lab family supports a subset.
JNP_DTYPES = {"bf16": "bfloat16", "f16": "float16", "f32": "float32", "f64": "float64", "s8": "int8",
              "s16": "int16", "s32": "int32", "s64": "int64", "u8": "uint8", "u16": "uint16", "u32": "uint32",
              "u64": "uint64", "pred": "bool_", "f8e4m3fn": "float8_e4m3fn", "f8e5m2": "float8_e5m2"}


def jnp_dtypes(*hlo: str) -> dict[str, str]:
    """The `JNP_DTYPES` entries of the HLO types `hlo`, in that order."""
    return {t: JNP_DTYPES[t] for t in hlo}


def element_bytes(dtype: str) -> float | None:
    """Bytes per element of an HLO dtype the table knows (f8 variants 1); None for any other."""
    return 1 if dtype.startswith("f8") else DTYPE_BYTES.get(dtype)
