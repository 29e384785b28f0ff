"""`cs336sys browse`: the store served by Datasette (the browse extra), read-only, its views'
columns described from the experiments' declarations, with canned queries."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import time
import urllib.request

import pytest

from cs336sys.experiments import model
from tests.conftest import MICRO, invoke, query
from tests.promises import READ_ONLY
from tests.report_fixture import build


def _get(url: str, deadline: float) -> object:
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.load(r)
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


@pytest.mark.slow  # a Python that starts Datasette
@pytest.mark.promise(READ_ONLY)
def test_browse_serves_the_views_with_their_meanings_and_canned_queries(tmp_path):
    # a name with a dot, whose path Datasette tilde-encodes (the one printed was a 404)
    db = build(tmp_path / "results.h100.db")
    before = hashlib.sha256(db.read_bytes()).hexdigest()
    files = sorted(p.name for p in tmp_path.iterdir())
    # --port 0: any free port, the one printed (it printed :0, which served nothing)
    proc = subprocess.Popen([sys.executable, "-m", "cs336sys", "browse", "--db", str(db),
                             "--port", "0"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        copy = proc.stderr.readline()  # served from a copy taken now (no writer has it open)
        assert copy.startswith(f"serving a copy of {db} as it is now"), copy
        said = proc.stderr.readline()
        assert said.startswith(f"serving {db} at http://127.0.0.1:"), said
        base = said.split(" at ")[1].split()[0]
        port = int(base.split(":")[2].split("/")[0])
        assert port > 0 and base == f"http://127.0.0.1:{port}/results~2Eh100"
        deadline = time.monotonic() + 60
        rows = _get(f"{base}/model_runs.json?_shape=array&_size=max", deadline)
        assert len(rows) == len(query(db, "SELECT * FROM model_runs"))
        assert {r["run_id"] for r in rows} == {r["run_id"] for r in query(
            db, "SELECT run_id FROM model_runs")}
        meta = _get(f"http://127.0.0.1:{port}/-/metadata.json", deadline)
        columns = meta["databases"]["results.h100"]["tables"]["model_runs"]["columns"]
        median = model.EXPERIMENT.metric("step_ms_median")
        assert columns["step_ms_median"] == f"{median.meaning} (ms)"
        fastest = _get(f"{base}/fastest_attention_per_seq.json?_shape=array", deadline)
        ok = query(db, "SELECT seq, min(e2e_ms_median) AS m FROM attention_runs "
                       "WHERE status = 'ok' AND e2e_ms_median IS NOT NULL GROUP BY seq")
        assert {(r["seq"], r["e2e_ms_median"]) for r in fastest} <= {(r["seq"], r["m"]) for r in ok}
        assert fastest and _get(f"{base}/latest_per_point.json?_shape=array", deadline)
        # a sweep writes the store meanwhile: the snapshot is served as it was ("database
        # disk image is malformed" from an immutable read of the live file)
        assert hashlib.sha256(db.read_bytes()).hexdigest() == before  # read-only
        stored = len(rows)
        result = invoke("model", *MICRO, "--seq", "8,16", "--mode", "forward", "--warmup", "0",
                        "--iters", "1", "--db", db)
        assert result.exit_code == 0, result.output
        assert len(_get(f"{base}/model_runs.json?_shape=array&_size=max", deadline)) == stored
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
    # read-only: the rows stored are the sweep's alone, and nothing is left beside the store
    # (a WAL store opened read-only gets -wal and -shm files) once the sweep is done
    assert len(query(db, "SELECT * FROM model_runs")) > stored
    assert sorted(p.name for p in tmp_path.iterdir()) == files


def test_without_datasette_it_says_how_to_install_it(tmp_path, monkeypatch):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "datasette" else find(name, *a))
    db = build(tmp_path / "results.db")
    result = invoke("browse", "--db", db)
    assert result.exit_code == 2
    assert result.stderr.strip() == ("Error: cs336sys browse needs Datasette, an optional "
                                     "extra: pip install 'cs336sys[browse]'")


def test_browse_refuses_what_is_not_a_store(tmp_path):
    result = invoke("browse", "--db", tmp_path / "missing.db")
    assert result.exit_code == 2 and "no results store" in result.stderr
    assert not (tmp_path / "missing.db").exists()


def test_a_port_another_server_listens_on_is_bad_input(tmp_path):
    """browse printed "serving ... at http://127.0.0.1:PORT" for someone else's server, then
    Datasette failed to bind (exit 3; --open sent the browser there): one line, exit 2."""
    import socket

    db = build(tmp_path / "results.db")
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        result = invoke("browse", "--db", db, "--port", str(port))
    assert result.exit_code == 2 and "serving" not in result.output, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith(f"Error: --port: cannot serve at 127.0.0.1:{port}: "), line
    # a host that is no address of this machine, with any free port: the host's fault (it
    # was a traceback from choosing the port)
    for port in ("0", "8001"):
        result = invoke("browse", "--db", db, "--port", port, "--host", "no.such.host.invalid")
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert line.startswith(f"Error: --host: cannot serve at no.such.host.invalid:{port}: ")
    # an empty host listened on every interface (the opposite of the default) at http://:PORT
    result = invoke("browse", "--db", db, "--port", "0", "--host", "")
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == ("Error: --host: empty value; give an address (127.0.0.1, "
                                     "or 0.0.0.0 to reach it from other machines)")


def test_the_canned_queries_keep_each_gpu_and_shape_apart(tmp_path):
    """A point is its settings on a machine, and device is cuda:0 on every GPU: the latest
    run per point hid one GPU's runs behind the other's. The fastest attention compared a
    batch of 8 with a batch of 1, and the Triton interpreter's times with compiled ones."""
    import sqlite3

    from cs336sys.cli.browse import QUERIES
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store.db import Store, point_key

    store = Store(tmp_path / "r.db", EXPERIMENTS)
    for inv, gpu in (("a", "NVIDIA H100 80GB HBM3"), ("b", "NVIDIA A100-SXM4-80GB")):
        store.db["invocations"].insert({"id": inv, "gpu": gpu, "started": "2026-01-01"})
    runs = [("a", "model", {"size": "small", "device": "cuda:0"}, {}),
            ("b", "model", {"size": "small", "device": "cuda:0"}, {})]
    shape = {"seq": 128, "d_head": 16, "precision": "fp32", "causal": True, "heads": 4,
             "pass": "both", "device": "cuda:0"}
    for impl, batch, ms, interpreted, apart in (
            ("naive", 8, 1.0, 0, None), ("flash-torch", 1, 1.5, 0, None),
            ("naive", 1, 2.0, 0, None), ("flash-triton", 1, 0.5, 1, None),
            ("yours-torch", 1, 0.7, 0, "ignores is_causal")):  # non-causal work: kept apart
        runs.append(("a", "attention", {**shape, "impl": impl, "batch": batch},
                     {"e2e_ms_median": ms, "interpreted": interpreted, "not_compared": apart}))
    for i, (inv, exp, settings, metrics) in enumerate(runs):
        store.db["runs"].insert({
            "id": f"r{i}", "invocation_id": inv, "experiment": exp, "status": "ok",
            "settings": json.dumps(settings), "metrics": json.dumps(metrics),
            "created": f"2026-01-01 00:00:{i:02d}", "point_key": point_key(exp, settings)})
    store.close()
    conn = sqlite3.connect(tmp_path / "r.db")
    conn.row_factory = sqlite3.Row
    latest = [dict(r) for r in conn.execute(QUERIES["latest_per_point"][1])]
    assert sorted(r["gpu"] for r in latest if r["experiment"] == "model") == [
        "NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"]
    fastest = [dict(r) for r in conn.execute(QUERIES["fastest_attention_per_seq"][1])]
    assert [(r["batch"], r["impl"], r["e2e_ms_median"]) for r in fastest] == [
        (1, "flash-torch", 1.5), (8, "naive", 1.0)]
