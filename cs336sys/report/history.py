"""`report --history`: each point's compared metric across commits, with its steps marked.

A point (experiment, GPU, settings) measured at two commits or more has a history: per
commit, the median of the experiment's compared metric (report/change.py: step time for
model, end-to-end time for attention, ...) over the raw timed samples of the point's runs
at that commit. Commits go in the time order of their first run in the selection, except
that a commit the current folder's repository has comes after its ancestors (a parent
measured after its child, in a bisection or a base measured last, still comes first);
a dirty checkout is a commit of its own (`abc1234-dirty`, after its commit), since it
measured other code. A run of the user's code (cs336sys.yours) counts at the user's commit,
the code that changed.

A step is a pair of consecutive commits of a point whose samples differ by the rule of
`--compare` (measure/significance.py): Mann-Whitney U p < 0.05 on the raw samples *and*
medians more than 5% apart. Each step is a regression (slower, bigger) or an improvement.

The report gets one section per experiment with a history: the table of every step, and
one plot per point (median per commit, the samples' min–max shaded, steps marked: red
triangles for regressions, green for improvements, pointing the way the metric went).
Plots are capped at MAX_PLOTS for the whole report, points with steps first, then those
with the most commits; the section says which points were left out. The step table is
capped at MAX_STEPS rows.
"""

from __future__ import annotations

import dataclasses
import heapq
import io
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.provenance import measures_yours
from cs336sys.measure.significance import ALPHA, THRESHOLD
from cs336sys.report.change import (
    Change,
    Metric,
    Side,
    assess,
    center,
    failure,
    measured,
    metrics,
    one_run_caveat,
    unmeasured,
)
from cs336sys.report.compare import differences, other_machine, text_table
from cs336sys.report.plots import short
from cs336sys.report.refs import ancestors, describe
from cs336sys.report.sections import (
    Figure,
    FilledTable,
    Row,
    Section,
    compared,
    num,
    point_labels,
    skey,
)
from cs336sys.report.tables import fill

MAX_PLOTS = 12
MAX_STEPS = 100
STEP_KINDS = ("regression", "improvement", "changed")


def method(threshold: float = THRESHOLD) -> str:
    """The rule, in words, for the report."""
    return (
        "Each commit's value is the median of its runs' medians where it ran the point more "
        "than once, else of its one run's timed samples (memory in bytes: one reading per "
        "run); commits are in the time order of their "
        "first run, each after its ancestors in git's history. A step is a pair of consecutive commits that differ significantly "
        f"(Mann-Whitney U, p < {ALPHA:g}: over each run's median where a commit ran the point "
        f"more than once, else over the raw samples) and whose medians are more than "
        f"{100 * threshold:g}% apart (memory: the threshold alone)."
    )



@dataclass
class Commit:
    key: tuple[str, bool]  # (git commit, dirty)
    first: str  # created of its first run in the selection
    date: str = ""  # its committer date, YYYY-MM-DD, where the repository here has it
    subject: str = ""  # its subject line, likewise

    @property
    def label(self) -> str:
        return self.key[0][:7] + ("-dirty" if self.key[1] else "")

    def title(self, most: int = 40) -> str:
        """`abc1234 (2026-11-24: Fuse the LM head)`: the hash, with its date and subject
        where they are known."""
        if not self.subject:
            return self.label
        subject = self.subject if len(self.subject) <= most else self.subject[:most - 1] + "…"
        return f"{self.label} ({self.date}: {subject})"


def described(key: tuple[str, bool], first: str) -> Commit:
    """The Commit, with its date and subject from the repository of the current folder."""
    found = describe(key[0])
    return Commit(key, first, *found) if found else Commit(key, first)


@dataclass
class Track:
    """One point's history."""

    experiment: str
    point: str
    metric: Metric
    commits: list[Commit]
    sides: list[Side]  # per commit
    steps: list[tuple[int, Change]] = field(default_factory=list)  # (index of `after`, change)
    # per commit, the index of the one it is compared with (predecessors): its nearest
    # measured ancestor, else the one before it
    before: list[int] = field(default_factory=list)

    def tips(self) -> set[int]:
        """The commits no later one is compared with: the latest of each branch measured."""
        return set(range(len(self.commits))) - set(self.before[1:])

    def medians(self) -> list[float]:
        """Per commit, the figure its step is judged on (`center`): the median of its runs'
        medians where it ran the point more than once, as the table gives it."""
        return [center(s) for s in self.sides]


