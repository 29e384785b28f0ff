"""Stopping a command from outside: Ctrl-C (SIGINT), SIGTERM (`timeout`, `kill`, Slurm,
`docker stop`) and SIGHUP (the terminal or SSH session that started it closed).

`install()` is the first thing `cs336sys` does (cs336sys/__main__.py), before typer, torch
or any rank. From then on each signal raises in the main thread, at once where Python
delivers it: KeyboardInterrupt for SIGINT, `Terminated` for SIGTERM and SIGHUP. Neither is
an Exception, so no point turns it into a row: it unwinds the sweep, whose executors store the
interrupted point and reap the ranks, and the recording says how many points are stored
and how to go on (cli/common.py, `recording`); the exit codes are 130, 143 and 129, as a
shell reports a process ended by those signals.

A signal is also remembered, because an import can swallow the exception: torch's C
extension imports numpy while torch is imported and takes any exception from that import,
KeyboardInterrupt included, to mean "numpy is missing". `check()` raises a remembered signal
again; the sweep calls it before each point, so a swallowed Ctrl-C stops the sweep at the
next point boundary at the latest.

A signal that arrives while torch or Triton is being imported is only remembered, not
raised: their imports run Python code called from C++ (pybind11), and a KeyboardInterrupt
thrown there can escape as a C++ exception and abort the process ("terminate called after
throwing an instance of 'pybind11::error_already_set'", exit -6, seen in
tests/test_signals.py under load). The signal is sent again every 50 ms from a helper
thread until it finds the import done, and then raises at once: torch imports
`torch._dynamo` inside the first point, as the model's first nn.Embedding is built, and a
Ctrl-C there waited for the whole point (a first point on a GPU can take minutes;
tests/test_stopping.py holds the import case). `check()`, before each point, and cli.main's end
still raise one that an import swallowed.

A signal raised inside a backward pass under autograd's anomaly mode (which torch.compile's
AOTAutograd turns on while it traces the joint graph) made torch print "Error detected in
ViewBackward0. Traceback of forward call that caused the error" above the stop's line: the
signal is the error, so from the first signal on that warning is ignored.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, NoReturn

from cs336sys.measure.landing import STOPS

__all__ = ["EXIT_CODES", "Terminated", "check", "done", "end", "exit_code", "finish", "install",
           "pending", "reset", "stored", "told", "untold"]

# The exit codes of a command a signal stopped (128 + the signal, as a shell reports it).
EXIT_CODES = tuple(128 + signum for signum in STOPS)


class Terminated(BaseException):
    """This process was asked to stop by SIGTERM or SIGHUP (`signum`). A BaseException like
    KeyboardInterrupt, so that no point turns it into a row and the sweep goes on."""

    def __init__(self, message: str = "", signum: int = signal.SIGTERM) -> None:
        super().__init__(message)
        self.signum = signum


_received: list[int] = []  # the signals received since install() or reset(), in order
_told: list[bool] = []  # whether the user was told what the stop left (told())
_stored: list[str] = []  # what the command stored, where no recording says it (stored())


# How a point SIGTERM or SIGHUP stopped reads in the store (its `error`): no measurement.
TERMINATED = "terminated by signal"
# ... and a point in rounds that Ctrl-C stopped short of its last one (sweep/runner.py)
INTERRUPTED = "interrupted by Ctrl-C (SIGINT)"


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"{TERMINATED} {signum} ({signal.Signals(signum).name})", signum)


# The packages whose imports run Python called from C++: a signal there is remembered only.
_NATIVE = tuple(f"{os.sep}{name}{os.sep}" for name in ("torch", "triton"))


def importing_native(frame: Any) -> bool:
    """Whether `frame`, or a frame below it, runs the module-level code of a torch or
    Triton module: an import of theirs is under way."""
    while frame is not None:
        code = frame.f_code
        if code.co_name == "<module>" and any(p in code.co_filename for p in _NATIVE):
            return True
        frame = frame.f_back
    return False


# torch/csrc/autograd/python_anomaly_mode.cpp's warning when a backward node raises
_ANOMALY_ECHO = r"Error detected in \w+\. Traceback of forward call"


def _handler(signum: int, frame: Any) -> None:
    if not _received:
        warnings.filterwarnings("ignore", message=_ANOMALY_ECHO, category=UserWarning)
    _received.append(signum)
    if importing_native(frame):
        _again_soon(signum)  # raised once the import is done (module docstring)
        return
    _raise(signum)


_AGAIN_S = 0.05
_again: list[bool] = []  # a helper thread is about to send the signal again


def _again_soon(signum: int) -> None:
    """Send `signum` to this process again in _AGAIN_S, while this module's handler still
    handles it: the handler then raises it, or, still inside the import, sends it again."""
    if _again:
        return

    def later() -> None:
        time.sleep(_AGAIN_S)
        _again.clear()  # before the kill: the handler it runs may need another one
        if signal.getsignal(signum) is _handler:  # not after finish() or in a held block
            os.kill(os.getpid(), signum)

    _again.append(True)
    threading.Thread(target=later, name="cs336sys-signal-again", daemon=True).start()


def install() -> None:
    """SIGINT, SIGTERM and SIGHUP raise (see above) from now on; call it in the main thread.

    A SIGINT or SIGHUP that this process was started ignoring stays ignored: a
    non-interactive shell starts `cmd &` with SIGINT ignored, as POSIX asks, so that the
    Ctrl-C meant for the script does not end its background jobs, and `nohup cmd` ignores
    SIGHUP so that closing the terminal does not end it. SIGTERM stops either."""
    for signum in STOPS:
        if signum == signal.SIGTERM or signal.getsignal(signum) is not signal.SIG_IGN:
            signal.signal(signum, _handler)
    sys.unraisablehook = _unraisable


def _unraisable(unraisable: Any) -> None:
    """sys.unraisablehook: a signal's exception raised where Python cannot pass it on (a
    weakref callback or a __del__ the garbage collector ran, an atexit handler) was printed
    as "Exception ignored in ..." with its traceback, and lost. It is remembered already:
    it is sent again to be raised in the code that runs next. Anything else as Python
    prints it."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt | Terminated) and _received:
        _again_soon(_received[0])
        return
    sys.__unraisablehook__(unraisable)


