"""`cs336sys db export|merge`: nothing lost or duplicated, OTHER untouched, bad input refused."""

import csv
import hashlib
import io
import json
import sqlite3

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.store import SCHEMA_VERSION, Store, schema
from cs336sys.store.transfer import merge
from tests.conftest import invoke

TRICKY = 'a,b "quoted"\nsecond line'



def prov(machine):
    return {
        "host": f"host-{machine}",
        "device": "cuda:0",
        "gpu": f"GPU {machine}",
        "gpu_count": 1,
        "gpu_memory_gb": 80.0,
        "torch_version": "2.11.0",
        "python_version": "3.11.7",
        "git_commit": f"c0ffee{machine}",
        "git_dirty": 1,
    }


def kstats(n):
    return [
        {
            "phase": "forward",
            "rank": i + 1,
            "name": f"kernel_{i}",
            "calls": 3 * (i + 1),
            "total_ms": 1.5 * (i + 1),
            "mean_ms": 0.5,
            "share": 0.25,
            "time_basis": "cuda",
        }
        for i in range(n)
    ]


def fill(path, machine):
    """A store as one machine leaves it: two invocations, runs of every status, a profile."""
    with Store(path, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov(machine), ["cs336sys", "model"], "model")
        s.add_run(
            inv,
            "model",
            "ok",
            {"size": "small", "mode": "train", "compile": True},
            {"step_ms_mean": 12.25, "tflops": 0.1},
            samples={"step_ms": [12.0, 12.5]},
            started="2026-01-01 00:00:00.000000",
            duration_s=1.25,
        )
        s.add_run(inv, "model", "oom", {"size": "xl", "mode": "train"}, error="CUDA out of memory")
        s.finish_invocation(inv, 0)
        inv = s.begin_invocation(prov(machine), ["cs336sys", "profile", "model"], "profile")
        rid = s.add_run(inv, "profile", "ok", {"target": "model", "note": TRICKY}, {"top": 2})
        s.add_kernel_stats(rid, kstats(2))
        s.add_run(inv, "attention", "error", {"impl": "triton", "seq": 128}, error="boom")
        s.add_run(inv, "attention", "skipped", {"impl": "naive", "seq": 65536})
        s.finish_invocation(inv, 1)


def table_rows(path, table):
    conn = sqlite3.connect(path)
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute(f"SELECT * FROM {table} ORDER BY id")]
    conn.close()
    return rows


def export_text(path, fmt, *extra):
    result = invoke("db", "export", "--format", fmt, "--samples", "--db", path, *extra)
    assert result.exit_code == 0, result.output
    return result.stdout


def fingerprint(path):
    """Bytes, mtime and the directory listing (a read must not leave -wal/-shm files)."""
    return (
        hashlib.sha256(path.read_bytes()).hexdigest(),
        path.stat().st_mtime_ns,
        sorted(p.name for p in path.parent.iterdir()),
    )


def test_export_then_merge_loses_nothing_and_leaves_other_untouched(tmp_path, db_path):
    a = tmp_path / "a" / "a.db"
    a.parent.mkdir()
    fill(a, "A")
    before = fingerprint(a)
    result = invoke("db", "merge", a, "--db", db_path)
    assert result.exit_code == 0, result.output
    assert fingerprint(a) == before
    for table in ("invocations", "runs", "kernel_stats"):
        assert table_rows(db_path, table) == table_rows(a, table), table
    assert len(table_rows(db_path, "runs")) == 5
    assert len(table_rows(db_path, "kernel_stats")) == 2
    for fmt in ("csv", "jsonl"):
        assert export_text(db_path, fmt) == export_text(a, fmt)
    assert fingerprint(a) == before  # neither merge nor export leaves -wal/-shm beside it
    # the table printed: 2 invocations, 5 runs, 2 kernel_stats rows added
    lines = [ln.split() for ln in result.stdout.splitlines()]
    assert ["invocations", "2", "0"] in lines and ["runs", "5", "0"] in lines
    assert ["kernel_stats", "2"] in lines