def _values(metric: Metric, side: Side) -> list[float]:
    return side.samples if metric.timed and side.samples else side.values


@dataclass
class History:
    tracks: list[Track]  # every point with a history, in report order
    plotted: list[Track]
    sections: list[Section]
    one_commit: int = 0  # points measured at a single commit (no history)
    no_commit: int = 0  # ok runs without a git commit (left out)
    threshold: float = THRESHOLD
    # why a difference beyond the threshold was no step: one run a side (one_run_caveat)
    caveat: list[str] = field(default_factory=list)
    # points measured ok at an earlier commit whose latest run, at their latest commit,
    # failed (change.FAILURES): (experiment, point, that commit, its status), what a CI
    # job gates on beside the regressions
    failed: list[tuple[str, str, Commit, str]] = field(default_factory=list)

    @property
    def steps(self) -> list[tuple[Track, int, Change]]:
        return [(t, i, c) for t in self.tracks for i, c in t.steps]

    def latest_regressions(self, percent: float) -> list[tuple[Track, int, Change]]:
        """The regressions worse than `percent` into each point's latest commit of each
        branch (a tip: Track.tips): what a CI job gates on, whatever came before; a side
        branch measured after the head hides no regression of the head's."""
        return [(t, i, c) for t, i, c in self.steps if i in t.tips()
                and c.kind == "regression" and c.percent > percent]

    def summary(self) -> str:
        n, steps = len(self.tracks), self.steps
        kinds = [c.kind for _, _, c in steps]
        worse, better = kinds.count("regression"), kinds.count("improvement")
        failed = (f"; {len(self.failed)} point{'s' * (len(self.failed) != 1)} failed at "
                  "the latest commit" if self.failed else "")
        return (f"History: {n} point{'s' * (n != 1)} measured at two commits or more; "
                f"{len(steps)} step{'s' * (len(steps) != 1)} detected ({worse} "
                f"regression{'s' * (worse != 1)}, {better} improvement{'s' * (better != 1)})"
                + failed)

    def text(self, width: int | None = None) -> str:
        """The steps as a plain-text table under a summary line, for a terminal of `width`
        columns: the prose filled to it, the table cut between columns into parts that each
        start with the experiment and point (tables.blocks)."""
        lines = [fill(self.summary(), width)]
        if self.steps:
            rows = [[t.experiment, *_step_row(t, i, c, metric=True)]
                    for t, i, c in self.steps[:MAX_STEPS]]
            lines.append(text_table(["experiment", "point", "commits", "metric", "before",
                                     "after", "after/before", "verdict", "p"], rows, width,
                                    key=(0, 1)))
            if len(self.steps) > MAX_STEPS:
                lines.append(f"(the first {MAX_STEPS} of {len(self.steps)} steps)")
        lines += [fill(f"Failed: {e} {p}: {status} at {c.title()}", width)
                  for e, p, c, status in self.failed]
        lines += [fill(x, width) for x in self.caveat]
        return "\n".join(lines)


def _step_row(t: Track, i: int, c: Change, metric: bool = False) -> list[str]:
    """point, commits (before → after), (metric,) before, after, after/before, verdict, p."""
    return [t.point, f"{t.commits[t.before[i]].label} → {t.commits[i].title()}",
            *([t.metric.label] if metric else []), num(c.a), num(c.b),
            "" if c.ratio is None else f"{c.ratio:.3f}", c.verdict, c.how]


def commit_of(r: Row) -> tuple[str, bool] | None:
    """(commit, dirty) of the code a run measured: the user's, when it measured theirs,
    else cs336sys's; None without git."""
    # the user's commit is recorded on every row of an invocation that ran their code,
    # cs336sys's baselines beside it (naive by yours-torch) too: those follow ours
    if r.get("user_commit") and measures_yours(r.get("_settings") or {}):
        return r["user_commit"], bool(r.get("user_dirty"))
    if r.get("git_commit"):
        return r["git_commit"], bool(r.get("git_dirty"))
    return None


