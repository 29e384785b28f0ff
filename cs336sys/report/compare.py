"""`--compare A B`: the same points measured two ways, side by side, every change labelled.

A and B are two git commits (prefixes allowed), two invocation ids (prefixes allowed), two
labels (`--label`, exactly) or two GPU names; which one is found by matching the invocations
table, in that order. The report
then covers the runs of A and of B only (`sides`), within the rest of the selection.

Points match when experiment and settings are equal, and the GPU too unless A and B are
GPUs. Each side's value is the median of the point's raw timed samples, or of its runs'
medians where that side ran the point more than once (change.center), B/A their ratio. Whether B differs from A is
decided by the Mann-Whitney U test (measure/significance.py): a change counts only when it
gives p < 0.05 *and* the medians are more than 5% apart (THRESHOLD, or --threshold). The
test's unit is the run (each run's median) where either side ran the point more than once,
since runs of the same code drift apart by more than steps scatter within a run; with one
run a side it is the raw samples. With too few for the test ever to reach p < 0.05 (3 vs 3,
say) a difference above the threshold is "too few samples (runs) to tell", never a change.

A change is labelled by what it means for the metric's unit: time up is "slower" and down
"faster" (ms); memory up "bigger", down "smaller" (bytes); a rate up (TFLOP/s, GB/s,
tokens/s: higher is better) is "faster", down "slower". The label gives the factor,
max(B/A, A/B): "1.25x faster". A regression is a change for the worse: slower or bigger.

Where the raw samples are (runs.samples, JSON; the warm-up is never used):

- `{"<metric>": [...], "warmup": {...}}`: model, attention, memory, profile keep every
  phase's timed samples under its metric's name (`step_ms`, `e2e_ms`), the warm-up apart;
- `{"rank0": [...], "rank1": [...]}`: comm, each rank's timed iterations; per iteration the
  mean over ranks (`time_ms_mean` is the mean of the ranks' means);
- `{"ranks": [{"step": [...], ...}, ...]}`: ddp, each rank's timed steps per phase; per step
  the slowest rank's (`step_ms` is the slowest rank's).

Metrics that are single readings (peak_bytes, saved_bytes: counts of bytes, not noisy
timings) have no samples: the threshold alone decides, and the table says "one reading".
A timed metric stored without raw samples (older rows) cannot be tested: a difference
above 5% there is "no samples to tell".
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.significance import ALPHA, THRESHOLD
from cs336sys.report.change import (
    FAILED,
    Change,
    Metric,
    Side,
    aggregate,
    assess,
    center,
    failed_in_b,
    metrics,
    one_run_caveat,
    unmeasured,
)
from cs336sys.report.compare_sides import Sides, sides
from cs336sys.report.plots import Strips
from cs336sys.report.sections import QUIET, Figure, FilledTable, Row, num, point_labels
from cs336sys.report.select import Selection
from cs336sys.report.tables import blocks, fill

__all__ = ["ALPHA", "THRESHOLD", "Comparison", "compare", "method"]


def method(threshold: float = THRESHOLD) -> str:
    """The rule, in words, for the report."""
    pct = f"{100 * threshold:g}%"
    return (
        f"Each value is the median of the point's timed samples (of its runs' medians where a "
        f"side ran it more than once); a change is labelled only "
        f"when the Mann-Whitney U test gives p < {ALPHA:g} and the medians differ by more "
        f"than {pct}. The test takes the runs as its unit (each run's median) where a side "
        f"ran the point more than once, so that run-to-run drift counts as noise; with one "
        f"run a side it takes the raw samples, which cannot see that drift. Memory in bytes "
        f"is one reading per run: the {pct} threshold alone decides."
    )


# What a side ran on and with, from its invocations: a difference between A's and B's is a
# cause of a change that is not the code's, named beside the verdicts.
ENVIRONMENT = ("host", "gpu", "cpu", "torch_version", "triton_version", "cuda_version",
               "driver_version", "python_version")


def _values(invs: list[dict[str, Any]], key: str) -> str:
    found = sorted({str(i[key]) for i in invs if i.get(key) not in (None, "")})
    return ", ".join(found) or "unset"


def _env(invs: list[dict[str, Any]]) -> dict[str, str]:
    """Each environment variable recorded (invocations.env) -> its values on this side."""
    seen: dict[str, set[str]] = {}
    for i in invs:
        try:
            env = json.loads(i.get("env") or "{}")
        except ValueError:
            continue
        for k, v in (env.items() if isinstance(env, dict) else ()):
            seen.setdefault(k, set()).add(str(v))
    return {k: ", ".join(sorted(v)) for k, v in seen.items()}


def differences(inv_a: list[dict[str, Any]], inv_b: list[dict[str, Any]],
                gpu: bool = True) -> list[str]:
    """`OMP_NUM_THREADS: A unset, B 1`, one per difference between two sets of invocations'
    machines, library versions and recorded environment variables (`gpu`: the GPU too)."""
    out = []
    for key in ENVIRONMENT:
        if key == "gpu" and not gpu:
            continue
        va, vb = _values(inv_a, key), _values(inv_b, key)
        if va != vb:
            out.append(f"{key}: A {va}, B {vb}")
    ea, eb = _env(inv_a), _env(inv_b)
    return out + [f"{k}: A {ea.get(k, 'unset')}, B {eb.get(k, 'unset')}"
                  for k in sorted(set(ea) | set(eb)) if ea.get(k) != eb.get(k)]


def other_machine(lines: list[str]) -> bool:
    """Whether `differences` found another machine (host, GPU or CPU), not just versions."""
    return any(line.startswith(("host:", "gpu:", "cpu:")) for line in lines)


def environment_differences(s: Sides) -> list[str]:
    """The sides' `differences` (the GPU aside when the sides are GPUs); a first line warns
    when they ran on different machines."""
    out = differences(s.inv_a, s.inv_b, gpu=s.kind != "gpu")
    if other_machine(out):
        out.insert(0, "A and B ran on different machines: a change may be the machine's, not "
                      "the code's.")
    return out


def unmatched(s: Sides, exp: str) -> str:
    """For an experiment both sides ran with no point in common: the settings whose values
    differ (`seq: A 128, B 256`), so the user sees what to run again. Those that never tell
    two points apart (QUIET: more timed steps measure the same point) are left out; the GPU
    is named where the sides' GPUs differ and points are matched on one GPU."""
    def values(rows: list[Row], key: str) -> str:
        return ", ".join(sorted({str(r["_settings"].get(key)) for r in rows}, key=_natural))

    ra, rb = s.a.get(exp, []), s.b.get(exp, [])
    keys = dict.fromkeys(k for r in (*ra, *rb) for k in r["_settings"] if k not in QUIET)
    differ = [f"{k}: A {values(ra, k)}, B {values(rb, k)}" for k in keys
              if values(ra, k) != values(rb, k)]
    gpus = [", ".join(sorted({str(r.get("gpu")) for r in side})) for side in (ra, rb)]
    if s.kind != "gpu" and gpus[0] != gpus[1]:
        differ.append(f"gpu: A {gpus[0]}, B {gpus[1]} (points are compared on one GPU; "
                      "`--compare GPU_A GPU_B` compares two)")
    return (f"{exp}: no point measured on both sides; the settings that differ: "
            + ("; ".join(differ) if differ else "none"))


