"""The results store: provenance, views, concurrent writers, migrations, refusals."""

import json
import multiprocessing as mp
import sqlite3
import subprocess
from pathlib import Path

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.measure import provenance
from cs336sys.store import SCHEMA_VERSION, Store, StoreError, connect_readonly, schema
from tests.promises import WRITERS

PROV = {
    "host": "h",
    "device": "cpu",
    "gpu": "cpu",
    "cpu": "some cpu",
    "git_commit": "abc",
    "git_dirty": 0,
}


def test_provenance_fields_filled_on_cpu():
    info = provenance.collect("cpu")
    for key in (
        "host",
        "device",
        "gpu",
        "gpu_count",
        "cpu",
        "torch_version",
        "python_version",
        "cs336sys_version",
        "git_commit",
        "git_dirty",
    ):
        assert key in info
    assert info["gpu"] == "cpu" and info["gpu_count"] == 0
    for key in ("host", "cpu", "torch_version", "python_version", "cs336sys_version"):
        assert info[key], key
    import torch

    assert info["torch_version"] == torch.__version__


def _git(cwd, *args):
    return subprocess.run(
        ["git", *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


def test_git_info_commit_and_dirty_flag(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = _git(tmp_path, "rev-parse", "HEAD")
    assert provenance.git_info(tmp_path) == {"git_commit": head, "git_dirty": 0}
    (tmp_path / "untracked.txt").write_text("not part of the commit")
    assert provenance.git_info(tmp_path)["git_dirty"] == 0
    (tmp_path / "a.txt").write_text("two")
    assert provenance.git_info(tmp_path) == {"git_commit": head, "git_dirty": 1}


def test_git_info_never_writes_the_index(tmp_path):
    """`git status` refreshes a stale index and writes it back under .git/index.lock; a
    Ctrl-C meanwhile had subprocess.run kill git, which left the lock in the user's checkout
    and their next git command refused. The user's repository is read, never written."""
    import os

    _git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("one")
    _git(tmp_path, "add", "a.txt")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    index = tmp_path / ".git" / "index"
    os.utime(tmp_path / "a.txt", (1, 1))  # its stat no longer matches the index: stale
    before = (index.read_bytes(), index.stat().st_mtime_ns)
    assert provenance.git_info(tmp_path)["git_dirty"] == 0
    assert (index.read_bytes(), index.stat().st_mtime_ns) == before


def test_git_info_outside_a_checkout_is_null(tmp_path):
    assert provenance.git_info(tmp_path) == {"git_commit": None, "git_dirty": None}


def test_views_flatten_settings_and_metrics(db_path):
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, ["cs336sys", "model"], "model")
        s.add_run(
            inv,
            "model",
            "ok",
            {"size": "tiny", "mode": "train", "compile": False},
            {"step_ms_mean": 12.5, "tflops": float("nan")},
            samples={"step_ms": [12, 13]},
        )
        s.add_run(inv, "other", "ok", {"size": "x"}, {})
        s.finish_invocation(inv, 0)
        rows = s.query("SELECT * FROM model_runs")
    assert len(rows) == 1
    row = rows[0]
    assert (row["size"], row["mode"], row["compile"], row["step_ms_mean"]) == (
        "tiny",
        "train",
        0,
        12.5,
    )
    assert row["tflops"] is None  # NaN is stored as null, the JSON stays valid
    assert (row["gpu"], row["git_commit"], row["status"]) == ("cpu", "abc", "ok")
    (stored,) = sqlite3.connect(db_path).execute("SELECT metrics FROM runs WHERE experiment = "
                                                 "'model'").fetchone()
    assert json.loads(stored)["nonfinite"] == {"tflops": "nan"}  # and kept apart, by name
    # an update that sets it finite leaves no trace of the NaN (the report read it back)
    with Store(db_path, EXPERIMENTS) as s:
        s.update_metrics(row["run_id"], {"tflops": 3.0, "mfu": float("inf")})
    (stored,) = sqlite3.connect(db_path).execute("SELECT metrics FROM runs WHERE experiment = "
                                                 "'model'").fetchone()
    assert json.loads(stored)["nonfinite"] == {"mfu": "inf"}
    assert json.loads(stored)["tflops"] == 3.0
    conn = sqlite3.connect(db_path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    inv_row = conn.execute("SELECT exit_status, finished, argv FROM invocations").fetchone()
    assert inv_row[0] == 0 and inv_row[1] and json.loads(inv_row[2]) == ["cs336sys", "model"]


def test_run_ids_are_uuids_and_status_is_checked(db_path):
    import uuid

    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [], "t")
        rid = s.add_run(inv, "model", "oom", {"size": "xl"})
        assert uuid.UUID(rid).version == 4
        with pytest.raises(ValueError):
            s.add_run(inv, "model", "crashed", {"size": "xl"})


def _writer(path, n, tag):
    with Store(path, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [tag], "t")
        for i in range(n):
            s.add_run(inv, "model", "ok", {"writer": tag, "i": i}, {"step_ms_mean": float(i)})
        s.finish_invocation(inv, 0)


@pytest.mark.promise(WRITERS)
@pytest.mark.slow
def test_two_processes_writing_at_once_lose_no_rows(db_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(db_path), 150, t)) for t in ("a", "b")]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    conn = sqlite3.connect(db_path)
    counts = dict(
        conn.execute("SELECT json_extract(settings, '$.writer'), count(*) FROM runs GROUP BY 1")
    )
    assert counts == {"a": 150, "b": 150}
    assert conn.execute("SELECT count(DISTINCT id) FROM runs").fetchone()[0] == 300