def ranked(first: dict[tuple[str, bool], str],
           older: dict[str, set[str]]) -> dict[tuple[str, bool], int]:
    """Each (commit, dirty)'s place in the history, from the time of its first run (`first`):
    in the time order, except that a commit the repository here has comes after its
    ancestors (`older`: refs.ancestors; a parent measured after its child still comes
    first), and a dirty checkout after its commit. Commits on branches apart, and those the
    repository lacks, keep the time order (a topological sort, the earliest first)."""
    by_time = sorted(first, key=lambda k: (first[k], k))
    when = {k: i for i, k in enumerate(by_time)}
    keys_of: dict[str, list[tuple[str, bool]]] = {}
    for key in by_time:
        keys_of.setdefault(key[0], []).append(key)
    after: dict[tuple[str, bool], list[tuple[str, bool]]] = {k: [] for k in by_time}
    waits = dict.fromkeys(by_time, 0)
    for key in by_time:
        commit, dirty = key
        before = [k for c in older.get(commit, ()) for k in keys_of.get(c, ())]
        before += [(commit, False)] if dirty and (commit, False) in first else []
        for k in before:
            after[k].append(key)
            waits[key] += 1
    ready = [(when[k], k) for k in by_time if not waits[k]]
    heapq.heapify(ready)
    order: list[tuple[str, bool]] = []
    while ready:
        _, key = heapq.heappop(ready)
        order.append(key)
        for k in after[key]:
            waits[k] -= 1
            if not waits[k]:
                heapq.heappush(ready, (when[k], k))
    return {k: i for i, k in enumerate(order)}


def predecessors(keys: list[tuple[str, bool]], older: dict[str, set[str]]) -> list[int]:
    """For each of a point's commits in history order, the index of the one it is compared
    with: its nearest ancestor among them (for a dirty checkout, its commit), else the one
    before it (commits the repository lacks). A commit on a side branch is so compared with
    where it branched off, not with the other branch's head measured just before it."""
    out = [0]
    for i in range(1, len(keys)):
        commit, dirty = keys[i]
        found = [j for j in range(i) if keys[j][0] in older.get(commit, ())
                 or (dirty and keys[j] == (commit, False))]
        out.append(found[-1] if found else i - 1)
    return out


def build(rows: dict[str, list[Row]], catalog: Sequence[Any], draw: bool = True,
          threshold: float = THRESHOLD,
          invocations: dict[str, dict[str, Any]] | None = None) -> History:
    """The history of every point in `rows` (experiment -> view rows with `_settings` and
    `_samples`, as select.load gives them); draw=False leaves the figures' PNGs empty.
    `invocations` (by id: where and with what the runs ran) keeps a step between commits
    measured on two machines from being called the code's, and names a library that
    changed beside a step."""
    order: dict[tuple[str, bool], str] = {}
    no_commit = 0
    for exp_rows in rows.values():
        for r in exp_rows:
            if r.get("status") != "ok" and not failure(r):
                continue
            k = commit_of(r)
            if k is None:
                no_commit += int(r.get("status") == "ok")
                continue
            order[k] = min(order.get(k, r["created"] or ""), r["created"] or "")
    older = ancestors(c for c, _ in order)
    rank = ranked(order, older)
    commits = {k: described(k, first) for k, first in order.items()}

    tracks: list[Track] = []
    moved: list[list[str]] = []  # per change between two machines, how they differ
    one_commit = 0
    assessed: list[Change] = []  # every change between consecutive commits, steps or not
    failed: list[tuple[str, str, Commit, str]] = []
    for exp, metric in metrics(catalog).items():
        groups: dict[tuple, dict[tuple[str, bool], Side]] = {}
        last: dict[tuple, Row] = {}  # per point, its latest run that was ok or failed
        for r in sorted(rows.get(exp, []), key=lambda r: (str(r.get("created") or ""))):
            if commit_of(r) is not None and (r.get("status") == "ok" or failure(r)):
                key = (r.get("gpu"), skey(r))
                if key not in last or rank[commit_of(r)] >= rank[commit_of(last[key])]:
                    last[key] = r
            if not compared(r) or not measured(r, metric) or commit_of(r) is None:
                continue
            at = groups.setdefault((r.get("gpu"), skey(r)), {})
            at.setdefault(commit_of(r), Side(r)).add(r, metric)
        for key, r in last.items():  # ok before, failed (or NaN) at its latest commit
            if (failure(r) or unmeasured(r, metric)) and key in groups:
                failed.append((exp, point_labels([r])[0], commits[commit_of(r)],
                               r["status"] if failure(r) else
                               f"{metric.label} {unmeasured(r, metric)}"))
        many = {k: at for k, at in groups.items() if len(at) > 1}
        one_commit += len(groups) - len(many)
        if not many:
            continue
        keys = sorted(many, key=lambda k: (str(k[0]), k[1]))
        heads = [max(many[k].values(), key=lambda s: s.row["created"] or "").row for k in keys]
        for key, label in zip(keys, point_labels(heads), strict=True):
            at = many[key]
            ck = sorted(at, key=lambda c: rank[c])
            t = Track(exp, label, metric, [commits[c] for c in ck], [at[c] for c in ck],
                      before=predecessors(ck, older))
            for i in range(1, len(ck)):
                change = assess(exp, label, metric, t.sides[t.before[i]], t.sides[i], threshold)
                change = _environment(change, t.sides[t.before[i]], t.sides[i],
                                      invocations or {}, moved)
                assessed.append(change)
                if change.kind in STEP_KINDS:
                    t.steps.append((i, change))
            tracks.append(t)

    chosen = sorted(tracks, key=lambda t: (not t.steps, -len(t.commits)))[:MAX_PLOTS]
    plotted = [t for t in tracks if t in chosen]  # in report order
    history = History(tracks, plotted, [], one_commit, no_commit, threshold,
                      one_run_caveat(assessed) + _machine_caveat(moved), failed)
    history.sections = _sections(history, draw)
    return history