def finish() -> None:
    """The command is done, or ending: from now on a first signal is only noted, so that
    it cannot raise inside the interpreter's exit (an atexit callback printed "Exception
    ignored ... KeyboardInterrupt" with its traceback) and the exit status stays the
    command's; a second one ends the process at once, as it would by default, in case the
    exit hangs. Signals received before stay pending()."""
    for signum in STOPS:
        if signal.getsignal(signum) is _handler:
            signal.signal(signum, _after_finish)


_late: list[int] = []  # signals received after finish()


def _after_finish(signum: int, frame: Any) -> None:
    if _late:
        signal.signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
    _late.append(signum)


def raised_by_code(exc: BaseException) -> bool:
    """Whether the KeyboardInterrupt `exc` was raised by code, not Ctrl-C: this module's
    handler (or SIG_IGN) has SIGINT and no signal is pending. Outside a command (run_sweep
    from a notebook) Python's own handler raises it: Ctrl-C's, as far as anyone can tell."""
    handled = signal.getsignal(signal.SIGINT) in (_handler, _after_finish, signal.SIG_IGN)
    return isinstance(exc, KeyboardInterrupt) and handled and pending() is None


def is_stop(exc: BaseException) -> bool:
    """Whether `exc`, a BaseException that is not an Exception, out of the code under test,
    is a stop asked from outside (SIGTERM's Terminated, Ctrl-C's KeyboardInterrupt, one
    raised while a signal is pending), not that code's own failure to store as its point's:
    a KeyboardInterrupt it raised with no key pressed, asyncio's CancelledError, ..."""
    if isinstance(exc, Terminated):
        return True
    if isinstance(exc, KeyboardInterrupt):
        return not raised_by_code(exc)
    return pending() is not None