def test_older_schema_is_migrated_and_keeps_its_rows(db_path):
    # A store as version 1 of the schema left it, with one run in it.
    conn = sqlite3.connect(db_path, isolation_level=None)
    schema.migrate(conn, target=1)
    assert schema.version(conn) == 1
    conn.execute(
        "INSERT INTO invocations (id, command, gpu, git_commit) VALUES ('i1', 'model', 'cpu', 'c0')"
    )
    conn.execute(
        "INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, created) "
        "VALUES ('r1', 'i1', 'model', 'ok', ?, ?, '2026-01-01 00:00:00')",
        (json.dumps({"size": "small", "mode": "train"}), json.dumps({"step_ms_mean": 3.0})),
    )
    conn.close()

    with Store(db_path, EXPERIMENTS) as s:
        assert schema.version(s.conn) == SCHEMA_VERSION
        cols = {r["name"] for r in s.query("PRAGMA table_info(runs)")}
        assert "point_key" in cols
        rows = s.query("SELECT run_id, size, mode, step_ms_mean, git_commit FROM model_runs")
        assert rows == [
            {
                "run_id": "r1",
                "size": "small",
                "mode": "train",
                "step_ms_mean": 3.0,
                "git_commit": "c0",
            }
        ]
        inv = s.begin_invocation(PROV, [], "t")  # and the migrated store takes new rows
        s.add_run(inv, "model", "ok", {"size": "tiny"}, {})
        assert s.query("SELECT count(*) AS n FROM runs")[0]["n"] == 2


