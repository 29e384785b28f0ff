"""Stores a command must refuse without touching them. A store whose side file (`-wal`,
`-shm`, `-journal`) exists and is not a regular file:
every command that opens a store refuses it in one line, exit 2, before anything opens the
store, and leaves the store and the side file as they were. Generated: every kind of side
file against every end and every command of the app that takes --db (read from the app,
so that a new command cannot miss it)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.conftest import invoke
from tests.promises import STORE
from tests.test_hostile import _commands as every_command

ENDS = ("-wal", "-shm", "-journal")
UNREADABLE = "not readable by this user"


def _unreadable(path: Path) -> None:
    path.write_bytes(b"")
    path.chmod(0)


KINDS = {
    "a directory": lambda p: p.mkdir(),
    "a named pipe (FIFO)": lambda p: os.mkfifo(p),
    "a symbolic link": lambda p: p.symlink_to(p.with_name("elsewhere")),
    UNREADABLE: _unreadable,
}


def _as_its_owner(real_access):
    """os.access as the file's owner without privileges sees it: by the owner's mode bits.
    Root reads and writes a file of mode 000, so where the tests run as root this stands in
    for the permission check an ordinary user's process gets from the kernel."""
    bits = {os.R_OK: 0o400, os.W_OK: 0o200, os.X_OK: 0o100}

    def access(path, mode, *args, **kwargs):
        if not os.path.exists(path):
            return real_access(path, mode, *args, **kwargs)
        have = os.stat(path).st_mode
        return all(have & bit for flag, bit in bits.items() if mode & flag)

    return access
# What a command needs beyond --db to get to its store: its arguments, and outputs in the
# test's folder. `db merge` is merged from and into the store below.
ARGUMENTS = {
    "sql": ["SELECT 1"],
    "report": ["--out", "{tmp}/out"],
    "db export": ["--out", "{tmp}/export.json"],
    "handout run": ["benchmarking_script"],
    "handout report": ["--out", "{tmp}/writeup"],
}
# Commands that take --db and never open the store: `env` only names it.
NOT_OPENING = ("env",)


def _commands() -> list[list[str]]:
    """Every command of the app that takes --db and opens the store, with its arguments."""
    out = []
    for path, cmd in every_command():
        name = " ".join(path)
        if any("--db" in p.opts for p in cmd.params) and name not in NOT_OPENING + ("db merge",):
            out.append([*path, *ARGUMENTS.get(name, [])])
    return out


COMMANDS = _commands()


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: ("dir" if p.is_dir() and not p.is_symlink() else
                     "link" if p.is_symlink() else
                     "fifo" if not p.is_file() else
                     f"mode {p.stat().st_mode:o}" if not p.stat().st_mode & 0o400 else
                     hashlib.sha256(p.read_bytes()).hexdigest())
            for p in sorted(folder.iterdir())}


@pytest.fixture
def store(tmp_path):
    """A store holding one point, in a folder of its own."""
    folder = tmp_path / "store"
    folder.mkdir()
    db = folder / "s.db"
    result = invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--db", db)
    assert result.exit_code == 0, result.output
    for end in ENDS:
        Path(f"{db}{end}").unlink(missing_ok=True)
    return db


@pytest.mark.promise(STORE)
@pytest.mark.parametrize("end", ENDS)
@pytest.mark.parametrize("kind", KINDS)
def test_a_side_file_that_is_not_a_file_is_refused_by_every_command(store, tmp_path, kind, end,
                                                                      monkeypatch):
    side = Path(f"{store}{end}")
    KINDS[kind](side)
    if kind == UNREADABLE and os.geteuid() == 0:
        monkeypatch.setattr(os, "access", _as_its_owner(os.access))
    before = _digest(store.parent)
    expected = (f"Error: {side} is {kind}, not the regular file SQLite keeps beside "
                f"{store.name}: move it away")
    if kind == UNREADABLE:  # someone else's: moved away, its runs would be lost
        expected = (f"Error: {side} (SQLite's, beside {store.name}) is {UNREADABLE}: the "
                    "store cannot be read as it is; ask its owner for read access, or read a "
                    "copy they make")
    merges = [["db", "merge", store, "--db", tmp_path / "into.db"],  # from it
              ["db", "merge", tmp_path / "from.db", "--db", store]]  # into it
    invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--db", tmp_path / "from.db")
    for command in [*([*c, "--db", store] for c in COMMANDS), *merges]:
        args = [str(a).replace("{tmp}", str(tmp_path)) for a in command]
        result = invoke(*args)
        assert result.exit_code == 2, (args, result.output)
        assert result.stderr.strip().splitlines() == [expected], (args, result.stderr)
        assert _digest(store.parent) == before, args
    assert not (tmp_path / "out").exists() and not (tmp_path / "export.json").exists()
    assert not (tmp_path / "into.db").exists()
    # `env` names the store and leaves it alone
    assert invoke("env", "--db", store).exit_code == 0 and _digest(store.parent) == before


