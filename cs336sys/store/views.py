"""One SQL view per experiment, flattening the JSON settings and metrics into columns.

Views are derived from the experiments' declarations (bench/declaration.py): a Spec's
settings and the declared metrics become columns, so adding a column or an experiment is a
change to its declaration only. When the definitions differ from those a store was created
with, the views are dropped and re-created on the next write-open (the rows never change).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

# Columns every view starts with: who, where and how the point ran.
_COMMON = [
    "r.id AS run_id",
    "r.invocation_id",
    "r.created",
    "i.gpu",
    "i.host",
    "i.git_commit",
    "i.git_dirty",
    "i.user_commit",
    "i.user_dirty",
    "i.label",
    "i.env",
    "r.status",
    "r.error",
]

def _derived() -> tuple[dict[str, tuple[str, list[str], list[str]]], dict[str, dict[str, str]]]:
    """(VIEWS, RENAMED) from the experiments' declarations (bench/declaration.py)."""
    from cs336sys.bench.declaration import catalog

    views = {e.view: (e.kind, list(e.settings), list(e.metric_names)) for e in catalog()}
    renamed = {e.view: dict(e.renamed) for e in catalog() if e.renamed}
    return views, renamed


def __getattr__(name: str):
    """`VIEWS` (view name -> (experiment, settings keys, metrics keys)) and `RENAMED` (view
    name -> {old column: metric}), derived on first use, so importing this module stays
    cheap for `cs336sys sql`."""
    if name in ("VIEWS", "RENAMED"):
        views, renamed = _derived()
        globals().setdefault("VIEWS", views)
        globals().setdefault("RENAMED", renamed)
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _get(name: str):
    """VIEWS or RENAMED as the module holds it now (a test may have replaced it)."""
    return globals()[name] if name in globals() else __getattr__(name)


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def view_sql(name: str) -> str:
    experiment, settings, metrics = _get("VIEWS")[name]
    renamed = _get("RENAMED").get(name, {})
    old_of = {new: old for old, new in renamed.items()}

    def metric(k: str) -> str:
        # A renamed metric: rows stored before the rename hold it under its old key, and
        # stored rows are never rewritten, so the column reads either.
        if k in old_of:
            return (f"coalesce(json_extract(r.metrics, '$.{k}'), "
                    f"json_extract(r.metrics, '$.{old_of[k]}'))")  # fmt: skip
        return f"json_extract(r.metrics, '$.{k}')"

    cols = list(_COMMON)
    cols += [f"json_extract(r.settings, '$.{k}') AS {_quote(k)}" for k in settings]
    cols += [f"{metric(k)} AS {_quote(k)}" for k in metrics]
    # The old names of renamed metrics stay columns for one release (docs/store.md, "Renamed
    # columns"), holding the same values as the new ones.
    cols += [f"{metric(new)} AS {_quote(old)}" for old, new in renamed.items() if old not in metrics]
    body = ",\n       ".join(cols)
    return (
        f"CREATE VIEW {_quote(name)} AS\nSELECT {body}\n"
        f"  FROM runs r LEFT JOIN invocations i ON i.id = r.invocation_id\n"
        f" WHERE r.experiment = '{experiment}'"
    )


def signature() -> str:
    text = "\n".join(view_sql(n) for n in sorted(_get("VIEWS")))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_views(conn: sqlite3.Connection) -> None:
    """(Re-)create the views if their definitions changed. Autocommit connection."""
    VIEWS = _get("VIEWS")
    sig = signature()
    if _meta(conn, "views") == sig:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Drop only the views cs336sys made (now or in an earlier version), never a user's own.
        ours = set(json.loads(_meta(conn, "view_names") or "[]")) | set(VIEWS)
        for name in sorted(ours):
            conn.execute(f"DROP VIEW IF EXISTS {_quote(name)}")
        for name in VIEWS:
            conn.execute(view_sql(name))
        conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [("views", sig), ("view_names", json.dumps(sorted(VIEWS)))],
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


def typed(value: str) -> int | float | str:
    """A value typed on the command line, as a view column holds it: '16' -> 16, '0.5' ->
    0.5, anything else as text. View columns come from json_extract, so they are typed, and
    the text '16' would never equal the integer 16."""
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        if kind is int and not -(2**63) <= number < 2**63:
            raise ValueError(f"{value} is outside SQLite's 64-bit integer range")
        return number
    return value
