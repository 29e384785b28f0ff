"""Moving rows between results stores: export to CSV/JSONL, and merge one store into another.

Why merge works at all: docs/store.md gives `invocations.id` and `runs.id` UUIDs, so a store
filled on an H100 box and one filled on an A100 box never reuse an id for different points,
and the same row merged twice keeps its id. Merging is therefore `INSERT OR IGNORE` keyed
on those ids (https://sqlite.org/lang_conflict.html), all in one transaction so that an
error leaves this store as it was. `kernel_stats` rows carry a local INTEGER id, not a
UUID, so they are copied only for runs the merge newly added (copying them for a run that
was already here would duplicate its profile).

OTHER is never written to. It is read through SQLite's online backup API into a temporary
snapshot (https://sqlite.org/backup.html), which gives a consistent copy even while another
process writes OTHER; an older schema is migrated in that snapshot, never in OTHER.
Library code: nothing here prints; errors are `StoreError` with a message for the user.
"""

from __future__ import annotations

import csv
import json
import os
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from cs336sys.measure.scratch import scratch
from cs336sys.store import schema
from cs336sys.store.db import (
    _PROVENANCE_COLUMNS,
    Store,
    StoreError,
    check_path,
    damage,
    open_untouched,
    store_problem,
)
from cs336sys.store.transaction import immediate

FORMATS = ("csv", "jsonl")

# Per run, in this order: the run's own columns, then its invocation's provenance.
RUN_COLUMNS = (
    "run_id",
    "invocation_id",
    "experiment",
    "status",
    "error",
    "started",
    "created",
    "duration_s",
    "point_key",
)
INVOCATION_COLUMNS = ("command", "argv", "label", *_PROVENANCE_COLUMNS)


# -- export ----------------------------------------------------------------------------


def known_experiments(conn: sqlite3.Connection, experiments: Sequence[Any] = ()) -> list[str]:
    """Experiments a filter may name: those declared (`experiments`), then any other stored
    in `runs`."""
    names = [e.kind for e in experiments]
    stored = [r[0] for r in conn.execute("SELECT DISTINCT experiment FROM runs ORDER BY 1")]
    return list(dict.fromkeys([*names, *stored]))


def records(
    conn: sqlite3.Connection,
    experiments: Sequence[str] = (),
    samples: bool = False,
    condition: tuple[str, Sequence[Any]] | None = None,
) -> Iterator[dict[str, Any]]:
    """One dict per run (oldest first), with provenance and parsed settings/metrics.

    `condition` is extra SQL over `runs r` joined with `invocations i` and its parameters
    (what `db export --since/--where` selects, built by report/select.py). Reads `SELECT r.*`
    and picks columns by name, so a store at an older schema version (no `point_key` before
    v2, no `label` before v4) exports too, with those fields None.
    """
    conds, params = [], list(experiments)
    if experiments:
        conds.append(f"r.experiment IN ({', '.join('?' * len(experiments))})")
    if condition is not None:
        conds.append(f"({condition[0]})")
        params.extend(condition[1])
    where = f"WHERE {' AND '.join(conds)}" if conds else ""
    present = {r[1] for r in conn.execute("PRAGMA table_info(invocations)")}
    inv_cols = ", ".join(f"i.{c} AS inv_{c}" if c in present else f"NULL AS inv_{c}"
                         for c in INVOCATION_COLUMNS)
    cursor = conn.execute(
        f"SELECT r.*, {inv_cols} FROM runs r LEFT JOIN invocations i ON i.id = r.invocation_id "
        f"{where} ORDER BY r.created, r.id",
        params,
    )
    names = [d[0] for d in cursor.description]
    for values in cursor:
        row = dict(zip(names, values, strict=True))
        rec: dict[str, Any] = {c: row.get("id" if c == "run_id" else c) for c in RUN_COLUMNS}
        rec.update({c: row[f"inv_{c}"] for c in INVOCATION_COLUMNS})
        rec["settings"] = _loads(row, "settings", {})
        rec["metrics"] = _loads(row, "metrics", {})
        if samples:
            rec["samples"] = _loads(row, "samples", None)
        yield rec


class MalformedRun(ValueError):
    """A stored run whose JSON column does not parse (a row edited by hand)."""


def _loads(row: dict[str, Any], column: str, default: Any) -> Any:
    text = row.get(column)
    try:
        return default if text is None else json.loads(text)
    except json.JSONDecodeError as exc:
        raise MalformedRun(f"run {row.get('id')}: its {column} is not JSON ({exc.msg})") from None


