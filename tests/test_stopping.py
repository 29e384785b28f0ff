"""How a command's process ends (sweep/stopping.py): once its work is done a signal is only
noted, so none raises inside the interpreter's exit; `done` skips torch's teardown yet
flushes every file still open and runs the atexit handlers."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")


def run(body: str) -> subprocess.CompletedProcess:
    """`body` in a fresh Python with cs336sys's handlers installed, as cs336sys runs.

    A body that spins until a signal tests its condition inside the loop: on Python 3.13 a
    KeyboardInterrupt raised as `while cond: pass` tests `cond` escapes the try around it
    (CPython issue 130279; 22 of 30 runs under load on 3.13.0, none on 3.12)."""
    source = "import os, signal, sys\nfrom cs336sys.sweep import stopping\nstopping.install()\n"
    return subprocess.run([sys.executable, "-c", source + textwrap.dedent(body)],
                          capture_output=True, text=True, timeout=60)


def test_a_signal_in_an_atexit_handler_after_the_command_is_noted_not_raised():
    """A Ctrl-C as the interpreter ran multiprocessing's atexit handler printed "Exception
    ignored in atexit callback" with a KeyboardInterrupt traceback."""
    out = run("""
        import atexit
        atexit.register(lambda: print("the handler ran to its end", file=sys.stderr))
        atexit.register(lambda: signal.raise_signal(signal.SIGINT))  # runs first (LIFO)
        stopping.finish()
        stopping.done(0)
    """)
    assert (out.returncode, out.stderr) == (0, "the handler ran to its end\n")


def test_a_signal_while_a_class_is_made_at_start_up_ends_the_command_by_it():
    """SIGTERM while the command line's modules load, inside a dataclass field's
    __set_name__: Python 3.10 and 3.11 wrap the stop in a RuntimeError, which ended the
    command with that traceback and exit 1 (tests/test_signals.py, at 0.13 s under load)."""
    source = textwrap.dedent("""
        import os, signal, sys, time, types
        import cs336sys.__main__ as entry

        class Field:
            def __set_name__(self, owner, name):
                os.kill(os.getpid(), signal.SIGTERM)  # the handler raises in here
                time.sleep(5)

        def load(name):  # `from cs336sys.cli import main` makes a class as it loads
            class Table:
                where = Field()

        cli = types.ModuleType("cs336sys.cli")
        cli.__getattr__ = load
        sys.modules["cs336sys.cli"] = cli
        entry.main()
    """)
    out = subprocess.run([sys.executable, "-c", source], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 143, out.stderr
    assert out.stderr == "Terminated (SIGTERM): this command stored nothing\n", out.stderr


@pytest.mark.parametrize("nohup", [False, True])
def test_a_hangup_stops_the_command_unless_it_runs_under_nohup(nohup):
    """A closed terminal's SIGHUP stops the command as SIGTERM does (it ended the process
    by the signal, the point it was measuring and the invocation's end unrecorded); under
    `nohup`, started with SIGHUP ignored, it stays ignored, and SIGTERM still stops it."""
    ignored = "signal.signal(signal.SIGHUP, signal.SIG_IGN)\n" if nohup else ""
    source = ignored + textwrap.dedent("""
        import os, signal, time
        from cs336sys.sweep import stopping
        stopping.install()
        try:
            os.kill(os.getpid(), signal.SIGHUP)
            print("went on", flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except stopping.Terminated as exc:
            print(exc, stopping.exit_code())
    """)
    out = subprocess.run([sys.executable, "-c", "import signal\n" + source],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    stop = "went on\nterminated by signal 15 (SIGTERM) 143" if nohup else \
        "terminated by signal 1 (SIGHUP) 129"
    assert out.stdout.strip() == stop, out.stdout


def test_a_second_signal_after_the_command_ends_the_process_as_by_default():
    """In case the exit hangs: the first signal is noted, the next one ends it."""
    out = run("""
        stopping.finish()
        signal.raise_signal(signal.SIGTERM)
        print("noted", file=sys.stderr, flush=True)
        signal.raise_signal(signal.SIGTERM)
        print("never", file=sys.stderr)
    """)
    assert (out.returncode, out.stderr) == (-15, "noted\n")


def test_done_flushes_what_the_users_code_left_open_and_exits_with_the_code(tmp_path):
    """...and reads no object's __class__ as it looks for files: torch.distributed's
    deprecated `reduce_op` warned when read, after the command's last line."""
    log = tmp_path / "log.txt"
    out = run(f"""
        import atexit, warnings

        class Deprecated:
            @property
            def __class__(self):
                warnings.warn("read", FutureWarning)
                return Deprecated

        deprecated = Deprecated()
        left_open = open({str(log)!r}, "w")
        left_open.write("a line the user's code never flushed\\n")
        atexit.register(lambda: print("atexit ran", file=sys.stderr))
        print("the command's output")  # stdout, unflushed in a pipe
        stopping.finish()
        stopping.done(3)
    """)
    assert (out.returncode, out.stdout, out.stderr) == (3, "the command's output\n",
                                                        "atexit ran\n")
    assert log.read_text() == "a line the user's code never flushed\n"


@pytest.mark.parametrize("code, status, said", [(None, 0, ""), ("no store here", 1,
                                                                "no store here\n")])
def test_done_reads_its_code_as_system_exit_does(code, status, said):
    out = run(f"stopping.finish()\nstopping.done({code!r})")
    assert (out.returncode, out.stderr) == (status, said)


def test_done_waits_for_a_thread_that_is_not_a_daemon():
    """A non-daemon thread still running is joined, as the interpreter's exit does."""
    out = run("""
        import threading, time
        threading.Thread(target=lambda: (time.sleep(0.2),
                                         print("the thread finished", file=sys.stderr))).start()
        stopping.finish()
        stopping.done(0)
    """)
    assert (out.returncode, out.stderr) == (0, "the thread finished\n")


def test_the_plain_exit_is_kept_where_cuda_was_initialised_or_cannot_be_told(monkeypatch):
    """CUDA's exit handlers (CUPTI's, under Nsight) run only in the interpreter's own exit."""
    from types import SimpleNamespace

    from cs336sys.sweep import stopping

    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert not stopping._cuda_initialised()
    for cuda_initialised, kept in [(False, False), (True, True)]:
        torch = SimpleNamespace(cuda=SimpleNamespace(is_initialized=lambda v=cuda_initialised: v))
        monkeypatch.setitem(sys.modules, "torch", torch)
        assert stopping._cuda_initialised() is kept
    monkeypatch.setitem(sys.modules, "torch", SimpleNamespace())  # half imported: no .cuda
    assert stopping._cuda_initialised()


def test_a_signal_after_the_sweep_ends_with_what_it_stored(db_path):
    """SIGTERM after the recording's last line (`1 point(s) stored in DB (invocation ID)`)
    ended the command with `Terminated (SIGTERM): this command stored nothing` (seen with
    `profile attention`)."""
    import signal

    from cs336sys.cli.common import recording
    from cs336sys.experiments import model
    from cs336sys.sweep import stopping
    from cs336sys.sweep.result import Result

    (spec,) = model.specs(size=["tiny"], seq=[16], mode=["forward"], device="cpu")

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stopping.install()
    try:
        with recording(db_path, "toy", "cpu") as rec:
            rec.add(model.EXPERIMENT, spec, Result("ok", metrics={"fwd_ms_mean": 1.0}))
        with pytest.raises(stopping.Terminated):
            signal.raise_signal(signal.SIGTERM)  # as the command returns
        said = stopping.untold()
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])
    assert said.startswith(f"Terminated (SIGTERM): 1 point(s) stored in {db_path} (invocation ")


