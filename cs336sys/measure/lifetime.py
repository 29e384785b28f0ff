"""Processes that do not outlive the one that started them (Linux: prctl PR_SET_PDEATHSIG).

A rank (parallel/launcher.py) and a report's drawing worker (report/plots.py) are forked by
the command; a command ended by os._exit (sweep/stopping.py), by SIGKILL or by a crash runs
no code that could stop them, and a worker left blocked on its queue held the command's
stdout and stderr open, so that a pipe's reader (`| tee`, a test) waited for ever.
"""

from __future__ import annotations

import signal


def end_with_parent() -> bool:
    """Have the kernel send SIGKILL to this process when the thread that forked it ends;
    False where it cannot (not Linux). The caller checks that its parent is still the one
    it expects: one that ended before this call sends nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(1, signal.SIGKILL) == 0  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # no libc with prctl: not Linux
        return False
