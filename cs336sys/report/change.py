"""Whether one point changed between two sides of a comparison (report/compare.py, report
--compare and --history): the metric an experiment compares by, the timed samples behind a
run's figure, a side's runs of a point, and the judgement of B against A
(measure/significance.py).
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.significance import THRESHOLD, judge
from cs336sys.report.sections import Row, compared, skey, stopped, timed_samples


@dataclass(frozen=True)
class Metric:
    """The metric an experiment declares for comparison (sweep/declaration.py, `compare`)."""

    name: str  # the declared name: a timed base (step_ms) or a single reading (peak_bytes)
    label: str  # "step ms"
    column: str  # the view column holding each run's value: step_ms_mean, peak_bytes
    unit: str
    timed: bool  # a statistic over timed samples (else one reading per run)

    @property
    def words(self) -> tuple[int, str, str]:
        """(+1 higher is better, -1 lower is better, 0 unknown; word for up; word for down)."""
        return direction(self.unit)


def metrics(catalog: Sequence[Any]) -> dict[str, Metric]:
    """experiment -> the metric it declares for comparison."""
    out = {}
    for e in catalog:
        if e.compare is not None:
            label, column, unit, lo, _hi = e.compare_columns()
            out[e.kind] = Metric(e.compare, label, column, unit, timed=lo is not None)
    return out


_TIME = {"ns", "us", "µs", "ms", "s"}
_BYTES = {"bytes", "B", "KB", "MB", "GB", "KiB", "MiB", "GiB"}


def direction(unit: str) -> tuple[int, str, str]:
    """What up and down mean for a metric in `unit`: time and memory are better lower, rates
    (anything per second: TFLOP/s, GB/s, tokens/s) better higher."""
    if unit in _TIME:
        return -1, "slower", "faster"
    if unit in _BYTES:
        return -1, "bigger", "smaller"
    if unit.endswith("/s"):
        return 1, "faster", "slower"
    return 0, "higher", "lower"


@dataclass
class Side:
    """A point on one side: its runs' values, their pooled timed samples, and each run's
    median (the unit of the test when the point ran more than once)."""

    row: Row  # the latest run (names the point)
    values: list[float] = field(default_factory=list)  # one per run: the column's value
    samples: list[float] = field(default_factory=list)  # raw timed samples, every run's
    runs: list[float] = field(default_factory=list)  # one per run with samples: its median
    invocations: set[str] = field(default_factory=set)  # of its runs: where and with what

    def add(self, r: Row, metric: Metric) -> None:
        """One more ok run of the point (the latest names it)."""
        self.row = r
        if r.get("invocation_id"):
            self.invocations.add(r["invocation_id"])
        self.values.append(float(r[metric.column]))
        if metric.timed:
            mine = timed_samples(r.get("_samples"), metric.name)
            self.samples += mine
            if mine:
                self.runs.append(statistics.median(mine))


def center(side: Side) -> float:
    """The figure `assess` compares for a side: the median of its runs' medians where it ran
    more than once, else of its one run's timed samples, else of its runs' values."""
    return statistics.median(side.runs if len(side.runs) > 1 else side.samples or side.values)


def measured(r: Row, metric: Metric) -> bool:
    """Whether the run holds a value of the compared metric: not null, and not inf or NaN
    (stored apart, store/db.py), which is no time nor size to compare."""
    value = r.get(metric.column)
    return value is not None and math.isfinite(value)


def aggregate(rows: list[Row], metric: Metric, by_gpu: bool = True) -> dict[tuple, Side]:
    """Per point (GPU unless by_gpu=False, settings): the ok runs' values and samples."""
    out: dict[tuple, Side] = {}
    for r in rows:
        if not compared(r) or not measured(r, metric):
            continue
        key = (r.get("gpu") if by_gpu else None, skey(r))
        out.setdefault(key, Side(r)).add(r, metric)
    return out


FAILED = "failed"  # a Change's kind: ok in A, its latest run in B not (oom, wrong, ...)


# What B's latest run of a point A measured ok may be to count as its failure: what the code
# did (not `skipped`: the memory estimate of that machine, or a sweep's choice).
FAILURES = ("oom", "wrong", "error")


def failure(r: Row) -> bool:
    """A run that failed in its code's doing (FAILURES; a point SIGTERM stopped measured
    nothing, sections.stopped)."""
    return r.get("status") in FAILURES and not stopped(r)


def unmeasured(r: Row, metric: Metric) -> str | None:
    """What an ok run's compared metric came out as where that is no measurement (`nan`,
    `inf`): a point whose time is NaN in B is no point to leave out unseen; else None."""
    value = r.get(metric.column)
    if r.get("status") != "ok" or value is None or math.isfinite(value):
        return None
    return str(value)


def failed_in_b(a_rows: list[Row], b_rows: list[Row], metric: Metric,
                by_gpu: bool = True) -> dict[tuple, Row]:
    """Per point (as aggregate keys it) that A measured ok: B's latest run of it, where that
    run failed (FAILURES). Such a point has no B to compare and was left out, the worst
    regression of all passing the gate unseen. A point SIGTERM stopped measured nothing and
    hides no earlier run of it (sections.stopped). An ok run whose metric came out NaN or
    inf (`unmeasured`) is listed so too."""
    ok_in_a = set(aggregate(a_rows, metric, by_gpu))
    latest: dict[tuple, Row] = {}
    for r in sorted(b_rows, key=lambda r: str(r.get("created") or "")):
        if not stopped(r):
            latest[r.get("gpu") if by_gpu else None, skey(r)] = r
    return {k: r for k, r in latest.items()
            if k in ok_in_a and (failure(r) or unmeasured(r, metric))}


