"""A report's drawing workers (report/drawer.py) end with the command, however it is
stopped, and print nothing of their own. (Linux: /proc.)"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.promises import SIGNALS
from tests.report_fixture import build
from tests.test_signals import descendants, gone_within

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]


@pytest.fixture(scope="module")
def fixture_store(tmp_path_factory) -> Path:
    return build(tmp_path_factory.mktemp("workers") / "fixture.db")


def _workers_below(root: int, timeout: float = 30.0) -> set[int]:
    """The report's drawing workers: forked by the command (its command line), not a `git`
    it runs (whose command line is the command's too, until its exec)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = set()
        for pid in descendants(root):
            try:
                if b"cs336sys\0report\0" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    found.add(pid)
            except OSError:
                continue
        if len(found) >= 2:  # a worker a core (the suite's machines have 2 or more)
            return found
        time.sleep(0.01)
    raise AssertionError("the report forked no drawing worker")


@pytest.mark.promise(SIGNALS)
@pytest.mark.parametrize("to_the_job", [True, False], ids=["ctrl-c-to-the-job", "sigterm"])
def test_a_report_stopped_while_its_workers_start_leaves_none(tmp_path, fixture_store,
                                                             to_the_job):
    """A terminal's Ctrl-C reaches the report's drawing workers too: each printed a
    KeyboardInterrupt traceback. A SIGTERM to the command alone left them idle on their
    queue, and the command's exit waited for them for ever, its output open."""
    db = tmp_path / "r.db"
    shutil.copy(fixture_store, db)
    proc = subprocess.Popen([sys.executable, "-m", "cs336sys", "report", "--since", "2020-01-01",
                             "--out", str(tmp_path / "report"), "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    workers = _workers_below(proc.pid)
    if to_the_job:
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode in (0, 130 if to_the_job else 143), err
    assert "Traceback" not in err, err
    gone_within(workers, 10.0)


# A worker whose start is slow: the command's SIGTERM (Pool.terminate) reaches it before its
# own handlers are set, as it did when a Ctrl-C came just after the workers were forked.
_SLOW_START = """
import time
from cs336sys.report import drawer

start = drawer._start_worker
drawer._start_worker = lambda command: (time.sleep(1.0), start(command))
pool = drawer.Drawer(start=True)
assert pool._pool is not None, "no workers forked (one core?)"
pool._stop()
print("stopped")
"""


@pytest.mark.promise(SIGNALS)
def test_a_worker_told_to_end_before_its_handlers_are_set_still_ends():
    """Pool.terminate's SIGTERM met the handler a worker inherits, which only notes it (the
    command's, held while it forks): the worker lived on idle, and the command stopped by a
    Ctrl-C waited for it for ever (2 runs in 25 of the test above). Each worker now starts
    with both signals blocked, and one sent early ends it once its handlers are set."""
    out = subprocess.run([sys.executable, "-c", _SLOW_START], capture_output=True, text=True,
                         timeout=20)
    assert out.returncode == 0 and out.stdout.strip() == "stopped", out.stderr


# A plot whose drawing kills the worker that draws it (as the OOM killer would), and that
# draws here, in the command's own process.
_KILLED_WORKER = """
import os
import signal

from cs336sys.report import drawer

COMMAND = os.getpid()


class Deadly:
    def draw(self):
        if os.getpid() != COMMAND:
            os.kill(os.getpid(), signal.SIGKILL)
        return b"drawn here"


with drawer.Drawer(start=True) as pool:
    assert pool._pool is not None, "no workers forked (one core?)"
    print(pool.draw([Deadly(), Deadly(), Deadly()]))
"""


def test_a_worker_killed_while_drawing_leaves_the_plots_to_the_command():
    """Pool.map waits for ever for the plot of a worker that died: `report` hung when the
    OOM killer (or a SIGKILL to that worker) ended one. The pool is ended and the plots
    drawn in the command instead."""
    out = subprocess.run([sys.executable, "-c", _KILLED_WORKER], capture_output=True,
                         text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str([b"drawn here"] * 3)