def _a_writer_holds(store: Path, tmp_path: Path):
    """A second point stored in `store` while another connection holds it open in WAL mode,
    as a sweep still writing (or killed) does: the point stays in the `-wal`."""
    import sqlite3

    holder = sqlite3.connect(store, isolation_level=None)
    holder.execute("PRAGMA journal_mode = WAL")
    # a read open on the store: the writer's checkpoint cannot copy the new point past it
    holder.execute("BEGIN")
    holder.execute("SELECT count(*) FROM runs").fetchone()
    result = invoke("plan", "--size", "tiny", "--strategy", "fsdp", "--n", "2", "--db", store)
    assert result.exit_code == 0, result.output
    assert Path(f"{store}-wal").stat().st_size > 0
    return holder


def _runs(db: Path) -> str:
    result = invoke("sql", "SELECT count(*) AS n FROM runs", "--csv", "--db", db)
    assert result.exit_code == 0, result.output
    return result.stdout.split()[-1]


@pytest.mark.promise(STORE)
def test_a_store_read_through_a_link_reads_the_runs_in_its_wal(store, tmp_path):
    """SQLite keeps the side files beside the file a link names: read through the link, the
    store's `-wal` went unseen, and its runs were left out of sql, report, export and merge."""
    link = tmp_path / "link.db"
    link.symlink_to(store)
    holder = _a_writer_holds(store, tmp_path)
    try:
        assert _runs(store) == _runs(link) == "2"
        # a writer killed and its -shm gone: read from a copy, whose WAL must sit beside the
        # copy under the name the link names (it was copied beside the link's name)
        import shutil

        killed = tmp_path / "killed"
        killed.mkdir()
        for end in ("", "-wal"):
            shutil.copyfile(f"{store}{end}", killed / f"s.db{end}")
        (tmp_path / "other").mkdir()
        (tmp_path / "other" / "named.db").symlink_to(Path("..") / "killed" / "s.db")
        assert _runs(tmp_path / "other" / "named.db") == _runs(killed / "s.db") == "2"
    finally:
        holder.close()


@pytest.mark.promise(STORE)
def test_someone_elses_store_with_a_wal_is_read_and_not_written(store, tmp_path, monkeypatch):
    """Another user's store while their sweep has it open (its files theirs, mode 444 to this
    user): a reader reads it, the runs in its WAL too; it was refused, told to move the
    `-wal` away, which would have lost them. A command that would write is refused."""
    holder = _a_writer_holds(store, tmp_path)
    try:
        for path in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
            path.chmod(0o444)
        if os.geteuid() == 0:
            monkeypatch.setattr(os, "access", _as_its_owner(os.access))
        assert _runs(store) == "2"
        result = invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "4", "--db", store)
        assert result.exit_code == 2, result.output
        assert result.stderr.strip() == (
            f"Error: {store}-wal (SQLite's, beside s.db) is read-only for this user: nothing "
            "can be stored in s.db; give another --db, or read it (report, sql) as it is")
    finally:
        for path in (store, Path(f"{store}-wal"), Path(f"{store}-shm")):
            path.chmod(0o644)
        holder.close()


def test_the_generated_commands_are_every_command_that_opens_a_store():
    names = {" ".join(c[:2]) if c[0] in ("db", "handout", "memory", "precision", "profile")
             and len(c) > 1 and not c[1].startswith("-") else c[0] for c in COMMANDS}
    assert {"sql", "report", "browse", "model", "attention", "memory", "memory residuals",
            "step", "ddp", "comm", "plan", "precision accumulate", "precision autocast",
            "profile model", "profile attention", "db export", "handout", "handout run",
            "handout report"} <= names


def _claiming(path: Path, version: int, tables: bool) -> Path:
    """A SQLite file at `version`: with the tables of that version (migrated to it; the
    current + 1 has the current's), or with none."""
    import sqlite3

    from cs336sys.store import schema

    conn = sqlite3.connect(path, isolation_level=None)
    if tables:
        schema.migrate(conn, min(version, schema.SCHEMA_VERSION))
    conn.execute(f"PRAGMA user_version = {version}")
    conn.close()
    return path


def _versions():
    from cs336sys.store import schema

    return range(schema.SCHEMA_VERSION + 2)


