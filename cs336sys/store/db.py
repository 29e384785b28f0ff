"""The results store: one SQLite file, written by experiments, read by SQL and reports.

Layout and rules are in docs/store.md: `invocations` (one per CLI call, with provenance),
`runs` (one per measured point, UUID ids), one view per experiment, WAL so several
processes can write, and rows written as each point finishes.
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cs336sys.measure.clock import now
from cs336sys.store import schema
from cs336sys.store.guard import (
    BUSY_TIMEOUT_S,
    StoreError,
    check_path,
    damage,
    no_tables,
    open_untouched,
    readable_immutable,
    store_problem,
)
from cs336sys.store.transaction import immediate
from cs336sys.store.views import ensure_views, stale_views, view_sql
from cs336sys.sweep.points import point_key

__all__ = ["STATUSES", "Store", "StoreError", "check_path", "connect_readonly", "damage", "no_tables",
           "now", "open_untouched", "point_key", "readable_immutable", "store_problem"]

STATUSES = ("ok", "wrong", "oom", "error", "skipped")
NONFINITE = "nonfinite"  # the metrics key of those that came out inf or NaN (_metrics_json)


def _dumps(obj: Any) -> str:
    # NaN/inf are not JSON; store them as null rather than produce unreadable JSON.
    return json.dumps(_finite(obj), default=str)


def _metrics_json(metrics: dict[str, Any]) -> str:
    """A run's metrics as JSON: a metric that came out infinite or NaN (an fp16 sum past
    65504, a diverged loss) is null in its column, which stays a number, and kept by name
    under `nonfinite` ({"result": "inf"}): the overflow is the finding, not a lost value."""
    odd = {k: str(v) for k, v in metrics.items() if isinstance(v, float) and not math.isfinite(v)}
    if odd:
        metrics = {**metrics, NONFINITE: {**(metrics.get(NONFINITE) or {}), **odd}}
    return _dumps(metrics)


def _finite(obj: Any) -> Any:
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def _wal(conn: sqlite3.Connection) -> None:
    """Put the store in WAL mode (several writers, readers never blocked). Switching needs
    the file to itself, and SQLite answers "database is locked" at once, without its busy
    timeout, while another process is creating the same new store: wait for it here."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    while True:
        try:
            if conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                conn.execute("PRAGMA journal_mode = WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.05)


class Store:
    """A results store opened for writing; migrates an older schema on open. With
    `experiments` (every declaration: experiments/catalog.py), its views are brought up to
    date with them; `ensure_views` does it for some."""

    def __init__(self, path: str | Path, experiments: Sequence[Any] | None = None):
        self.path = check_path(path, writing=True)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a read-only file system, /proc, a parent it may not write
            raise StoreError(f"cannot create the folder of {self.path}: "
                             f"{exc.strerror or exc}") from None
        try:
            conn = sqlite3.connect(self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            _wal(conn)
            schema.migrate(conn)  # before foreign keys are on: v6 rebuilds `runs`
            conn.execute("PRAGMA foreign_keys = ON")
            if experiments is not None:
                ensure_views(conn, experiments, complete=True)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot open {self.path}: {exc}") from exc
        except schema.SchemaError as exc:
            raise StoreError(f"{self.path}: {exc}") from exc
        import sqlite_utils  # here, not at the top: it imports numpy, and `cs336sys sql` must not

        self.conn = conn
        self.db = sqlite_utils.Database(conn)

    def ensure_views(self, experiments: Sequence[Any]) -> None:
        """The views of these experiments, as they declare them now (store/views.py)."""
        try:
            ensure_views(self.conn, experiments)
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot update the views of {self.path}: {exc}") from exc

    def close(self) -> None:
        # The last connection to close folds the WAL into the store and deletes it; while a
        # reader (browse's Datasette) holds the store open, it stays, and a copy of the .db
        # alone (scp of results.db) lacked the runs in it. A passive checkpoint copies them
        # in without waiting on anyone (https://sqlite.org/wal.html#checkpointing).
        try:
            self.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
        except sqlite3.Error:  # a store that cannot take it now: the next writer's turn
            pass
        self.conn.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- writing --------------------------------------------------------------------------

    def begin_invocation(
        self, provenance: dict[str, Any], argv: list[str], command: str, label: str | None = None
    ) -> str:
        inv_id = str(uuid.uuid4())
        row = {k: provenance.get(k) for k in _PROVENANCE_COLUMNS}
        row.update(id=inv_id, command=command, argv=json.dumps(argv), started=now(), label=label)
        self.db["invocations"].insert(row)
        return inv_id

    def finish_invocation(self, invocation_id: str, exit_status: int,
                          busy_s: float | None = None) -> None:
        """Record the invocation's end, waiting for another writer's lock at most `busy_s`
        (default: the connection's busy timeout)."""
        conn = self.db.conn
        (busy_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()
        if busy_s is not None:
            conn.execute(f"PRAGMA busy_timeout = {int(busy_s * 1000)}")
        try:
            self.db["invocations"].update(
                invocation_id, {"finished": now(), "exit_status": int(exit_status)})
        finally:
            conn.execute(f"PRAGMA busy_timeout = {busy_ms}")

    def add_run(
        self,
        invocation_id: str,
        experiment: str,
        status: str,
        settings: dict[str, Any],
        metrics: dict[str, Any] | None = None,
        samples: dict[str, Any] | None = None,
        error: str | None = None,
        started: str | None = None,
        duration_s: float | None = None,
        tables: dict[str, list[dict[str, Any]]] | None = None,
        committed: Callable[[], Any] | None = None,
    ) -> str:
        """Write one measured point at once (so a crash later keeps it); returns its id.

        `tables` holds rows for tables linked to the run (`kernel_stats`), written in the same
        transaction: a run is never stored without them (Ctrl-C between the two writes used
        to leave an `ok` profile run with no kernel_stats). `committed()` is called once the
        row is in, also when a signal's exception surfaces right after (store/transaction.py)."""
        if status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, not {status!r}")
        for table in tables or {}:
            if table not in _LINKED_TABLES:
                raise ValueError(f"no table {table!r} is linked to runs; known: {_LINKED_TABLES}")
        run_id = str(uuid.uuid4())
        row = {
            "id": run_id,
            "invocation_id": invocation_id,
            "experiment": experiment,
            "status": status,
            "error": error,
            "settings": _dumps(settings),
            "metrics": _metrics_json(metrics or {}),
            "samples": None if samples is None else _dumps(samples),
            "started": started,
            "created": now(),
            "duration_s": duration_s,
            "point_key": point_key(experiment, settings),
        }
        with immediate(self.conn, committed):
            self.conn.execute(
                f"INSERT INTO runs ({', '.join(row)}) VALUES ({', '.join('?' * len(row))})",
                tuple(row.values()),
            )
            for table, rows in (tables or {}).items():
                self._insert_linked(table, run_id, rows)
        return run_id

    def _insert_linked(self, table: str, run_id: str, rows: list[dict[str, Any]]) -> None:
        """Rows of a table linked to runs (within the caller's transaction, or autocommit)."""
        for row in rows:
            full = {**row, "run_id": run_id}
            self.conn.execute(
                f"INSERT INTO {table} ({', '.join(full)}) VALUES ({', '.join('?' * len(full))})",
                tuple(full.values()),
            )

    def update_metrics(self, run_id: str, updates: dict[str, Any]) -> None:
        """Set metrics of a stored run (a value derived once its sweep group had run)."""
        metrics = json.loads(self.db["runs"].get(run_id)["metrics"])
        # what the update sets is what it is now: no longer inf or NaN where it was
        gone = {k: v for k, v in (metrics.pop(NONFINITE, None) or {}).items() if k not in updates}
        metrics.update(updates, **({NONFINITE: gone} if gone else {}))
        self.db["runs"].update(run_id, {"metrics": _metrics_json(metrics)})

    def add_kernel_stats(self, run_id: str, rows: list[dict[str, Any]]) -> int:
        """Write a profiled run's op/kernel summary (`kernel_stats`, linked to runs.id)."""
        with immediate(self.conn):
            self._insert_linked("kernel_stats", run_id, rows)
        return len(rows)

    # -- reading --------------------------------------------------------------------------

    def done_points(self, experiment: str, provenance: dict[str, Any],
                    label: str | None = None) -> set[str]:
        """Point keys already stored with status ok by the same code on the same machine (for
        --resume): the same git commit (outside a checkout, an installed package: the same
        cs336sys version), host, GPU (name and count) or CPU model, torch, Triton and CUDA
        versions, and measurement environment (provenance.measurement_env); with a `label`,
        only those stored under it (a labelled run resumes itself: `handout run` measures
        each problem's points under its name). A point merged from another machine, or run
        with other switches, is run again."""
        return done_points(self.conn, experiment, provenance, label)

    def query(self, sql: str, params: tuple | dict = ()) -> list[dict[str, Any]]:
        return list(self.db.query(sql, params))


def done_points(conn: sqlite3.Connection, experiment: str, provenance: dict[str, Any],
                label: str | None = None) -> set[str]:
    """Store.done_points on any connection to a store (a read-only one for --dry-run)."""
    if provenance.get("git_commit") is None and provenance.get("cs336sys_version") is None:
        return set()
    same = " AND ".join(f"i.{c} IS ?" for c in MACHINE)
    labelled = (" AND i.label = ?" if label is not None else "", (label,) if label is not None else ())
    rows = conn.execute(
        "SELECT r.point_key, r.id, json_extract(r.metrics, '$.code'), i.user_repo FROM runs r "
        f"JOIN invocations i ON i.id = r.invocation_id WHERE r.experiment = ? AND "
        f"r.status = 'ok' AND {same}" + labelled[0],
        (experiment, *(provenance.get(c) for c in MACHINE), *labelled[1]),
    )
    now_digest: dict[Path, str | None] = {}
    done = {(key, run) for key, run, code, repo in rows
            if code is None or _same_code(code, repo, now_digest)}
    # the point's latest run on this GPU, what `handout` and the writeup show, must be one of
    # those: code edited (stored wrong), then put back, is measured again, not left reading
    # the edit's verdict
    latest = dict(conn.execute(
        "SELECT r.point_key, r.id FROM runs r JOIN invocations i ON i.id = r.invocation_id "
        "WHERE r.experiment = ? AND i.gpu IS ?" + labelled[0] + " ORDER BY r.created, r.rowid",
        (experiment, provenance.get("gpu"), *labelled[1])).fetchall())
    return {key for key, run in done if latest.get(key) == run}


def _same_code(code: str, repo: str | None, digests: dict[Path, str | None]) -> bool:
    """Whether every file a stored point's user code came from (its `code`: path, relative
    to the user's repository, -> sha256) still holds that content: an edit to it is measured
    again by --resume, committed or not, in a checkout without commits or outside git.
    `digests` keeps each file's sha256 across the points of one call."""
    try:
        files = json.loads(code)
    except ValueError:
        return False
    for shown, digest in files.items() if isinstance(files, dict) else ():
        path = Path(shown) if Path(shown).is_absolute() or repo is None else Path(repo) / shown
        if path not in digests:
            try:
                digests[path] = hashlib.sha256(path.read_bytes()).hexdigest()
            except OSError:
                digests[path] = None
        if digests[path] != digest:
            return False
    return True


_LINKED_TABLES = ("kernel_stats",)
# What makes two stored points the same measurement besides their settings (--resume).
# The user's code is part of it: their commit, their uncommitted Python code and adapters
# file (cs336sys's own dirty tree is not told apart). cs336sys's version stands for its code
# where there is no commit (a package installed from a wheel).
MACHINE = ("git_commit", "cs336sys_version", "host", "gpu", "gpu_count", "cpu", "torch_version",
           "triton_version", "cuda_version", "env", "user_commit", "user_changes",
           "adapters_sha256")
_PROVENANCE_COLUMNS = (
    "host",
    "device",
    "gpu",
    "gpu_count",
    "gpu_memory_gb",
    "cpu",
    "cuda_version",
    "driver_version",
    "torch_version",
    "triton_version",
    "python_version",
    "cs336sys_version",
    "git_commit",
    "git_dirty",
    "env",
    "user_repo",
    "user_commit",
    "user_dirty",
    "user_changes",
    "adapters",
    "adapters_sha256",
)


def connect_readonly(path: str | Path,
                     experiments: Callable[[], Sequence[Any]] | None = None) -> sqlite3.Connection:
    """A connection that can neither change the store nor create any file: opened untouched
    (see open_untouched) and query_only, with an authorizer that refuses ATTACH (which
    would create the attached file) before SQLite touches the filesystem.

    A store of an older schema, or whose views another cs336sys made (an older checkout that
    stored a point last rebuilds them to its own columns, and a reader of those would miss
    columns or read another statistic), is read as it would be after migrating: it is
    copied into memory, the copy migrated and given the current views of `experiments` (a
    function returning the catalog). The file stays as it is."""
    path = check_path(path)
    if not path.exists():
        raise StoreError(f"no results store at {path} (run an experiment first, or pass --db)")
    try:
        conn = open_untouched(path)
        found = schema.version(conn)
        if found <= schema.SCHEMA_VERSION and store_problem(conn) is None and (
                found < schema.SCHEMA_VERSION
                or (experiments is not None and stale_views(
                    conn, {e.view: view_sql(e) for e in experiments()}))):
            conn = _migrated_copy(conn, experiments)
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"cannot open {path}: {exc}") from exc
    conn.set_authorizer(_read_only)
    return conn


def _migrated_copy(conn: sqlite3.Connection,
                   experiments: Callable[[], Sequence[Any]] | None) -> sqlite3.Connection:
    """An in-memory copy of the store behind `conn` (closed), migrated, query_only."""
    copy = sqlite3.connect(":memory:", isolation_level=None)
    conn.backup(copy)
    conn.close()
    schema.migrate(copy)
    if experiments is not None:
        ensure_views(copy, experiments(), complete=True)
    copy.execute("PRAGMA query_only = ON")
    return copy


# PRAGMAs that take an argument and only read (https://sqlite.org/pragma.html); any other
# given a value sets something, which a read-only connection would answer as if it had.
_READING_PRAGMAS = frozenset({
    "table_info", "table_xinfo", "table_list", "index_list", "index_info", "index_xinfo",
    "foreign_key_list", "foreign_key_check", "quick_check", "integrity_check",
})


def _read_only(action: int, *args: object) -> int:
    # ATTACH (and VACUUM INTO, which attaches its target) would create files; DETACH is
    # refused with it; so is a PRAGMA that sets a value (`journal_mode = DELETE` answered
    # `delete` and changed nothing). Everything else a read-only, query_only connection may do.
    if action in (sqlite3.SQLITE_ATTACH, sqlite3.SQLITE_DETACH):
        return sqlite3.SQLITE_DENY
    if action == sqlite3.SQLITE_PRAGMA and args[1] is not None \
            and str(args[0]).lower() not in _READING_PRAGMAS:
        return sqlite3.SQLITE_DENY
    return sqlite3.SQLITE_OK
