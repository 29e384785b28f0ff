"""Draws a report's plots, on every core where it can (report/plots.py has the plots).

Drawing is most of a report's time (docs/report.md, "Speed": 10,000 runs in under 5 s on 2
cores), and importing matplotlib alone takes most of a second, so on Linux
`Drawer(start=True)` forks one worker per core at once: they import matplotlib while the
caller is still reading the store, then draw the plots side by side. Elsewhere (macOS and
Windows do not fork safely), on one core, or with start=False, plots are drawn in this
process, one after another.

    with Drawer(start=True) as drawer:
        ...                      # read the store, build the tables
        pngs = drawer.draw(plots)

The workers belong to the command: a Ctrl-C is the command's to handle (a terminal sends
it to every process of the job, and each worker printed a KeyboardInterrupt traceback), a
command stopped or failed part-way terminates them rather than waiting for what is queued,
and they end with it however it ends (measure/lifetime.py). They were a ProcessPoolExecutor
once: its workers are not daemons, so the exit of a command stopped while they sat idle
waited for them for ever, with its output still open.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

from cs336sys.measure.landing import STOPS, held
from cs336sys.measure.lifetime import end_with_parent
from cs336sys.report.plots import Bars, Plot, Ranked, Strips, import_matplotlib


class Drawer:
    """Draws plots in a pool of forked workers, or here (see the module)."""

    def __init__(self, start: bool = True) -> None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
        self._pool: Any = None
        if start and cores > 1 and sys.platform.startswith("linux"):
            import multiprocessing

            context = multiprocessing.get_context("fork")
            try:
                # A worker starts with the command's handlers, and one that only notes a
                # signal: Pool.terminate's SIGTERM, sent before the worker sets its own,
                # would be noted and lost, and the command would wait for it for ever. So
                # each worker starts with both signals blocked, pending until _start_worker
                # has set them.
                with held():
                    before = signal.pthread_sigmask(signal.SIG_BLOCK, STOPS)
                    try:
                        self._pool = context.Pool(cores, initializer=_start_worker,
                                                  initargs=(os.getpid(),))
                    finally:
                        signal.pthread_sigmask(signal.SIG_SETMASK, before)
            except BaseException:  # a signal, delivered as the workers started
                self._stop()
                raise

    def __enter__(self) -> Drawer:
        return self

    def __exit__(self, *exc: object) -> None:
        if exc[0] is None and self._pool is not None:
            self._pool.close()
            self._pool.join()
        self._stop()

    def _stop(self) -> None:
        """End the workers now, whatever they are drawing."""
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None

    def draw(self, plots: list[Plot | Bars | Strips | Ranked]) -> list[bytes]:
        """PNG bytes of every plot, in order. A worker that dies while they are drawn (the
        kernel's OOM killer, a SIGKILL to it alone) takes its plot with it, and Pool.map
        waits for that plot for ever: the pool is ended then, and every plot drawn here."""
        if self._pool is None or len(plots) < 2:
            return [p.draw() for p in plots]
        workers = list(getattr(self._pool, "_pool", ()))  # the processes forked at the start
        pending = self._pool.map_async(_draw, plots, chunksize=1)
        while not pending.ready():
            pending.wait(0.2)
            if any(w.exitcode not in (None, 0) for w in workers):
                self._stop()
                return [p.draw() for p in plots]
        return pending.get()


def _draw(plot: Plot | Bars | Strips | Ranked) -> bytes:
    return plot.draw()


def _start_worker(command: int) -> None:
    """A worker, forked by the command: Ctrl-C ignored (the command's), SIGTERM and SIGHUP
    their default (Pool.terminate sends SIGTERM; SIGHUP stays ignored under nohup), and ended
    with the command (see the module)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if signal.getsignal(signal.SIGHUP) is not signal.SIG_IGN:  # (nohup's choice kept)
        signal.signal(signal.SIGHUP, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOPS)  # a SIGTERM already sent ends it here
    end_with_parent()
    if os.getppid() != command:  # the command ended before the line above
        os._exit(1)
    import_matplotlib()
