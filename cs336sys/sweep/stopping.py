"""Stopping a command from outside: Ctrl-C (SIGINT) and SIGTERM (`timeout`, `kill`, Slurm,
`docker stop`).

`install()` is the first thing `cs336sys` does (cs336sys/__main__.py), before typer, torch
or any rank. From then on either signal raises in the main thread, at once where Python
delivers it: KeyboardInterrupt for SIGINT, `Terminated` for SIGTERM. Neither is an
Exception, so no point turns it into a row: it unwinds the sweep, whose executors store the
interrupted point and reap the ranks, and the recording says how many points are stored
and how to go on (cli/common.py, `recording`); the exit codes are 130 and 143, as a shell
reports a process ended by those signals.

A signal is also remembered, because an import can swallow the exception: torch's C
extension imports numpy while torch is imported and takes any exception from that import,
KeyboardInterrupt included, to mean "numpy is missing". `check()` raises a remembered signal
again; the sweep calls it before each point, so a swallowed Ctrl-C stops the sweep at the
next point boundary at the latest.

A signal that arrives while torch or Triton is being imported is only remembered, not
raised: their imports run Python code called from C++ (pybind11), and a KeyboardInterrupt
thrown there can escape as a C++ exception and abort the process ("terminate called after
throwing an instance of 'pybind11::error_already_set'", exit -6, seen in
tests/test_signals.py under load). It is raised at the next `check()`, before the first
point, or ends the command when it returns (cli.main).

A signal raised inside a backward pass under autograd's anomaly mode (which torch.compile's
AOTAutograd turns on while it traces the joint graph) made torch print "Error detected in
ViewBackward0. Traceback of forward call that caused the error" above the stop's line: the
signal is the error, so from the first signal on that warning is ignored.
"""

from __future__ import annotations

import os
import signal
import warnings
from typing import Any, NoReturn

__all__ = ["Terminated", "check", "end", "exit_code", "install", "pending", "reset", "stored",
           "told", "untold"]


class Terminated(BaseException):
    """This process was asked to stop by SIGTERM. A BaseException like KeyboardInterrupt,
    so that no point turns it into a row and the sweep goes on."""


_received: list[int] = []  # the signals received since install() or reset(), in order
_told: list[bool] = []  # whether the user was told what the stop left (told())
_stored: list[str] = []  # what the command stored, where no recording says it (stored())


def _raise(signum: int) -> None:
    if signum == signal.SIGINT:
        raise KeyboardInterrupt
    raise Terminated(f"terminated by signal {signum} (SIGTERM)")


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
        return  # raised at the next check() (module docstring)
    _raise(signum)


def install() -> None:
    """SIGINT and SIGTERM raise (see above) from now on; call it in the main thread.

    A SIGINT that this process was started ignoring stays ignored: a non-interactive shell
    starts `cmd &` so, as POSIX asks, so that the Ctrl-C meant for the script does not end
    its background jobs. Python itself keeps that choice; SIGTERM stops such a job."""
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:
        signal.signal(signal.SIGINT, _handler)
    signal.signal(signal.SIGTERM, _handler)


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
    what = "Interrupted" if _received[0] == signal.SIGINT else "Terminated (SIGTERM)"
    return f"{what}: {_stored[0] if _stored else 'this command stored nothing'}"


def exit_code() -> int:
    """130 after SIGINT, 143 after SIGTERM (128 + the signal, as a shell reports it)."""
    return 128 + (_received[0] if _received else signal.SIGINT)


def end() -> NoReturn:
    """Exit as the signal received asks (exit_code): stdio flushed and the atexit handlers
    run (temporary folders, torch's workers), then os._exit. A plain exit could end by
    SIGINT instead: CPython kills itself with SIGINT at exit once a KeyboardInterrupt has
    passed through code it ran for a C extension, even one that was caught (seen, now and
    then, with Ctrl-C during torch's import: tests/test_signals.py)."""
    import atexit
    import os
    import sys

    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe: nothing more can be said
            pass
    atexit._run_exitfuncs()
    os._exit(exit_code())


def reset() -> None:
    """Forget the signals received (a test that sends one, once it has been handled)."""
    _received.clear()
    _told.clear()
    _stored.clear()
