"""`cs336sys report`: stored runs -> HTML and markdown with tables, plots and comparisons."""

from __future__ import annotations

import sqlite3
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, choices, fail

ListOpt = list[str] | None


def report(
    since: Annotated[
        str | None,
        typer.Option(help="Runs created since: today, yesterday, 7d, 12h, 2026-01-05, or an ISO datetime (UTC)."),
    ] = None,
    until: Annotated[
        str | None,
        typer.Option(help="Runs created before this (same forms; a day means its end)."),
    ] = None,
    experiment: Annotated[
        ListOpt, typer.Option(help="Only these experiments (model, attention, comm, ...).")
    ] = None,
    gpu: Annotated[str | None, typer.Option(help="Only runs on this GPU (its name).")] = None,
    commit: Annotated[
        str | None, typer.Option(help="Only runs at this git commit (a prefix is enough).")
    ] = None,
    where: Annotated[
        ListOpt,
        typer.Option(help="KEY=VALUE on the run's settings, e.g. size=small (repeatable)."),
    ] = None,
    compare: Annotated[
        tuple[str, str] | None,
        typer.Option(
            help="Two commits, invocation ids or GPUs: matching points side by side with B/A.",
            metavar="A B",
        ),
    ] = None,
    fmt: Annotated[ListOpt, typer.Option("--format", help="html and/or md. [default: both]")] = None,
    out: Annotated[Path, typer.Option(help="Folder to write the report into.")] = Path("reports"),
    title: Annotated[str, typer.Option(help="Title of the report.")] = "cs336sys report",
    db: DbOption = DEFAULT_DB,
) -> None:
    """Render stored runs as a report: one section per experiment, a provenance header, and with --compare the same points side by side.

    Writes report.html (one self-contained file, plots embedded) and report.md (images in
    report_files/ beside it) into --out, and prints the paths written.

    Example:

        cs336sys report --since today --experiment model,attention --out reports/
    """
    from cs336sys.bench.paths import why_unwritable
    from cs336sys.report.render import FORMATS, build, write
    from cs336sys.report.select import (
        Selection,
        SelectionError,
        experiments,
        parse_time,
        parse_where,
    )
    from cs336sys.store.db import StoreError, connect_readonly

    formats = choices(fmt, FORMATS, "--format", default=FORMATS)
    exps = choices(experiment, sorted(experiments()), "--experiment")
    now = datetime.now(timezone.utc)
    try:
        sel = Selection(
            since=parse_time(since, now) if since is not None else None,
            until=parse_time(until, now, end=True) if until is not None else None,
            experiments=tuple(exps),
            gpu=gpu,
            commit=commit,
            where=tuple(parse_where(where or [])),
        )
    except SelectionError as exc:
        fail(exc)
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} exists and is not a folder")
    try:
        conn = connect_readonly(db)
    except StoreError as exc:
        fail(exc)
    problem = why_unwritable(out)
    if problem:
        conn.close()
        fail(f"--out {out}: {problem}")
    filters = [f"{k} {v}" for k, v in (("since", since), ("until", until), ("gpu", gpu),
                                        ("commit", commit)) if v]  # fmt: skip
    filters += [f"experiment {', '.join(exps)}"] if exps else []
    filters += [f"where {w}" for w in where or []]
    try:
        rep = build(conn, sel, title, filters, compare_ab=tuple(compare) if compare else None)
    except SelectionError as exc:
        fail(exc)
    except sqlite3.DatabaseError as exc:  # damaged pages past the header and schema
        fail(f"cannot read {db} as a results store: {exc}")
    finally:
        conn.close()
    if not rep.sections:
        typer.echo("No stored runs match this selection; the report says so.", err=True)
    try:
        written = write(rep, out, formats)
    except OSError as exc:
        fail(f"--out {out}: cannot write there ({exc.strerror or exc})")
    for path in written:
        typer.echo(str(path))

