"""One write transaction, as every writer of the store opens it: BEGIN IMMEDIATE, the block,
COMMIT, and what the caller counts once the rows are in.

    with immediate(conn, committed=lambda: counter.append(1)):
        conn.execute("INSERT ...")

SIGINT and SIGTERM are held from just before the COMMIT until `committed` has counted the
rows (measure/landing.py's `held`), so that a point stored is a point counted and the line a
Ctrl-C ends with tells the truth. A signal's exception (KeyboardInterrupt,
sweep/stopping.py's Terminated) whose handler was already on its way can still surface just
after the COMMIT's C call: the rows are then written, the exception goes on as itself (not
as "cannot rollback - no transaction is active"), and `committed` is still called first.
`conn` is in autocommit mode (isolation_level=None).

BEGIN IMMEDIATE waits for another writer through the connection's busy timeout, and then
again for as long as it takes: a program that holds the store's write lock (a SQLite browser
with unsaved edits) would otherwise end a sweep with "database is locked" and lose the point
it had just measured. Nothing is written before BEGIN, so waiting is safe; a line on stderr
says why the command waits.
"""

from __future__ import annotations

import sqlite3
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from cs336sys.measure.landing import held


@contextmanager
def immediate(conn: sqlite3.Connection,
              committed: Callable[[], Any] | None = None) -> Iterator[None]:
    """The block in one write transaction; rolled back if it raises (see the module)."""
    _begin(conn)
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    _commit(conn, committed or (lambda: None))


# SQLite's busy handler sleeps in C, where no signal handler runs: each try waits this long
# at most, so that Ctrl-C is answered within it (the connection's 60 s held it a minute)
_TRY_MS = 100
_TELL_AFTER_S = 2.0  # another cs336sys writer holds the lock for milliseconds: not worth a line


def _begin(conn: sqlite3.Connection) -> None:
    (busy_ms,) = conn.execute("PRAGMA busy_timeout").fetchone()
    conn.execute(f"PRAGMA busy_timeout = {min(busy_ms, _TRY_MS)}")
    try:
        _begin_waiting(conn)
    finally:
        conn.execute(f"PRAGMA busy_timeout = {busy_ms}")


def _begin_waiting(conn: sqlite3.Connection) -> None:
    told, start = False, time.monotonic()
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc):
                raise
            if not told and time.monotonic() - start > _TELL_AFTER_S:
                print("cs336sys: another program holds the store's write lock (a SQLite "
                      "browser with unsaved changes?); waiting for it to let go (Ctrl-C "
                      "stops, keeping what is stored)", file=sys.stderr, flush=True)
                told = True
            # an answer of `locked` at once (which _wal's docstring says SQLite may give)
            # must not make this loop spin a core
            time.sleep(0.05)


def _commit(conn: sqlite3.Connection, then: Callable[[], Any]) -> None:
    with held():  # a signal from here on is handled once the rows are in and counted
        try:
            conn.execute("COMMIT")
        except BaseException as exc:
            if conn.in_transaction:  # the COMMIT did not run, or failed: nothing written
                conn.execute("ROLLBACK")
            elif not isinstance(exc, sqlite3.Error):  # written; a signal's exception, late
                then()
            raise
        then()
