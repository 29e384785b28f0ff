"""`cs336sys browse`: the results store in a browser, through Datasette (an optional extra),
read-only, with every view's columns described from the experiments' declarations and a
few canned queries."""

from __future__ import annotations

import errno
import json
import socket
import sys
import tempfile
from pathlib import Path
from typing import Any

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, catalog, fail
from cs336sys.cli.options import option
from cs336sys.store.views import column_meanings
from cs336sys.sweep import stopping

# Canned queries: name -> (title, SQL over the views and tables of the current schema).
QUERIES = {
    "latest_per_point": (
        "The latest run of every point on each GPU",
        # a point is its settings on a machine: device is cuda:0 on every GPU
        "SELECT r.experiment, i.gpu, r.created, r.status, r.error, r.settings, r.invocation_id\n"
        "  FROM runs r JOIN invocations i ON i.id = r.invocation_id\n"
        "  JOIN (SELECT r2.experiment, r2.point_key, i2.gpu, max(r2.created) AS created\n"
        "         FROM runs r2 JOIN invocations i2 ON i2.id = r2.invocation_id\n"
        "        GROUP BY r2.experiment, r2.point_key, i2.gpu) latest\n"
        "    ON latest.experiment = r.experiment AND latest.point_key = r.point_key\n"
        "   AND latest.gpu IS i.gpu AND latest.created = r.created\n"
        " ORDER BY r.experiment, i.gpu, r.created DESC",
    ),
    "fastest_attention_per_seq": (
        "The fastest attention implementation at each shape (end to end, median; compiled "
        "Triton only, not the interpreter; no point kept apart from the others, such as a "
        "kernel that ignored is_causal)",
        # SQLite: the bare columns of a min() aggregate come from the row that has the min
        "SELECT gpu, precision, causal, batch, heads, d_head, seq, impl, compile, sdpa_backend,\n"
        "       min(e2e_ms_median) AS e2e_ms_median\n"
        "  FROM attention_runs WHERE status = 'ok' AND e2e_ms_median IS NOT NULL\n"
        "   AND NOT coalesce(interpreted, 0) AND not_compared IS NULL\n"
        " GROUP BY gpu, precision, causal, batch, heads, d_head, seq\n"
        " ORDER BY gpu, precision, causal, batch, heads, d_head, seq",
    ),
}


def metadata(name: str) -> dict[str, Any]:
    """Datasette's metadata for a store served as database `name`: the views' titles and
    column descriptions (store/views.column_meanings) and the canned queries."""
    tables = {}
    for e in catalog():
        columns = {}
        for column, (unit, meaning) in column_meanings(e).items():
            columns[column] = f"{meaning} ({unit})" if unit else meaning
        tables[e.view] = {"description": f"{e.title}: one row per stored point of `cs336sys "
                                         f"{e.kind}`.", "columns": columns}
    return {
        "title": "cs336sys results",
        "description": "Read-only. Views: one per experiment, one column per setting and "
                       "metric; tables runs, invocations, kernel_stats.",
        "databases": {name: {
            "tables": tables,
            "queries": {k: {"title": title, "sql": sql} for k, (title, sql) in QUERIES.items()},
        }},
    }