@dataclass(frozen=True)
class Change:
    """One point, A against B."""

    experiment: str
    point: str  # the settings that tell it apart from the other compared points
    metric: Metric
    a: float
    b: float
    ratio: float | None  # b / a
    p: float | None
    n_a: int  # what the verdict counted on A's side: `n_of`
    n_b: int
    verdict: str  # "1.23x slower", "unchanged", "too few samples to tell", ...
    kind: str  # "regression", "improvement", "unchanged", "undecided"; "changed" (no
    # direction); FAILED (ok in A, not in B)
    how: str  # "p=0.002", "p<0.001", "one reading", "no samples"
    one_run_a_side: bool = False  # tested on the pooled samples of a single run per side

    @property
    def n_of(self) -> str:
        """What n_a and n_b count: one run's timed samples a side, or the runs."""
        return "samples" if self.one_run_a_side else "runs"

    @property
    def factor(self) -> float:
        """max(B/A, A/B): 1.25 for both 1.25x slower and 1.25x faster."""
        if not self.ratio:
            return float("inf")
        return max(self.ratio, 1 / self.ratio)

    @property
    def percent(self) -> float:
        """How much worse or better, in percent of the label's factor as printed: 1.12x
        slower is 12 (a B/A of 1.124 failed a gate of 12 %, though its label read 12)."""
        return round(100 * (round(self.factor, 2) - 1), 6)  # 1.12 - 1 is 0.12000000000000011


ONE_RUN = "one run a side"  # the verdict of a change the samples of one run cannot tell


def one_run_caveat(changes: list[Change]) -> list[str]:
    """Why a change beyond the threshold on one run a side is not decided (see assess), in
    one line, or nothing."""
    if any(c.verdict == ONE_RUN for c in changes):
        return [f"{ONE_RUN.capitalize()}: the samples of one run see the scatter within it, "
                "not the drift between runs, which alone reads as a change (two runs of one "
                "command on a shared CPU: 1.14x to 50x apart, p<0.05 in half the points), so "
                "such a difference is not decided. Run each side 4 times or more (the command "
                "again at the same commit, or with the same --label): the runs' medians are "
                "then compared."]
    return []


def assess(experiment: str, point: str, metric: Metric, a: Side, b: Side,
           threshold: float = THRESHOLD) -> Change:
    """B against A for one point: the verdict and whether it is a regression.

    The test's unit: where either side ran the point more than once, each run's median (a
    second run of the same code drifts by more than its steps scatter within a run: 8-18 %
    between single runs on a shared 2-core VM, all p < 0.01 on the pooled samples). With one
    run a side only a difference within the threshold is decided (unchanged); a larger one
    is ONE_RUN, undecided: the pooled samples' test, shown, cannot tell it from drift. A
    difference beyond the threshold that the test does not find significant is undecided
    too, never `unchanged`."""
    sign, up, down = metric.words
    tested = metric.timed and bool(a.samples) and bool(b.samples)
    by_runs = tested and max(len(a.runs), len(b.runs)) > 1
    if by_runs:
        xa, xb = a.runs, b.runs
    else:
        xa, xb = (a.samples, b.samples) if tested else (a.values, b.values)
    j = judge(xa, xb, tested=tested, threshold=threshold)
    if tested:
        how = "p<0.001" if j.p < 0.001 else f"p={j.p:.3f}"
        # the unit the test took: runs, or the samples of one run a side (which cannot see
        # the drift between runs: one_run_caveat says so wherever such a verdict is shown)
        how += f" ({len(xa)} vs {len(xb)} runs)" if by_runs else " (1 vs 1 run)"
    else:
        how = "no samples" if metric.timed else "one reading"
    outcome, reason = j.outcome, j.reason
    if by_runs and reason == "too few samples to tell":
        reason = "too few runs to tell"
    if tested and not by_runs and (outcome in ("up", "down") or reason == "not significant"):
        outcome, reason = "unknown", ONE_RUN
    if outcome == "same" and reason == "not significant":  # beyond the threshold, untold
        outcome = "unknown"
    if metric.timed and not tested and outcome in ("up", "down"):
        outcome, reason = "unknown", "no samples to tell"
    if outcome in ("up", "down"):
        factor = max(j.ratio, 1 / j.ratio)
        verdict = f"{factor:.2f}x {up if outcome == 'up' else down}"
        better = (outcome == "up") == (sign > 0)
        kind = "changed" if sign == 0 else "improvement" if better else "regression"
    elif outcome == "same":
        verdict, kind = "unchanged", "unchanged"
    else:
        verdict, kind = reason, "undecided"
    return Change(experiment, point, metric, j.a, j.b, j.ratio, j.p,
                  len(xa), len(xb), verdict, kind, how, one_run_a_side=tested and not by_runs)
