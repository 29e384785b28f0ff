"""The results store: one SQLite file, written by experiments, read by SQL and reports.

Layout and rules are in docs/store.md: `invocations` (one per CLI call, with provenance),
`runs` (one per measured point, UUID ids), one view per experiment, WAL so several
processes can write, and rows written as each point finishes.
"""

from __future__ import annotations

import json
import os
import sqlite3
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from cs336sys.measure.clock import now
from cs336sys.store import schema
from cs336sys.store.transaction import immediate
from cs336sys.store.views import ensure_views
from cs336sys.sweep.points import point_key

__all__ = ["STATUSES", "Store", "StoreError", "check_path", "connect_readonly", "damage", "now",
           "open_untouched", "point_key", "readable_immutable", "store_problem"]

SQLITE_HEADER = b"SQLite format 3\x00"
STATUSES = ("ok", "wrong", "oom", "error", "skipped")
# How long a writer waits for another process's write lock before giving up.
BUSY_TIMEOUT_S = 60.0


class StoreError(Exception):
    """The store cannot be opened or used; the message is meant for the user."""


def _kind_of(path: Path) -> str:
    """What a path that exists but is no regular file or directory is, in words."""
    import stat

    mode = path.stat().st_mode
    for test, words in ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                        (stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return words
    return "not a regular file"


# The files SQLite keeps beside a database (https://sqlite.org/tempfiles.html): it opens them
# by name, so one that is a directory, a FIFO or a link made it fail mid-command (a directory
# as `-wal`: IsADirectoryError out of sql, report, db export, plan).
SIDE_FILES = ("-wal", "-shm", "-journal")


def _check_side_files(path: Path) -> None:
    """Refuse a store whose side file exists and is not a regular file this process may read
    and write (a symlink too: SQLite would write through it wherever it points)."""
    import os

    for end in SIDE_FILES:
        side = path.with_name(path.name + end)
        if not os.path.lexists(side):
            continue
        if side.is_symlink():
            what = "a symbolic link"
        elif side.is_dir():
            what = "a directory"
        elif not side.is_file():
            what = _kind_of(side)
        elif not os.access(side, os.R_OK | os.W_OK):
            what = "a file this process may not read and write"
        else:
            continue
        raise StoreError(f"{side} is {what}, not the regular file SQLite keeps beside {path.name}: "
                         "move it away")


def check_path(path: str | Path, writing: bool = False) -> Path:
    """Refuse, before anything is written or created, a path that cannot be a results store:
    a directory, a device, pipe or socket, a path under a file, a file that is not SQLite, and a
    SQLite database that is not a results store (someone's own database, or a file that
    claims a schema version whose tables it lacks: never written into, not even its journal
    mode). A missing or empty file, or a SQLite database with nothing in it, is fine: it
    becomes a store. `writing`: the caller will write, so a store of a newer schema than
    this code's, or one whose pages are damaged (SQLite's quick_check), is refused too,
    before the first write switches it to WAL."""
    path = Path(path)
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a SQLite database")
    _check_side_files(path)
    if path.exists() and not path.is_file():  # stat follows a symlink to what it names
        # /dev/null read as an empty store and took writes into nothing; a FIFO hung
        raise StoreError(f"{path} is {_kind_of(path)}, not a file: a results store is a file")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise StoreError(f"{path}: {parent} is a file, not a directory")
            break
    if writing and path.exists() and not os.access(path, os.W_OK):
        # SQLite would open it read-only, create its -wal and -shm beside it (which then
        # stop every later reader), and fail at the first write with a traceback
        raise StoreError(f"{path} is read-only for this user: nothing can be stored in it; "
                         f"give another --db, or read it (report, sql) as it is")
    if path.exists() and path.stat().st_size > 0:
        with open(path, "rb") as f:
            if f.read(len(SQLITE_HEADER)) != SQLITE_HEADER:
                raise StoreError(f"{path} is not a SQLite database")
        try:
            conn = open_untouched(path)
            try:
                problem = None if _no_tables(conn) else store_problem(conn)
                if problem is None and schema.version(conn):  # tables or none, it claims some
                    problem = (store_problem(conn) and
                               f"claims cs336sys's schema version {schema.version(conn)} but "
                               f"lacks its tables")
                if writing and problem is None:
                    problem = _unwritable(conn)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if problem:
            raise StoreError(f"{path} {problem}; refusing to touch it")
    return path


def _no_tables(conn: sqlite3.Connection) -> bool:
    """An empty database, or a store another process is creating right now: it switched the
    new file to WAL, and its migration (one transaction) has not committed yet. Either way
    it becomes a store, like an empty file; refusing it made one of two processes that open a
    new store at once fail (a flaky test_store test)."""
    return conn.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0


def store_problem(conn: sqlite3.Connection) -> str | None:
    """Why the database behind `conn` is not a results store, or None when it is one: a
    schema version and the tables and columns that version has."""
    tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if not {"meta", "invocations", "runs"} <= tables:
        return "is a SQLite database but not a results store (it lacks cs336sys's tables)"
    if schema.version(conn) == 0:  # the tables, and no version: `.dump` does not keep it
        return ("has cs336sys's tables but no schema version (PRAGMA user_version is 0, as "
                "after `sqlite3 old.db .dump | sqlite3 new.db`); copy a store with `sqlite3 "
                "old.db '.backup new.db'` or `cs336sys db merge`, or set the version it was "
                f"dumped at (`PRAGMA user_version = {schema.SCHEMA_VERSION}` for this "
                "cs336sys's stores)")
    lacks = schema.lacking(conn)
    if lacks:
        return f"is not the results store it claims to be: {lacks}"
    return None


def _unwritable(conn: sqlite3.Connection) -> str | None:
    """Why a results store must not be written by this code: a newer schema (refused before
    anything, where migrate would refuse it after the switch to WAL), or damaged pages.
    quick_check reads every page once (https://sqlite.org/pragma.html#pragma_quick_check):
    19 ms for a store of 10,000 runs (benchmarks/store_check.py)."""
    found = schema.version(conn)
    if found > schema.SCHEMA_VERSION:
        return (f"has schema version {found}, newer than this cs336sys knows "
                f"({schema.SCHEMA_VERSION}); upgrade cs336sys")
    return damage(conn)


def damage(conn: sqlite3.Connection) -> str | None:
    """'is damaged (...)' with the first fault SQLite's quick_check finds, on one line; None
    when the pages read back whole. A store whose pages were cut or overwritten still opens,
    and copies, without complaint: it fails at the first query that reads a broken page."""
    verdict = conn.execute("PRAGMA quick_check(1)").fetchone()[0]
    if verdict == "ok":
        return None
    fault = [line for line in verdict.splitlines() if not line.startswith("***")]
    return f"is damaged (SQLite's quick_check: {' '.join(fault) or verdict})"


def open_untouched(path: str | Path) -> sqlite3.Connection:
    """Open a store for reading without leaving any trace beside it.

    A read-only open of a WAL-mode database creates `-wal`/`-shm` files beside it and
    leaves them there (https://sqlite.org/wal.html, "Read-Only Databases"). When the store
    has no `-wal` file no connection has it open in WAL mode (SQLite keeps the file while
    one does), so it is read with `immutable=1`, which creates nothing and also reads from
    read-only media; with both a `-wal` and a `-shm` (a writer has it open, or was killed)
    plain `mode=ro` reads the live WAL consistently. A `-wal` without its `-shm` (a writer
    killed, the `-shm` removed) holds committed rows that only a WAL recovery reads, and the
    recovery writes a new `-shm`: that store is read from a copy (see _read_a_copy). (A
    writer that opens the store during an immutable read is not seen by it.)
    """
    path = Path(path)
    uri = path.resolve().as_uri()
    wal, shm = (path.with_name(path.name + end) for end in ("-wal", "-shm"))
    if wal.exists() and not shm.exists():
        conn = _read_a_copy(path, wal)
        if conn is not None:
            return conn
    uri += "?mode=ro&immutable=1" if readable_immutable(path) else "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    conn.execute("PRAGMA query_only = ON")
    return conn


def readable_immutable(path: str | Path) -> bool:
    """Whether the store can be read with `immutable=1`, which leaves nothing beside it: it
    has no `-wal`, so no connection has it open in WAL mode (see open_untouched)."""
    path = Path(path)
    return not path.with_name(path.name + "-wal").exists()


def _read_a_copy(path: Path, wal: Path) -> sqlite3.Connection | None:
    """The store and its WAL copied to a temporary folder, recovered there and read into
    memory; None when a writer opened the store meanwhile (its `-shm` is back: read the
    live file instead)."""
    import shutil
    import tempfile

    with tempfile.TemporaryDirectory(prefix="cs336sys-read-") as tmp:
        copy = Path(tmp) / path.name
        shutil.copyfile(path, copy)
        try:
            shutil.copyfile(wal, Path(tmp) / wal.name)
        except FileNotFoundError:  # checkpointed and removed since: the copy has it all
            pass
        if path.with_name(path.name + "-shm").exists():
            return None
        source = sqlite3.connect(copy)
        try:
            memory = sqlite3.connect(":memory:", timeout=BUSY_TIMEOUT_S)
            source.backup(memory)
        finally:
            source.close()
    memory.execute("PRAGMA query_only = ON")
    return memory


def _dumps(obj: Any) -> str:
    # NaN/inf are not JSON; store them as null rather than produce unreadable JSON.
    return json.dumps(_finite(obj), default=str)


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
        self.path.parent.mkdir(parents=True, exist_ok=True)
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

    def finish_invocation(self, invocation_id: str, exit_status: int) -> None:
        self.db["invocations"].update(
            invocation_id, {"finished": now(), "exit_status": int(exit_status)}
        )

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
            "metrics": _dumps(metrics or {}),
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
        metrics.update(updates)
        self.db["runs"].update(run_id, {"metrics": _dumps(metrics)})

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
    rows = conn.execute(
        "SELECT r.point_key FROM runs r JOIN invocations i ON i.id = r.invocation_id "
        f"WHERE r.experiment = ? AND r.status = 'ok' AND {same}"
        + (" AND i.label = ?" if label is not None else ""),
        (experiment, *(provenance.get(c) for c in MACHINE),
         *((label,) if label is not None else ())),
    )
    return {r[0] for r in rows}


_LINKED_TABLES = ("kernel_stats",)
# What makes two stored points the same measurement besides their settings (--resume).
# The user's code is part of it: their commit and adapters file (a dirty tree is not told
# apart, as cs336sys's own is not). cs336sys's version stands for its code where there is
# no commit (a package installed from a wheel).
MACHINE = ("git_commit", "cs336sys_version", "host", "gpu", "gpu_count", "cpu", "torch_version",
           "triton_version", "cuda_version", "env", "user_commit", "adapters_sha256")
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
    "adapters",
    "adapters_sha256",
)


def connect_readonly(path: str | Path,
                     experiments: Callable[[], Sequence[Any]] | None = None) -> sqlite3.Connection:
    """A connection that can neither change the store nor create any file: opened untouched
    (see open_untouched) and query_only, with an authorizer that refuses ATTACH (which
    would create the attached file) before SQLite touches the filesystem.

    A store of an older schema is read as it would be after migrating: it is copied into
    memory, the copy migrated and, with `experiments` (a function returning the catalog,
    called only then), given the current views. The file stays as it is."""
    path = check_path(path)
    if not path.exists():
        raise StoreError(f"no results store at {path} (run an experiment first, or pass --db)")
    try:
        conn = open_untouched(path)
        if schema.version(conn) < schema.SCHEMA_VERSION and store_problem(conn) is None:
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