def write_jsonl(recs: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """One JSON object per line (https://jsonlines.org), settings/metrics kept nested."""
    n = 0
    for rec in recs:
        out.write(json.dumps(rec) + "\n")
        n += 1
    return n


def write_csv(recs: Iterable[dict[str, Any]], out: IO[str]) -> int:
    """A header row, then one row per run; settings.* and metrics.* become columns.

    The columns are the union of keys over the exported runs, in order of first
    appearance, so two exports of the same rows have the same header. Cells: None is
    empty, booleans/lists/dicts are JSON text, numbers are Python's shortest repr (which
    float() reads back exactly).
    """
    rows = list(recs)  # the header needs every run's keys before the first row is written
    keys: dict[str, dict[str, None]] = {"settings": {}, "metrics": {}}
    for rec in rows:
        for part in ("settings", "metrics"):
            keys[part].update(dict.fromkeys(rec[part]))
    base = [*RUN_COLUMNS, *INVOCATION_COLUMNS]
    flat = [f"{part}.{k}" for part in ("settings", "metrics") for k in keys[part]]
    tail = ["samples"] if rows and "samples" in rows[0] else []
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow([*base, *flat, *tail])
    for rec in rows:
        cells = [rec[c] for c in base]
        cells += [rec[p].get(k) for p in ("settings", "metrics") for k in keys[p]]
        cells += [rec[c] for c in tail]
        writer.writerow([_cell(v) for v in cells])
    return len(rows)


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, (bool, list, dict)):
        return json.dumps(value)
    return str(value)


def export(
    conn: sqlite3.Connection,
    out: IO[str],
    fmt: str,
    experiments: Sequence[str] = (),
    samples: bool = False,
    condition: tuple[str, Sequence[Any]] | None = None,
) -> int:
    """Write the runs (all, or of `experiments`, and meeting `condition`: see `records`) to
    `out`; returns how many."""
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {FORMATS}, not {fmt!r}")
    recs = records(conn, experiments, samples, condition)
    return write_csv(recs, out) if fmt == "csv" else write_jsonl(recs, out)


# -- merge -----------------------------------------------------------------------------


@dataclass(frozen=True)
class MergeCounts:
    """What a merge did. `*_differing`: ids present in both stores with different content
    (this store's row was kept; e.g. an invocation still running when OTHER was copied);
    `invocations_finished`: those running here and finished in OTHER, given OTHER's end."""

    other_version: int
    invocations_added: int
    invocations_present: int
    invocations_differing: int
    invocations_finished: int  # running here, finished in OTHER: their end copied
    runs_added: int
    runs_present: int
    runs_differing: int
    kernel_stats_added: int
    # "table.column" of OTHER's that --db lacks (a column a user added there): not copied
    columns_left: tuple[str, ...] = ()


def check_other(other: str | Path, this: str | Path) -> Path:
    """Refuse an OTHER that is missing, not a SQLite file, or the same file as THIS."""
    other = check_path(other)
    if not other.exists():
        raise StoreError(f"no results store at {other}")
    if other.stat().st_size == 0:
        raise StoreError(f"{other} is empty, not a results store")
    this = Path(this)
    if this.exists() and os.path.samefile(other, this):
        raise StoreError(f"{other} is the store being merged into (--db); nothing to merge")
    return other


def _open_other(path: str | Path) -> sqlite3.Connection:
    path = check_path(path)
    if not path.exists():
        raise StoreError(f"no results store at {path} (run an experiment first, or pass --db)")
    try:
        return open_untouched(path)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc


def snapshot(other: Path, dest: Path) -> int:
    """Copy OTHER into `dest` with the backup API, migrate the copy; returns OTHER's version."""
    try:
        src = _open_other(other)
        try:
            dst = sqlite3.connect(dest, isolation_level=None)
            try:
                src.backup(dst)
                found = schema.version(dst)
                problem = store_problem(dst) or damage(dst)
                if problem:
                    raise StoreError(f"{other} {problem}")
                schema.migrate(dst)  # refuses a newer version; migrates an older one
                orphan = _orphans(dst)
                if orphan:
                    raise StoreError(f"{other} {orphan}; nothing merged")
            finally:
                dst.close()
        finally:
            src.close()
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot read {other}: {exc}") from exc
    except schema.SchemaError as exc:
        raise StoreError(f"{other}: {exc}") from exc
    return found


def _orphans(conn: sqlite3.Connection) -> str | None:
    """What in the store behind `conn` names a row it lacks (a run of an invocation it does
    not hold: a store edited or cut by hand), in words, or None; the merge failed on it with
    SQLite's "FOREIGN KEY constraint failed" alone."""
    found = conn.execute("PRAGMA foreign_key_check").fetchall()  # (table, rowid, parent, fk)
    if not found:
        return None
    table, rowid, parent, _ = found[0]
    key = conn.execute(f"SELECT * FROM {table} WHERE rowid = ?", (rowid,)).fetchone()
    more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
    return (f"has rows that name a row of {parent} it does not hold: {table} {key[0]!r}"
            f"{more}")


