"""`cs336sys sql`: read-only SQL over the results store."""

from __future__ import annotations

import csv
import io
import json
import sqlite3
from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, catalog, fail, table
from cs336sys.cli.options import option
from cs336sys.store.views import typed


def sql(
    query: Annotated[str, typer.Argument(help="One SQL statement; it may only read.")],
    db: DbOption = DEFAULT_DB,
    as_json: option("Print a JSON list of objects.", bool, "--json") = False,
    as_csv: option("Print CSV with a header row.", bool, "--csv") = False,
    param: option("Value for a ? placeholder (repeatable, in order); numbers bind as numbers.",
                  list[str] | None, "--param", "-p") = None,
) -> None:
    """Run a read-only SQL query on the results store and print the rows.

    The store is opened read-only: a statement that would write is refused.

    Views, one per experiment, one column per setting and metric: model_runs, attention_runs, memory_runs, memory_residuals_runs, comm_runs, ddp_runs, plan_runs, profile_runs, precision_runs, step_runs. Every view starts with run_id, invocation_id, created, gpu, host, git_commit, git_dirty, label, status and error. Tables: runs (settings, metrics and raw samples as JSON), invocations (one per command: argv, provenance, label, exit status), kernel_stats (profile summaries, by run_id).

    Examples:

        cs336sys sql "SELECT size, mode, step_ms_mean FROM model_runs"

        cs336sys sql "SELECT impl, seq, fwd_ms_mean FROM attention_runs WHERE label = ?" -p baseline --csv
    """  # noqa: E501
    from cs336sys.store.db import StoreError, connect_readonly

    if as_json and as_csv:
        fail("choose one of --json and --csv")
    if not query.strip():
        fail("the SQL statement is empty")
    try:
        params = tuple(typed(p) for p in param or ())
    except ValueError as exc:
        fail(f"--param: {exc}")
    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    try:
        cursor = conn.execute(query, params)
        headers = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall()
    except sqlite3.DatabaseError as exc:
        if any(w in str(exc) for w in ("readonly", "query_only", "not authorized", "denied")):
            fail(f"refused: `cs336sys sql` is read-only and creates nothing ({exc})")
        fail(f"SQL error: {exc}")
    except sqlite3.Error as exc:
        fail(f"SQL error: {exc}")
    finally:
        conn.close()

    if as_json:
        typer.echo(
            json.dumps([dict(zip(headers, r, strict=True)) for r in rows], indent=2, default=str)
        )
    elif as_csv:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
    elif headers:
        typer.echo(table(rows, headers))
        typer.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", err=True)