def test_version_5_store_is_rebuilt_for_wrong_without_losing_a_row(db_path):
    """v6 rebuilds `runs` (SQLite cannot change its CHECK) under a store that has views, a
    user's own view and kernel_stats pointing at runs: every row, link and view survives,
    and so does a column the user added, with its index (the copy of cs336sys's columns
    dropped a column of notes)."""
    conn = sqlite3.connect(db_path, isolation_level=None)
    schema.migrate(conn, target=5)
    conn.execute("INSERT INTO invocations (id, command, gpu) VALUES ('i1', 'profile', 'cpu')")
    for rid, exp, status in (("r1", "profile", "ok"), ("r2", "model", "oom")):
        conn.execute(
            "INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, created)"
            " VALUES (?, 'i1', ?, ?, '{\"size\": \"tiny\"}', '{\"step_ms_mean\": 2.0}', ?)",
            (rid, exp, status, f"2026-01-01 00:00:0{rid[1]}"),
        )
    conn.execute("INSERT INTO kernel_stats (run_id, phase, rank, name, calls, total_ms, mean_ms, "
                 "share, time_basis) VALUES ('r1', 'forward', 1, 'mm', 2, 1.0, 0.5, 1.0, 'cpu')")
    conn.execute("CREATE VIEW profile_runs AS SELECT id AS run_id FROM runs")  # as an old version made it
    conn.execute("INSERT INTO meta (key, value) VALUES ('views', 'old'), ('view_names', '[\"profile_runs\"]')")
    conn.execute("CREATE VIEW mine AS SELECT id, status FROM runs")  # the user's own
    conn.execute('ALTER TABLE runs ADD COLUMN "my note" TEXT')
    conn.execute('CREATE INDEX runs_my_note ON runs ("my note")')
    # a generated column with an index (the store would not open), a NOT NULL default
    conn.execute("ALTER TABLE runs ADD COLUMN minutes REAL GENERATED ALWAYS AS "
                 "(duration_s / 60) VIRTUAL")
    conn.execute("CREATE INDEX runs_minutes ON runs (minutes)")
    conn.execute("ALTER TABLE runs ADD COLUMN reviewed INTEGER NOT NULL DEFAULT 0")
    conn.execute("""UPDATE runs SET "my note" = 'reran after reboot' WHERE id = 'r1'""")
    with pytest.raises(sqlite3.IntegrityError):
        conn.execute("UPDATE runs SET status = 'wrong'")
    conn.close()

    with Store(db_path, EXPERIMENTS) as s:
        assert schema.version(s.conn) == SCHEMA_VERSION
        assert s.query("SELECT id, status FROM mine ORDER BY id") == [
            {"id": "r1", "status": "ok"}, {"id": "r2", "status": "oom"}]
        assert s.query("SELECT run_id, name FROM kernel_stats") == [{"run_id": "r1", "name": "mm"}]
        assert s.query('SELECT id, "my note" AS note FROM runs ORDER BY id') == [
            {"id": "r1", "note": "reran after reboot"}, {"id": "r2", "note": None}]
        assert s.query("SELECT name FROM sqlite_master WHERE name = 'runs_my_note'")
        assert s.query("SELECT minutes, reviewed FROM runs WHERE id = 'r1'") == [
            {"minutes": None, "reviewed": 0}]
        assert s.query("SELECT run_id, step_ms_mean, user_commit FROM profile_runs") == [
            {"run_id": "r1", "step_ms_mean": 2.0, "user_commit": None}]
        inv = s.begin_invocation({**PROV, "user_commit": "abc", "user_dirty": 1}, [], "t")
        s.add_run(inv, "attention", "wrong", {"impl": "yours"}, {"check": "fail"})
        assert s.query("SELECT count(*) AS n FROM runs WHERE reviewed = 0") == [{"n": 3}]
        assert s.query('SELECT status, "check", user_commit, user_dirty FROM attention_runs') == [
            {"status": "wrong", "check": "fail", "user_commit": "abc", "user_dirty": 1}]
        with pytest.raises(sqlite3.IntegrityError):  # the foreign key is still enforced
            s.conn.execute("INSERT INTO kernel_stats (run_id, phase, rank, name, calls, total_ms, "
                           "mean_ms, share, time_basis) VALUES ('none', 'forward', 1, 'x', 1, 1, "
                           "1, 1, 'cpu')")


