"""The writeup starter: per problem, in the handout's order, what it asks, one method line
(GPU, commit, versions, warm-up, samples), its tables in the handout's shapes and its
experiments' plots, from the runs labelled with its name. Facts only: no prose answers.

It is a report (report/render.Report) whose sections are problems, so it is written as
every report is: HTML, markdown, LaTeX and Typst (report/typeset.py).
"""

from __future__ import annotations

import json
import sqlite3
from collections import Counter
from collections.abc import Sequence
from typing import Any

from cs336sys.handout import problems as every_problem
from cs336sys.handout.pivot import tables
from cs336sys.handout.problem import COMPUTE, CPU_NOTE, IMPLEMENT, MEASURE, WRITTEN, Problem
from cs336sys.handout.status import UNTESTED, Status, in_words, unlabelled
from cs336sys.measure.provenance import measures_yours
from cs336sys.models.config import HANDOUTS
from cs336sys.report.drawer import Drawer
from cs336sys.report.experiment_section import build_section
from cs336sys.report.render import STOPPED_EARLY, Report, kernel_stats, provenance
from cs336sys.report.sections import (
    QUIET,
    FilledTable,
    Row,
    Section,
    latest,
    point_labels,
    sample_count,
    stopped,
    text,
)
from cs336sys.report.select import Selection, invocations, load


def _counts(values: list[int], what: str) -> str:
    """`2 warm-up steps`, `0, 1, 2, 5 warm-up steps`, `1 warm-up step`."""
    return f"{', '.join(map(str, values))} {what}{'' if values == [1] else 's'}"


def _rerun(inv: dict[str, Any]) -> tuple:
    """What running `inv` again is: its label and its command line without --resume; for a
    run of `handout run` (whose command line is the handout run's, each problem's command a
    run of it), the problem's command of that run with or without --yours, for the year:
    `handout run PROBLEM` after a stopped `handout run --all` measured what it left out."""
    argv = inv.get("argv")
    words = json.loads(argv) if isinstance(argv, str) else list(argv or [])
    if words[1:3] == ["handout", "run"]:
        year = words[words.index("--year") + 1] if "--year" in words[:-1] else None
        return inv.get("label"), inv.get("command"), "--yours" in words, year
    return inv.get("label"), tuple(w for w in words if w != "--resume")


