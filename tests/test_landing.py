"""Outputs that land whole (measure/landing.py): a signal held across a block is handled
after it, whichever thread the OS gives it to; staged files land together or not at all,
in a report, an export, a trace."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cs336sys.measure.landing import held, staged


def test_a_signal_inside_a_held_block_is_handled_after_it():
    done = []
    with pytest.raises(KeyboardInterrupt):
        with held():
            signal.raise_signal(signal.SIGINT)
            done.append("the block ran to its end")
    assert done == ["the block ran to its end"]
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_a_signal_the_os_gives_another_thread_is_held_too():
    """A process-directed signal goes to any thread that does not block it: blocking it in
    the main thread alone (pthread_sigmask) let torch's or OpenBLAS's threads take it, and
    Python then ran the handler in the main thread, inside the block."""
    started, stop = threading.Event(), threading.Event()
    other = threading.Thread(target=lambda: (started.set(), stop.wait(10)), daemon=True)
    other.start()
    started.wait()
    done = []
    try:
        with pytest.raises(KeyboardInterrupt):
            with held():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(50):  # Python's checks, where a handler would run
                    time.sleep(0.001)
                done.append("the block ran to its end")
    finally:
        stop.set()
        other.join()
    assert done == ["the block ran to its end"]


def test_staged_files_land_together_and_are_told(tmp_path):
    told = []
    old = tmp_path / "out" / "a.txt"
    old.parent.mkdir()
    old.write_text("old")
    with staged(told.append) as stage:
        stage.path(old).write_text("new a")
        stage.path(tmp_path / "out" / "sub" / "b.txt").write_text("new b")
        assert old.read_text() == "old" and not (tmp_path / "out" / "sub" / "b.txt").exists()
    assert told == [[old, tmp_path / "out" / "sub" / "b.txt"]]
    assert old.read_text() == "new a" and (tmp_path / "out" / "sub" / "b.txt").read_text() == "new b"
    assert sorted(p.name for p in (tmp_path / "out").rglob("*")) == ["a.txt", "b.txt", "sub"]


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_a_block_stopped_part_way_leaves_everything_as_it_was(tmp_path, stop):
    old = tmp_path / "a.txt"
    old.write_text("old")
    told = []
    with pytest.raises(stop):
        with staged(told.append) as stage:
            stage.path(old).write_text("new")
            stage.path(tmp_path / "new" / "deeper" / "b.txt").write_text("b")
            raise stop()
    assert told == [] and old.read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.txt"]  # no temporary, no folder


def test_a_report_stopped_while_written_leaves_the_last_one(tmp_path, monkeypatch):
    """A Ctrl-C once report.html was rendered and before the markdown was: the old report
    stays whole and nothing new appears beside it (each file used to be written in place,
    so the new HTML stood beside the old markdown)."""
    from cs336sys.report import render

    out = tmp_path / "reports"
    render.write(render.Report("the last report", [], []), out, ["html", "md"])
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real_env = render._env

    class Stopped:
        def get_template(self, name):
            raise KeyboardInterrupt  # as the markdown is about to be rendered

    monkeypatch.setattr(render, "_env", lambda markdown=False: Stopped() if markdown
                        else real_env())
    with pytest.raises(KeyboardInterrupt):
        render.write(render.Report("a newer one", [], []), out, ["html", "md"])
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
