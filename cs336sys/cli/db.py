"""`cs336sys db export|merge`: take runs out of a store, or combine stores from several machines.

Thin: options are checked here (bad input exits 2 with one line and writes nothing), the
work is in cs336sys/store/transfer.py. Nothing here imports torch.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from pathlib import Path
from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    cannot_write,
    catalog,
    fail,
    table,
    user_errors,
)
from cs336sys.cli.options import Commit, Gpu, Replace, Since, Until, Where, option
from cs336sys.measure.landing import staged
from cs336sys.sweep import stopping
from cs336sys.sweep.points import listed

db_app = typer.Typer(name="db", no_args_is_help=True, add_completion=False)


@db_app.callback()
def _db() -> None:
    """Export stored runs to CSV/JSONL, or merge another machine's store into this one.

    Example:

        cs336sys db merge h100.db --db db/results.db
    """


@db_app.command()
def export(
    fmt: option("csv or jsonl.", str, "--format") = "csv",
    experiment: option("Only these experiments (repeatable or comma list). [default: all]",
                       list[str] | None) = None,
    out: option("Write to this file instead of stdout: a new file, or one an export wrote "
                "(replaced whole).", Path | None) = None,
    samples: option("Include each run's raw samples (big).", bool, "--samples") = False,
    since: Since = None,
    until: Until = None,
    gpu: Gpu = None,
    commit: Commit = None,
    where: Where = None,
    force: Replace = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Export stored runs as CSV or JSONL, one record per run.

    Each record is the run, its invocation's provenance (gpu, host, git commit and dirty flag, library versions), its settings and its metrics. CSV flattens settings and metrics into settings.KEY and metrics.KEY columns (the union of keys, in order of first appearance; an empty cell is null); JSONL keeps them as nested objects, one run per line. Runs come oldest first.

    Example:

        cs336sys db export --format csv --experiment model,attention --out runs.csv

        cs336sys db export --since 7d --where label=baseline --format jsonl

        cs336sys db export --commit HEAD --gpu "NVIDIA H100 80GB HBM3" --out h100.csv
    """
    from datetime import datetime, timezone

    from cs336sys.report.select import SelectionError, check_gpu, selected
    from cs336sys.store.db import StoreError, connect_readonly
    from cs336sys.store.transfer import FORMATS, MalformedRun, export, known_experiments

    experiments = catalog()
    if fmt not in FORMATS:
        fail(f"--format: unknown value {fmt!r}; choose from {', '.join(FORMATS)}")
    try:  # the same filters as `report`, as one SQL condition
        condition = selected(since=since, until=until, gpu=gpu, commit=commit, where=where,
                             catalog=experiments, now=datetime.now(timezone.utc)).clause()
    except SelectionError as exc:
        fail(exc)
    if out is not None and not out.name.strip():  # a name of spaces (a pasted one): blank
        fail("--out: empty value; give a file name, or leave --out out for stdout")
    if out is not None and out.is_dir():
        fail(f"--out: {out} is a directory")
    if out is not None:
        from cs336sys.cli.outputs import refuse_to_replace

        refuse_to_replace([out], "export", "--out", force, db)
    try:
        conn = connect_readonly(db, catalog)
        known = known_experiments(conn, experiments)
        check_gpu(conn, gpu)
    except (StoreError, SelectionError) as exc:
        fail(exc)
    except sqlite3.DatabaseError as exc:
        fail(f"cannot read {db} as a results store: {exc}")
    try:
        with user_errors():  # given but empty is not "all"
            wanted = listed(experiment, "--experiment")
        for name in wanted:
            if name not in known:
                fail(f"--experiment: unknown value {name!r}; choose from {', '.join(known)}")
        if out is None:
            try:
                n = export(conn, sys.stdout, fmt, wanted, samples, condition)
                sys.stdout.flush()
            except BrokenPipeError:  # `| head`: the reader has what it wanted, as with cat
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(0) from None
        else:
            n = _export_to_file(conn, out, fmt, wanted, samples, condition)
    except OSError as exc:  # --out where nothing can be written
        cannot_write(out, exc)
    except (sqlite3.DatabaseError, MalformedRun) as exc:
        fail(f"cannot read {db} as a results store: {exc}")
    finally:
        conn.close()
    where = "" if out is None else f" to {out}"
    typer.echo(f"exported {n} run{'s' if n != 1 else ''}{where}", err=True)


def _export_to_file(conn, out: Path, fmt: str, wanted: list[str], samples: bool, condition) -> int:
    """Written beside `out` and renamed at the end (measure/landing.py): a failed or stopped
    export leaves no half file, and the one there before as it was."""
    from cs336sys.store.transfer import export

    counted: list[int] = []
    with staged(lambda _: stopping.stored(f"exported {counted[0]} run(s) to {out}")) as stage:
        with open(stage.path(out), "w", encoding="utf-8", newline="") as fh:
            counted.append(export(conn, fh, fmt, wanted, samples, condition))
    return counted[0]


@db_app.command()
def merge(
    other: Annotated[
        Path, typer.Argument(help="The store to take rows from; it is only read.")
    ],
    db: DbOption = DEFAULT_DB,
) -> None:
    """Merge another store's invocations and runs into --db.

    Ids are UUIDs, so rows already present (merged before, or the same store) are skipped, never duplicated; the kernel_stats of newly added runs come along; everything happens in one transaction. OTHER is never modified: it is copied to a temporary snapshot, migrated there if its schema is older, and refused if newer than this cs336sys knows. --db is created if missing.

    Example:

        cs336sys db merge a100.db --db db/results.db
    """
    from cs336sys.store.db import StoreError, check_path
    from cs336sys.store.transfer import check_other, merge

    def committed(counts) -> None:  # what a signal from here on ends the command with
        stopping.stored(f"merged {other} into {db}: {counts.invocations_added} invocation(s) "
                        f"and {counts.runs_added} run(s) added")

    if not other.name.strip():  # '' reads as `.`
        fail("OTHER: empty value; give the store file to merge")
    experiments = catalog()
    try:
        check_path(db, writing=True)
        check_other(other, db)
        counts = merge(db, other, experiments, committed)
    except StoreError as exc:
        fail(exc)
    rows = [
        ["invocations", counts.invocations_added, counts.invocations_present],
        ["runs", counts.runs_added, counts.runs_present],
        ["kernel_stats", counts.kernel_stats_added, ""],
    ]
    typer.echo(f"merged {other} (schema v{counts.other_version}) into {db}")
    typer.echo(table(rows, ["table", "added", "already present"]))
    if counts.invocations_finished:
        typer.echo(f"{counts.invocations_finished} invocation(s) running in {db} had finished "
                   f"in {other}: their end and exit status taken from it")
    if counts.columns_left:  # a column a user added to OTHER: said, not dropped unsaid
        typer.echo(f"note: {db} has no column {', '.join(counts.columns_left)} of {other}'s: "
                   "its values were not copied", err=True)
    differing = counts.invocations_differing + counts.runs_differing
    if differing:
        typer.echo(
            f"note: {counts.invocations_differing} invocation(s) and {counts.runs_differing} "
            f"run(s) have the same id in both stores but different content; kept those in {db}",
            err=True,
        )
