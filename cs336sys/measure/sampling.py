"""How many samples a timed point takes, whether they drifted, and how sure a ratio of two
points is.

- **Enough samples** (`Enough`): a point keeps taking samples until it has at least
  `min_count` of them *and* they add up to at least `min_seconds`, never more than
  `max_count`. On a GPU the defaults are 10 samples and 1 s: a figure from 1-4 samples (what
  do_bench's own 100 ms gives a 50 ms step) says nothing about its spread.
- **Drift** (`drift`): the median of the last third of a point's samples against the median
  of its first third, minus 1. A GPU's clocks fall as it heats (+4 to +11 % from first to last
  sample was seen on an H200 within one point), which a median over the whole point hides;
  past DRIFT (3 %) the point is flagged.
- **A ratio with its interval** (`ratio_interval`): the ratio of two points' medians with a
  bootstrap percentile interval (Efron & Tibshirani 1993, ch. 13): each side resampled with
  replacement, the ratio of the resampled medians, 2.5th and 97.5th percentiles. A
  difference is called only when the interval excludes 1 (`verdict`).
- **Rounds** (`rounds_interval`): points whose timed steps interleaved in rounds are paired
  round by round, and the t interval of the rounds' log ratios joins the samples' (`wider`):
  resampling steps treats a round that load slowed as many independent samples, and on a
  loaded CPU called a function against itself 9.7x to 189x faster.

No torch: the report computes intervals from stored samples, with numpy (matplotlib's), one
array operation for all the resamples of a side; Python's loop of random.choices took 3 ms
an interval, 1.3 s of a report of 10,000 runs (benchmarks/report_speed.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

DRIFT = 0.03  # |drift| past this is flagged
DRIFT_MIN_SAMPLES = 6  # two thirds of at least two samples each
CONFIDENCE = 0.95
RESAMPLES = 1000
# The fewest samples a side for the interval's verdict: on equal lognormal samples the 95 %
# percentile bootstrap of the medians' ratio excluded 1 in 7.8 % of 4-against-4 pairs and
# 6.8 % of 3-against-5, 3.5-4.4 % from 5 a side (5,000 pairs each:
# python benchmarks/bootstrap_false_rate.py).
BOOTSTRAP_MIN = 5
# The most samples a point keeps: 1 s of 25 us calls would be 40,000 floats in the store.
MAX_SAMPLES = 1000


@dataclass(frozen=True)
class Enough:
    """When a point has taken enough samples: at least `min_count` adding up to at least
    `min_seconds`, and never more than `max_count` (which wins over `min_seconds`)."""

    min_count: int = 1
    min_seconds: float = 0.0
    max_count: int = MAX_SAMPLES

    def __call__(self, samples_ms: Sequence[float]) -> bool:
        count = len(samples_ms)
        if count >= max(self.max_count, self.min_count):
            return True
        return count >= self.min_count and sum(samples_ms) / 1e3 >= self.min_seconds


def drift(samples: Sequence[float]) -> float | None:
    """median(last third) / median(first third) - 1, in the order the samples were taken;
    None for fewer than DRIFT_MIN_SAMPLES samples."""
    if len(samples) < DRIFT_MIN_SAMPLES:
        return None
    third = len(samples) // 3
    first = statistics.median(samples[:third])
    return statistics.median(samples[-third:]) / first - 1 if first else None


def drifted(value: float | None) -> bool:
    return value is not None and abs(value) > DRIFT


@dataclass(frozen=True)
class Interval:
    """`ratio` = median(b) / median(a), and its interval at `confidence`."""

    ratio: float
    low: float
    high: float
    confidence: float = CONFIDENCE


def ratio_interval(a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE,
                   resamples: int = RESAMPLES, seed: int = 0) -> Interval | None:
    """median(b) / median(a) with a bootstrap percentile interval; deterministic (`seed`).
    None when a side is empty or A's median is 0."""
    if not a or not b or statistics.median(a) == 0:
        return None
    import numpy as np

    rng = np.random.default_rng(seed)

    def medians(x: Sequence[float]) -> Any:  # of `resamples` resamples of x, drawn at once
        values = np.asarray(x, dtype=float)
        return np.median(values[rng.integers(0, len(values), (resamples, len(values)))], axis=1)

    ma, mb = medians(a), medians(b)
    ratios = np.sort(mb[ma != 0] / ma[ma != 0])
    if not len(ratios):
        return None
    tail = (1 - confidence) / 2
    low = float(ratios[int(tail * (len(ratios) - 1))])
    high = float(ratios[int((1 - tail) * (len(ratios) - 1) + 0.5)])
    return Interval(statistics.median(b) / statistics.median(a), low, high, confidence)


# Student's t, 97.5th percentile, by degrees of freedom 1, 2, ...: the rounds' interval
# (past the table, 1.96 + 2.4 / df, within 0.3 % of t from df 30).
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201,
         2.179, 2.160, 2.145, 2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069,
         2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def rounds_interval(a: Sequence[float], b: Sequence[float]) -> Interval | None:
    """The ratio b / a of two points' medians per round, paired by round (round i of both
    ran in one pass of the command), and the 95 % t interval of their geometric mean: two
    rounds that agree give a narrow interval, one slowed by load a wide one, as it should
    (two rounds: t = 12.7). None under two rounds, for unequal counts or a median <= 0."""
    if len(a) < 2 or len(a) != len(b) or min(*a, *b) <= 0:
        return None
    logs = [math.log(y / x) for x, y in zip(a, b, strict=True)]
    mean = statistics.fmean(logs)
    df = len(logs) - 1
    t = _T975[df - 1] if df <= len(_T975) else 1.96 + 2.4 / df
    half = t * statistics.stdev(logs) / math.sqrt(len(logs))
    return Interval(math.exp(mean), math.exp(mean - half), math.exp(mean + half))


def wider(found: Interval, other: Interval | None) -> Interval:
    """`found` widened to take in `other` too (its ratio kept)."""
    if other is None:
        return found
    return Interval(found.ratio, min(found.low, other.low), max(found.high, other.high),
                    found.confidence)


def verdict(interval: Interval | None, lower_is_better: bool = True) -> str:
    """'faster', 'slower' or 'no difference' for a time ratio B / A (b faster when below 1),
    from whether the interval excludes 1; '' without an interval."""
    if interval is None:
        return ""
    if interval.high < 1:
        return "faster" if lower_is_better else "smaller"
    if interval.low > 1:
        return "slower" if lower_is_better else "larger"
    return "no difference"