def test_merging_the_same_store_twice_adds_nothing(tmp_path, db_path):
    a = tmp_path / "a.db"
    fill(a, "A")
    first = merge(db_path, a)
    assert (first.invocations_added, first.runs_added, first.kernel_stats_added) == (2, 5, 2)
    snapshot = {t: table_rows(db_path, t) for t in ("invocations", "runs", "kernel_stats")}
    again = merge(db_path, a)
    assert (again.invocations_added, again.runs_added, again.kernel_stats_added) == (0, 0, 0)
    assert (again.invocations_present, again.runs_present) == (2, 5)
    assert (again.invocations_differing, again.runs_differing) == (0, 0)
    assert {t: table_rows(db_path, t) for t in snapshot} == snapshot


def test_a_column_the_user_added_to_either_store_does_not_stop_a_merge(tmp_path):
    """docs/store.md keeps the columns a user adds: one in --db is left empty in the rows a
    merge adds (it was `no such column: o.note` and a traceback), one in OTHER alone is not
    copied; the rest of every row is."""
    here, there = tmp_path / "here.db", tmp_path / "there.db"
    fill(there, "B")
    with Store(here, EXPERIMENTS):
        pass
    for path, column in ((here, "note"), (there, "mine")):
        conn = sqlite3.connect(path)
        for table in ("invocations", "runs"):
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
        conn.execute(f"UPDATE runs SET {column} = 'x'")
        conn.commit()
        conn.close()
    result = invoke("db", "merge", there, "--db", here)
    assert result.exit_code == 0, result.output
    assert f"note: {here} has no column invocations.mine, runs.mine of {there}'s: its values " \
        "were not copied" in result.stderr  # said, not dropped unsaid
    for table in ("invocations", "runs"):
        ours, theirs = table_rows(here, table), table_rows(there, table)
        assert [r.pop("note") for r in ours] == [None] * len(theirs), table
        assert [{k: v for k, v in r.items() if k != "mine"} for r in theirs] == ours, table
    assert invoke("db", "merge", there, "--db", here).exit_code == 0  # again: nothing added


def test_the_copy_a_killed_merge_left_is_removed_by_the_next(tmp_path, monkeypatch):
    """A merge copies OTHER to a temporary folder; killed by SIGKILL it left the copy (43 MB
    a time) in /tmp. The next merge removes the folders of merges whose process is gone,
    and leaves none of its own."""
    import os
    import subprocess
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / "tmp" / f"cs336sys-merge-{gone.pid}-abc"
    alive = tmp_path / "tmp" / f"cs336sys-merge-{os.getppid()}-def"
    for folder in (orphan, alive):
        folder.mkdir()
        (folder / "other.db").write_bytes(b"x" * 1000)
        (folder / ".cs336sys-lock").touch()  # as its maker left it, no longer locked
    here, there = tmp_path / "here.db", tmp_path / "there.db"
    fill(there, "B")
    result = invoke("db", "merge", there, "--db", here)
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "tmp").iterdir()) == [alive.name]


def test_two_machines_merge_to_the_union(tmp_path, db_path):
    a, c = tmp_path / "a.db", tmp_path / "c.db"
    fill(a, "A")
    fill(c, "C")
    merge(db_path, a)
    counts = merge(db_path, c)
    assert (counts.invocations_added, counts.runs_added, counts.kernel_stats_added) == (2, 5, 2)
    for table in ("invocations", "runs"):
        ids = {r["id"] for r in table_rows(db_path, table)}
        assert ids == {r["id"] for r in table_rows(a, table) + table_rows(c, table)}
    ks = table_rows(db_path, "kernel_stats")
    assert len(ks) == 4 and len({r["id"] for r in ks}) == 4  # renumbered, not clashing
    gpus = [json.loads(line)["gpu"] for line in export_text(db_path, "jsonl").splitlines()]
    assert sorted(gpus) == ["GPU A"] * 5 + ["GPU C"] * 5
    # merging into a store that already has C's runs adds only A's (profile rows follow)
    d = tmp_path / "d.db"
    merge(d, c)
    counts = merge(d, db_path)
    assert (counts.runs_added, counts.runs_present, counts.kernel_stats_added) == (5, 5, 2)


