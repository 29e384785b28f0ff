"""Bad input, as a hostile user types it: one clear line on stderr, exit code 2, and the
store as it was (docs/bad-input.md). Keep the list growing: every input that once slipped
through (a traceback, an error row, a write) gets a line here."""

from __future__ import annotations

import hashlib
import os
import sqlite3
from pathlib import Path

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.report.render import FORMATS
from cs336sys.store import Store
from tests.conftest import MICRO, invoke, query
from tests.promises import INPUT, OUTPUT, READ_ONLY, STORE, WRITERS

BIG = "9" * 400
ATTN = ["attention", "--seq", "32", "--d-head", "16", "--batch", "1", "--device", "cpu"]
COMM = ["comm", "--bytes", "1KB", "--world-size", "2"]
DDP = ["ddp", "--size", "tiny", "--seq", "16", "--world-size", "2"]
PLAN = ["--size", "tiny", "--hardware", "h100", "--strategy", "dp", "--n", "2"]

# (what, arguments; {store}, {file}, {foreign}, {truncated}, {corrupted} are filled in)
STORE_CASES = [
    # a --db that cannot be a store
    ("db under a file", ["model", *MICRO, "--db", "{file}/results.db"], "is a file, not a directory"),
    # a folder linked to a disk that is not mounted, and one that cannot be made: a traceback
    ("db under a dangling link", ["model", *MICRO, "--db", "{dangling}/results.db"],
     "is a symbolic link to a missing path"),
    ("db whose folder cannot be made", ["plan", *PLAN, "--db", "/proc/cs336sys-none/x.db"],
     "cannot create the folder of /proc/cs336sys-none/x.db"),
    ("foreign SQLite for a command that writes", ["model", *MICRO, "--db", "{foreign}"], "not a results store"),
    ("foreign SQLite for sql", ["sql", "SELECT 1", "--db", "{foreign}"], "not a results store"),
    ("report on a foreign store", ["report", "--db", "{foreign}", "--out", "{out}"], "not a results store"),
    ("report on a truncated store", ["report", "--db", "{truncated}", "--out", "{out}"], "cannot"),
    ("report on a corrupted store", ["report", "--db", "{corrupted}", "--out", "{out}"], "malformed"),
    # a damaged store is refused before anything is written into it or beside it
    ("plan into a corrupted store", ["plan", *PLAN, "--db", "{corrupted}"], "is damaged (SQLite's quick_check: "),
    ("accumulate into a corrupted store", ["precision", "accumulate", "--db", "{corrupted}"], "is damaged"),
    ("model into a corrupted store", ["model", *MICRO, "--db", "{corrupted}"], "is damaged"),
    ("merge a corrupted store", ["db", "merge", "{corrupted}", "--db", "{store}"], "is damaged"),
    # a store of a newer schema: refused before the switch to WAL rewrites its header
    ("model into a newer store", ["model", *MICRO, "--db", "{newer}"], "schema version 99, newer"),
    ("plan into a newer store", ["plan", *PLAN, "--db", "{newer}"], "schema version 99, newer"),
    ("merge into a newer store", ["db", "merge", "{store}", "--db", "{newer}"], "schema version 99, newer"),
    ("merge a newer store", ["db", "merge", "{newer}", "--db", "{store}"], "schema version 99, newer"),
    # a store that claims the current schema and lacks its columns (forged or cut by hand)
    ("model into a forged store", ["model", *MICRO, "--db", "{forged}"], "its table runs lacks point_key, status"),
    ("plan into a forged store", ["plan", *PLAN, "--db", "{forged}"], "lacks point_key, status"),
    ("sql on a forged store", ["sql", "SELECT * FROM runs", "--db", "{forged}"], "lacks point_key, status"),
    ("report on a forged store", ["report", "--db", "{forged}", "--out", "{out}"], "lacks point_key, status"),
    ("merge a forged store", ["db", "merge", "{forged}", "--db", "{store}"], "lacks point_key, status"),
    ("export a forged store", ["db", "export", "--db", "{forged}", "--out", "{out}"], "lacks point_key, status"),
]
OUTPUT_CASES = [
    # outputs that would replace what cs336sys did not write
    ("export over someone's file", ["db", "export", "--out", "{file}"], "is a file cs336sys did not write"),
    ("export over a store's wal", ["db", "export", "--out", "{wal}"], "is a SQLite database's wal file"),
    ("export over a SQLite file", ["db", "export", "--out", "{foreign}"], "is a SQLite database;"),
    ("report over someone's report.html", ["report", "--out", "{mine}"], "report.html is a file cs336sys did not write"),
    ("report over someone's report.md", ["report", "--out", "{mine}", "--format", "md"], "report.md is a file"),
    ("report over someone's report.tex", ["report", "--out", "{mine}", "--format", "tex"], "report.tex is a file"),
    ("writeup over someone's writeup.tex", ["handout", "report", "--out", "{mine}", "--format", "tex"], "writeup.tex is a file"),
    ("writeup over someone's writeup.typ", ["handout", "report", "--out", "{mine}", "--format", "typst"], "writeup.typ is a file"),
    ("trace over someone's file", ["profile", "attention", "--attention", "naive", *ATTN[1:], "--trace", "{file}"], "--trace: "),
    ("trace over a store's wal", ["profile", "attention", "--attention", "naive", *ATTN[1:], "--trace", "{wal}"], "wal file"),
]
INPUT_CASES = [
    # times, paths and numbers out of range
    ("since 99999999d", ["report", "--since", "99999999d", "--out", "{out}"], "further back"),
    ("since 10000000000d", ["report", "--since", "10000000000d", "--out", "{out}"], "further back"),
    ("since 9999999999w", ["report", "--since", "9999999999w", "--out", "{out}"], "further back"),
    ("report --out impossible", ["report", "--out", "{file}/sub"], "--out"),
    ("report --out unwritable", ["report", "--out", "/proc/cs336sys/report"], "--out"),
    ("export --out impossible", ["db", "export", "--out", "/proc/cs336sys/runs.csv"], "--out"),
    ("sql --param beyond 64 bits", ["sql", "SELECT ?", "-p", "9" * 30], "64-bit"),
    ("report --where beyond 64 bits", ["report", "--where", f"seed={'9' * 30}", "--out", "{out}"], "64-bit"),
    ("comm --bytes with 400 digits", [*COMM, "--bytes", BIG], "--bytes"),
    ("model --seed beyond 64 bits", ["model", *MICRO, "--seed", str(2**64)], "--seed"),
    ("attention --seed beyond 64 bits", [*ATTN, "--seed", str(2**64)], "--seed"),
    ("memory --seed beyond 64 bits", ["memory", *MICRO, "--seed", str(2**64)], "--seed"),
    ("ddp --seed beyond 64 bits", [*DDP, "--seed", str(2**64)], "--seed"),
    ("autocast --seed beyond 64 bits", ["precision", "autocast", "--seed", str(2**64)], "--seed"),
    # empty values are not the default
    ("model --size ''", ["model", *MICRO[2:], "--size", ""], "--size: empty"),
    ("model --mode ''", ["model", *MICRO, "--mode", ""], "--mode: empty"),
    ("attention --impl ''", [*ATTN, "--impl", ""], "--impl: empty"),
    ("attention --precision ''", [*ATTN, "--precision", ""], "--precision: empty"),
    ("comm --bytes ''", ["comm", "--world-size", "2", "--bytes", ""], "--bytes: empty"),
    ("comm --bytes 1KB --bytes ''", [*COMM, "--bytes", ""], "--bytes: empty"),
    ("report --since ''", ["report", "--since", "", "--out", "{out}"], "cannot read time"),
    ("step --adamw ''", ["step", *MICRO, "--adamw", ""], "--adamw: unknown value ''"),
    ("step --attention ''", ["step", *MICRO, "--attention", ""], "--attention: empty"),
    ("export --experiment ''", ["db", "export", "--experiment", ""], "--experiment: empty"),
    ("sql ''", ["sql", ""], "empty"),
    ("model --db ' '", ["model", *MICRO, "--db", " "], "--db: empty value"),
    # '' reads as `.`: it was "file '' is a directory"
    ("model --db ''", ["model", *MICRO, "--db", ""], "--db: empty value"),
    ("merge ''", ["db", "merge", "", "--db", "{store}"], "OTHER: empty value"),
    ("export --out ''", ["db", "export", "--out", ""], "--out: empty value"),
    ("model --adapters ''", ["model", *MICRO, "--adapters", ""], "--adapters .: a folder"),
    ("export --gpu ''", ["db", "export", "--gpu", ""], "--gpu: empty value"),
    # a non-breaking space (pasted from a web page) is blank, like a space
    ("model --size nbsp", ["model", *MICRO[2:], "--size", "\xa0"], "--size: empty"),
    ("comm --precision nbsp", [*COMM, "--precision", "\xa0"], "--precision: empty"),
    ("attention --impl nbsp", [*ATTN, "--impl", "\xa0,"], "--impl: empty"),
    # sizes beyond 64 bits fail at the option, not inside a point or the store
    ("attention --batch beyond 64 bits", [*ATTN[:-4], "--batch", "9" * 30, "--device", "cpu"], "--batch: "),
    ("attention --heads beyond 64 bits", [*ATTN, "--heads", "9" * 23], "--heads: "),
    ("model --d-ff beyond 64 bits", ["model", *MICRO, "--d-ff", "9" * 23], "--d-ff: "),
    ("plan --seq beyond 64 bits", ["plan", "--seq", "9" * 26], "--seq: "),
    # a typo that would run for days
    ("model --iters 10M", ["model", *MICRO, "--iters", "10000000"], "at most 1,000,000"),
    ("attention --iters 10M", [*ATTN, "--iters", "10000000"], "at most 1,000,000"),
    ("comm --iters 10M", [*COMM, "--iters", "10000000"], "at most 1,000,000"),
    ("accumulate --additions 10M", ["precision", "accumulate", "--additions", "10000000"], "at most 1,000,000"),
]
TIMEOUTS = ["abc", "0", "-1", "nan", "inf", "", "1e15"]  # 1e15: OverflowError in each point


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture
def files(tmp_path, monkeypatch):
    """A real store with one run, and the bad files the cases name."""
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    monkeypatch.delenv("CS336SYS_DIST_TIMEOUT", raising=False)
    here = tmp_path / "files"
    here.mkdir()
    store = here / "store.db"
    with Store(store, EXPERIMENTS) as s:
        inv = s.begin_invocation({"gpu": "cpu", "git_commit": "c"}, [], "model")
        s.add_run(inv, "model", "ok", {"size": "tiny", "seed": 1}, {"step_ms_mean": 1.0})
    con = sqlite3.connect(store)
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    con.execute("PRAGMA journal_mode = DELETE")
    con.close()
    data = store.read_bytes()
    (here / "truncated.db").write_bytes(data[:100])
    page = 4096
    corrupted = bytearray(data)
    corrupted[2 * page : 2 * page + 64] = b"\xff" * 64  # a page past sqlite_master
    (here / "corrupted.db").write_bytes(bytes(corrupted))
    foreign = sqlite3.connect(here / "foreign.db")
    foreign.execute("CREATE TABLE notes (x)")
    foreign.execute("INSERT INTO notes VALUES ('my precious notes')")
    foreign.commit()
    foreign.close()
    (here / "file").write_text("not a folder")
    (here / "dangling").symlink_to(here / "unmounted")
    newer = here / "newer.db"
    newer.write_bytes(data)
    con = sqlite3.connect(newer)
    con.execute("PRAGMA user_version = 99")
    con.commit()
    con.close()
    forged = here / "forged.db"  # the current schema's number, without two of its columns
    forged.write_bytes(data)
    con = sqlite3.connect(forged, isolation_level=None)
    for kind, name in con.execute(
            "SELECT type, name FROM sqlite_master WHERE type IN ('view', 'index') "
            "AND sql IS NOT NULL").fetchall():
        con.execute(f'DROP {kind.upper()} "{name}"')
    for column in ("status", "point_key"):
        con.execute(f"ALTER TABLE runs DROP COLUMN {column}")
    con.close()
    (here / "other.db-wal").write_bytes(b"\x37\x7f\x06\x82" + bytes(28))  # a WAL's header
    (here / "mine").mkdir()
    (here / "mine" / "report.html").write_text("<!DOCTYPE html>\n<p>my own page</p>\n")
    (here / "mine" / "report.md").write_text("# My notes\n")
    for name in ("report.tex", "writeup.tex"):  # a LaTeX file of their own, comments first
        (here / "mine" / name).write_text("% my writeup\n\\documentclass{article}\n")
    (here / "mine" / "writeup.typ").write_text("// my writeup\n= Answers\n")
    names = {"store": store, "file": here / "file", "dangling": here / "dangling",
             "foreign": here / "foreign.db",
             "wal": here / "other.db-wal", "mine": here / "mine",
             "truncated": here / "truncated.db", "corrupted": here / "corrupted.db",
             "newer": newer, "forged": forged, "out": tmp_path / "out"}
    return here, names


