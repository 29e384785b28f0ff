"""Where each problem stands in a store: its runs are the invocations labelled with its name
(`cs336sys handout run` labels them so; any command takes `--label PROBLEM` too)."""

from __future__ import annotations

import json
import shlex
import sqlite3
from collections import Counter
from dataclasses import dataclass, field

from cs336sys.handout.problem import COMPUTE, IMPLEMENT, MEASURE, WRITTEN, Problem
from cs336sys.yours import is_yours

_ORDER = ("ok", "wrong", "oom", "error", "skipped")


@dataclass
class Status:
    """A problem's stored runs: how many of each status, the last one's time, the GPUs, and
    whose code they measured."""

    problem: Problem
    statuses: Counter = field(default_factory=Counter)
    last: str | None = None  # UTC, as the store writes it
    gpus: list[str] = field(default_factory=list)
    yours: bool = False
    experiments: set[str] = field(default_factory=set)  # the kinds of its stored runs

    @property
    def done(self) -> bool:
        return sum(self.statuses.values()) > 0

    def line(self) -> str:
        """One line: what the store holds for the problem, or what it is."""
        p = self.problem
        if p.kind == WRITTEN:
            return "a written answer: nothing to measure"
        if not self.done:
            if p.kind == IMPLEMENT:
                return ("your implementation: the course's tests check it; cs336sys checks it "
                        "with the command below")
            return "not yet computed" if p.kind == COMPUTE else "not yet measured"
        verb = {MEASURE: "measured", COMPUTE: "computed", IMPLEMENT: "checked"}[p.kind]
        counts = ", ".join(f"{self.statuses[s]} {s}" for s in _ORDER if self.statuses[s])
        whose = "your code" if self.yours else "cs336sys's code"
        where = f" on {', '.join(self.gpus)}" if self.gpus and p.kind != COMPUTE else ""
        left = self.left()
        if left:
            verb = f"partly {verb}"
            counts += f"; not yet: {', '.join(left)}"
        return f"{verb} {_when(self.last)}{where} ({whose}): {counts}"

    def left(self) -> list[str]:
        """The parts of the problem whose experiment holds no run of it (`(f) memory
        residuals`): a problem with one part stored read `measured` as a whole."""
        out: list[str] = []
        for run in self.problem.runs:
            if run.yours_only or run.experiment in self.experiments:
                continue
            words = shlex.split(run.gpu)[:2]  # the command's name, `memory residuals`
            what = " ".join(w for w in words if not w.startswith("-"))
            named = f"{run.part} {what}".strip()
            if named not in out:
                out.append(named)
        return out


def _when(created: str | None) -> str:
    """'2026-11-28 09:14 UTC' from the store's 'YYYY-MM-DD HH:MM:SS.ffffff'."""
    return f"{created[:16]} UTC" if created else ""


def yours(settings: dict) -> bool:
    """Whether a run measured the user's code: an implementation of theirs (`yours...`) or
    their model (`--model`)."""
    if settings.get("model"):
        return True
    return any(isinstance(v, str) and is_yours(v) for v in settings.values())


def statuses(conn: sqlite3.Connection | None, problems: list[Problem]) -> list[Status]:
    """Each problem's Status from the runs of the invocations labelled with its name (every
    one empty without a store)."""
    out = {p.name: Status(p) for p in problems}
    if conn is None or not problems:
        return list(out.values())
    marks = ", ".join("?" * len(out))
    rows = conn.execute(
        "SELECT i.label, r.status, r.created, i.gpu, r.settings, r.experiment FROM runs r "
        f"JOIN invocations i ON i.id = r.invocation_id WHERE i.label IN ({marks}) "
        "ORDER BY r.created", list(out))
    for label, status, created, gpu, settings, experiment in rows:
        s = out[label]
        s.statuses[status] += 1
        s.experiments.add(experiment)
        s.last = created
        if gpu and gpu not in s.gpus:
            s.gpus.append(gpu)
        s.yours = s.yours or yours(json.loads(settings or "{}"))
    return list(out.values())


def unlabelled(conn: sqlite3.Connection | None, problems: list[Problem]) -> Counter:
    """Runs per experiment whose invocation carries no problem's label: measured by hand,
    they count for no problem until run again with `--label PROBLEM`."""
    if conn is None:
        return Counter()
    marks = ", ".join("?" * len(problems))
    rows = conn.execute(
        "SELECT r.experiment, count(*) FROM runs r JOIN invocations i ON i.id = r.invocation_id "
        f"WHERE i.label IS NULL OR i.label NOT IN ({marks}) GROUP BY r.experiment",
        [p.name for p in problems])
    return Counter(dict(rows))


def in_words(counts: Counter) -> str:
    """`35 attention and 36 model run(s)`: runs per experiment (`unlabelled`), in words;
    '' for none."""
    runs = [f"{n} {experiment}" for experiment, n in sorted(counts.items()) if n]
    if not runs:
        return ""
    return (", ".join(runs[:-1]) + " and " + runs[-1] if len(runs) > 1 else runs[0]) + " run(s)"