def merge(this: str | Path, other: str | Path, experiments: Sequence[Any] | None = None,
          committed: Callable[[MergeCounts], None] | None = None) -> MergeCounts:
    """Add OTHER's invocations, runs and their kernel_stats to THIS, in one transaction.

    THIS is created if missing and migrated like any store opened for writing, its views
    brought up to date with `experiments` (the catalog) when given. `committed(counts)` is
    called as the transaction commits, with no signal handled between the two: whoever
    reports a stop then reports the merge (the CLI's last line after a Ctrl-C).
    """
    other = check_other(other, this)
    with scratch("cs336sys-merge-") as tmp:  # a killed merge's copy goes at the next
        copy = Path(tmp) / "other.db"
        found = snapshot(other, copy)

        def report(counts: dict[str, int]) -> None:
            if committed is not None:
                committed(MergeCounts(other_version=found, **counts))

        with Store(this, experiments) as store:
            counts = _merge_attached(store.conn, copy, report)
    return MergeCounts(other_version=found, **counts)


def _columns(conn: sqlite3.Connection, table: str) -> list[str]:
    """The columns of `table` in both stores: a column the user added to one (docs/store.md
    keeps them) is left at its default in this store's new rows, or not copied."""
    # PRAGMA takes no parameters; `table` is one of our own table names.
    there = {r[1] for r in conn.execute(f"PRAGMA other.table_info({table})")}
    return [r[1] for r in conn.execute(f"PRAGMA main.table_info({table})") if r[1] in there]


def _only_other(conn: sqlite3.Connection, table: str) -> list[str]:
    """OTHER's columns of `table` that this store lacks (a column a user added there): what
    a merge does not copy, and says so."""
    here = set(_columns(conn, table))
    return [r[1] for r in conn.execute(f"PRAGMA other.table_info({table})") if r[1] not in here]


def _merge_attached(conn: sqlite3.Connection, copy: Path,
                    committed: Callable[[dict[str, int]], Any]) -> dict[str, int]:
    """INSERT OR IGNORE from the attached snapshot. `conn` is in autocommit mode."""
    conn.execute("ATTACH DATABASE ? AS other", (str(copy),))
    counts: dict[str, int] = {}
    try:
        with immediate(conn, committed=lambda: committed(counts)):
            # An invocation still running when THIS copied it and finished in OTHER takes
            # its end from OTHER: filled in, nothing this store holds is replaced.
            counts["invocations_finished"] = conn.execute(
                "UPDATE main.invocations SET (finished, exit_status) = (SELECT o.finished, "
                "o.exit_status FROM other.invocations o WHERE o.id = main.invocations.id) "
                "WHERE finished IS NULL AND exit_status IS NULL AND id IN (SELECT id FROM "
                "other.invocations WHERE finished IS NOT NULL)"
            ).rowcount
            counts["columns_left"] = tuple(f"{table}.{c}" for table in ("invocations", "runs")
                                           for c in _only_other(conn, table))
            for table in ("invocations", "runs"):
                cols = _columns(conn, table)
                total = conn.execute(f"SELECT count(*) FROM other.{table}").fetchone()[0]
                same = " AND ".join(f"m.{c} IS o.{c}" for c in cols)
                differing = conn.execute(
                    f"SELECT count(*) FROM other.{table} o JOIN main.{table} m ON m.id = o.id "
                    f"WHERE NOT ({same})"
                ).fetchone()[0]
                col_list = ", ".join(cols)
                added = conn.execute(
                    f"INSERT OR IGNORE INTO main.{table} ({col_list}) "
                    f"SELECT {col_list} FROM other.{table} ORDER BY rowid"
                ).rowcount
                counts.update(
                    {
                        f"{table}_added": added,
                        f"{table}_present": total - added,
                        f"{table}_differing": differing,
                    }
                )
            # kernel_stats.id is a local rowid: let THIS number the copied rows. They are
            # copied for every run of OTHER that has none here: the new runs, and runs that
            # an older cs336sys stored without them (a Ctrl-C between the two writes).
            conn.execute(
                "CREATE TEMP TABLE merge_stats_runs AS SELECT DISTINCT run_id FROM "
                "other.kernel_stats WHERE run_id IN (SELECT id FROM main.runs) AND run_id NOT "
                "IN (SELECT run_id FROM main.kernel_stats)"
            )
            cols = ", ".join(c for c in _columns(conn, "kernel_stats") if c != "id")
            counts["kernel_stats_added"] = conn.execute(
                f"INSERT INTO main.kernel_stats ({cols}) SELECT {cols} FROM other.kernel_stats "
                "WHERE run_id IN (SELECT run_id FROM temp.merge_stats_runs) ORDER BY id"
            ).rowcount
            conn.execute("DROP TABLE temp.merge_stats_runs")
    except sqlite3.IntegrityError as exc:  # rolled back
        raise StoreError(f"merge refused, nothing written: {exc}") from exc
    finally:
        conn.execute("DETACH DATABASE other")
    return counts


__all__ = [
    "FORMATS",
    "MergeCounts",
    "check_other",
    "export",
    "known_experiments",
    "merge",
    "open_untouched",
    "records",
    "snapshot",
    "write_csv",
    "write_jsonl",
]