def _not_rerun(invs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The invocations but those stopped early whose command later ran to its end (a
    problem's `handout run` again, which resumes: it stored what the first left out). To
    its end: exit 0, or exit 1 with a point stored failed (a sweep goes on past one); an
    exit 1 without one crashed part-way. `invs` has a row per invocation and status."""
    failed = {inv.get("id") for inv in invs if inv.get("_status") in ("error", "oom", "wrong")}

    def ran_to_its_end(inv: dict[str, Any]) -> bool:
        return bool(inv.get("finished")) and (
            inv.get("exit_status") == 0 or inv.get("exit_status") == 1 and inv.get("id") in failed)

    ended = {}
    for inv in invs:
        if ran_to_its_end(inv):
            ended[_rerun(inv)] = max(ended.get(_rerun(inv), ""), str(inv.get("started") or ""))
    return [inv for inv in invs if ran_to_its_end(inv)
            or ended.get(_rerun(inv), "") <= str(inv.get("started") or "")]


def _latest_statuses(rows: dict[str, list]) -> str:
    """`ok 3, error 1`: the status of each point's latest run (an error a rerun measured
    since is not counted)."""
    # a point SIGTERM stopped measured nothing: an earlier run of it counts (latest), and
    # one that has no other run is none measured
    counts = Counter(r.get("status") for kind_rows in rows.values()
                     for r in latest(kind_rows) if not stopped(r))
    return ", ".join(f"{s} {counts[s]}" for s in ("ok", "wrong", "oom", "error", "skipped")
                     if counts[s]) or "none measured (every run was stopped)"


def computed_only(inv: dict[str, Any]) -> bool:
    """An invocation that measured nothing: plan's arithmetic from a data sheet (its
    --hardware), recorded on no device."""
    return inv.get("device") == "none"


def method(invs: list[dict[str, Any]], rows: dict[str, list],
           compared: dict[str, str] | None = None) -> str:
    """One line: where and how the problem's runs were measured; `compared`, each
    experiment's compared metric (step_ms), names the samples counted where a row has it (a
    step's 3 optimizer calls timed alone read as its `--iters 2`)."""
    facts = dict(provenance(invs, rows))
    stopped = dict(provenance(_not_rerun(invs), rows)).get(STOPPED_EARLY)
    settings = [r["_settings"] for kind_rows in rows.values() for r in kind_rows]
    # attention under do_bench ignores --warmup: do_bench warms up itself (25 ms of calls)
    benched = [r["_settings"] for r in rows.get("attention", [])
               if r["_settings"].get("timer") == "do-bench"]
    warm = sorted({s["warmup"] for s in settings
                   if isinstance(s.get("warmup"), int) and s not in benched})
    iters = sorted({s["iters"] for s in settings if isinstance(s.get("iters"), int)})
    # the samples the statistics come from (report/sections.sample_count): do_bench chooses
    # its own count and a point past its time budget stops short of --iters
    def timed(kind: str, r: dict[str, Any]) -> list[str]:
        main = f"{(compared or {}).get(kind)}_mean"
        return [main] if r.get(main) is not None else [
            k for k in r if k.endswith("_ms_mean") and r[k] is not None]

    counts = sorted({n for kind, kind_rows in rows.items() for r in kind_rows
                     for k in timed(kind, r)
                     for n in [sample_count(r, k.removesuffix("_mean"))] if n is not None})
    computed = bool(invs) and all(map(computed_only, invs))
    parts = ["computed, not measured (cs336sys plan: the hardware's data sheet)" if computed
             else f"on {facts['GPUs']}", f"commit {facts['Commits']}", facts["Versions"]]
    if "Your code" in facts:
        parts.append(f"your code {facts['Your code']}")
    if warm:
        parts.append(_counts(warm, "warm-up step"))
    if benched:
        parts.append("do_bench's own warm-up where it timed attention")
    if counts:
        span = str(counts[0]) if len(counts) == 1 else f"{counts[0]} to {counts[-1]}"
        asked = f" (--iters {', '.join(map(str, iters))})" if iters else ""
        parts.append(f"{span} timed sample{'' if counts == [1] else 's'} a point{asked}")
    elif iters:
        parts.append(f"{_counts(iters, 'timed sample')} asked a point")
    parts.append(f"points by their latest run: {_latest_statuses(rows)}")
    if stopped:
        parts.append(f"{STOPPED_EARLY.lower()}: {stopped}")
    return "Method: " + "; ".join(p for p in parts if p) + "."


# A check's figures: how far the user's code is from the reference (an attention point's
# output and, where it ran the backward, its gradients, which the course's backward tests check).
_FIGURES = (("max_err", "max err"), ("max_err_grad", "max grad err"),
            ("check_worst", "worst parameter"), ("check_optimizer_err", "AdamW move"))


# The settings that name which of the user's code a point ran (yours-torch, their model).
_WHOSE = ("impl", "attention", "model", "ddp", "shard_optimizer", "optimizer")


def _whose(settings: dict[str, Any], label: str) -> str:
    """`impl=yours-torch`: the settings naming the user's code, where the label has none (a
    label names only what tells points apart: two d_head of one kernel read `d_head=32`)."""
    return " ".join(f"{k}={text(v)}" for k in _WHOSE if (v := settings.get(k)) is not None
                    and (k == "model" or str(v).startswith("yours"))
                    and f"{k}={text(v)}" not in label)


def _shared(points: list[Row]) -> str:
    """`seq=128, causal=True`: the settings every checked point has alike (none of _WHOSE,
    which each row names), as a table's constant line."""
    if not points:
        return ""
    first = points[0]["_settings"]
    return ", ".join(f"{k}={text(v)}" for k, v in first.items()
                     if k not in QUIET and k not in _WHOSE and v is not None
                     and all(p["_settings"].get(k) == v for p in points))


def _clipped(text: str, most: int = 240) -> str:
    """`text` cut to its whole clauses (`; ` apart) that fit in `most` characters, ` …` said
    where it was cut; where its first clause alone is longer, its middle cut at words, its
    end kept: a DDP's check ends with the course's verdict ("... tolerance (atol=1e-08,
    rtol=1e-05) would pass)"), which a cut at the end lost for 2025's longer test name."""
    if len(text) <= most:
        return text
    kept = ""
    for clause in text.split("; "):
        longer = f"{kept}; {clause}" if kept else clause
        if len(longer) + 2 > most:
            break
        kept = longer
    if kept:
        return f"{kept} …"
    half = (most - 3) // 2
    head = text[:half].rsplit(" ", 1)[0]
    tail = text[-half:].split(" ", 1)[-1]
    return f"{head} … {tail}"