OTHER_MACHINE = "another machine"  # the verdict of a change between two machines' runs


def _environment(change: Change, a: Side, b: Side, invocations: dict[str, dict[str, Any]],
                 moved: list[list[str]]) -> Change:
    """A step between CPU runs on two machines (a store merged from a laptop, every CPU stored
    as GPU `cpu`) is no step: undecided, OTHER_MACHINE. One between two library versions (a
    torch upgrade between commits), or between two hosts of one GPU model (a lent GPU's host
    is new each time), stays a step, what changed named beside its verdict."""
    if change.kind not in STEP_KINDS:
        return change
    lines = differences([invocations[i] for i in sorted(a.invocations) if i in invocations],
                        [invocations[i] for i in sorted(b.invocations) if i in invocations],
                        gpu=False)
    if not lines:
        return change
    if other_machine(lines) and a.row.get("gpu") == "cpu":
        moved.append(lines)
        return dataclasses.replace(change, verdict=OTHER_MACHINE, kind="undecided")
    changed = ", ".join(line.split(":", 1)[0] for line in lines)
    return dataclasses.replace(change, verdict=f"{change.verdict} ({changed} changed too)")


def _machine_caveat(moved: list[list[str]]) -> list[str]:
    if not moved:
        return []
    n = len(moved)
    return [f"{OTHER_MACHINE.capitalize()}: {n} difference{'s' * (n != 1)} between commits "
            "measured on different machines (" + "; ".join(moved[0]) + ") not called a step: "
            "the machine changed with the code. Run both commits on one machine to compare "
            "them."]