def test_csv_round_trips_values(db_path):
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov("A"), ["x"], "model")
        s.add_run(inv, "model", "ok", {"size": TRICKY, "layers": 4}, {"ms": 0.1, "big": 1e300})
        s.add_run(inv, "model", "oom", {"mode": "train", "size": "s"}, {"ms": None, "n": -7})
        s.finish_invocation(inv, 0)
    rows = list(csv.DictReader(io.StringIO(export_text(db_path, "csv"))))
    header = list(rows[0])
    # union of keys in order of first appearance, settings before metrics, samples last
    assert header[:9] == [
        "run_id",
        "invocation_id",
        "experiment",
        "status",
        "error",
        "started",
        "created",
        "duration_s",
        "point_key",
    ]
    assert {"gpu", "host", "git_commit", "git_dirty", "torch_version"} <= set(header[9:-7])
    # union of keys in order of first appearance, settings before metrics, samples last
    assert header[-7:] == [
        "settings.size",
        "settings.layers",
        "settings.mode",
        "metrics.ms",
        "metrics.big",
        "metrics.n",
        "samples",
    ]
    first, second = rows
    assert first["settings.size"] == TRICKY
    assert int(first["settings.layers"]) == 4 and first["settings.mode"] == ""
    assert float(first["metrics.ms"]) == 0.1 and float(first["metrics.big"]) == 1e300
    assert second["metrics.ms"] == "" and int(second["metrics.n"]) == -7
    assert (first["status"], second["status"]) == ("ok", "oom")
    assert first["gpu"] == "GPU A" and first["git_dirty"] == "1" and first["error"] == ""
    assert first["host"] == "host-A" and first["torch_version"] == "2.11.0"


def test_jsonl_is_one_object_per_run_with_nested_settings(tmp_path, db_path):
    fill(db_path, "A")
    lines = export_text(db_path, "jsonl").splitlines()
    assert len(lines) == 5
    recs = [json.loads(line) for line in lines]
    ids = [r["id"] for r in table_rows(db_path, "runs")]
    assert sorted(r["run_id"] for r in recs) == sorted(ids)
    (prof,) = [r for r in recs if r["experiment"] == "profile"]
    assert prof["settings"] == {"target": "model", "note": TRICKY}
    assert prof["metrics"] == {"top": 2} and prof["status"] == "ok"
    (model,) = [r for r in recs if r["status"] == "ok" and r["experiment"] == "model"]
    assert model["samples"] == {"step_ms": [12.0, 12.5]}
    assert model["settings"]["compile"] is True and model["duration_s"] == 1.25
    assert model["gpu"] == "GPU A" and model["git_commit"] == "c0ffeeA"
    assert json.loads(model["argv"]) == ["cs336sys", "model"]
    # default: no samples; --experiment filters (comma list or repeated)
    out = invoke("db", "export", "--format", "jsonl", "--experiment", "attention", "--db", db_path)
    recs = [json.loads(line) for line in out.stdout.splitlines()]
    assert [r["experiment"] for r in recs] == ["attention", "attention"]
    assert "samples" not in recs[0]
    out = invoke("db", "export", "--experiment", "model,profile", "--db", db_path)
    assert len(list(csv.DictReader(io.StringIO(out.stdout)))) == 3
    # --out writes the file, stdout stays empty
    target = tmp_path / "out" / "runs.jsonl"
    out = invoke("db", "export", "--format", "jsonl", "--out", target, "--db", db_path)
    assert out.exit_code == 0 and out.stdout == "" and len(target.read_text().splitlines()) == 5


def _old_store(path, version):
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, target=version)
    conn.execute("INSERT INTO invocations (id, command, gpu) VALUES ('i-old', 'model', 'V100')")
    conn.execute(
        "INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, created) "
        "VALUES ('r-old', 'i-old', 'model', 'ok', '{\"size\": \"small\"}', "
        "'{\"step_ms_mean\": 3.0}', '2025-01-01 00:00:00')"
    )
    conn.close()


@pytest.mark.parametrize("version", [1, 2])
def test_an_older_schema_merges_and_is_not_migrated_in_place(tmp_path, db_path, version):
    old = tmp_path / "other" / "old.db"
    old.parent.mkdir()
    _old_store(old, version)
    before = fingerprint(old)
    counts = merge(db_path, old)
    assert fingerprint(old) == before
    assert counts.other_version == version and counts.runs_added == 1
    (run,) = table_rows(db_path, "runs")
    assert (run["id"], run["invocation_id"], run["settings"]) == (
        "r-old",
        "i-old",
        '{"size": "small"}',
    )
    conn = sqlite3.connect(old)
    assert schema.version(conn) == version
    conn.close()
    rec = json.loads(export_text(old, "jsonl"))  # export reads the old schema as it is
    assert rec["run_id"] == "r-old" and rec["point_key"] is None and rec["gpu"] == "V100"