def _check(here: Path, names: dict, args: list[str], message: str, env=None) -> None:
    before = _digest(here)
    argv = [a.format(**names) for a in args]
    if "--db" not in argv and (argv[0] != "db" or argv[:2] == ["db", "export"]):
        argv += ["--db", str(names["store"])]
    result = invoke(*argv)
    assert result.exit_code == 2, (argv, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], lines
    assert "Traceback" not in result.output
    assert _digest(here) == before, "a file beside the store changed"  # nothing written
    assert not names["out"].exists()


CASES = [pytest.param(*case, marks=pytest.mark.promise(promise), id=case[0])
         for promise, cases in ((STORE, STORE_CASES), (OUTPUT, OUTPUT_CASES), (INPUT, INPUT_CASES))
         for case in cases]


@pytest.mark.parametrize("what, args, message", CASES)
def test_bad_input_is_one_line_exit_2_and_the_store_unchanged(files, what, args, message):
    here, names = files
    _check(here, names, args, message)


@pytest.mark.promise(INPUT)
@pytest.mark.parametrize("value", TIMEOUTS)
def test_a_bad_dist_timeout_is_refused_before_any_rank_starts(files, monkeypatch, value):
    here, names = files
    monkeypatch.setenv("CS336SYS_DIST_TIMEOUT", value)
    for args in (COMM, DDP):
        _check(here, names, args, "CS336SYS_DIST_TIMEOUT must be a positive number")