def _natural(text: str) -> tuple:
    return (0, float(text), "") if text.replace(".", "", 1).isdigit() else (1, 0.0, text)


@dataclass
class Comparison:
    """Every point measured on both sides, A against B."""

    kind: str
    a: str
    b: str
    changes: list[Change]
    tables: list[FilledTable]  # one per experiment, for the report
    # Where a change may not be the code's (environments that differ), and experiments both
    # sides ran with no point in common (the settings that differ): for the reader.
    notes: list[str] = field(default_factory=list)
    # Per experiment, every sample of each compared point on both sides (a strip plot).
    figures: list[Figure] = field(default_factory=list)

    def counts(self) -> Counter:
        """Points by verdict word: faster, slower, bigger, ..., unchanged, undecided."""
        c: Counter = Counter()
        for ch in self.changes:
            c[ch.verdict.split()[-1] if ch.kind in ("regression", "improvement", "changed")
              else ch.kind] += 1
        return c

    def summary(self) -> str:
        """'N points compared: X faster, Y slower, Z unchanged' (and the other verdicts)."""
        c = self.counts()
        parts = [f"{c['faster']} faster", f"{c['slower']} slower"]
        parts += [f"{c[w]} {w}" for w in ("bigger", "smaller", "higher", "lower") if c[w]]
        parts.append(f"{c['unchanged']} unchanged")
        if c[FAILED]:
            parts.append(f"{c[FAILED]} {FAILED} in B")
        if c[FIXED]:
            parts.append(f"{c[FIXED]} failed in A, ok in B")
        if c["undecided"]:  # by why: too few samples or runs, one run a side, ...
            why = Counter(ch.verdict for ch in self.changes if ch.kind == "undecided")
            parts.append(f"{c['undecided']} undecided ("
                         + ", ".join(f"{n} {w}" if len(why) > 1 else w
                                     for w, n in why.most_common()) + ")")
        n = len(self.changes)
        return f"{n} point{'s' * (n != 1)} compared: " + ", ".join(parts)

    def regressions(self, percent: float) -> list[Change]:
        """The regressions worse than `percent` (1.12x slower is 12 percent worse), and the
        points that failed in B, worse than any."""
        return [c for c in self.changes if c.kind == FAILED
                or c.kind == "regression" and c.percent > percent]

    def text(self, width: int | None = None) -> str:
        """The compared points as a plain-text table and the summary line, for a terminal of
        `width` columns: the prose filled to it, the table cut between columns into parts
        that each start with the experiment, point and metric (tables.blocks)."""
        head = [f"Comparison by {self.kind}: {self.a} (A) against {self.b} (B)", *self.notes]
        if not self.changes:
            head += ["No point was measured on both sides.", self.summary()]
            return "\n".join(fill(line, width) for line in head)
        rows = [[c.experiment, c.point, c.metric.label,
                 num(c.a) if c.kind != FIXED else c.verdict.split()[0],
                 num(c.b) if c.kind != FAILED else c.verdict.split()[0], _ratio(c.ratio),
                 c.verdict, c.how] for c in self.changes]
        table = text_table(["experiment", "point", "metric", "A", "B", "B/A", "verdict", "p"],
                           rows, width, key=(0, 1, 2))
        return "\n".join([*(fill(line, width) for line in head), table,
                          *(fill(line, width) for line in [*self.caveats(), self.summary()])])

    def caveats(self) -> list[str]:
        """What a reader must know before trusting a verdict: a change judged on one run a
        side (see method())."""
        return one_run_caveat(self.changes)