def assert_refused(result, *absent):
    assert result.exit_code == 2, result.output
    err = result.stderr.strip()
    assert err.startswith("Error:") and "\n" not in err, err
    for path in absent:
        assert not path.exists(), path
    return err


def test_merge_refuses_bad_other(tmp_path, db_path):
    missing = tmp_path / "missing.db"
    assert "no results store" in assert_refused(
        invoke("db", "merge", missing, "--db", db_path), db_path
    )
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    assert "not a SQLite" in assert_refused(invoke("db", "merge", text, "--db", db_path), db_path)
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    err = assert_refused(invoke("db", "merge", foreign, "--db", db_path), db_path)
    assert "not a results store" in err
    newer = tmp_path / "newer.db"
    fill(newer, "N")
    conn = sqlite3.connect(newer)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.close()
    err = assert_refused(invoke("db", "merge", newer, "--db", db_path), db_path)
    assert "newer" in err and "upgrade" in err
    fill(db_path, "A")
    before = fingerprint(db_path)
    err = assert_refused(invoke("db", "merge", db_path, "--db", db_path))
    assert "same" in err or "being merged into" in err
    assert fingerprint(db_path) == before


def test_failed_merge_writes_nothing(tmp_path, db_path):
    # An orphan run (its invocation missing) breaks the foreign key: the whole merge rolls back.
    bad = tmp_path / "bad.db"
    fill(bad, "B")
    conn = sqlite3.connect(bad)
    conn.execute("DELETE FROM invocations WHERE command = 'profile'")
    conn.commit()
    conn.close()
    fill(db_path, "A")
    before = {t: table_rows(db_path, t) for t in ("invocations", "runs", "kernel_stats")}
    err = assert_refused(invoke("db", "merge", bad, "--db", db_path))
    assert {t: table_rows(db_path, t) for t in before} == before
    # the cause in words, the run named (it read "FOREIGN KEY constraint failed" alone)
    (orphan,) = [r["id"] for r in table_rows(bad, "runs")
                 if r["experiment"] == "profile"][:1]
    assert f"has rows that name a row of invocations it does not hold: runs {orphan!r}" in err


def test_a_ctrl_c_once_the_merge_is_written_ends_with_what_it_added(tmp_path, db_path,
                                                                    monkeypatch):
    """Ctrl-C while the merged rows' table is printed: the line the command ends with says
    what the merge added, not "stored nothing"."""
    import signal

    from cs336sys.cli import db as cli_db
    from cs336sys.sweep import stopping

    a = tmp_path / "a.db"
    fill(a, "A")

    def interrupted(*args, **kwargs):
        stopping._received.append(signal.SIGINT)
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_db, "table", interrupted)
    invoke("db", "merge", a, "--db", db_path)
    assert len(table_rows(db_path, "runs")) == 5
    assert stopping.untold() == (f"Interrupted: merged {a} into {db_path}: 2 invocation(s) and 5 "
                                 "run(s) added")


def test_export_refuses_bad_input(tmp_path, db_path):
    out = tmp_path / "x.csv"
    assert_refused(invoke("db", "export", "--db", db_path, "--out", out), db_path, out)
    fill(db_path, "A")
    err = assert_refused(
        invoke("db", "export", "--format", "xml", "--db", db_path, "--out", out), out
    )
    assert "--format" in err
    err = assert_refused(invoke("db", "export", "--gpu", "H100", "--db", db_path, "--out", out),
                         out)
    assert "--gpu 'H100': no stored run is on that GPU" in err
    err = assert_refused(
        invoke("db", "export", "--experiment", "model,nope", "--db", db_path, "--out", out), out
    )
    assert "'nope'" in err
    foreign = tmp_path / "foreign.db"
    sqlite3.connect(foreign).execute("CREATE TABLE t (x)").connection.close()
    err = assert_refused(invoke("db", "export", "--db", foreign, "--out", out), out)
    assert "results store" in err
    # an experiment with a view but no rows is not an error: just a header
    res = invoke("db", "export", "--experiment", "comm", "--db", db_path)
    assert res.exit_code == 0 and len(res.stdout.splitlines()) == 1


