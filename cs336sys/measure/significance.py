"""Did B change from A? The Mann-Whitney U test on raw samples, and the noise threshold.

The rule `report --compare` and `report --history` apply to two sets of timed samples
(`judge`): a change counts only when both hold

- **significance**: the two-sided Mann-Whitney U test on the raw samples gives p < ALPHA
  (0.05): the samples of B are not drawn from the same distribution as those of A;
- **effect above the noise threshold**: the medians differ by more than THRESHOLD (5%):
  |median(B) / median(A) - 1| > 0.05. A change smaller than that is not worth a label even
  when the test is sure of it (a GPU's clocks and a busy host move timings by a few percent).

Why a rank test: timings are not normally distributed (a floor, then a long tail of slow
steps: a page fault, a clock change, another process), so a t-test's assumptions do not
hold; Mann-Whitney U uses only the order of the samples, so one 10x outlier moves it no
more than any other slow sample. asv (`asv compare`) uses the same test for the same reason.

The p-value: with at most EXACT_PAIRS (400) pairs of values, n1·n2 (20 vs 20, 8 vs 50), the
exact distribution of U, by counting the arrangements of the pooled ranks (with ties, of
their mid-ranks); otherwise the normal approximation with the tie correction of the variance
and a continuity correction of 0.5. The approximation is generous with few tied samples: for
3 vs 3 values with one tie it gave p = 0.047, where no arrangement of 6 values can give less
than 0.1, and 4 vs 10 runs with ties 0.047 where the exact p is 0.062; timings tie often
(CUDA events tick in 32 ns steps).

Few samples: the smallest two-sided p an exact test can give is 2 / C(n1 + n2, n1), which for
2 vs 2 samples is 1/3, for 3 vs 3 is 0.1 and for 3 vs 4 is 0.057: however far apart, such
samples can never reach p < 0.05. `judge` says "too few samples to tell" then, rather than
calling a change or its absence (4 vs 4 samples, or 3 vs 5, are the fewest that can tell).

Single readings (a peak memory in bytes) have no samples to test: `judge(..., tested=False)`
applies the threshold alone.

Pure Python (math only), no scipy.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache

ALPHA = 0.05  # a change must be significant at this level (two-sided)...
THRESHOLD = 0.05  # ...and its medians more than this fraction apart
EXACT_PAIRS = 400  # exact p when n1·n2 is at most this (20 vs 20: 50 ms at worst, in Python)


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of the first sample: pairs (x, y) with x > y, ties counting one half
    p: float  # two-sided
    exact: bool  # p from the exact distribution (else the normal approximation)


def ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks of `values` in their sorted order, ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


@cache  # up to (n1 + 1)(n2 + 1) tables under EXACT_PAIRS
def _counts(m: int, n: int) -> tuple[int, ...]:
    """How many of the C(m+n, m) arrangements of m x's and n y's give U = 0, 1, ..., m*n.

    The largest value is an x (it beats all n y's: U - n for the rest) or a y (it adds
    nothing): f(m, n, u) = f(m-1, n, u-n) + f(m, n-1, u)."""
    if m == 0 or n == 0:
        return (1,)
    with_x, with_y = _counts(m - 1, n), _counts(m, n - 1)
    out = [0] * (m * n + 1)
    for u, c in enumerate(with_x):
        out[u + n] += c
    for u, c in enumerate(with_y):
        out[u] += c
    return tuple(out)


def exact_p(u: int, m: int, n: int) -> float:
    """Two-sided exact p of U = u for samples of m and n values without ties."""
    counts = _counts(m, n)
    low = min(u, m * n - u)  # the distribution is symmetric about m*n/2
    return min(1.0, 2 * sum(counts[: low + 1]) / math.comb(m + n, m))


def exact_p_tied(r: Sequence[float], n1: int, u1: float) -> float:
    """Two-sided exact p of U = u1 for the first n1 of the pooled mid-ranks `r`: the share of
    the C(len(r), n1) ways to pick the first sample's ranks whose U lies at least as far from
    its mean n1·n2/2. The ways are counted, not enumerated: by the sum of the picked doubled
    mid-ranks (integers), one rank at a time, as `_counts` does U without ties."""
    n2 = len(r) - n1
    doubled = [round(2 * v) for v in r]
    # ways[k]: how many picks of k of the ranks seen so far give each doubled sum
    ways: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n1)]
    for seen, rank in enumerate(doubled):
        for k in range(min(seen + 1, n1), 0, -1):
            into = ways[k]
            for total, count in ways[k - 1].items():
                into[total + rank] = into.get(total + rank, 0) + count
    centre = n1 * n2 + n1 * (n1 + 1)  # 2 (E[U] + n1 (n1 + 1) / 2): the mean doubled sum
    far = abs(sum(doubled[:n1]) - centre)
    hits = sum(count for total, count in ways[n1].items() if abs(total - centre) >= far)
    return hits / math.comb(len(r), n1)


def mann_whitney_u(x: Sequence[float], y: Sequence[float]) -> MannWhitney:
    """The two-sided Mann-Whitney U test of samples `x` and `y` (see the module docstring)."""
    n1, n2 = len(x), len(y)
    if n1 == 0 or n2 == 0:
        raise ValueError("the Mann-Whitney U test needs at least one value in each sample")
    pooled = [float(v) for v in (*x, *y)]
    r = ranks(pooled)
    u1 = sum(r[:n1]) - n1 * (n1 + 1) / 2
    ties = [t for t in Counter(pooled).values() if t > 1]
    if n1 * n2 <= EXACT_PAIRS:
        p = exact_p_tied(r, n1, u1) if ties else exact_p(round(u1), n1, n2)
        return MannWhitney(u1, p, exact=True)
    n = n1 + n2
    mu = n1 * n2 / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1))
    var = n1 * n2 / 12 * ((n + 1) - tie_term)
    if var <= 0:  # every value the same
        return MannWhitney(u1, 1.0, exact=False)
    z = (max(u1, n1 * n2 - u1) - mu - 0.5) / math.sqrt(var)
    return MannWhitney(u1, min(1.0, math.erfc(z / math.sqrt(2))), exact=False)


def min_p(n1: int, n2: int) -> float:
    """The smallest two-sided p the test can give for samples of n1 and n2 values (no ties):
    that of two samples with no overlap at all."""
    if n1 == 0 or n2 == 0:
        return 1.0
    return mann_whitney_u(range(n1), range(n1, n1 + n2)).p


@dataclass(frozen=True)
class Judgement:
    """What `judge` found: B against A."""

    a: float  # median of A
    b: float  # median of B
    ratio: float | None  # b / a (None when a is 0)
    p: float | None  # two-sided Mann-Whitney p (None: not tested)
    outcome: str  # "up", "down", "same" or "unknown"
    reason: str = ""  # why "unknown" (or how "same"/"up"/"down" was decided without a test)


def judge(
    a: Sequence[float],
    b: Sequence[float],
    tested: bool = True,
    alpha: float = ALPHA,
    threshold: float = THRESHOLD,
) -> Judgement:
    """Whether B went up, down or stayed the same against A (see the module docstring).

    tested=False: `a` and `b` are single readings (or one per run), not samples of a noisy
    quantity; the threshold alone decides and no p is given.
    """
    if not a or not b:
        raise ValueError("judge needs at least one value on each side")
    ma, mb = statistics.median(a), statistics.median(b)
    if ma == 0:
        same = mb == 0
        return Judgement(ma, mb, None, None, "same" if same else "unknown",
                         "" if same else "A is 0: no ratio")
    ratio = mb / ma
    # by the factor a label prints, max(B/A, A/B): |B/A - 1| called 1.05x slower a change
    # and 1.051x faster (B/A 0.951) not
    big = (max(ratio, 1 / ratio) if ratio > 0 else float("inf")) - 1 > threshold
    if not tested:
        return Judgement(ma, mb, ratio, None, ("up" if ratio > 1 else "down") if big else "same",
                         "threshold only")
    p = mann_whitney_u(a, b).p
    # no p these sizes can give is below alpha: neither a change nor its absence is told
    # (3 samples over 24 to 716 ms against 3 over 37 to 138 read `unchanged`)
    if min_p(len(a), len(b)) >= alpha:
        return Judgement(ma, mb, ratio, p, "unknown", "too few samples to tell")
    if not big:
        return Judgement(ma, mb, ratio, p, "same")
    if p < alpha:
        return Judgement(ma, mb, ratio, p, "up" if ratio > 1 else "down")
    return Judgement(ma, mb, ratio, p, "same", "not significant")