def pending() -> int | None:
    """The first signal received since install() or reset(), or None."""
    return _received[0] if _received else None


def check() -> None:
    """Raise the first signal received again, if one was (an import may have swallowed
    it); nothing otherwise."""
    if _received:
        _raise(_received[0])


def told() -> None:
    """The user was told what the stop left (the recording's `--resume` line)."""
    _told.append(True)


def stored(what: str) -> None:
    """What this command has stored, said where no recording says it (`db merge`, once its
    transaction has committed): the line a later signal ends the command with (untold)."""
    _stored[:] = [what]


def untold() -> str | None:
    """The line to end with when a signal was received and nobody said what it left: the
    signal came while the command was starting, or while it did something that stores no
    point (a report, a query), or after what `stored` says; None otherwise."""
    if not _received or _told:
        return None
    first = _received[0]
    what = "Interrupted" if first == signal.SIGINT else f"Terminated ({signal.Signals(first).name})"
    return f"{what}: {_stored[0] if _stored else 'this command stored nothing'}"


def exit_code() -> int:
    """130 after SIGINT, 143 after SIGTERM, 129 after SIGHUP (128 + the signal, as a shell
    reports it)."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def end() -> NoReturn:
    """Exit as the signal received asks (exit_code): stdio flushed and the atexit handlers
    run (temporary folders, torch's workers), then os._exit. A plain exit could end by
    SIGINT instead: CPython kills itself with SIGINT at exit once a KeyboardInterrupt has
    passed through code it ran for a C extension, even one that was caught (seen, now and
    then, with Ctrl-C during torch's import: tests/test_signals.py)."""
    finish()
    _leave(exit_code())


def done(code: int | str | None) -> NoReturn:
    """End the process once the command is done, with `code` read as SystemExit reads it.

    Where CUDA was never initialised and no other thread must be waited for, the way end()
    does, after every file still open for writing is flushed (the user's code may leave
    one): the interpreter's teardown of torch took about half a second after the command's
    last line (benchmarks/rank_start.py), and a signal inside it ended the process by the
    signal, with no line. Elsewhere a plain exit: CUDA's own exit handlers (CUPTI's,
    under Nsight) must run."""
    if _cuda_initialised() or any(t is not threading.main_thread() and not t.daemon
                                  for t in threading.enumerate()):
        raise SystemExit(code)
    if code is None or isinstance(code, int):
        status = code or 0
    else:  # as SystemExit("message") does
        print(code, file=sys.stderr)
        status = 1
    _leave(status, every_file=True)


def _cuda_initialised() -> bool:
    """Whether this process initialised CUDA (torch imported it); True when that cannot be
    told, so that the plain exit is kept."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return bool(torch.cuda.is_initialized())
    except Exception:  # a torch half imported (a Ctrl-C its import swallowed)
        return True


def _leave(status: int, every_file: bool = False) -> NoReturn:
    """The atexit handlers run and the output flushed (`every_file`: every file object
    still open, not only stdout and stderr), then os._exit(status)."""
    import atexit

    atexit._run_exitfuncs()
    streams: list[Any] = [sys.stdout, sys.stderr]
    if every_file:
        import gc
        import io

        # By type: isinstance() reads each object's __class__, and some warn when read
        # (torch.distributed.reduce_op printed a FutureWarning after the last line).
        streams += [f for f in gc.get_objects() if issubclass(type(f), io.IOBase)]
    for stream in streams:
        try:
            if not stream.closed:
                stream.flush()
        except Exception:  # a closed pipe, a file opened to read: nothing to say
            pass
    os._exit(status)


def reset() -> None:
    """Forget the signals received (a test that sends one, once it has been handled)."""
    _received.clear()
    _late.clear()
    _told.clear()
    _stored.clear()