def checks(rows: dict[str, list[Row]]) -> FilledTable | None:
    """An implementation problem's verdicts: each checked point of the user's code (which
    code, and what tells it apart), its check, the figure it was judged by and what was
    compared (None where none was checked); the settings all share above it."""
    body, checked = [], []
    for kind, kind_rows in rows.items():
        # the user's code (`code` names its files), not ours beside it: ours is checked too
        pts = [r for r in latest(kind_rows) if r.get("check") is not None and r.get("code")]
        checked += pts
        for r, label in zip(pts, point_labels(pts) if pts else [], strict=True):
            label = " ".join(x for x in (_whose(r["_settings"], label), label) if x)
            figure = ", ".join(f"{name} {r[key]:.2g}" for key, name in _FIGURES
                               if isinstance(r.get(key), (int, float)))
            what = r.get("check_detail") or (
                f"every element within {r['check_atol']:g} + {r['check_rtol']:g}·|ref| of a "
                "float64 reference" if r.get("check_rtol") is not None else "")
            # a pass judged against other work than the point names (a PyTorch FlashAttention
            # checked non-causal): said first, as the command's table says it; the cut at 160
            # characters left a bare `pass` beside "O off by up to 2.82" at the causal point
            verdict = str(r["check"]) + (" (non-causal)" if r.get("not_compared") else "")
            what = "; ".join(x for x in (r.get("not_compared"), what) if x)
            body.append([kind, label, str(r.get("status")), verdict, figure, _clipped(what)])
    if not body:
        return None
    return FilledTable("Checks of your code", ["experiment", "point", "status", "check",
                                               "figure", "what was compared"], body,
                       note="Each point of your code against its reference, as the course's "
                       "tests check it (docs/yours.md has the tolerances).",
                       constant=_shared(checked))


def section(problem: Problem, rows: dict[str, list], invs: list[dict[str, Any]],
            catalog: Sequence[Any], commands: list[str],
            linked: dict[str, list[dict[str, Any]]] | None = None, year: str = "") -> Section:
    """The problem's section from its runs (`rows` by experiment, their invocations, the
    rows `linked` to them: kernel_stats): what it asks, the commands, the method line, its
    tables and its experiments' figures and failures (every one empty where nothing is
    stored)."""
    sec = Section(problem.name, f"{problem.name} ({problem.points} "
                                f"point{'s' * (problem.points != 1)})")
    sec.notes.append(f"Asks: {problem.asks}")
    if problem.kind == WRITTEN:
        sec.notes.append("A written answer: nothing to measure.")
        return sec
    if problem.kind == IMPLEMENT:
        sec.notes.append(f"Your implementation: the course's tests check it; cs336sys checks it "
                         f"with {' and '.join(f'`{c}`' for c in problem.checks)}." if problem.checks else
                         f"Your implementation: {UNTESTED.format(name=problem.name)}.")
    again = f"--year {year} " if year and year != HANDOUTS[0] else ""
    if not rows:
        if problem.kind != IMPLEMENT:  # the commands, run so that they count for it
            left = "Not yet computed" if problem.kind == COMPUTE else "Not yet measured"
            sec.notes.append(f"{left}: `cs336sys handout run {again}{problem.name}` runs "
                             + "; ".join(f"`{c}`" for c in commands)
                             + " (by hand, each with `--label " + problem.name + "`).")
        return sec
    sec.notes.append(method(invs, rows, {e.kind: e.compare for e in catalog}))
    # a problem about the student's code, measured on cs336sys's alone: said, or a table's
    # `ours` pasted into a writeup reads as theirs
    if any(run.yours is not None or run.yours_only for run in problem.runs) and not any(
            measures_yours(r["_settings"]) for kind_rows in rows.values() for r in kind_rows):
        sec.notes.append(f"These are cs336sys's own implementations: `cs336sys handout run "
                         f"{again}{problem.name} --yours` measures yours.")
    stored = [(kind, r["_settings"]) for kind, kind_rows in rows.items() for r in kind_rows]
    on_cpu = problem.kind == MEASURE and not all(run.anywhere for run in problem.runs) and all(
        r.get("gpu") == "cpu" for kind_rows in rows.values() for r in kind_rows)
    if on_cpu:  # the handout's figures are owed: said where they would be read
        sec.notes.append("; ".join(
            ["Measured on a CPU at cut-down sizes (the head of this writeup says which): the "
             "handout's figures still need a GPU"]
            + [f"{run.part} {run.cpu_note}".strip() for run in problem.runs if run.cpu_note])
            + ".")
    left = Status(problem, stored=stored).left()
    if left:
        # an implementation's check runs under --yours alone (`handout run` refuses it else)
        theirs = " --yours" if problem.kind == IMPLEMENT or any(
            measures_yours(s) for _, s in stored) else ""
        verb = {COMPUTE: ("computed", "computes"), IMPLEMENT: ("checked", "checks")}.get(
            problem.kind, ("measured", "measures"))
        sec.notes.append(f"Not yet {verb[0]}: {', '.join(left)} (`cs336sys handout run {again}"
                         f"{problem.name}{theirs}` {verb[1]} what is missing).")
    if problem.kind == IMPLEMENT and (verdicts := checks(rows)) is not None:
        sec.tables.append(verdicts)
    by_kind = {e.kind: e for e in catalog}
    # as the writeup's other tables: no `n` column (how often a point was stored)
    drawn = {kind: build_section(by_kind[kind], rows[kind], linked, counts=False)
             for kind in problem.experiments or tuple(rows) if rows.get(kind)}
    for entry in problem.tables:
        sec.tables.extend(tables(entry, rows, catalog, drawn))
    for part in drawn.values():
        for fig in part.figures:
            fig.name = f"{problem.name}-{fig.name}"
        sec.figures.extend(part.figures)
        sec.failures.extend(part.failures)
    return sec