def _sections(h: History, draw: bool) -> list[Section]:
    left = [t for t in h.tracks if t not in h.plotted]
    general = [f"Failed at the latest commit: {e} {p}: {status} at {c.title()}."
               for e, p, c, status in h.failed] + list(h.caveat)
    if h.one_commit:
        general.append(f"{h.one_commit} point{'s' * (h.one_commit != 1)} measured at one commit "
                       "only ha" + ("ve" if h.one_commit != 1 else "s") + " no history.")
    if h.no_commit:
        general.append(f"{h.no_commit} run{'s' * (h.no_commit != 1)} without a git commit "
                       "left out.")
    if left:
        names = ", ".join(f"{t.experiment} {t.point}" for t in left[:10])
        more = f" and {len(left) - 10} more" if len(left) > 10 else ""
        general.append(
            f"Plotted {len(h.plotted)} of {len(h.tracks)} points with a history (at most "
            f"{MAX_PLOTS}: those with steps first, then those with the most commits); left "
            f"out: {names}{more}. Their steps are in the tables; narrow the selection with "
            "--experiment and --where to plot them."
        )
    if not h.tracks:
        return [Section("history", "History by commit", notes=[
            "No point of this selection was measured at two commits or more: no history.",
            *general])]
    out = []
    shown = 0
    for exp in dict.fromkeys(t.experiment for t in h.tracks):
        tracks = [t for t in h.tracks if t.experiment == exp]
        metric = tracks[0].metric
        sec = Section(f"history-{exp}", f"History: {exp}, {metric.label} by commit",
                      notes=[method(h.threshold)] + (general if not out else []))
        steps = [(t, i, c) for t in tracks for i, c in t.steps]
        if steps:
            rows = [_step_row(t, i, c) for t, i, c in steps[:MAX_STEPS]]
            note = (f"The first {MAX_STEPS} of {len(steps)} steps."
                    if len(steps) > MAX_STEPS else "")
            sec.tables.append(FilledTable("Steps detected", ["point", "commits",
                                    f"before {metric.label}", f"after {metric.label}",
                                    "after/before", "verdict", "p"], rows, note))
        else:
            sec.notes.append(f"No step detected in {len(tracks)} point"
                             f"{'s' * (len(tracks) != 1)} with a history.")
        for t in tracks:
            if t not in h.plotted:
                continue
            shown += 1
            fig = Figure(f"{t.point}: median {metric.label} per commit", f"history-{exp}-{shown}")
            if draw:
                fig.png = plot(t)
            sec.figures.append(fig)
        out.append(sec)
    return out


def plot(t: Track) -> bytes:
    """A point's history as PNG bytes: median per commit, min–max shaded, steps marked."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure as MplFigure
    from matplotlib.ticker import FuncFormatter

    xs = list(range(len(t.commits)))
    # bytes in MiB, as the tables give them (440M read as another figure than 419.6 MiB)
    scale, label = (2**20, t.metric.label.replace("bytes", "MiB")) \
        if t.metric.unit == "bytes" else (1, t.metric.label)
    med = [m / scale for m in t.medians()]
    lo = [min(_values(t.metric, s)) / scale for s in t.sides]
    hi = [max(_values(t.metric, s)) / scale for s in t.sides]
    width = max(4.5, 0.45 * len(xs) + 2.5)
    fig = MplFigure(figsize=(width, 3.2), dpi=100)
    ax = fig.subplots()
    ax.fill_between(xs, lo, hi, color="C0", alpha=0.15, linewidth=0, label="min–max")
    ax.plot(xs, med, marker="o", markersize=3, color="C0", label="median")
    labelled = set()
    for kind, colour in (("regression", "#c00000"), ("improvement", "#1a7f37"), ("changed", "C1")):
        for up in (True, False):  # the triangle points the way the metric went
            at = [i for i, c in t.steps if c.kind == kind and ((c.ratio or 0) > 1) == up]
            if at:
                ax.plot(at, [med[i] for i in at], linestyle="none", marker="^" if up else "v",
                        markersize=9, color=colour, label=None if kind in labelled else kind)
                labelled.add(kind)
    ax.set_xticks(xs)
    ax.set_xticklabels([_tick(c) for c in t.commits], rotation=45 if len(xs) > 6 else 0,
                       ha="right" if len(xs) > 6 else "center", fontsize=7)
    ax.yaxis.set_major_formatter(FuncFormatter(short))
    ax.tick_params(axis="y", labelsize=8)
    ax.set_xlabel("commit (in the order of its first run, after its ancestors)", fontsize=9)
    ax.set_ylabel(label, fontsize=9)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, frameon=False)
    # a point's settings run long: wrapped to the figure (about 10 characters an inch at
    # this size), or the title ran off both edges
    ax.set_title(fill(f"{t.experiment} {t.point}", int(width * 10)), fontsize=10)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", metadata={"Software": None})
    return buf.getvalue()


def _tick(c: Commit) -> str:
    """A commit on the x-axis: its hash and date, its subject under them (shortened)."""
    if not c.subject:
        return c.label
    subject = c.subject if len(c.subject) <= 18 else c.subject[:17] + "…"
    return f"{c.label} {c.date[5:]}\n{subject}"
