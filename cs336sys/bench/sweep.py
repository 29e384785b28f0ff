"""Sweep expansion: list-valued options become the cartesian product of their values."""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any


def split_list(values: Iterable[str] | None) -> list[str]:
    """`--size small,medium --size large` -> ['small', 'medium', 'large'] (order kept, no dups)."""
    out: list[str] = []
    for value in values or []:
        for item in str(value).split(","):
            item = item.strip()
            if item and item not in out:
                out.append(item)
    return out


def expand(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, the first axis varying slowest."""
    names = list(axes)
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*(axes[n] for n in names))
    ]
