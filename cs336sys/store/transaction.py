"""One write transaction, as every writer of the store opens it: BEGIN IMMEDIATE, the block,
COMMIT, and what the caller counts once the rows are in.

    with immediate(conn, committed=lambda: counter.append(1)):
        conn.execute("INSERT ...")

A signal's exception (KeyboardInterrupt, sweep/stopping.py's Terminated) can surface just
after the COMMIT: Python runs a signal's handler at its next check, and that may fall right
after the C call that committed. The rows are then written; the exception goes on as
itself (not as "cannot rollback - no transaction is active"), and `committed` is still
called first, so that a point stored is a point counted and the line a Ctrl-C ends with
tells the truth. SIGINT and SIGTERM are held back across the COMMIT and `committed`
(delivered as soon as it returns). `conn` is in autocommit mode (isolation_level=None).
"""

from __future__ import annotations

import signal
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

_HELD = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def immediate(conn: sqlite3.Connection,
              committed: Callable[[], Any] | None = None) -> Iterator[None]:
    """The block in one write transaction; rolled back if it raises (see the module)."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    _commit(conn, committed or (lambda: None))


def _commit(conn: sqlite3.Connection, then: Callable[[], Any]) -> None:
    masks = hasattr(signal, "pthread_sigmask")  # POSIX
    before = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD) if masks else None
    try:
        conn.execute("COMMIT")
        then()
    except BaseException as exc:
        if conn.in_transaction:  # the COMMIT did not run, or failed: nothing written
            conn.execute("ROLLBACK")
        elif not isinstance(exc, sqlite3.Error):  # written; a signal's exception, late
            then()
        raise
    finally:
        if before is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, before)