def test_export_into_a_pipe_its_reader_closed_ends_quietly(db_path):
    """`cs336sys db export | head -1`: the reader stops reading; the export ends as cat does,
    exit 0 and nothing on stderr (it said `--out None: cannot write there`, exit 2)."""
    import subprocess
    import sys

    fill(db_path, "A")
    proc = subprocess.Popen([sys.executable, "-m", "cs336sys", "db", "export", "--samples",
                             "--db", str(db_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # before a byte is read
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0 and err == "", err


def test_merge_reads_a_store_another_process_has_open(tmp_path, db_path):
    # While a writer holds OTHER open, its newest rows may live only in OTHER-wal: the
    # snapshot must see them, and the differing-content count flags a row that changed.
    live = tmp_path / "live" / "live.db"
    live.parent.mkdir()
    fill(live, "L")
    merge(db_path, live)
    with Store(live, EXPERIMENTS) as writer:
        inv = writer.begin_invocation(prov("L"), ["x"], "model")
        writer.add_run(inv, "model", "ok", {"size": "late"}, {"step_ms_mean": 1.0})
        assert live.with_name("live.db-wal").exists()
        counts = merge(db_path, live)
        writer.finish_invocation(inv, 0)
        finished = merge(db_path, live)
    assert (counts.invocations_added, counts.runs_added, counts.runs_present) == (1, 1, 5)
    # running when first merged, finished since: its end is taken, nothing else differs
    assert (finished.invocations_added, finished.invocations_finished,
            finished.invocations_differing) == (0, 1, 0)
    ended = [r for r in table_rows(db_path, "invocations") if r["id"] == inv]
    assert ended[0]["exit_status"] == 0 and ended[0]["finished"] is not None
    assert merge(db_path, live).invocations_finished == 0
    (late,) = [r for r in table_rows(db_path, "runs") if '"late"' in r["settings"]]
    assert late["status"] == "ok"


def test_a_run_and_its_kernel_stats_are_one_write(db_path):
    bad = {"phase": "forward", "rank": 1, "calls": 1, "total_ms": 1.0, "mean_ms": 1.0,
           "share": 1.0, "time_basis": "cpu"}  # no name: kernel_stats refuses it
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov("A"), [], "profile")
        with pytest.raises(sqlite3.IntegrityError):
            s.add_run(inv, "profile", "ok", {"target": "model"}, tables={"kernel_stats": [bad]})
        assert s.query("SELECT count(*) AS n FROM runs")[0]["n"] == 0  # rolled back together
        s.add_run(inv, "profile", "ok", {"target": "model"},
                  tables={"kernel_stats": [{**bad, "name": "mm"}]})
        assert [r["n"] for r in s.query("SELECT count(*) AS n FROM kernel_stats")] == [1]


def test_merge_adds_the_kernel_stats_a_run_here_lacks(tmp_path):
    other, this = tmp_path / "other.db", tmp_path / "this.db"
    row = {"phase": "forward", "rank": 1, "name": "mm", "calls": 2, "total_ms": 1.5,
           "mean_ms": 0.75, "share": 1.0, "time_basis": "cpu"}
    with Store(other, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov("A"), [], "profile")
        rid = s.add_run(inv, "profile", "ok", {"target": "model"}, tables={"kernel_stats": [row]})
    # THIS has the run without its stats, as a Ctrl-C between the writes once left it
    assert invoke("db", "merge", other, "--db", this).exit_code == 0
    conn = sqlite3.connect(this)
    conn.execute("DELETE FROM kernel_stats")
    conn.commit()
    conn.close()
    assert invoke("db", "merge", other, "--db", this).exit_code == 0
    assert table_rows(this, "kernel_stats") == table_rows(other, "kernel_stats")
    assert invoke("db", "merge", other, "--db", this).exit_code == 0  # and only once
    assert len(table_rows(this, "kernel_stats")) == 1
    assert table_rows(this, "runs")[0]["id"] == rid


def test_a_folder_whose_maker_holds_its_lock_is_kept(tmp_path, monkeypatch):
    """A maker in another PID namespace sharing /tmp (a container, a Slurm job) has a pid
    that reads as gone here: its folder was removed under it, a merge in progress with it.
    A folder is removed only where no process holds its lock."""
    import os
    import subprocess
    import sys
    import tempfile

    from cs336sys.measure import scratch

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    held = tmp_path / "cs336sys-merge-999999-abc"  # a pid that names no process here
    held.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", (
        "import fcntl, os, sys, time\n"
        f"fd = os.open({str(held / scratch.LOCK)!r}, os.O_CREAT | os.O_RDWR)\n"
        "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(60)")],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline() == "held\n"
        with scratch.scratch("cs336sys-merge-") as mine:
            assert held.exists() and os.path.exists(os.path.join(mine, scratch.LOCK))
    finally:
        holder.kill()
        holder.wait()
    scratch.remove_orphans("cs336sys-merge-")
    assert not held.exists() and not os.path.exists(mine)