@pytest.mark.promise(INPUT)
@pytest.mark.parametrize("name, value, args, message", [
    # a traceback from the sweep, invocation rows left behind
    ("CS336SYS_START_METHOD", "fork", COMM, "CS336SYS_START_METHOD must be forkserver or "
     "spawn (or unset), got 'fork'"),
    # every compiled point stored an error (InvalidBackend)
    ("CS336SYS_COMPILE_BACKEND", "bogus", [*ATTN, "--impl", "compiled"],
     "CS336SYS_COMPILE_BACKEND must name a torch.compile backend ("),
])
def test_a_bad_switch_in_the_environment_is_refused_before_anything_runs(
        files, monkeypatch, name, value, args, message):
    here, names = files
    monkeypatch.setenv(name, value)
    _check(here, names, args, message)


@pytest.mark.promise(STORE)
def test_a_foreign_database_keeps_its_journal_mode_and_bytes(files):
    here, names = files
    foreign = names["foreign"]
    con = sqlite3.connect(foreign)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    con.close()
    for command in (["model", *MICRO], ["precision", "accumulate"], ["db", "merge", str(names["store"])]):
        _check(here, names, [*command, "--db", str(foreign)], "not a results store")
    con = sqlite3.connect(foreign)
    assert con.execute("PRAGMA journal_mode").fetchone() == ("delete",)
    assert con.execute("SELECT x FROM notes").fetchall() == [("my precious notes",)]
    with pytest.raises(Exception, match="not a results store"):
        Store(foreign, EXPERIMENTS)


