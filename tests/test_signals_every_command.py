"""A signal at a random moment of every command (docs/bad-input.md#failures-while-running):
tests/test_signals.py draws four moments for each command that starts ranks, and two for
`handout run`; here every other command of the app gets one, Ctrl-C or SIGTERM, drawn from
the same seed (new with each commit), half of the commands in each run. The command ends
with 0 (done before the signal, or noted after its last line) or 130/143 and a last line
that says what it left, which the store and the folder agree with; no traceback, no staged
file, no process left. Commands are read from the app, so a new one fails here until it has
a moment."""

from __future__ import annotations

import random
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.promises import SIGNALS
from tests.report_fixture import build
from tests.test_hostile import _commands
from tests.test_signals import (  # noqa: F401 (the fixture kills what a failed test left)
    SEED,
    _no_command_outlives_its_test,
    before_cs336sys,
    descendants,
    gone_within,
    signal_command,
    start,
    stored_runs,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]

# The commands test_signals.py stops at its own moments.
RANKED_OR_COVERED = {"model", "comm", "ddp", "step", "handout run"}
# command -> (its arguments, {tmp} for the test's folder; whether --db is the fixture store of
# tests/report_fixture.py; the latest moment, in seconds: about as long as it runs here)
EVERY_OTHER = {
    "env": ([], False, 1.2),
    "sql": (["SELECT count(*) FROM runs a, runs b, runs c"], True, 1.0),
    "attention": (["--seq", "64,128", "--d-head", "16", "--attention", "naive,sdpa",
                   "--iters", "5", "--device", "cpu"], False, 2.5),
    "plan": (["--size", "xl"], False, 0.6),
    "report": (["--since", "2020-01-01", "--out", "{tmp}/report"], True, 2.0),
    "browse": (["--port", "0"], True, 1.5),
    "memory": (["--size", "tiny", "--seq", "32,64", "--device", "cpu", "--snapshot",
                "{tmp}/timelines"], False, 3.0),
    "memory residuals": (["--size", "tiny", "--seq", "32,64", "--no-compile", "--device",
                          "cpu"], False, 2.5),
    "profile model": (["--size", "tiny", "--seq", "32", "--iters", "1", "--device", "cpu",
                       "--trace", "{tmp}/trace.json"], False, 3.0),
    "profile attention": (["--seq", "64", "--d-head", "16", "--attention", "naive", "--iters",
                           "1", "--device", "cpu"], False, 2.5),
    "precision accumulate": ([], False, 1.5),
    "precision autocast": (["--device", "cpu"], False, 1.2),
    "db export": (["--out", "{tmp}/runs.csv"], True, 0.6),
    "db merge": (["{tmp}/other.db"], False, 0.6),
    "handout": ([], True, 0.4),
    "handout report": (["--out", "{tmp}/writeup"], True, 2.0),
}


def moment(command: str) -> tuple[int, float]:
    """The signal and the moment for `command`, from the suite's seed."""
    rng = random.Random(f"{SEED}-{command}")
    _, _, latest = EVERY_OTHER[command]
    return rng.choice([signal.SIGINT, signal.SIGTERM]), round(rng.uniform(0.05, latest), 2)


def test_every_command_has_a_moment():
    commands = {" ".join(path) for path, _ in _commands()}
    assert commands - RANKED_OR_COVERED == set(EVERY_OTHER)


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("signals") / "fixture.db")


# Half of them in each run, the halves changing with the commit (the seed): each command
# is reached within a few commits, for half the time in `make test-slow`.
DRAWN = [c for i, c in enumerate(sorted(EVERY_OTHER)) if (i + SEED) % 2 == 0]


@pytest.mark.promise(SIGNALS)
@pytest.mark.parametrize("command", DRAWN)
def test_a_signal_at_a_random_moment_of_every_other_command(tmp_path, fixture_store, command):
    args, on_fixture, _ = EVERY_OTHER[command]
    sig, after_s = moment(command)
    db = tmp_path / "r.db"
    if on_fixture:
        shutil.copy(fixture_store, db)
    if command == "db merge":
        shutil.copy(fixture_store, tmp_path / "other.db")
    before = len(stored_runs(db)) if db.exists() else 0
    proc = start([*command.split(), *(a.format(tmp=tmp_path) for a in args)], db)
    time.sleep(after_s)
    below = descendants(proc.pid)
    ours = signal_command(proc, sig)
    _, err = proc.communicate(timeout=60)
    again = (f"{signal.Signals(sig).name} at {after_s} s; CS336SYS_SIGNAL_SEED={SEED} draws "
             "the same moment")
    if not ours:
        before_cs336sys(proc, sig, db, again, err, below, had=before)
        return
    done = proc.returncode == 0
    assert done or proc.returncode == 128 + sig, (again, err)
    assert "Traceback" not in err and "Exception ignored" not in err, (again, err)
    added = len(stored_runs(db)) - before if db.exists() else 0
    last = err.strip().splitlines()[-1] if err.strip() else ""
    if not done:
        said = last.split(": ", 1)[1] if ": " in last else last
        if said == "this command stored nothing":
            assert added == 0, (again, err)
        elif said.startswith("wrote "):  # a report or a writeup, landed whole
            assert Path(said.split()[1]).is_file(), (again, err)
        elif said.startswith("exported "):
            assert (tmp_path / "runs.csv").is_file() and added == 0, (again, err)
        elif said.startswith("merged "):
            assert added == int(said.rsplit(" and ", 1)[1].split()[0]), (again, err)
        else:  # a sweep stopped (--resume), or one that had ended ("(invocation ID)")
            assert "point(s) stored in" in said, (again, err)
            assert "--resume" in said or "(invocation " in said, (again, err)
            assert added == int(said.split()[0]), (again, err)
    staged = [p for p in tmp_path.rglob(".*") if p.is_file()]
    assert not staged, (again, staged)
    gone_within(below | descendants(proc.pid), 10.0)



def test_a_signal_ends_a_query_that_would_never_end(tmp_path, fixture_store):
    """A long query of `sql`: SQLite's loop runs no Python, so Ctrl-C and SIGTERM waited for
    the query to end (a recursive one never does: only SIGKILL ended it). A signal
    interrupts the query and the command ends by it, saying it stored nothing (SIGTERM
    takes the same path through sweep/stopping.py)."""
    sig = signal.SIGINT
    db = tmp_path / "r.db"
    shutil.copy(fixture_store, db)
    endless = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
    proc = start(["sql", endless], db)
    time.sleep(2.0)  # well into the query (the command starts in under a second)
    sent = time.monotonic()
    proc.send_signal(sig)
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        pytest.fail("the query went on after the signal")
    assert time.monotonic() - sent < 5 and proc.returncode == 128 + sig, err
    assert err.strip().endswith("this command stored nothing") and "Traceback" not in err, err