def test_version_6_settings_get_one_name_per_concept(db_path):
    """v7 renames the settings each experiment stored under its 0.2 names, v8 the last ones
    stored under another word than their option's (step's cold_cache inverted into
    warm_cache), v9 ddp's `own` into `ours`; each recomputes the point keys (--resume
    matches on them)."""
    from cs336sys.sweep.points import point_key

    conn = sqlite3.connect(db_path, isolation_level=None)
    schema.migrate(conn, target=6)
    conn.execute("INSERT INTO invocations (id, command, gpu) VALUES ('i1', 'x', 'cpu')")
    old = {
        "model": {"size": "tiny", "context_length": 128, "batch_size": 4, "steps": 5},
        "ddp": {"impl": "flat", "context_length": 64, "global_batch": 8, "steps": 3,
                "optimizer_sharding": "own"},
        "attention": {"impl": "sdpa", "seq": 256, "dtype": "bf16", "iters": 10},
        "comm": {"op": "all-reduce", "dtype": "fp32", "size_bytes": 4000},
        "plan": {"size": "8b", "seq": 4096},
    }
    residuals = [{"size": "tiny", "impl": "eager"}, {"size": "tiny", "impl": "compiled"}]
    steps = [{"switches": "compile", "compile": True, "cold_cache": True},
             {"switches": "compile", "compile": True, "cold_cache": False},
             {"switches": "none", "compile": False, "cold_cache": False}]
    rows = [*old.items(), *(("step", st) for st in steps),
            *(("memory-residuals", r) for r in residuals)]
    for i, (kind, settings) in enumerate(rows):
        conn.execute("INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, "
                     "point_key) VALUES (?, 'i1', ?, 'ok', ?, '{}', ?)",
                     (f"r{i}", kind, json.dumps(settings), point_key(kind, settings)))
    conn.close()
    with Store(db_path, EXPERIMENTS) as s:
        stored = s.query("SELECT experiment, settings, point_key FROM runs ORDER BY id")
        got = {r["experiment"]: (json.loads(r["settings"]), r["point_key"]) for r in stored}
        assert got["model"][0] == {"size": "tiny", "seq": 128, "batch": 4, "iters": 5}
        assert got["ddp"][0] == {"impl": "flat", "seq": 64, "batch": 8, "iters": 3,
                                 "shard_optimizer": "ours"}
        assert got["attention"][0] == {"impl": "sdpa", "seq": 256, "precision": "bf16", "iters": 10}
        assert got["comm"][0] == {"op": "all-reduce", "precision": "fp32", "bytes": 4000}
        assert got["plan"][0] == old["plan"]  # nothing to rename
        assert [json.loads(r["settings"])["warm_cache"] for r in stored
                if r["experiment"] == "step"] == [False, True, False]
        assert [json.loads(r["settings"]) for r in stored if r["experiment"] == "memory-residuals"
                ] == [{"size": "tiny", "compile": False}, {"size": "tiny", "compile": True}]
        for r in stored:
            assert r["point_key"] == point_key(r["experiment"], json.loads(r["settings"]))
        assert s.query("SELECT seq, batch, iters FROM model_runs") == [
            {"seq": 128, "batch": 4, "iters": 5}]
        assert s.query("SELECT batch, shard_optimizer FROM ddp_runs") == [
            {"batch": 8, "shard_optimizer": "ours"}]
        assert s.query("SELECT precision FROM attention_runs") == [{"precision": "bf16"}]
        assert s.query("SELECT bytes FROM comm_runs") == [{"bytes": 4000}]
        # the old names are no columns any more
        for view, old_name in (("model_runs", "context_length"), ("model_runs", "steps"),
                               ("ddp_runs", "global_batch"), ("attention_runs", "dtype"),
                               ("ddp_runs", "optimizer_sharding"), ("comm_runs", "size_bytes"),
                               ("step_runs", "cold_cache"), ("memory_residuals_runs", "impl")):
            with pytest.raises(sqlite3.OperationalError, match=f"no such column: {old_name}"):
                s.query(f"SELECT {old_name} FROM {view}")


