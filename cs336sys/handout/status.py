"""Where each problem stands in a store: its runs are the invocations labelled with its name
(`cs336sys handout run` labels them so; any command takes `--label PROBLEM` too)."""

from __future__ import annotations

import itertools
import json
import shlex
import sqlite3
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from cs336sys.handout.problem import COMPUTE, IMPLEMENT, MEASURE, WRITTEN, Problem, Run
from cs336sys.measure.provenance import measures_yours
from cs336sys.report.sections import stopped
from cs336sys.report.select import of_handout

_ORDER = ("ok", "wrong", "oom", "error", "skipped")
# An implementation problem with nothing to run it by (2025's naive_ddp is a script).
UNTESTED = ("no test of the course's checks it and `handout run` has nothing to run (no adapters "
            "function names your code): the command in what it asks checks it, with "
            "`--label {name}` to count here")


@dataclass
class Status:
    """A problem's stored runs: how many points' latest run has each status (an error a
    rerun measured since is not counted), the last one's time, the GPUs, and whose code
    they measured."""

    problem: Problem
    statuses: Counter = field(default_factory=Counter)
    theirs: Counter = field(default_factory=Counter)  # of `statuses`, the user's code's
    last: str | None = None  # UTC, as the store writes it
    gpus: list[str] = field(default_factory=list)
    stored: list[tuple[str, dict]] = field(default_factory=list)  # (experiment, settings)

    @property
    def yours(self) -> bool:
        """Whether any of its points measured the user's code."""
        return bool(self.theirs)

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
                if not p.checks:
                    return f"your implementation: {UNTESTED.format(name=p.name)}"
                return ("your implementation: the course's tests check it; cs336sys checks it "
                        f"with the command{'s' if len(p.checks) > 1 else ''} below")
            return "not yet computed" if p.kind == COMPUTE else "not yet measured"
        verb = {MEASURE: "measured", COMPUTE: "computed", IMPLEMENT: "checked"}[p.kind]
        where = f" on {', '.join(self.gpus)}" if self.gpus and p.kind != COMPUTE else ""
        ours = self.statuses - self.theirs
        if self.theirs and ours:  # a baseline of ours beside their code: each counted apart
            where += ":"
            counts = f"{_counts(self.theirs)} (your code), {_counts(ours)} (cs336sys's code)"
        else:
            where += " (your code):" if self.theirs else " (cs336sys's code):"
            counts = _counts(self.statuses)
        left = self.left()
        if left:
            verb = f"partly {verb}"
            counts += f"; not yet: {', '.join(left)}"
        return f"{verb} {_when(self.last)}{where} {counts}"

    def left(self) -> list[str]:
        """The parts of the problem not yet run: those whose experiment holds no run of it
        (`(f) memory residuals`), and those where a combination of the values its command
        asks for (`marks`) is in none of its experiment's runs (`(c) model (warmup=0,1,2)`:
        the warm-up steps of benchmarking_script's (c), beside (b)'s runs of the same
        experiment; `(b) model (mode=train, compile=True)`: a compiled forward and an eager
        training step answer neither run of torch_compile's (b)). A problem with one part
        stored read `measured` as a whole."""
        out: list[str] = []
        runs = self.problem.runs + checked(self.problem)
        for run in runs:
            if run.yours_only:
                continue
            named = f"{run.part} {run.name}".strip()
            settings = [s for experiment, s in self.stored if experiment == run.experiment]
            # what its command or, for the user's code, its --yours command asks (either
            # answers the part: pytorch_attention times assignment 1's attention or naive),
            # and what the other runs of its experiment ask, each flag at its default where
            # another gives it
            mine = [marks(run)] + ([marks(run, yours=True)] if run.yours is not None else [])
            raw = [marks(r, yours) for r in runs if r is not run
                   and r.experiment == run.experiment
                   for yours in (False, True) if not yours or r.yours is not None]
            asked = [_flagged(m, raw) for m in mine]
            others = [_flagged(o, raw + mine) for o in raw]
            missed = [_missing(m, settings) for m in asked]
            if any(not m for m in missed):
                continue
            # what is missing of the code the stored runs measured
            which = -1 if any(map(measures_yours, settings)) else 0
            shown = _shown(asked[which], missed[which], others)
            if settings and shown:
                named += f" ({shown})"
            if named not in out:
                out.append(named)
        return out


