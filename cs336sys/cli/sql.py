"""`cs336sys sql`: read-only SQL over the results store."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import sqlite3
from typing import Annotated, Any

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, catalog, fail, table, terminal_width
from cs336sys.cli.options import option
from cs336sys.store.views import column_meanings, typed
from cs336sys.sweep import stopping
from cs336sys.sweep.points import closest


def sql(
    query: Annotated[str | None, typer.Argument(help="One SQL statement; it may only read.")] = None,
    db: DbOption = DEFAULT_DB,
    schema: option("Print the store's views and tables with their columns instead (no query); "
                   "--schema VIEW: that view's columns, each with its unit and meaning.",
                   bool, "--schema") = False,
    as_json: option("Print a JSON list of objects.", bool, "--json") = False,
    as_csv: option("Print CSV with a header row.", bool, "--csv") = False,
    param: option("Value for a ? placeholder (repeatable, in order); numbers bind as numbers.",
                  list[str] | None, "--param", "-p") = None,
) -> None:
    """Run a read-only SQL query on the results store and print the rows.

    The store is opened read-only: a statement that would write is refused.

    Views, one per experiment, one column per setting and metric: model_runs, attention_runs, memory_runs, memory_residuals_runs, comm_runs, ddp_runs, plan_runs, profile_runs, precision_runs, step_runs. Every view starts with run_id, invocation_id, created, gpu, host, git_commit, git_dirty, user_commit, user_dirty, label, env, status and error. Tables: runs (settings, metrics and raw samples as JSON), invocations (one per command: argv, provenance, label, exit status), kernel_stats (profile summaries, by run_id).

    Examples:

        cs336sys sql "SELECT size, mode, step_ms_mean FROM model_runs"

        cs336sys sql "SELECT impl, seq, fwd_ms_mean FROM attention_runs WHERE label = ?" -p baseline --csv

        cs336sys sql --schema attention_runs
    """
    from cs336sys.store.db import StoreError, connect_readonly

    if as_json and as_csv:
        fail("choose one of --json and --csv")
    if schema:
        return _schema(db, query, as_json, as_csv)
    if query is None:
        fail("give one SQL statement (or --schema to list the views and their columns)")
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
    # Ctrl-C or SIGTERM while SQLite runs the query: Python's handler runs only between
    # bytecodes, so a long query ran on to its end; SQLite calls this every _PROGRESS_OPS
    # instructions, and a signal received (sweep/stopping.py) interrupts the query.
    conn.set_progress_handler(lambda: stopping.pending() is not None, _PROGRESS_OPS)
    try:
        cursor = conn.execute(query, params)
        headers = [d[0] for d in cursor.description or ()]
        rows = cursor.fetchall()
    except sqlite3.DatabaseError as exc:
        stopping.check()  # the signal that interrupted it ends the command (130, 143, 129)
        if str(exc) in _REFUSALS:
            fail(f"refused: `cs336sys sql` is read-only and creates nothing ({exc})")
        fail(f"SQL error: {exc}{_hint(conn, str(exc), query)}")
    except sqlite3.Error as exc:
        stopping.check()
        fail(f"SQL error: {exc}")
    finally:
        conn.close()

    _print(headers, rows, as_json, as_csv)
    if headers and not (as_json or as_csv):
        typer.echo(f"({len(rows)} row{'s' if len(rows) != 1 else ''})", err=True)


def _print(headers: list[str], rows: list, as_json: bool, as_csv: bool) -> None:
    """Rows as a JSON list of objects, CSV, or a table."""
    if as_json:
        names = _unique(headers)
        typer.echo(json.dumps([dict(zip(names, map(_json_value, r), strict=True)) for r in rows],
                              indent=2, default=str))
    elif as_csv:
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerow(headers)
        writer.writerows(rows)
        typer.echo(buf.getvalue(), nl=False)
    elif headers:
        # the stored values as they are: tabulate's numbers read the text '1.10' as 1.1
        # and cut floats to 6 digits
        typer.echo(table(rows, headers, numparse=False))


# SQLite's words for a statement the read-only connection refused (store/db.py's
# connect_readonly: query_only, and its authorizer); a typo of a column named `readonly`
# read as a refused write where any message holding the word was one.
_REFUSALS = ("attempt to write a readonly database", "not authorized", "authorization denied")
_PROGRESS_OPS = 100_000  # SQLite VM instructions between checks for a signal: ~1 ms


def _unique(headers: list[str]) -> list[str]:
    """The columns' names as JSON keys, each once: a join's second `mode` is `mode_2` (an
    object keeps one value per key, so the first was lost)."""
    out: list[str] = []
    for header in headers:
        name, n = header, 1
        while name in out or (name != header and name in headers):  # a real name stays its own
            n += 1
            name = f"{header}_{n}"
        out.append(name)
    return out


def _json_value(value: Any) -> Any:
    """A value as JSON can hold it: an infinite or NaN float (computed in the query) as the
    text 'inf', '-inf' or 'nan', which JSON has no number for."""
    return str(value) if isinstance(value, float) and not math.isfinite(value) else value


def _hint(conn: sqlite3.Connection, error: str, query: str) -> str:
    """Where the error's unknown column is found, or the table it may have meant: settings
    and metrics are columns of the experiments' views, not of the runs table (which keeps
    them as JSON)."""
    try:
        return _where(conn, error, query)
    except sqlite3.Error:  # a store too broken to say more: the error alone
        return ""


def _objects(conn: sqlite3.Connection) -> dict[str, str]:
    """The store's tables and views, name -> 'table' or 'view', views first."""
    return dict(conn.execute(
        "SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view') "
        "AND name NOT LIKE 'sqlite_%' ORDER BY type DESC, name"))


