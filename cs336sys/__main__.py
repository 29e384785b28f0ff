"""`cs336sys` and `python -m cs336sys`: the signal handlers first, then the command line.

The handlers (sweep/stopping.py) are installed before typer, torch or any rank is imported
or started, so that Ctrl-C and SIGTERM stop the command the same way at any moment."""

from __future__ import annotations

import sys

from cs336sys.sweep import stopping


def main() -> None:
    stopping.install()
    try:
        from cs336sys.cli import main as command_line
    except (KeyboardInterrupt, stopping.Terminated):  # while the command line loads
        print(stopping.untold(), file=sys.stderr)
        stopping.end()
    command_line()


if __name__ == "__main__":
    main()