def browse(
    db: DbOption = DEFAULT_DB,
    port: option("Port to serve on (0: any free one).", int) = 8001,
    host: option("Address to serve on; 0.0.0.0 to reach it from other machines.", str) = "127.0.0.1",
    open_browser: option("Open the page in a browser.", bool, "--open") = False,
) -> None:
    """Serve the results store in a browser with Datasette: browse, facet and filter every view, and run read-only SQL. Needs the browse extra (pip install 'cs336sys[browse]').

    Each view's columns carry their unit and meaning; canned queries give the latest run of every point on each GPU and the fastest attention at each shape. The store is opened read-only and nothing is written beside it: a store no sweep has open is served as it is at the start (rows stored later show after a restart); one a sweep is writing, live; one of an older schema, as a migrated snapshot. Ctrl-C stops it.

    Example:

        cs336sys browse --open

        cs336sys browse --db h100.db --port 8080
    """
    import importlib.util
    import sqlite3
    import subprocess

    from cs336sys.store.db import StoreError, connect_readonly, readable_immutable

    if importlib.util.find_spec("datasette") is None:
        fail("cs336sys browse needs Datasette, an optional extra: pip install 'cs336sys[browse]'")
    if not 0 <= port <= 65535:
        fail(f"--port must be from 0 to 65535, got {port}")
    if not host.strip():  # '' binds every interface, the opposite of the default
        fail("--host: empty value; give an address (127.0.0.1, or 0.0.0.0 to reach it from "
             "other machines)")
    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    # a taken port or a host not this machine's: Datasette said so after the address line
    # (exit 3), and --open sent the browser to whatever served there (port 0: any free one)
    problem = _unbindable(host, port)
    if problem:
        conn.close()
        option, why = problem
        fail(f"{option}: cannot serve at {host}:{port}: {why}")
    if port == 0:  # chosen here, so that the address printed (and --open's) is the one served
        from cs336sys.parallel.launcher import free_port

        port = free_port(host)
    with tempfile.TemporaryDirectory(prefix="cs336sys-browse-") as tmp:
        # A store no writer has open is served as a copy, taken now: Datasette keeps its
        # connections, and an immutable one over the live file, which a sweep started later
        # writes, read torn pages ("database disk image is malformed"); nor would a live
        # read leave nothing beside it. A store a writer has open, live.
        served, immutable = Path(db), readable_immutable(db)
        copied = conn.execute("PRAGMA database_list").fetchone()[2] == ""
        if copied or immutable:
            served, immutable = Path(tmp) / served.name, True
            out = sqlite3.connect(served)
            conn.backup(out)
            out.close()
            typer.echo(f"{db} was read into a copy (an older schema, migrated; views another "
                       "cs336sys version made, rebuilt; or the log a killed writer left, "
                       "recovered): serving that snapshot (the store "
                       "itself is left as it is)" if copied else
                       f"serving a copy of {db} as it is now: rows stored later show after a "
                       "restart", err=True)
        conn.close()
        meta = Path(tmp) / "metadata.json"
        meta.write_text(json.dumps(metadata(served.stem)))
        argv = [sys.executable, "-m", "datasette", "serve",
                *(["--immutable", str(served)] if immutable else [str(served)]),
                "--metadata", str(meta), "--host", host, "--port", str(port),
                "--setting", "sql_time_limit_ms", "5000", *(["--open"] if open_browser else [])]
        address = f"[{host}]" if ":" in host else host  # an IPv6 address in a URL: RFC 3986
        # Datasette's path of a database tilde-encodes its name (`results.h100`: a 404)
        from datasette.utils import tilde_encode

        typer.echo(f"serving {db} at http://{address}:{port}/{tilde_encode(served.stem)} "
                   "(Ctrl-C stops it)", err=True)
        try:
            code = subprocess.call(argv)
        except KeyboardInterrupt:  # how a server is stopped: not an interrupted command
            stopping.reset()
            code = 0
    raise typer.Exit(code)


def _unbindable(host: str, port: int) -> tuple[str, str] | None:
    """The option at fault and why a server cannot listen at host:port (`--port`: in use;
    `--host`: no such name or not this machine's address), or None: bound and let go at
    once, with SO_REUSEADDR as uvicorn binds, so a port left in TIME_WAIT by the last server
    counts as free and one another server listens on does not."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_STREAM) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind((host, port))
    except OSError as exc:
        why = exc.strerror or str(exc)
        taken = exc.errno in (errno.EADDRINUSE, errno.EACCES)
        return ("--port" if taken else "--host", why)
    except (UnicodeError, ValueError) as exc:  # a name IDNA cannot encode, a NUL in it
        return ("--host", str(exc))
    return None