def _columns(conn: sqlite3.Connection, name: str) -> list[tuple[str, str]]:
    """(column, declared type) of the table or view `name`."""
    return list(conn.execute("SELECT name, type FROM pragma_table_info(?)", (name,)))


def _where(conn: sqlite3.Connection, error: str, query: str) -> str:
    objects = _objects(conn)
    if error.startswith("no such column: "):
        column = error.removeprefix("no such column: ").rsplit(".", 1)[-1]
        holding = [name for name in objects if column in dict(_columns(conn, name))]
        if holding:
            runs = ("; the runs table keeps settings and metrics as JSON"
                    if re.search(r"\bruns\b", query, re.IGNORECASE) else "")
            return f" ({column} is a column of {', '.join(holding)}{runs})"
    elif error.startswith("no such table: "):
        near = closest(error.removeprefix("no such table: "), objects)
        if near:
            return f" (did you mean {near!r}? cs336sys sql --schema lists them)"
    return ""


def _schema(db, view: str | None, as_json: bool, as_csv: bool) -> None:
    """`sql --schema [VIEW]`: what the store at `db` holds, as this version reads it (as JSON
    or CSV where asked, as the rows of a query are)."""
    from cs336sys.store.db import StoreError, connect_readonly

    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    try:
        objects = _objects(conn)
        experiments = {e.view: e for e in catalog()}
        if view is None:
            rows = []
            for name, kind in objects.items():
                exp = experiments.get(name)
                what = f"experiment {exp.kind}" if exp else kind
                rows.append((name, what, len(_columns(conn, name))))
            _print(["name", "what", "columns"], rows, as_json, as_csv)
            typer.echo("cs336sys sql --schema NAME lists the columns of one.", err=True)
            return
        if view not in objects:
            near = closest(view, objects)
            hint = f" (did you mean {near!r}?)" if near else ""
            fail(f"--schema: no view or table {view!r} in {db}{hint}; see cs336sys sql --schema")
        meanings = column_meanings(experiments[view]) if view in experiments else {}
        rows = [(name, meanings.get(name, ("", ""))[0], meanings.get(name, ("", ""))[1] or sqltype)
                for name, sqltype in _columns(conn, view)]
        if not (as_json or as_csv):  # a meaning on several lines, the table the terminal's width
            from cs336sys.report.tables import fill

            room = terminal_width() - max(len(r[0]) for r in [*rows, ("column",)]) - max(
                len(r[1]) for r in [*rows, ("", "unit")]) - 4  # tabulate's two gaps of 2
            rows = [(name, unit, fill(meaning, max(room, 20))) for name, unit, meaning in rows]
        _print(["column", "unit", "meaning"], rows, as_json, as_csv)
    finally:
        conn.close()