def build(conn: sqlite3.Connection, problems: list[Problem], year: str, catalog: Sequence[Any],
          commands: dict[str, list[str]]) -> Report:
    """The writeup starter of `problems` (handout release `year`): a report of a section per
    problem, its figures drawn; `commands` gives each problem's commands for the line of a
    problem not yet measured."""
    with Drawer(start=True) as drawer:
        sections, every_inv, every_row = [], [], {}
        for p in problems:  # each problem's runs: the invocations labelled with its name
            sel = Selection(label=p.name, handout=year)
            rows, invs = load(conn, sel, catalog), invocations(conn, sel)
            linked = kernel_stats(conn, [r["run_id"] for rs in rows.values() for r in rs])
            sections.append(section(p, rows, invs, catalog, commands.get(p.name, []), linked,
                                    year))
            every_inv += invs
            for kind, kind_rows in rows.items():
                every_row.setdefault(kind, []).extend(kind_rows)
        # runs labelled for a problem this writeup leaves out count for that problem
        others = in_words(unlabelled(conn, list(every_problem(year))))
        # a point's latest run counts, and an invocation stopped early counts until its
        # command ran again to the end (as in each problem's method line)
        stopped = dict(provenance(_not_rerun(every_inv), every_row)).get(STOPPED_EARLY)
        facts = [(k, v) for k, v in provenance(every_inv, every_row) if v
                 and k != STOPPED_EARLY]
        facts = [("Points by their latest run", _latest_statuses(every_row))
                 if k == "Runs by status" and any(every_row.values()) else (k, v)
                 for k, v in facts] + ([(STOPPED_EARLY, stopped)] if stopped else [])
        measured = [i for i in every_inv if not computed_only(i)]
        # (a problem measured alike anywhere, the handout's accumulation loops, is no cut)
        cut = [p for p in problems if p.kind == MEASURE and not all(r.anywhere for r in p.runs)]
        if measured and cut and all(i.get("gpu") == "cpu" for i in measured):
            facts.append(("Sizes", f"{CPU_NOTE}; these figures fill the tables and answer "
                                   "nothing the handout asks about a GPU"))
        if others:  # measured by hand: the student's to label, before handing the writeup in
            facts.append(("Not counted", f"{others} without a problem's label (a run counts "
                                         f"for a problem under --label PROBLEM)"))
        report = Report(f"CS336 assignment 2 ({year} handout): writeup starter",
                        [f"problems {', '.join(p.name for p in problems)}"], facts)
        report.sections = sections
        figures = [f for s in report.sections for f in s.figures if f.plot is not None]
        for fig, png in zip(figures, drawer.draw([f.plot for f in figures]), strict=True):
            fig.png = png
    return report