@pytest.mark.promise(STORE)
def test_a_store_this_user_cannot_write_is_refused_and_stays_readable(files, monkeypatch):
    """Someone else's store (mode 444 on a shared cluster): SQLite opened it read-only, left a
    -wal and -shm beside it that stopped every later reader, and the first write ended in a
    traceback. The permission is asked first (root passes any, so it is faked here)."""
    import os

    here, names = files
    store = str(names["store"])
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, *a, **k: not (
        str(p) == store and mode & os.W_OK) and real(p, mode, *a, **k))
    for command in (["precision", "accumulate"], ["model", *MICRO],
                    ["db", "merge", str(here / "store.db")]):
        _check(here, names, [*command, "--db", store],
               f"{store} is read-only for this user: nothing can be stored in it")
    assert sorted(p.name for p in here.glob("store.db*")) == ["store.db"]
    assert invoke("sql", "SELECT count(*) FROM runs", "--db", store).exit_code == 0


@pytest.mark.promise(READ_ONLY)
def test_sql_creates_no_file(files, tmp_path):
    here, names = files
    for statement in (f"ATTACH '{tmp_path / 'new.db'}' AS n", f"VACUUM INTO '{tmp_path / 'copy.db'}'"):
        _check(here, names, ["sql", statement], "read-only")
    assert not (tmp_path / "new.db").exists() and not (tmp_path / "copy.db").exists()
    # a PRAGMA that sets a value answered as if it had (`delete`) and changed nothing
    for statement in ("PRAGMA journal_mode = DELETE", "PRAGMA query_only = 0",
                      "PRAGMA writable_schema = 1"):
        _check(here, names, ["sql", statement], "read-only")


