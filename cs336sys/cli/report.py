"""`cs336sys report`: stored runs -> HTML and markdown with tables, plots and comparisons."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    cannot_write,
    catalog,
    choices,
    fail,
    given,
    terminal_width,
    wrote,
)
from cs336sys.cli.options import Commit, Gpu, Replace, Since, Until, Where, list_option, option


def report(
    ctx: typer.Context,
    since: Since = None,
    until: Until = None,
    experiment: list_option("Only these experiments (model, attention, comm, ...).") = None,
    gpu: Gpu = None,
    commit: Commit = None,
    where: Where = None,
    compare: option("Two commits (prefixes, or git refs of this folder's repository: HEAD~1 HEAD; "
                    "cs336sys's or your code's), invocation ids, labels or GPUs: the report covers "
                    "only their runs, and every point measured on both sides gets B/A and a "
                    "verdict (1.23x slower, from a Mann-Whitney U test on the raw samples), also "
                    "printed as a table.", tuple[str, str] | None, metavar="A B") = None,
    fail_on_regression: option("With --compare: exit 1 (after writing the report) when a "
                               "significant regression is worse than PCT percent (1.12x slower is "
                               "12), for CI; with --history, when a point's last step (into its "
                               "latest commit, of each branch measured) is such a regression.",
                               float | None,
                               metavar="PCT") = None,
    threshold: option("With --compare or --history: the smallest change in percent that counts "
                      "(beside p < 0.05). Raise it where runs of the same code drift further "
                      "apart.", float, metavar="PCT") = 5.0,
    history: option("Plot each point's median across commits, in the time order of their runs with a "
                    "commit after its ancestors, and list the steps "
                    "(regressions and improvements) found in the raw samples; steps are also "
                    "printed.", bool, "--history") = False,
    fmt: list_option("html, md, tex (booktabs tables, a LaTeX document) and/or typst (#table "
                     "files, a Typst document). [default: html,md]", "--format") = None,
    out: option("Folder to write the report into.", str) = "reports",
    title: option("Title of the report.", str) = "cs336sys report",
    force: Replace = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Render stored runs as a report: one section per experiment, a provenance header, and with --compare the same points side by side.

    Writes report.html (one self-contained file, plots embedded) and report.md (images in
    report_files/ beside it) into --out, and prints the paths written. With --compare (and
    --history) it prints the compared points (the steps) first; with --fail-on-regression
    it exits 1 after writing when a significant regression exceeds PCT percent.

    Example:

        cs336sys report --since today --experiment model,attention --out reports/

        cs336sys report --compare 3f2c1e9 8a41b07 --fail-on-regression 10

        cs336sys report --compare HEAD~1 HEAD --experiment attention

        cs336sys report --history --experiment model --where size=small
    """
    from cs336sys.measure.paths import why_unwritable
    from cs336sys.report.render import DEFAULT_FORMATS, EXTENSIONS, FORMATS, build, write
    from cs336sys.report.select import SelectionError, check_gpu, selected, views_of
    from cs336sys.store.db import StoreError, connect_readonly

    experiments = catalog()
    if not out.strip():  # (Path("") is ".": an empty value would mean this folder)
        fail("--out: empty value; give a folder")
    out = Path(out)
    if compare and any(not ref.strip() for ref in compare):
        fail("--compare: empty value; give two commits, A B")
    if fail_on_regression is not None and not compare and not history:
        fail("--fail-on-regression needs --compare A B or --history")
    if fail_on_regression is not None and not fail_on_regression >= 0:
        fail(f"--fail-on-regression must be a percentage of 0 or more, got {fail_on_regression}")
    if given(ctx, "threshold") and not compare and not history:
        fail("--threshold needs --compare A B or --history")
    if not 0 <= threshold < 1000:
        fail(f"--threshold must be a percentage from 0 up to (not including) 1000, got "
             f"{threshold}")
    formats = choices(fmt, FORMATS, "--format", default=DEFAULT_FORMATS)
    exps = choices(experiment, sorted(views_of(experiments)), "--experiment")
    try:
        sel = selected(since=since, until=until, gpu=gpu, commit=commit, where=where,
                       catalog=experiments, now=datetime.now(timezone.utc), experiments=exps)
    except SelectionError as exc:
        fail(exc)
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} exists and is not a folder")
    from cs336sys.cli.outputs import refuse_to_replace

    for f in formats:
        refuse_to_replace([out / f"report.{EXTENSIONS[f]}"], f, "--out", force, db)
    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    try:
        check_gpu(conn, gpu)
    except SelectionError as exc:
        conn.close()
        fail(exc)
    problem = why_unwritable(out)
    if problem:
        conn.close()
        fail(f"--out {out}: {problem}")
    filters = [f"{k} {v}" for k, v in (("since", since), ("until", until), ("gpu", gpu),
                                        ("commit", commit)) if v]
    filters += [f"experiment {', '.join(exps)}"] if exps else []
    filters += [f"where {w}" for w in where or []]
    try:
        rep = build(conn, sel, title, filters, experiments,
                    compare_ab=tuple(compare) if compare else None,
                    history=history, threshold=threshold / 100)
    except SelectionError as exc:
        fail(exc)
    except sqlite3.DatabaseError as exc:  # damaged pages past the header and schema
        fail(f"cannot read {db} as a results store: {exc}")
    finally:
        conn.close()
    if not rep.sections:
        from cs336sys.report.select import also_headers

        meant = "; ".join(also_headers(where or [], experiments))
        typer.echo("No stored runs match this selection" + (f" ({meant})" if meant else "")
                   + "; the report says so.", err=True)
    from cs336sys.cli.outputs import refuse_to_replace_any

    refuse_to_replace_any(rep, out, formats, "report", force, db)
    try:
        written = write(rep, out, formats, landed=wrote)
    except OSError as exc:
        cannot_write(out, exc)
    if rep.compared is not None:
        typer.echo(rep.compared.text(terminal_width()))
    if rep.history is not None:
        typer.echo(rep.history.text(terminal_width()))
    for path in written:
        typer.echo(str(path))
    if fail_on_regression is not None:
        worse = [] if rep.compared is None else [
            f"{c.experiment} {c.point} {c.verdict}, {c.how}"
            for c in rep.compared.regressions(fail_on_regression)]
        if rep.history is not None:
            worse += [f"{t.experiment} {t.point} {c.verdict} at {t.commits[i].title()}, {c.how}"
                      for t, i, c in rep.history.latest_regressions(fail_on_regression)]
            worse += [f"{e} {p} {status} at {c.title()}" for e, p, c, status in rep.history.failed]
        if worse:
            typer.echo(f"Regression: {len(worse)} point{'s' * (len(worse) != 1)} worse than "
                       f"{fail_on_regression:g}%: " + "; ".join(worse), err=True)
            raise typer.Exit(1)