def test_reading_an_older_store_reads_it_migrated_and_leaves_it_as_it_was(db_path, tmp_path):
    """`sql` and `report` on a store of an older schema see the current names and views;
    the file is not written (it is migrated by the next measuring command)."""
    from tests.conftest import invoke

    conn = sqlite3.connect(db_path, isolation_level=None)
    schema.migrate(conn, target=6)
    conn.execute("INSERT INTO invocations (id, command, gpu, started) VALUES "
                 "('i1', 'model', 'cpu', '2026-11-20 10:00:00')")
    settings = {"size": "tiny", "context_length": 128, "batch_size": 4, "steps": 5,
                "mode": "train", "precision": "fp32", "device": "cpu"}
    conn.execute("INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, "
                 "point_key, created) VALUES ('r1', 'i1', 'model', 'ok', ?, ?, 'k', "
                 "'2026-11-20 10:00:01')",
                 (json.dumps(settings), json.dumps({"step_ms_mean": 12.5})))
    conn.close()
    before = db_path.read_bytes()

    with connect_readonly(db_path, lambda: EXPERIMENTS) as ro:
        assert ro.execute("SELECT seq, batch, iters, step_ms_mean FROM model_runs").fetchall() == [
            (128, 4, 5, 12.5)]
        with pytest.raises(sqlite3.OperationalError):
            ro.execute("DELETE FROM runs")
    got = invoke("sql", "SELECT seq, batch FROM model_runs", "--json", "--db", db_path)
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == [{"seq": 128, "batch": 4}]
    out = tmp_path / "rep"
    rep = invoke("report", "--where", "seq=128", "--db", db_path, "--out", out)
    assert rep.exit_code == 0, rep.output
    assert "12.5" in (out / "report.md").read_text()
    assert db_path.read_bytes() == before
    assert sorted(p.name for p in db_path.parent.iterdir() if p.name.startswith(db_path.name)) == [
        db_path.name]


def test_views_an_older_cs336sys_rebuilt_are_read_as_this_ones(db_path, tmp_path):
    """A store measured by this cs336sys, then by an older checkout of the same schema, which
    rebuilt the views to its own columns: `sql` failed on a column the older view lacks
    (`no such column: time_ms_rank_max`) and the report fell back to another statistic. A
    reader reads the current views of a copy; the file stays as it was."""
    import dataclasses

    from cs336sys.experiments.catalog import by_kind
    from cs336sys.store.views import ensure_views
    from tests.conftest import invoke

    comm = by_kind()["comm"]
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [], "comm")
        s.add_run(inv, "comm", "ok", {"op": "all-reduce", "bytes": 1000},
                  {"time_ms_max": 4.7, "time_ms_rank_max": 3.5})
    older = dataclasses.replace(comm, metrics=tuple(
        m for m in comm.metrics if m.name != "time_ms_rank_max"))
    conn = sqlite3.connect(db_path, isolation_level=None)
    ensure_views(conn, [older])  # what the older checkout's writer leaves behind
    conn.close()
    before = db_path.read_bytes()
    got = invoke("sql", "SELECT time_ms_max, time_ms_rank_max FROM comm_runs", "--json",
                 "--db", db_path)
    assert got.exit_code == 0, got.output
    assert json.loads(got.stdout) == [{"time_ms_max": 4.7, "time_ms_rank_max": 3.5}]
    assert db_path.read_bytes() == before


def test_a_closed_store_holds_its_runs_though_a_reader_keeps_it_open(db_path, tmp_path):
    """browse's Datasette keeps the store open while a sweep writes it: the WAL outlived the
    sweep, and a copy of the .db alone (scp of results.db) lacked its runs."""
    import shutil

    Store(db_path, EXPERIMENTS).close()
    reader = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True)
    reader.execute("SELECT count(*) FROM runs").fetchone()
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [], "model")
        for i in range(3):
            s.add_run(inv, "model", "ok", {"size": "tiny", "seq": i}, {"step_ms_mean": 1.0})
    copy = tmp_path / "copy.db"
    shutil.copyfile(db_path, copy)  # the .db alone, its -wal left behind
    reader.close()
    assert sqlite3.connect(copy).execute("SELECT count(*) FROM runs").fetchone() == (3,)


def test_newer_schema_is_refused(db_path):
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA user_version = 99")
    conn.close()
    with pytest.raises(StoreError, match="newer"):
        Store(db_path, EXPERIMENTS)