@pytest.mark.promise(STORE)
def test_an_empty_or_new_file_becomes_a_store(tmp_path):
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    for path in (empty, tmp_path / "new" / "results.db"):
        with Store(path, EXPERIMENTS) as s:
            assert s.query("SELECT count(*) AS n FROM runs") == [{"n": 0}]


@pytest.mark.promise(STORE)
@pytest.mark.parametrize("command", [["sql", "select 1"], ["report", "--out", "{out}"],
                                     ["db", "export"], ["model", "--size", "tiny"]])
@pytest.mark.parametrize("kind", ["character device", "named pipe"])
def test_a_store_that_is_not_a_file_is_refused(tmp_path, command, kind):
    """/dev/null read as an empty store and took writes into nothing; a FIFO hung the
    command. Either is one line and exit 2 now, in every command that opens a store."""
    if kind == "named pipe":
        db = tmp_path / "pipe.db"
        os.mkfifo(db)
    else:
        db = Path("/dev/null")
    args = [a.replace("{out}", str(tmp_path / "out")) for a in command]
    result = invoke(*args, "--db", db)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    what = "a named pipe (FIFO)" if kind == "named pipe" else "a character device"
    assert line == f"Error: {db} is {what}, not a file: a results store is a file"
    assert not (tmp_path / "out").exists()
    merged = invoke("db", "merge", db, "--db", tmp_path / "r.db")
    assert merged.exit_code == 2 and "not a file" in merged.stderr
    assert not (tmp_path / "r.db").exists()


@pytest.mark.promise(STORE)
@pytest.mark.parametrize("name, said", [
    (":memory:", "its in-memory database, which keeps nothing"),
    ("file:{tmp}/other.db", "a URI, not a file name")])
def test_sqlites_own_names_are_refused(tmp_path, monkeypatch, name, said):
    """`--db :memory:` stored 16 points in memory and kept none; `--db file:PATH` reached
    someone's own SQLite database past every check (refused by its plain path) and wrote
    the store's tables into it, with stray `file:` folders in the working directory."""
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other.db"
    sqlite3.connect(other).execute("CREATE TABLE users (name TEXT)")
    db = name.replace("{tmp}", str(tmp_path))
    result = invoke("model", "--size", "tiny", "--db", db)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line == f"Error: {db}: SQLite reads this as {said}; a results store is a file: " \
        "give its path"
    listed = invoke("handout", "--db", db)  # read as no store, it advised `--db :memory:`
    assert listed.exit_code == 2 and "SQLite reads this as" in listed.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.db"]
    tables = sqlite3.connect(other).execute("SELECT name FROM sqlite_master").fetchall()
    assert tables == [("users",)]


@pytest.mark.promise(READ_ONLY)
def test_reading_a_store_a_killed_writer_left_creates_nothing_beside_it(files, tmp_path):
    """A writer killed after its commit leaves rows in the `-wal` only; without the `-shm`
    beside it, reading them needs a WAL recovery, which wrote a new `-shm` into the folder.
    sql, report and db export read the committed row and leave the folder as it was."""
    here, names = files
    store = names["store"]
    con = sqlite3.connect(store, isolation_level=None)
    con.execute("PRAGMA journal_mode = WAL")
    con.execute("PRAGMA wal_autocheckpoint = 0")
    con.execute("UPDATE runs SET error = 'only in the wal'")
    # what a killed writer leaves: its -wal, not checkpointed; the -shm then removed
    wal_bytes = (here / "store.db-wal").read_bytes()
    main_bytes = store.read_bytes()
    con.close()  # (a clean close would checkpoint: put back what the kill left)
    store.write_bytes(main_bytes)
    (here / "store.db-wal").write_bytes(wal_bytes)
    (here / "store.db-shm").unlink(missing_ok=True)
    before = _digest(here)
    out = invoke("sql", "SELECT error FROM runs", "--db", store)
    assert out.exit_code == 0 and "only in the wal" in out.output, out.output
    exported = invoke("db", "export", "--db", store, "--out", tmp_path / "runs.csv")
    assert exported.exit_code == 0 and "only in the wal" in (tmp_path / "runs.csv").read_text()
    assert invoke("report", "--db", store, "--out", tmp_path / "r").exit_code == 0
    assert _digest(here) == before  # no -shm, and the -wal untouched