# Flags of a command, each with its value when not given (`--compile` off, `--causal` on):
# a run without one asks for that where another run of the problem's experiment gives the
# flag (torch_compile's eager and compiled (b); flash_forward's causal and --no-causal checks).
_FLAGS = {"compile": "False", "causal": "True"}


def _flagged(asked: dict[str, set[str]], others: list[dict[str, set[str]]]) -> dict:
    """`asked` with each flag another run gives and this one does not, at its default
    (after the options it gives, as they are named)."""
    return {**asked, **{k: {v} for k, v in _FLAGS.items()
                        if k not in asked and any(k in o for o in others)}}


def _value(settings: dict, key: str) -> str:
    """A stored setting as marks spell it: a flag never stored is at its default."""
    value = settings.get(key)
    return _FLAGS[key] if value is None and key in _FLAGS else str(value)


def _missing(asked: dict[str, set[str]], settings: list[dict]) -> list[tuple[str, ...]]:
    """The combinations of the asked values (keys sorted) that no stored run holds at once."""
    keys = sorted(asked)
    held = {tuple(_value(s, k) for k in keys) for s in settings}
    return [c for c in itertools.product(*(sorted(asked[k]) for k in keys)) if c not in held]


def _shown(asked: dict[str, set[str]], missing: list[tuple[str, ...]],
           others: list[dict[str, set[str]]]) -> str:
    """`mode=train, compile=True`: what is missing in words; a key is named where only some
    of its values are missing or where it tells this run from another of the experiment.
    Missing combinations that are no product of values are each named, `; ` apart."""
    keys = sorted(asked)  # as _missing orders them
    values = {k: sorted({c[keys.index(k)] for c in missing}) for k in asked}
    named = [k for k in asked if set(values[k]) != asked[k]
             or any(o.get(k) not in (None, asked[k]) for o in others)]
    if len(missing) == len(list(itertools.product(*values.values()))):  # a product
        return ", ".join(f"{k}={','.join(values[k])}" for k in named)
    # each combination by the keys whose values differ among them (and the telling ones):
    # a forward fp32 stored of memory's four read `(; ; )`, every value of each key missing
    named = [k for k in asked if k in named or len(values[k]) > 1] or list(asked)
    return "; ".join(", ".join(f"{k}={c[keys.index(k)]}" for k in named) for c in missing)


def _counts(statuses: Counter) -> str:
    """`2 ok, 1 error`, in _ORDER."""
    return ", ".join(f"{statuses[s]} {s}" for s in _ORDER if statuses[s])


def checked(problem: Problem) -> tuple[Run, ...]:
    """An implementation's checks as the runs whose points they store: a check that
    `handout run` cut short (the Triton kernel's points left out where Triton cannot run)
    leaves its part not yet checked."""
    if problem.kind != IMPLEMENT:
        return ()
    return tuple(Run(c.removeprefix("cs336sys ")) for c in problem.checks
                 if c.startswith("cs336sys "))


# The options of a problem's command whose values say which part of it a stored run is, by
# the setting each becomes (`--attention` is attention's `impl`, the model's `attention`).
_MARKS = {"--warmup": "warmup", "--mode": "mode", "--precision": "precision",
          "--checkpoint": "checkpoint", "--world-size": "world_size", "--impl": "impl",
          "--switches": "switches", "--compile": "compile", "--strategy": "strategy",
          "--variant": "variant", "--value": "value", "--additions": "additions"}


