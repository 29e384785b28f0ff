"""Byte sizes with units, as users type them: `1MB`, `512KiB`, `1.5GB`, `4096`, and ranges
of them as nccl-tests takes (`8B:1GiB:x2`).

Decimal units (KB, MB, GB = 10^3, 10^6, 10^9) as network people count; binary units
(KiB, MiB, GiB = 2^10, 2^20, 2^30) when written with the `i`, as nccl-tests reads its own
K, M, G (its `-e 1G` is 1,073,741,824 bytes: `1GiB` here). No torch here:
the CLI parses sizes before anything heavy is imported.
"""

from __future__ import annotations

import re

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 2**10,
    "MIB": 2**20,
    "GIB": 2**30,
    "TIB": 2**40,
}
MAX_BYTES = 2**40
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")


def parse_size(text: str) -> int:
    """'10MB' -> 10_000_000; '1MiB' -> 1_048_576. ValueError with one sentence otherwise."""
    m = _SIZE.match(str(text))
    unit = m.group(2).upper() if m else None
    if m is None or unit not in _UNITS:
        raise ValueError(
            f"{text!r} is not a size; write a number with an optional unit "
            "B, KB, MB, GB (powers of 1000) or KiB, MiB, GiB (powers of 1024)"
        )
    value = float(m.group(1)) * _UNITS[unit]
    if value < 1:
        raise ValueError(f"{text!r} is less than one byte")
    if value > MAX_BYTES:
        raise ValueError(f"{text!r} is more than 1TiB, larger than any buffer a benchmark needs")
    return int(value)


# A range of sizes as nccl-tests' -b/-e/-f: START:END, or START:END:xFACTOR (default x2).
_RANGE = re.compile(r"^\s*([^:]+):([^:]+)(?::\s*[xX]?\s*(\d+(?:\.\d+)?))?\s*$")
MAX_RANGE_POINTS = 64


def parse_sizes(text: str) -> list[int]:
    """'1MB' -> [1_000_000]; '8B:1GiB:x2' (nccl-tests' -b 8 -e 1G -f 2) -> 8, 16, ..., 2^30:
    28 sizes, the largest multiple of 8 by a power of two up to the end. ValueError with one sentence otherwise."""
    m = _RANGE.match(str(text))
    if m is None:
        return [parse_size(text)]
    start, end = parse_size(m.group(1)), parse_size(m.group(2))
    factor = float(m.group(3)) if m.group(3) else 2.0
    if end < start:
        raise ValueError(f"{text!r}: the range ends ({end} B) before it starts ({start} B)")
    if factor <= 1:
        raise ValueError(f"{text!r}: the factor must be more than 1, got x{m.group(3)}")
    sizes, size = [], float(start)
    while size <= end * (1 + 1e-12):
        sizes.append(int(round(size)))
        if len(sizes) > MAX_RANGE_POINTS:
            raise ValueError(f"{text!r} is more than {MAX_RANGE_POINTS} sizes; take a larger "
                             "factor or a shorter range")
        size *= factor
    return list(dict.fromkeys(sizes))


def format_duration(seconds: float) -> str:
    """A duration as people say it: '40 s', '12 min', '3.5 h', '89 days' (a sweep no one
    should start, read at a glance)."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 2 * 3600:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h" if seconds < 48 * 3600 else f"{seconds / 86400:,.0f} days"


def format_size(n: float) -> str:
    """10_000_000 -> '10MB', 1_048_576 -> '1MiB', 1234 -> '1.23KB' (short, for tables): an
    exact unit, decimal first, as a size is typed (`1024MB`, `1500MiB`), where it takes
    fewer than five digits; else three digits in decimal units (a computed count that
    happens to be a multiple of 1,024 is '90.8MB', not '88658KiB', beside '68.1MB')."""
    decimal = (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3))
    binary = (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10))
    for units in (decimal, binary):  # `2048KB` as typed, not `2000KiB`
        for unit, scale in units:
            if n >= scale and n % scale == 0 and n // scale < 10_000:
                return f"{int(n // scale)}{unit}"
    for unit, scale in decimal:
        if n >= scale * 0.9995:  # 999,996 B is '1MB', not '1e+03KB'
            return f"{n / scale:.3g}{unit}"
    return f"{int(n)}B"