def test_a_file_that_is_not_sqlite_is_refused_and_untouched(tmp_path):
    path = tmp_path / "notes.txt"
    path.write_text("my precious notes\n")
    with pytest.raises(StoreError, match="not a SQLite database"):
        Store(path, EXPERIMENTS)
    with pytest.raises(StoreError, match="not a SQLite database"):
        connect_readonly(path)
    assert path.read_text() == "my precious notes\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_views_follow_the_declarations_passed_in_and_a_users_own_view_survives(db_path):
    """Views come from the declarations the caller passes (experiments/catalog.py): a new one
    gets its view, a changed one is re-created, one no longer declared is dropped with the
    whole catalog; a user's own view is never touched."""
    import dataclasses

    from cs336sys.experiments.catalog import by_kind
    from cs336sys.sweep.declaration import Experiment, Metric

    Store(db_path, EXPERIMENTS).close()
    conn = sqlite3.connect(db_path)
    conn.execute("CREATE VIEW my_view AS SELECT 1 AS one")
    conn.commit()
    conn.close()
    extra = Experiment(kind="extra", view="extra_runs", title="Extra", spec=object, run=print,
                       settings=("a",), metrics=(Metric("b", "", "b"),), tables=())
    with Store(db_path, (*EXPERIMENTS, extra)) as s:
        names = {r["name"] for r in s.query("SELECT name FROM sqlite_master WHERE type='view'")}
        assert {"model_runs", "extra_runs", "my_view"} <= names
        inv = s.begin_invocation(PROV, [], "t")
        s.add_run(inv, "extra", "ok", {"a": 1}, {"b": 2, "c": 3})
        assert s.query("SELECT a, b FROM extra_runs") == [{"a": 1, "b": 2}]
    more = dataclasses.replace(extra, metrics=(*extra.metrics, Metric("c", "", "c")))
    with Store(db_path) as s:  # no declarations: the views stay as they are
        s.ensure_views([more])  # one declaration changed: its view alone is re-created
        assert s.query("SELECT a, b, c FROM extra_runs") == [{"a": 1, "b": 2, "c": 3}]
        assert s.query("SELECT count(*) AS n FROM model_runs") == [{"n": 0}]
    with Store(db_path, EXPERIMENTS) as s:  # the whole catalog, without extra: dropped
        names = {r["name"] for r in s.query("SELECT name FROM sqlite_master WHERE type='view'")}
    assert "extra_runs" not in names and {"model_runs", "my_view"} <= names
    assert by_kind()["model"].view == "model_runs"


def test_readonly_connection_cannot_write(db_path):
    Store(db_path, EXPERIMENTS).close()
    conn = connect_readonly(db_path)
    with pytest.raises(sqlite3.OperationalError):
        conn.execute("DELETE FROM runs")


def test_a_store_being_created_by_another_process_is_not_refused(db_path):
    """What a second process sees while the first creates the store: a WAL-mode database
    without a table yet (the migration is one transaction). It becomes the store; a database
    with anyone else's table is still refused."""
    conn = sqlite3.connect(db_path)
    conn.execute("PRAGMA journal_mode = WAL")  # what the creator does before migrating
    assert db_path.stat().st_size > 0
    with Store(db_path, EXPERIMENTS) as s:  # no "not a results store"
        assert schema.version(s.conn) == SCHEMA_VERSION
    conn.close()
    foreign = db_path.with_name("foreign.db")
    sqlite3.connect(foreign).execute("CREATE TABLE notes (x)").connection.close()
    with pytest.raises(StoreError, match="not a results store"):
        Store(foreign, EXPERIMENTS)