def _ratio(r: float | None) -> str:
    return "" if r is None else f"{r:.3f}"


def text_table(headers: list[str], rows: list[list[str]], width: int | None = None,
               key: tuple[int, ...] = (0,)) -> str:
    """Columns padded to their widest cell, two spaces apart; with `width`, a table wider
    than that cut between columns into parts, each led by the `key` columns, a cell too
    long for any part set on several lines (tables.blocks)."""
    return "\n\n".join(blocks(headers, rows, width, list(key), render=_plain))


def _plain(headers: list[str], rows: list[list[str]]) -> str:
    """`text_table`'s one block: a cell of several lines makes its row as many lines tall."""
    cells = [[str(x).split("\n") for x in line] for line in (headers, *rows)]
    widths = [max(len(s) for cell in column for s in cell)
              for column in zip(*cells, strict=True)]
    return "\n".join(
        "  ".join((cell[k] if k < len(cell) else "").ljust(w)
                  for cell, w in zip(line, widths, strict=True)).rstrip()
        for line in cells for k in range(max(len(cell) for cell in line))
    )


def compare_sides(s: Sides, a: str, b: str, catalog: Sequence[Any],
                  threshold: float = THRESHOLD) -> Comparison:
    """A against B, point by point, one table per experiment (in the declared order)."""
    declared = metrics(catalog)
    by_gpu = s.kind != "gpu"
    changes, tables, figures, notes = [], [], [], environment_differences(s)
    for exp, metric in declared.items():
        pa = aggregate(s.a.get(exp, []), metric, by_gpu)
        pb = aggregate(s.b.get(exp, []), metric, by_gpu)
        # a point ok in A whose latest run in B failed: listed, a regression, not left out
        failed = failed_in_b(s.a.get(exp, []), s.b.get(exp, []), metric, by_gpu)
        # and one that failed in A, never ok there, and B measured: fixed, not left out
        fixed = {k: r for k, r in failed_in_b(s.b.get(exp, []), s.a.get(exp, []), metric,
                                              by_gpu).items() if k not in pa}
        both = sorted(set(pa) & set(pb) - set(failed), key=lambda k: (str(k[0]), k[1]))
        if not both and not failed and not fixed:
            if s.a.get(exp) and s.b.get(exp):
                notes.append(unmatched(s, exp))
            continue
        keys = [*both, *sorted(failed, key=lambda k: (str(k[0]), k[1])),
                *sorted(fixed, key=lambda k: (str(k[0]), k[1]))]
        names = point_labels([pb[k].row if k in pb and k not in failed else failed[k]
                              for k in keys])
        found = [
            _failed(exp, name, metric, pa[k], failed[k]) if k in failed
            else _fixed(exp, name, metric, fixed[k], pb[k]) if k in fixed
            else assess(exp, name, metric, pa[k], pb[k], threshold)
            for k, name in zip(keys, names, strict=True)
        ]
        changes += found
        figures.append(_strips(exp, metric, [(c.point, pa[k], pb[k])
                                             for c, k in zip(found, keys, strict=True)
                                             if k in both], s.names))
        what = ("median of the timed samples; of the runs' medians where a side ran a point "
                "more than once" if metric.timed else "one reading per run")
        tables.append(FilledTable(
            f"{exp}: {metric.label} ({what})",
            ["point", f"A {metric.label}", f"B {metric.label}", "B/A", "verdict", "p", "n A/B"],
            [[c.point, num(c.a) if c.kind != FIXED else c.verdict.split()[0],
              num(c.b) if c.kind != FAILED else c.verdict.split()[0],
              _ratio(c.ratio), c.verdict, c.how, f"{c.n_a}/{c.n_b} {c.n_of}"] for c in found],
        ))
    return Comparison(s.kind, a, b, changes, tables, notes, figures)