@pytest.mark.promise(WRITERS)
def test_plan_on_a_store_another_plan_is_creating_finds_its_tables(tmp_path):
    """Eight `plan --db new.db` at once: one opened its read-only lookup on the new file
    after another had switched it to WAL and before that one had made the tables, and
    failed with `no such table: runs` (its rows lost). The lookup now opens after this
    process's own store has the tables."""
    db = tmp_path / "new.db"
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode = WAL")  # the first step of another process's open
    con.close()
    assert db.stat().st_size > 0
    out = invoke("plan", *PLAN, "--db", db)
    assert out.exit_code == 0, out.output
    assert sqlite3.connect(db).execute("SELECT count(*) FROM plan_runs").fetchone()[0] == 1


@pytest.mark.promise(OUTPUT)
def test_outputs_replace_what_cs336sys_wrote_and_with_force_anything(files, tmp_path):
    """The other side of the refusals above: an export, a report and a trace written again
    replace the ones written before; --force replaces someone's file."""
    here, names = files
    store = names["store"]
    csv = tmp_path / "runs.csv"
    for _ in range(2):
        assert invoke("db", "export", "--db", store, "--out", csv).exit_code == 0
    assert csv.read_text().startswith("run_id,")
    out = tmp_path / "report"
    every_format = ",".join(FORMATS)
    for _ in range(2):  # a report and a writeup in every format, written again over their own
        for command in (["report"], ["handout", "report"]):
            result = invoke(*command, "--db", store, "--out", out, "--format", every_format)
            assert result.exit_code == 0, result.output
    assert (out / "report.md").read_text().startswith("<!-- generated by cs336sys -->\n# ")
    assert '<meta name="generator" content="cs336sys">' in (out / "report.html").read_text()
    assert (out / "writeup.tex").read_text().startswith("% generated by cs336sys\n")
    assert (out / "writeup.typ").read_text().startswith("// generated by cs336sys\n")
    forced = invoke("db", "export", "--db", store, "--out", names["file"], "--force")
    assert forced.exit_code == 0 and names["file"].read_text().startswith("run_id,")
    trace = tmp_path / "trace.json"
    profile = ["profile", "attention", "--attention", "naive", *ATTN[1:], "--iters", "2",
               "--db", tmp_path / "p.db", "--trace", trace]
    for _ in range(2):
        result = invoke(*profile)
        assert result.exit_code == 0, result.output
    assert '"traceEvents"' in trace.read_text()


# -- generated: every option of every command, with the values a careless script passes ---------

HOSTILE_VALUES = ["", "\xa0", "9" * 30, "abc", "-1"]
# Options whose value is free text, or a name only the store can answer for: anything goes.
FREE = {"label", "title", "gpu", "param", "host", "commit", "model"}


# The arguments a command needs besides its options.
ARGUMENTS = {"sql": ["SELECT ?"]}


class Reached(Exception):
    """The command accepted its options and was about to measure, write or serve."""


def _commands():
    import typer.main

    from cs336sys.cli import app

    def walk(cmd, path):
        if hasattr(cmd, "commands"):
            if getattr(cmd, "invoke_without_command", False):
                yield path, cmd
            for name, sub in cmd.commands.items():
                yield from walk(sub, (*path, name))
        else:
            yield path, cmd

    return list(walk(typer.main.get_command(app), ()))