def test_a_signal_inside_a_native_import_raises_once_the_import_is_done(tmp_path):
    """A Ctrl-C while torch imports is not raised there (it could cross pybind11 and abort
    the process) but it is raised as soon as the import is done: torch imports
    torch._dynamo inside `memory`'s first point, and a Ctrl-C then waited for the whole
    point (2 s at tiny size, minutes on a GPU), where nothing called check()."""
    native = tmp_path / "site" / "torch"  # a module body under /torch/ counts as torch's
    native.mkdir(parents=True)
    (native / "slow_part.py").write_text(
        "import os, signal, time\nos.kill(os.getpid(), signal.SIGINT)\ntime.sleep(1.0)\n")
    out = run(f"""
        import time
        sys.path.insert(0, {str(native)!r})
        t0 = time.monotonic()
        try:
            import slow_part
            while True:  # the rest of a point: no check() in it (a spin: see run())
                if time.monotonic() - t0 >= 8:
                    break
            print("ran to the end")
        except KeyboardInterrupt:
            print(f"stopped {{time.monotonic() - t0:.1f}} s in, {{slow_part.__name__}} imported")
    """)
    assert out.returncode == 0, out.stderr
    said = out.stdout.split()
    assert said[0] == "stopped" and 1.0 <= float(said[1]) < 3, out.stdout


def test_a_signal_in_a_callback_the_collector_runs_is_raised_again_not_printed():
    """A Ctrl-C handled inside a weakref callback (WeakValueDictionary's, as `handout
    report` collected its garbage) was printed as "Exception ignored in ..." with a
    traceback, and lost: the command ran on to its next point."""
    out = run("""
        import time, weakref

        class Thing:
            pass

        thing = Thing()
        ref = weakref.ref(thing, lambda _: signal.raise_signal(signal.SIGINT))
        t0 = time.monotonic()
        try:
            del thing  # the callback runs here, and the handler raises inside it
            while True:  # a spin (see run())
                if time.monotonic() - t0 >= 8:
                    break
            print("ran on")
        except KeyboardInterrupt:
            print(f"stopped {time.monotonic() - t0:.1f} s in")
    """)
    assert (out.returncode, out.stderr) == (0, ""), out.stderr
    assert out.stdout.startswith("stopped 0."), out.stdout
