"""The store's write transaction (store/transaction.py): a signal's exception that surfaces
just after the COMMIT leaves the rows written and counted, one before it leaves nothing."""

import sqlite3

import pytest

from cs336sys.store import Store
from cs336sys.store.transaction import immediate


class Committing:
    """A connection whose COMMIT is interrupted by a signal's exception: raised by the
    handler Python runs at its first check after the COMMIT (`late`), or before it ran."""

    def __init__(self, conn: sqlite3.Connection, late: bool):
        self.conn, self.late = conn, late

    @property
    def in_transaction(self) -> bool:
        return self.conn.in_transaction

    def execute(self, sql: str, *args):
        if sql != "COMMIT":
            return self.conn.execute(sql, *args)
        if self.late:
            self.conn.execute(sql)
        raise KeyboardInterrupt


@pytest.mark.parametrize("late", [True, False])
def test_the_rows_are_counted_if_and_only_if_they_were_written(tmp_path, late):
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    counted = []
    with pytest.raises(KeyboardInterrupt):
        with immediate(Committing(conn, late), committed=lambda: counted.append(1)):
            conn.execute("INSERT INTO t VALUES (1)")
    assert not conn.in_transaction
    assert (counted, conn.execute("SELECT x FROM t").fetchall()) == (
        ([1], [(1,)]) if late else ([], []))


def test_a_block_that_raises_writes_nothing_and_counts_nothing(tmp_path):
    conn = sqlite3.connect(tmp_path / "x.db", isolation_level=None)
    conn.execute("CREATE TABLE t (x)")
    counted = []
    with pytest.raises(ValueError):
        with immediate(conn, committed=lambda: counted.append(1)):
            conn.execute("INSERT INTO t VALUES (1)")
            raise ValueError("half way")
    assert (counted, conn.execute("SELECT x FROM t").fetchall()) == ([], [])
    with immediate(conn, committed=lambda: counted.append(1)):
        conn.execute("INSERT INTO t VALUES (2)")
    assert (counted, conn.execute("SELECT x FROM t").fetchall()) == ([1], [(2,)])


def test_a_point_stored_as_the_signal_lands_is_a_point_counted(tmp_path):
    """What `Recorder.add` relies on: add_run calls `committed` for a row that is in, also
    when Ctrl-C's exception comes out of the COMMIT."""
    store = Store(tmp_path / "r.db")
    invocation = store.begin_invocation({}, ["cs336sys"], "model", None)
    counted = []
    real = store.conn
    store.conn = Committing(real, late=True)
    with pytest.raises(KeyboardInterrupt):
        store.add_run(invocation, "model", "ok", {"seq": 8}, committed=lambda: counted.append(1))
    store.conn = real
    assert counted == [1]
    assert real.execute("SELECT count(*) FROM runs").fetchone()[0] == 1
    store.close()


def test_a_write_lock_held_past_the_busy_timeout_is_waited_out(tmp_path, capsys, monkeypatch):
    """Another program holds the write lock (a SQLite browser with unsaved edits) for longer
    than the connection's busy timeout: the write waits, says why once, and lands; it ended
    the sweep with "database is locked" and lost the point just measured."""
    import threading
    import time

    from cs336sys.store import transaction

    monkeypatch.setattr(transaction, "_TELL_AFTER_S", 0.2)

    path = tmp_path / "x.db"
    conn = sqlite3.connect(path, timeout=0.05, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    other = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    threading.Timer(0.6, lambda: other.execute("ROLLBACK")).start()
    started = time.monotonic()
    with immediate(conn):
        conn.execute("INSERT INTO t VALUES (1)")
    assert time.monotonic() - started >= 0.5  # it waited out the other writer
    assert conn.execute("SELECT x FROM t").fetchall() == [(1,)]
    err = capsys.readouterr().err
    assert err.count("another program holds the store's write lock") == 1


def test_a_signal_ends_the_wait_for_the_write_lock_at_once(tmp_path):
    """SQLite's busy handler sleeps in C, where no signal handler runs: with the store's 60 s
    busy timeout a Ctrl-C waited a minute while another program held the write lock."""
    import signal
    import time

    class Stop(Exception):
        pass

    def stop(*_):
        raise Stop

    path = tmp_path / "x.db"
    conn = sqlite3.connect(path, timeout=60, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (x)")
    other = sqlite3.connect(path, isolation_level=None)
    other.execute("BEGIN IMMEDIATE")
    before = signal.signal(signal.SIGALRM, stop)
    try:
        started = time.monotonic()
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(Stop), immediate(conn):
            conn.execute("INSERT INTO t VALUES (1)")
        assert time.monotonic() - started < 2
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
        other.execute("ROLLBACK")
    assert conn.execute("PRAGMA busy_timeout").fetchone() == (60000,)  # put back