@pytest.mark.promise(INPUT)
@pytest.mark.parametrize("path", [" ".join(p) for p, _ in _commands()])
def test_every_option_of_every_command_refuses_hostile_values(tmp_path, monkeypatch, path,
                                                             record_property):
    """Each option given "", a non-breaking space, 30 digits, "abc" and -1: refused in one
    line that names the option (exit 2, nothing written), or accepted where the option is
    free text or the value is one it takes; never a traceback, another exit code or a
    file. Accepted values reach a stub instead of a sweep, a report or a server."""
    import subprocess

    from cs336sys.cli import common

    def reached(*args, **kwargs):
        raise Reached

    from cs336sys.report import render

    monkeypatch.setattr(common, "check_db", reached)
    monkeypatch.setattr(common, "recording", reached)  # the store opened: the sweep is next
    monkeypatch.setattr(subprocess, "call", reached)
    monkeypatch.setattr(render, "write", reached)
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    monkeypatch.chdir(tmp_path)
    (command,) = [c for p, c in _commands() if " ".join(p) == path]
    db = tmp_path / "store.db"
    Store(db, EXPERIMENTS).close()  # an empty store: read-only commands get to their checks
    before = _digest(tmp_path)
    takes_db = any("--db" in q.opts for q in command.params)
    broke, accepted, attempts = [], 0, 0
    for param in command.params:
        if param.param_type_name != "option" or param.is_flag or param.name in ("help", "db"):
            continue
        for value in HOSTILE_VALUES:
            given = [f"{param.opts[0]}={value}"] + [value] * (param.nargs - 1)
            argv = [*path.split(), *given, *ARGUMENTS.get(path, []),
                    *(["--db", db] if takes_db else [])]
            result = invoke(*argv)
            attempts += 1
            lines = result.stderr.strip().splitlines()
            if isinstance(result.exception, Reached) or result.exit_code == 0:
                accepted += 1
                if param.name not in FREE and value in ("", "\xa0"):
                    broke.append((argv, "an empty value was taken for the default"))
            elif result.exit_code != 2 or len(lines) != 1 or not lines[0].startswith("Error:"):
                broke.append((argv, result.exit_code, result.output[-300:]))
            elif not any(name in lines[0] for name in param.opts):
                broke.append((argv, "the error does not name the option", lines[0]))
            if _digest(tmp_path) != before:
                if result.exit_code == 2:
                    broke.append((argv, "refused, but a file was written or changed"))
                before = _digest(tmp_path)  # (an accepted --out writes its file)
    record_property("attempts", attempts)
    record_property("broken", len({str(b[0]) for b in broke}))
    assert not broke, "\n".join(map(str, broke))
    print(f"{path}: {accepted} value(s) accepted")


@pytest.mark.slow
@pytest.mark.promise(OUTPUT)
def test_a_memory_timeline_replaces_nothing(tmp_path):
    """`memory --snapshot DIR` writes one PNG per point under a name no file there has:
    never over someone's file of that name, nor over an earlier run's timeline, which that
    run's row names (it wrote over its own, and the report showed the later timeline under
    the earlier numbers)."""
    from cs336sys.experiments import memory as memory_exp

    args = ["memory", *MICRO, "--seq", "16", "--iters", "1", "--snapshot", tmp_path / "snap",
            "--db", tmp_path / "m.db"]
    (spec,) = memory_exp.specs(size=["tiny"], seq=["16"], batch=["2"], d_model=64, d_ff=128,
                               num_layers=2, num_heads=4, vocab_size=256, device="cpu")
    png = tmp_path / "snap" / f"{spec.label()}.png"
    png.parent.mkdir()
    png.write_bytes(b"my own picture")
    for _ in range(2):
        result = invoke(*args)
        assert result.exit_code == 0, result.output
    assert png.read_bytes() == b"my own picture"
    stored = [Path(r["snapshot_png"]) for r in query(tmp_path / "m.db",
                                                     "SELECT snapshot_png FROM memory_runs")]
    assert [p.name for p in stored] == [f"{spec.label()}-2.png", f"{spec.label()}-3.png"]
    assert all(p.read_bytes().startswith(b"\x89PNG") for p in stored)


def test_a_store_named_from_home_is_there_not_in_a_folder_named_tilde(tmp_path, monkeypatch):
    """CS336SYS_DB='~/x.db' (quoted: no shell expands it) stored into ./~/x.db, and a later
    `--db ~/x.db` typed in a shell found no store there: the runs looked lost."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("CS336SYS_DB", "~/x.db")
    result = invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "home" / "x.db").is_file() and not (tmp_path / "~").exists()
