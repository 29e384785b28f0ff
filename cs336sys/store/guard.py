"""What may be opened as a results store, checked before anything is written or created:
a path that is no store (a folder, a device, someone's own SQLite, a damaged or newer one,
one this user may not write) is refused untouched, and a store is read without leaving a
trace beside it (docs/store.md, docs/bad-input.md)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

from cs336sys.measure.scratch import scratch
from cs336sys.store import schema

SQLITE_HEADER = b"SQLite format 3\x00"
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


def side_file(path: str | Path, end: str) -> Path:
    """The store's `-wal`, `-shm` or `-journal`: beside the file a symbolic link names, where
    SQLite keeps them (it resolves the link; read beside the link, a store's `-wal` was missed
    and its newest runs left out)."""
    real = Path(os.path.realpath(path))
    return real.with_name(real.name + end)


def _check_side_files(path: Path, writing: bool) -> None:
    """Refuse a store whose side file exists and is not a regular file this process may read
    (and, `writing`, write; a reader of someone else's store reads them as they are), or is
    a symlink: SQLite would write through it wherever it points."""
    for end in SIDE_FILES:
        side = side_file(path, end)
        if not os.path.lexists(side):
            continue
        kind = ("a symbolic link" if side.is_symlink() else "a directory" if side.is_dir()
                else None if side.is_file() else _kind_of(side))
        # a file this user may not read or write is someone else's, which may hold their
        # newest runs: never to be moved away
        theirs = f"{side} (SQLite's, beside {path.name}) is"
        if kind is not None:
            problem = (f"{side} is {kind}, not the regular file SQLite keeps beside "
                       f"{path.name}: move it away")
        elif not os.access(side, os.R_OK):
            problem = (f"{theirs} not readable by this user: the store cannot be read as it is; "
                       "ask its owner for read access, or read a copy they make")
        elif writing and not os.access(side, os.W_OK):
            problem = (f"{theirs} read-only for this user: nothing can be stored in {path.name}; "
                       "give another --db, or read it (report, sql) as it is")
        else:
            continue
        if os.path.lexists(side):  # (a journal another writer's commit removed meanwhile)
            raise StoreError(problem)


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
    if str(path) == ":memory:" or str(path).startswith("file:"):
        # SQLite's in-memory database and its URIs: a run "stored" in :memory: kept nothing,
        # and a URI reached someone's own database past every check below
        raise StoreError(f"{path}: SQLite reads this as "
                         + ("its in-memory database, which keeps nothing" if str(path) ==
                            ":memory:" else "a URI, not a file name")
                         + "; a results store is a file: give its path")
    if path.is_dir():
        raise StoreError(f"{path} is a directory, not a SQLite database")
    _check_side_files(path, writing)
    if path.exists() and not path.is_file():  # stat follows a symlink to what it names
        # /dev/null read as an empty store and took writes into nothing; a FIFO hung
        raise StoreError(f"{path} is {_kind_of(path)}, not a file: a results store is a file")
    for parent in path.parents:
        if parent.is_symlink() and not parent.exists():  # (exists() follows the link)
            raise StoreError(f"{path}: {parent} is a symbolic link to a missing path or a "
                             "loop (a disk that is not mounted?)")
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
                if not no_tables(conn):
                    problem = store_problem(conn)
                elif version := schema.version(conn):  # no tables, yet it claims some
                    problem = (store_problem(conn) and f"claims cs336sys's schema version "
                               f"{version} but lacks its tables")
                else:
                    problem = None
                if writing and problem is None:
                    problem = _unwritable(conn)
            finally:
                conn.close()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"cannot read {path}: {exc}") from exc
        if problem:
            raise StoreError(f"{path} {problem}; refusing to touch it")
    return path


def no_tables(conn: sqlite3.Connection) -> bool:
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

    A `-journal` beside it (a store in rollback mode: an older cs336sys's, or one the
    `sqlite3` shell wrote) belongs to a writer in a transaction, or to one killed in it (a
    "hot" journal, https://sqlite.org/atomiccommit.html#hot_journals). Read immutable, the
    pages that writer changed and never committed were read as stored, or as damaged. Plain
    `mode=ro` takes SQLite's locks, so it waits out a live writer; a hot journal only a
    writable connection can roll back: that store is read from a copy rolled back there.
    """
    path = Path(path)
    uri = path.resolve().as_uri()
    wal, shm = side_file(path, "-wal"), side_file(path, "-shm")
    if wal.exists() and not shm.exists():
        conn = _read_a_copy(path, wal)
        if conn is not None:
            return conn
    uri += "?mode=ro&immutable=1" if readable_immutable(path) else "?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S)
    conn.execute("PRAGMA query_only = ON")
    journal = side_file(path, "-journal")
    if journal.exists() and _rollback_mode(path):
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()
        except sqlite3.OperationalError as exc:
            code = getattr(exc, "sqlite_errorcode", None)
            if code == SQLITE_BUSY:  # "database is locked", after BUSY_TIMEOUT_S
                conn.close()
                raise sqlite3.OperationalError(
                    "another process holds its write lock (a writer in rollback mode, such as "
                    "the sqlite3 shell in a transaction); run this again when it is done"
                ) from exc
            if code != SQLITE_READONLY_ROLLBACK:
                raise
            conn.close()
            copied = _read_a_copy(path, journal)
            return copied if copied is not None else open_untouched(path)
    return conn


# https://sqlite.org/rescode.html: another connection holds a lock this one waited out
SQLITE_BUSY = 5


# https://sqlite.org/rescode.html#readonly_rollback: a hot journal a read-only connection
# cannot roll back
SQLITE_READONLY_ROLLBACK = 776


def readable_immutable(path: str | Path) -> bool:
    """Whether the store can be read with `immutable=1`, which leaves nothing beside it: it
    has no `-wal`, so no connection has it open in WAL mode, and, in rollback mode, no
    `-journal`, so no writer is in a transaction or was killed in one (see open_untouched).
    (A `-journal` beside a WAL store is none of its own: left by another tool.)"""
    return not (side_file(path, "-wal").exists()
                or side_file(path, "-journal").exists() and _rollback_mode(path))


def _rollback_mode(path: str | Path) -> bool:
    """Whether the database's header says rollback journal (its read and write versions, bytes
    18 and 19: 1 legacy, 2 WAL; https://sqlite.org/fileformat.html#file_format_version_numbers)."""
    try:
        with open(path, "rb") as f:
            head = f.read(20)
    except OSError:
        return False
    return len(head) == 20 and head[18] == 1


def _read_a_copy(path: Path, side: Path) -> sqlite3.Connection | None:
    """The store and its `-wal` or `-journal` copied to a temporary folder, recovered (the
    WAL replayed, the hot journal rolled back) there and read into memory; None when the
    live file should be read instead: a writer opened the store meanwhile (its `-shm` is
    back), or the journal is gone (rolled back or committed since the copy began)."""
    import shutil

    end = "-wal" if side.name.endswith("-wal") else "-journal"
    with scratch("cs336sys-read-") as tmp:
        # named as its side file is (the file a link names): SQLite looks for it beside that
        copy = Path(tmp) / side.name.removesuffix(end)
        shutil.copyfile(path, copy)
        try:
            shutil.copyfile(side, Path(tmp) / side.name)
        except FileNotFoundError:  # a WAL checkpointed and removed since: the copy has it all
            if end == "-journal":
                return None
        if end == "-wal" and side_file(path, "-shm").exists():
            return None
        source = sqlite3.connect(copy)
        try:
            memory = sqlite3.connect(":memory:", timeout=BUSY_TIMEOUT_S)
            source.backup(memory)
        finally:
            source.close()
    memory.execute("PRAGMA query_only = ON")
    return memory
