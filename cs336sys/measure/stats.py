"""Summary statistics of raw timing samples."""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from cs336sys.measure.sampling import drift

# p10/p90 and the interquartile range say how wide the middle of the samples is without
# letting one spike (a GC pause, a clock ramp) set the figure, as std does. n is how many
# samples were taken (not the iters asked for: do_bench and a minimum time choose their
# own count); drift, the last third's median over the first third's, minus 1
# (measure/sampling.py).
STATS = ("mean", "std", "min", "median", "max", "p10", "p90", "iqr", "n", "drift")


def summarize(samples: Sequence[float]) -> dict[str, float | None]:
    """mean, std (sample standard deviation; 0 for one sample), min, median, max, the 10th
    and 90th percentiles, the interquartile range (Q3 - Q1), the count and the drift. Percentiles interpolate
    between samples (`statistics.quantiles`, method "inclusive": numpy's default), so they
    lie within [min, max]; one sample is every percentile of itself."""
    if not samples:
        return dict.fromkeys(STATS)
    xs = [float(x) for x in samples]
    if len(xs) > 1:
        deciles = statistics.quantiles(xs, n=10, method="inclusive")
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
        p10, p90, iqr = deciles[0], deciles[-1], q3 - q1
    else:
        p10 = p90 = xs[0]
        iqr = 0.0
    return {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs) if len(xs) > 1 else 0.0,
        "min": min(xs),
        "median": statistics.median(xs),
        "max": max(xs),
        "p10": p10,
        "p90": p90,
        "iqr": iqr,
        "n": len(xs),
        "drift": drift(xs),
    }


def flatten(prefix: str, samples: Sequence[float]) -> dict[str, float | None]:
    """{'fwd_ms_mean': ..., 'fwd_ms_std': ..., ...} for prefix 'fwd_ms'."""
    return {f"{prefix}_{k}": v for k, v in summarize(samples).items()}