def test_export_of_a_run_edited_into_bad_json_is_one_line(tmp_path, db_path):
    """A row whose metrics were edited by hand into something that is not JSON: report said
    so in one line, db export ended with JSONDecodeError's traceback."""
    fill(db_path, "a")
    conn = sqlite3.connect(db_path)
    conn.execute("UPDATE runs SET metrics = '{bad' WHERE rowid = (SELECT min(rowid) FROM runs)")
    conn.commit()
    conn.close()
    out = tmp_path / "runs.jsonl"
    result = invoke("db", "export", "--db", db_path, "--out", out)
    assert result.exit_code == 2 and not out.exists(), result.output
    (line,) = result.stderr.strip().splitlines()
    assert "its metrics is not JSON" in line and "Traceback" not in result.output, line


def test_where_matches_a_setting_in_any_case_as_the_commands_read_it(db_path):
    """`--size 8B` stores 8b: `db export --where size=8B` exported 0 runs and report said no
    run matched. Text settings match in any case; numbers and booleans as before."""
    fill(db_path, "a")
    for where in ("size=small", "size=SMALL", "size=Small"):
        got = [json.loads(line) for line in export_text(db_path, "jsonl", "--where", where)
               .splitlines()]
        assert [r["settings"]["size"] for r in got] == ["small"], where
    assert export_text(db_path, "jsonl", "--where", "compile=true").count("\n") == 1
    # the invocation's own columns too: `command=MODEL` the runs `cs336sys model` stored
    assert export_text(db_path, "jsonl", "--where", "command=MODEL").count("\n") == 2


def test_where_takes_a_size_as_the_comm_table_prints_it(db_path):
    """comm's table prints its `bytes` setting as `1MB` under the header `size`: `--where
    bytes=1MB` and `--where size=1MB` both selected nothing, silently; the first selects the
    1,000,000-byte rows, and a report the second leaves empty says what `size` also heads."""
    from cs336sys.report.select import also_headers, parse_where

    assert parse_where(["bytes=1MB", "bytes=1MiB", "bytes=8"], EXPERIMENTS) == [
        ("bytes", "1000000"), ("bytes", "1048576"), ("bytes", "8")]
    assert parse_where(["size=1MB"], EXPERIMENTS) == [("size", "1MB")]  # a model's size name
    assert also_headers(["size=1MB", "bytes=1MB", "ckpt=none"], EXPERIMENTS) == [
        "size is also the header of the setting bytes"]
    with Store(db_path, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov("a"), ["cs336sys", "comm"], "comm")
        for size in (1_000_000, 2_000_000):
            s.add_run(inv, "comm", "ok", {"op": "all-reduce", "bytes": size}, {"time_ms_mean": 1.0})
        s.finish_invocation(inv, 0)
    got = [json.loads(line)["settings"]["bytes"]
           for line in export_text(db_path, "jsonl", "--where", "bytes=1MB").splitlines()]
    assert got == [1_000_000]
    result = invoke("report", "--db", db_path, "--where", "size=1MB", "--format", "md",
                    "--out", db_path.parent / "r")
    assert result.exit_code == 0
    assert "No stored runs match this selection (size is also the header of the setting " \
           "bytes)" in result.stderr