def test_a_store_copied_by_dump_is_told_why_and_how_to_mend_it(db_path, tmp_path):
    """`sqlite3 old.db .dump | sqlite3 new.db` keeps every table and drops PRAGMA
    user_version: it was refused as lacking cs336sys's tables. It is still refused (its
    version is unknown), for the right reason; with the version set, it is a store again."""
    with Store(db_path, EXPERIMENTS) as s:
        s.add_run(s.begin_invocation({"gpu": "cpu"}, [], "model"), "model", "ok",
                  {"size": "tiny"}, {"step_ms_mean": 1.0})
    dumped = tmp_path / "dumped.db"
    copy = sqlite3.connect(dumped)
    copy.executescript("\n".join(sqlite3.connect(db_path).iterdump()))
    copy.close()
    with pytest.raises(StoreError, match=r"has cs336sys's tables but no schema version "
                                         r"\(PRAGMA user_version is 0, as after `sqlite3 "
                                         r"old.db .dump"):
        connect_readonly(dumped)
    sqlite3.connect(dumped).execute(f"PRAGMA user_version = {SCHEMA_VERSION}").connection.close()
    assert connect_readonly(dumped).execute("SELECT count(*) FROM runs").fetchone() == (1,)


STORE_6 = Path(__file__).parent / "stores" / "schema6.db"  # tests/stores/make_schema6.py


def test_a_committed_schema_6_store_reads_and_reports_in_todays_names(tmp_path):
    """A store 0.2 wrote (committed, not built by today's migrations): `sql` and `report`
    read it under today's names and leave the file as it is; a measuring command's open
    migrates it with every row kept."""
    from tests.conftest import invoke

    db = tmp_path / "old.db"
    db.write_bytes(STORE_6.read_bytes())

    def sql(query):
        got = invoke("sql", query, "--json", "--db", db)
        assert got.exit_code == 0, got.output
        return json.loads(got.stdout)

    assert sql("SELECT seq, batch, iters, step_ms_mean FROM model_runs") == [
        {"seq": 256, "batch": 4, "iters": 5, "step_ms_mean": 41.5}]
    assert sql("SELECT precision, fwd_ms_mean, e2e_ms_mean FROM attention_runs") == [
        {"precision": "bf16", "fwd_ms_mean": 0.25, "e2e_ms_mean": 0.75}]
    assert sql("SELECT seq, batch, iters, shard_optimizer FROM ddp_runs") == [
        {"seq": 64, "batch": 4, "iters": 3, "shard_optimizer": "ours"}]
    assert sql("SELECT bytes, precision FROM comm_runs") == [{"bytes": 4000, "precision": "fp32"}]
    assert sql("SELECT warm_cache, seq FROM step_runs") == [{"warm_cache": 0, "seq": 32}]
    assert sql("SELECT compile, saved_bytes FROM memory_residuals_runs") == [
        {"compile": 1, "saved_bytes": 1048576}]
    out = tmp_path / "report"
    result = invoke("report", "--format", "md", "--out", out, "--db", db)
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    # one point each: its settings on the line above its table (under today's names)
    assert "Same in every row: size=small, seq=256, batch=4, mode=train, precision=bf16" in md
    assert "41.5" in md
    assert "Same in every row: impl=sdpa, d=64, seq=1024, precision=bf16" in md
    assert "| 0.25 | 0.5 | 0.75 |" in md
    assert "flat +sharded opt" in md  # stored as 0.2 did, `own`
    assert db.read_bytes() == STORE_6.read_bytes()  # read through a migrated copy
    with Store(db, EXPERIMENTS) as s:
        assert schema.version(s.conn) == SCHEMA_VERSION
        assert s.query("SELECT count(*) AS n FROM runs") == [{"n": 6}]


def test_a_journal_that_vanishes_while_it_is_checked_is_no_refusal(tmp_path, monkeypatch):
    """Another process creating the store leaves a -journal for an instant: seen, then gone
    before its permissions were read, it was 'a file this process may not read and write'
    and a writer failed (two writers at once, once in a few hundred runs)."""
    import os

    from cs336sys.store.guard import check_path

    path = tmp_path / "results.db"
    journal = tmp_path / "results.db-journal"
    journal.write_bytes(b"")
    real = os.access

    def committed_meanwhile(p, mode, *args, **kwargs):
        if str(p) == str(journal):
            journal.unlink()
            return False
        return real(p, mode, *args, **kwargs)

    monkeypatch.setattr(os, "access", committed_meanwhile)
    assert check_path(path, writing=True) == path