def _options(line: str, experiment: str) -> dict[str, set[str]]:
    words = shlex.split(line)
    out: dict[str, set[str]] = {}
    for i, word in enumerate(words):
        key = "impl" if word == "--attention" and experiment == "attention" else \
            "attention" if word == "--attention" else _MARKS.get(word)
        if key == "compile":  # a flag
            out[key] = {"True"}
        elif word in ("--causal", "--no-causal"):  # flags: a check of each is a part
            out["causal"] = {str(word == "--causal")}
        elif key and i + 1 < len(words) and not words[i + 1].startswith("-"):
            # a one-off target is stored by its name: `yours=pkg.module:fn` as `yours`
            out[key] = {v.partition("=")[0] for v in words[i + 1].split(",")}
    return out


def marks(run: Any, yours: bool = False) -> dict[str, set[str]]:
    """The settings a run's points take whatever the machine: the values of `_MARKS`'
    options that its GPU and CPU commands (`yours`: its --yours commands) give alike
    (`--warmup 0,1,2`; not `--size`, which a CPU cuts down). Every value must be in some
    stored run of the part."""
    on_gpu, on_cpu = (run.yours, run.yours_cpu) if yours else (run.gpu, run.cpu)
    gpu = _options(on_gpu, run.experiment)
    if on_cpu == "":  # GPU only
        return gpu
    cpu = gpu if on_cpu is None else _options(on_cpu, run.experiment)
    return {k: v for k, v in gpu.items() if cpu.get(k) == v}


def _when(created: str | None) -> str:
    """'2026-11-28 09:14 UTC' from the store's 'YYYY-MM-DD HH:MM:SS.ffffff'."""
    return f"{created[:16]} UTC" if created else ""


def statuses(conn: sqlite3.Connection | None, problems: list[Problem],
             release: str | None = None) -> list[Status]:
    """Each problem's Status from the runs of the invocations labelled with its name, of the
    handout `release` where given (report/select.of_handout; every one empty without a
    store)."""
    out = {p.name: Status(p) for p in problems}
    if conn is None or not problems:
        return list(out.values())
    placeholders = ", ".join("?" * len(out))
    year, values = of_handout(release) if release is not None else ("1", [])
    rows = conn.execute(
        "SELECT i.label, r.status, r.created, i.gpu, r.settings, r.experiment, r.point_key, "
        "r.error "
        f"FROM runs r JOIN invocations i ON i.id = r.invocation_id WHERE i.label IN "
        f"({placeholders}) AND {year} ORDER BY r.created", [*out, *values])
    latest: dict[str, dict[tuple, tuple[str, bool]]] = {name: {} for name in out}
    for label, status, created, gpu, settings, experiment, point, error in rows:
        if stopped({"status": status, "error": error}):  # it measured nothing, ran no part
            continue
        s = out[label]
        s.stored.append((experiment, json.loads(settings or "{}")))
        theirs = measures_yours(s.stored[-1][1])
        latest[label][experiment, gpu, point or settings] = status, theirs
        s.statuses = Counter(st for st, _ in latest[label].values())
        s.theirs = Counter(st for st, mine in latest[label].values() if mine)
        s.last = created
        if gpu and gpu not in s.gpus:
            s.gpus.append(gpu)
    return list(out.values())


def unlabelled(conn: sqlite3.Connection | None, problems: list[Problem]) -> Counter:
    """Runs per experiment whose invocation carries no problem's label: measured by hand,
    they count for no problem until run again with `--label PROBLEM`."""
    if conn is None:
        return Counter()
    placeholders = ", ".join("?" * len(problems))
    rows = conn.execute(
        "SELECT r.experiment, count(*) FROM runs r JOIN invocations i ON i.id = r.invocation_id "
        f"WHERE i.label IS NULL OR i.label NOT IN ({placeholders}) GROUP BY r.experiment",
        [p.name for p in problems])
    return Counter(dict(rows))


def in_words(counts: Counter) -> str:
    """`35 attention and 36 model run(s)`: runs per experiment (`unlabelled`), in words;
    '' for none."""
    runs = [f"{n} {experiment}" for experiment, n in sorted(counts.items()) if n]
    if not runs:
        return ""
    return (", ".join(runs[:-1]) + " and " + runs[-1] if len(runs) > 1 else runs[0]) + " run(s)"
