"""Which degrees each parallelism strategy of `cs336sys plan` can take: TP splits the heads
(or the xxl's d_ff) evenly, DP and FSDP give each device whole sequences, FSDP+TP needs a split
X x Y of both; and the --split and --mesh-axes values, read and checked."""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Any

from cs336sys.sweep.points import SpecError


def tp_units(spec: Any) -> int:
    """What TP splits evenly: the heads of a Transformer, d_ff of two-matrix blocks."""
    return spec.d_ff if spec.blocks == "ffn2" else spec.num_heads


def split_of(text: str) -> tuple[int, int]:
    """"16x4" -> (16, 4), the FSDP and TP degrees of --split; SpecError otherwise."""
    x, sep, y = text.lower().partition("x")
    if not (sep and x.strip().isdigit() and y.strip().isdigit() and int(x) > 0 and int(y) > 0):
        raise SpecError(f"--split: {text!r} is not XxY, the FSDP and TP degrees (16x4)")
    return int(x), int(y)


def mesh_of(text: str) -> str:
    """--mesh-axes "2,1" as stored: two positive numbers, M_X and M_Y; SpecError otherwise."""
    parts = [p.strip() for p in text.split(",")]
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != 2 or not all(0 < v <= 64 for v in values):
        raise SpecError(f"--mesh-axes: {text!r} is not MX,MY, the mesh axes of FSDP and of TP, "
                        "each above 0 and at most 64 (2,1 on a 3D TPU mesh)")
    return ",".join(parts)


def problem(strategy: str, n: int, heads: int, sequences: int, split: str | None = None,
            unit: str = "heads") -> str | None:
    """Why `strategy` cannot run at degree `n` (None if it can): TP splits the heads (or
    d_ff) evenly, DP and FSDP give each device whole sequences, FSDP+TP needs a split of
    both (the one given, with --split)."""
    if strategy == "fsdp-tp" and split:
        x, y = split_of(split)
        if x * y != n:
            return f"fsdp-tp --split {split} is {x * y} devices, not {n}"
        if heads % y or sequences % x:
            return (f"fsdp-tp --split {split}: {y} must divide the {heads} {unit} and {x} the "
                    f"batch's {sequences} sequences")
        return None
    if strategy == "tp" and heads % n:
        return f"tp splits the {heads} {unit} evenly; {n} does not divide {heads}"
    if strategy in ("dp", "fsdp") and sequences % n:
        return (
            f"{strategy} gives each device whole sequences; {n} does not divide the "
            f"batch's {sequences} sequences"
        )
    if strategy == "fsdp-tp" and not splits(n, heads, sequences):
        return f"fsdp-tp finds no split X*Y = {n} with Y dividing {heads} heads and X {sequences} sequences"
    return None


@lru_cache(maxsize=64)
def divisors(k: int) -> tuple[int, ...]:
    """Every divisor of k, ascending, by trial division up to sqrt(k): k is at most
    MAX_SPLIT, a million steps, where a walk of every integer up to k hung on a large batch."""
    small = [d for d in range(1, math.isqrt(k) + 1) if k % d == 0]
    return tuple(sorted({*small, *(k // d for d in small)}))


MAX_SPLIT = 2**40  # the batch's tokens, the heads or d_ff: what the degrees divide


def check_splittable(option: str, value: int | None) -> None:
    """SpecError where `value` (of `option`) is more than MAX_SPLIT: divisors() of it would
    take too long."""
    if value is not None and value > MAX_SPLIT:
        raise SpecError(f"{option}: {value} is too large for a plan "
                        f"(at most 2^{MAX_SPLIT.bit_length() - 1})")


def splits(n: int, heads: int, sequences: int) -> list[tuple[int, int]]:
    """FSDP+TP splits (X, Y) of n: X * Y == n, Y divides the heads, X the sequences."""
    return [(n // y, y) for y in divisors(heads)
            if y <= n and n % y == 0 and sequences % (n // y) == 0]


def whole_split(x_bound: float, y_bound: float, units: int, sequences: int) -> tuple[int, int]:
    """The split (X, Y) of the largest degree a plan can run that hides: X dividing the
    batch's sequences and Y the heads (or d_ff), each at most its axis's bound (plan's
    axis_bounds; 1 on an axis the strategy lacks). N max, the bounds' product, takes the
    degrees as real numbers, as the handout does; a degree under it need not split so."""
    xs = [x for x in divisors(sequences) if x <= x_bound]
    ys = [y for y in divisors(units) if y <= y_bound]
    return max(((x, y) for x in xs or [1] for y in ys or [1]), key=lambda s: (s[0] * s[1], s[1]))
