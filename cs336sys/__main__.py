"""`cs336sys` and `python -m cs336sys`: the signal handlers first, then the command line.

The handlers (sweep/stopping.py) are installed before typer, torch or any rank is imported
or started, so that Ctrl-C and SIGTERM stop the command the same way at any moment."""

from __future__ import annotations

import faulthandler
import os
import sys

from cs336sys.sweep import stopping


def main() -> None:
    stopping.install()
    # Started with stdout or stderr closed (a daemon, `2>&-`), Python holds None there, and
    # the command failed before it ran: it runs, and says nothing.
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))
    # A point's code that crashes the process (a segfault in a C extension, a Triton
    # interpreter's wild load, an abort) ended the command without a word: Python's fault
    # handler prints each thread's stack, the user's file and line in it, on the way down.
    faulthandler.enable()
    try:
        from cs336sys.cli import main as command_line
    except BaseException:  # while the command line loads
        # The signal's stop, raised as it is or wrapped by what it interrupted: Python 3.10
        # and 3.11 turn an exception raised in a class's __set_name__ (a dataclass field's,
        # as the class is made) into "RuntimeError: Error calling __set_name__" (SIGTERM at
        # 0.13 s, under load). Without a signal, as raised.
        if stopping.pending() is None:
            raise
        print(stopping.untold(), file=sys.stderr)
        stopping.end()
    command_line()


if __name__ == "__main__":
    main()
