"""One SQL view per experiment, flattening the JSON settings and metrics into columns.

Views are derived from the experiments' declarations (sweep/declaration.py), which the
caller passes in: a Spec's settings and the declared metrics become columns, so adding a
column or an experiment is a change to its declaration only. A view whose definition differs
from the one a store holds is dropped and re-created when the store is opened for writing
with that declaration (the rows never change).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sqlite3
from collections.abc import Sequence
from typing import Any

from cs336sys.store.transaction import immediate

# Columns every view starts with: who, where and how the point ran (and what each means).
_COMMON = {
    "r.id AS run_id": "the run's id (runs.id)",
    "r.invocation_id": "the command that ran it (invocations.id)",
    "r.created": "when it was stored (UTC, YYYY-MM-DD HH:MM:SS.ffffff)",
    "i.gpu": "the GPU's name, or cpu",
    "i.host": "the machine's host name",
    "i.git_commit": "cs336sys's git commit",
    "i.git_dirty": "1 if cs336sys's checkout had uncommitted changes",
    "i.user_commit": "the commit of your code measured (yours-...; docs/yours.md)",
    "i.user_dirty": "1 if your checkout had uncommitted changes",
    "i.label": "the invocation's --label",
    "i.env": "environment variables that change timings (OMP_NUM_THREADS, ...), as JSON",
    "r.status": "ok, oom, error, skipped or wrong",
    "r.error": "why it is not ok (the error's first line, a skip's reason)",
}


def column_meanings(experiment: Any) -> dict[str, tuple[str, str]]:
    """Each column of `experiment`'s view -> (unit, meaning), in the view's order: the
    common columns, the settings (with the Spec's type) and the metrics as declared."""
    out = {sql.rpartition(" ")[2].rpartition(".")[2]: ("", meaning)
           for sql, meaning in _COMMON.items()}
    types = experiment.setting_types()
    for k in experiment.settings:
        kind = f" ({types[k]})" if types.get(k) else ""
        out[k] = ("", f"setting{kind}")
    for m in experiment.metrics:
        out[m.name] = (m.unit, m.meaning)
    return out


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def view_sql(experiment: Any) -> str:
    """The CREATE VIEW of one experiment's declaration (sweep/declaration.Experiment)."""
    settings, metrics = list(experiment.settings), list(experiment.metric_names)
    old_of = {new: old for old, new in experiment.renamed.items()}  # metrics renamed

    def metric(k: str) -> str:
        # A renamed metric: rows stored before the rename hold it under its old key, and
        # stored rows are never rewritten, so the column reads either.
        if k in old_of:
            return (f"coalesce(json_extract(r.metrics, '$.{k}'), "
                    f"json_extract(r.metrics, '$.{old_of[k]}'))")
        return f"json_extract(r.metrics, '$.{k}')"

    def setting(k: str) -> str:
        return f"json_extract(r.settings, '$.{k}')"

    cols = list(_COMMON)  # the keys: the SQL of each column
    cols += [f"{setting(k)} AS {_quote(k)}" for k in settings]
    cols += [f"{metric(k)} AS {_quote(k)}" for k in metrics]
    body = ",\n       ".join(cols)
    return (
        f"CREATE VIEW {_quote(experiment.view)} AS\nSELECT {body}\n"
        f"  FROM runs r LEFT JOIN invocations i ON i.id = r.invocation_id\n"
        f" WHERE r.experiment = '{experiment.kind}'"
    )


def ensure_views(conn: sqlite3.Connection, experiments: Sequence[Any], complete: bool = False) -> None:
    """(Re-)create the view of each experiment in `experiments` whose definition differs from
    the one the store holds (meta 'view:<name>'). With `complete` (the whole catalog), also
    drop the views cs336sys made earlier that no experiment declares any more. A user's own
    views are never touched. Autocommit connection."""
    wanted = {e.view: view_sql(e) for e in experiments}
    ours = set(json.loads(_meta(conn, "view_names") or "[]"))
    stale = stale_views(conn, wanted)
    gone = (ours - set(wanted)) if complete else set()
    if not stale and not gone:
        return
    with immediate(conn):
        for name in sorted(stale | gone):
            conn.execute(f"DROP VIEW IF EXISTS {_quote(name)}")
            conn.execute("DELETE FROM meta WHERE key = ?", (f"view:{name}",))
        for name in sorted(stale):
            conn.execute(wanted[name])
        conn.executemany("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                         [(f"view:{n}", _digest(wanted[n])) for n in stale]
                         + [("view_names", json.dumps(sorted((ours - gone) | set(wanted))))])


def stale_views(conn: sqlite3.Connection, wanted: dict[str, str]) -> set[str]:
    """The views of `wanted` (name -> definition) that the store holds otherwise: made by
    another cs336sys (an older checkout that wrote last rebuilt them to its own columns)."""
    return {n for n, sql in wanted.items() if _meta(conn, f"view:{n}") != _digest(sql)}


def _digest(sql: str) -> str:
    return hashlib.sha256(sql.encode()).hexdigest()[:16]


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None


# A number as it is written to be read as one: no leading zeros ('007' is a label), no '+',
# no '_' and no nan or inf, which Python's int() and float() would take
_NUMBER = re.compile(r"-?((0|[1-9][0-9]*)(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def typed(value: str) -> int | float | str:
    """A value typed on the command line, as a view column holds it: '16' -> 16, '0.5' ->
    0.5, anything else as text ('007', 'nan'). View columns come from json_extract, so they
    are typed, and the text '16' would never equal the integer 16."""
    if not _NUMBER.fullmatch(value.strip()):
        return value
    for kind in (int, float):
        try:
            number = kind(value)
        except ValueError:
            continue
        if kind is int and not -(2**63) <= number < 2**63:
            raise ValueError(f"{value} is outside SQLite's 64-bit integer range")
        return number if math.isfinite(number) else value
    return value