def _failed(exp: str, point: str, metric: Metric, a: Side, b: Row) -> Change:
    """A point A measured ok and B's latest run did not: `oom in B` (why: its first line)."""
    verdict, how = _how_it_failed(b, metric)
    return Change(exp, point, metric, center(a), float("nan"), None, None,
                  len(a.values), 0, f"{verdict} in B", FAILED, how)


FIXED = "fixed"  # a Change's kind: failed in A (never ok there), ok in B


def _fixed(exp: str, point: str, metric: Metric, a: Row, b: Side) -> Change:
    """A point whose run in A failed (or came out NaN) and B measured: `oom in A`."""
    verdict, how = _how_it_failed(a, metric)
    return Change(exp, point, metric, float("nan"), center(b), None, None, 0, len(b.values),
                  f"{verdict} in A", FIXED, how)


def _how_it_failed(r: Row, metric: Metric) -> tuple[str, str]:
    """(its status, or `nan` where the metric came out so; why, in the error's first line)."""
    odd = unmeasured(r, metric)
    why = ([f"its {metric.label} came out {odd}"] if odd else
           (r.get("error") or "").strip().splitlines()[:1])
    return odd or str(r.get("status")), why[0][:80] if why else "no run ok"


# At most this many points in one strip plot (the first ones; the table has every point).
MAX_STRIPS = 30


def _strips(exp: str, metric: Metric, points: list[tuple[str, Side, Side]],
            names: tuple[str, str]) -> Figure:
    """The strip plot of one experiment's compared points: each side's timed samples (or,
    for a reading such as memory, one value per run)."""
    def samples(side: Side) -> tuple[float, ...]:
        return tuple(side.samples if metric.timed and side.samples else side.values)

    shown = points[:MAX_STRIPS]
    note = (f"The first {MAX_STRIPS} of {len(points)} points." if len(points) > MAX_STRIPS
            else "")
    # the bars at the table's figures: pooled, two runs of 149 and 1,604 ms and their
    # samples put A's bar at 619 where the table read 876
    plot = Strips(tuple((label, samples(a), samples(b)) for label, a, b in shown),
                  metric.label, f"{exp}: every sample of each point",
                  (f"A: {names[0]}", f"B: {names[1]}"),
                  bars=tuple((center(a), center(b)) for _, a, b in shown))
    return Figure(f"{exp}: {metric.label}, every sample of A and of B (the bar: the table's "
                  "figure, the median, of the runs' medians where a side ran a point more than "
                  "once)", f"compare-{exp}", plot=plot, note=note)


def compare(conn: sqlite3.Connection, sel: Selection, a: str, b: str, catalog: Sequence[Any],
            threshold: float = THRESHOLD) -> Comparison:
    """A against B within the selection; raises SelectionError when A or B names nothing."""
    both = sides(conn, sel, a, b, catalog)
    return compare_sides(both, *both.names, catalog, threshold)
