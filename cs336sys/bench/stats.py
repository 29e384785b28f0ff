"""Summary statistics of raw timing samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

STATS = ("mean", "std", "min", "median", "max")


def summarize(samples: Sequence[float]) -> dict[str, float | None]:
    """mean, std (sample standard deviation; 0 for one sample), min, median, max."""
    if not samples:
        return dict.fromkeys(STATS)
    xs = [float(x) for x in samples]
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "median": statistics.median(xs),
        "max": max(xs),
    }


def flatten(prefix: str, samples: Sequence[float]) -> dict[str, float | None]:
    """{'fwd_ms_mean': ..., 'fwd_ms_std': ..., ...} for prefix 'fwd_ms'."""
    return {f"{prefix}_{k}": v for k, v in summarize(samples).items()}