@pytest.mark.promise(STORE)
@pytest.mark.parametrize("tables", [False, True], ids=["no-tables", "tables"])
@pytest.mark.parametrize("version", _versions())
def test_a_refusal_writes_nothing_whatever_schema_a_file_claims(tmp_path, version, tables):
    """Files claiming every schema version from 0 to the current + 1, with and without the
    tables: a command that refuses one (exit 2, one line) has not changed a byte of it, nor
    left a file beside it. Without tables only version 0 (an empty database) becomes a
    store; a newer version than this code's is refused by every command that writes."""
    from cs336sys.store import schema

    source = tmp_path / "source.db"
    assert invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--db",
                  source).exit_code == 0
    folder = tmp_path / "claims"
    folder.mkdir()
    writers = [["plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--db", "{f}"],
               ["db", "merge", source, "--db", "{f}"]]
    readers = [["db", "merge", "{f}", "--db", tmp_path / "into.db"], ["sql", "SELECT 1", "--db", "{f}"]]
    for command in [*writers, *readers]:
        claims = _claiming(folder / "claims.db", version, tables)
        before = _digest(folder)
        result = invoke(*[str(a).replace("{f}", str(claims)) for a in command])
        if (not tables and version > 0) or (command in writers and version > schema.SCHEMA_VERSION):
            assert result.exit_code == 2, (command, result.output)
        if result.exit_code == 2:
            assert len(result.stderr.strip().splitlines()) == 1, result.stderr
            assert _digest(folder) == before, command
        for p in folder.iterdir():
            p.unlink()


def _killed_mid_transaction(store: Path) -> None:
    """A writer in rollback mode (as an older cs336sys's stores, or the `sqlite3` shell's)
    killed in a transaction that changed every run and spilled its pages into the store: a
    hot `-journal` holds what was committed."""
    import subprocess
    import sys

    script = f"""
import os, sqlite3
conn = sqlite3.connect({str(store)!r}, isolation_level=None)
conn.execute("PRAGMA journal_mode = DELETE")
conn.execute("PRAGMA cache_size = 1")
conn.execute("BEGIN EXCLUSIVE")
conn.execute("UPDATE runs SET status = 'error', error = 'UNCOMMITTED'")
conn.execute("CREATE TABLE filler (x BLOB)")
conn.executemany("INSERT INTO filler VALUES (?)", [(os.urandom(2000),)] * 50)
os._exit(9)
"""
    subprocess.run([sys.executable, "-c", script], check=False)
    assert Path(f"{store}-journal").stat().st_size > 0


@pytest.mark.promise(STORE)
def test_a_writer_killed_in_a_transaction_leaves_only_what_it_committed(store, tmp_path):
    """A store with a hot journal was read immutable: its uncommitted rows were shown by sql
    and report and merged into another store for good, and a command that would write
    called the store damaged. Readers read the committed store and leave both files as they
    are; a writer rolls the journal back, as SQLite does, and stores its point."""
    _killed_mid_transaction(store)
    before = _digest(store.parent)
    query = "SELECT count(*) AS n, count(error) AS failed FROM runs"
    result = invoke("sql", query, "--csv", "--db", store)
    assert result.exit_code == 0, result.output
    assert result.stdout.split()[-1] == "1,0"
    into = tmp_path / "into.db"
    assert invoke("db", "merge", store, "--db", into).exit_code == 0
    assert invoke("sql", query, "--csv", "--db", into).stdout.split()[-1] == "1,0"
    assert _digest(store.parent) == before
    result = invoke("plan", "--size", "tiny", "--strategy", "fsdp", "--n", "2", "--db", store)
    assert result.exit_code == 0, result.output
    assert invoke("sql", query, "--csv", "--db", store).stdout.split()[-1] == "2,0"


@pytest.mark.promise(STORE)
def test_a_rollback_writer_holding_its_lock_is_named_and_a_stray_journal_is_ignored(
        store, tmp_path, monkeypatch):
    """A writer in rollback mode inside an exclusive transaction: a reader waited out the
    busy timeout and said only "database is locked". A `-journal` beside a store in WAL mode
    (another tool's) made a read open it live, leaving a `-wal` and `-shm` beside it."""
    import sqlite3

    from cs336sys.store import guard

    before = _digest(store.parent)
    Path(f"{store}-journal").write_bytes(b"")  # a WAL store: the journal is none of its own
    assert _runs(store) == "1"
    after = _digest(store.parent)
    assert set(after) == {"s.db", "s.db-journal"} and after["s.db"] == before["s.db"]
    Path(f"{store}-journal").unlink()
    writer = sqlite3.connect(store, isolation_level=None)
    writer.execute("PRAGMA journal_mode = DELETE")
    writer.execute("BEGIN EXCLUSIVE")
    writer.execute("UPDATE runs SET status = 'error'")
    try:
        monkeypatch.setattr(guard, "BUSY_TIMEOUT_S", 0.2)
        result = invoke("sql", "SELECT count(*) FROM runs", "--db", store)
        assert result.exit_code == 2, result.output
        assert "another process holds its write lock" in result.stderr, result.stderr
    finally:
        writer.execute("ROLLBACK")
        writer.close()
