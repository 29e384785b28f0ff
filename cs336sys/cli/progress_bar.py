"""The progress of a sweep on stderr, while `run_experiment` runs it (cli/common.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import typer

from cs336sys.measure.units import format_duration


class Bar:
    """The sweep's progress on stderr (stdout stays clean for tables): on a terminal a bar
    that moves per point and names the running point and its step; elsewhere (a log, CI)
    plain lines: one per finished point, and one every EVERY_S seconds inside a long one."""

    EVERY_S = 10.0

    def __init__(
        self,
        label: str,
        show: Callable[[Any], str] | None = None,
        on: bool = True,
        tty: bool | None = None,
    ):
        self.label, self.show, self.on = label, show, on
        self.tty = sys.stderr.isatty() if tty is None else tty
        self.bar: Any = None
        self.total = self.done = 0
        self.current: Any = None  # the spec of the point now running
        self.step = ""  # "step 3/15" (or "backward step 3/15") inside it
        self._last = self._began = 0.0
        self._hook: Any = None
        self._phase: Callable[[], str] = str  # measure/progress.current_phase, from start()
        self._stop: Any = None  # ends the heartbeat thread (off a terminal)

    def _name(self, spec: Any) -> str:
        return self.show(spec) if spec is not None and self.show else ""

    def start(self, experiment: Any, total: int) -> None:
        if not self.on:
            return
        from cs336sys.measure.progress import current_phase, on_step

        self._phase = current_phase
        self.total = total
        if self.tty:
            self.bar = typer.progressbar(
                length=total, label=self.label, file=sys.stderr, show_pos=True,
                item_show_func=lambda _: f"{self._name(self.current)} {self.step}".strip() or None,
            )
            self.bar.__enter__()
        else:
            import threading

            typer.echo(f"{self.label}: {total} point(s)", err=True)
            if self.EVERY_S > 0:  # 0: a line at every step, nothing in between
                self._stop = threading.Event()
                threading.Thread(target=self._heartbeat, args=(self._stop,), daemon=True,
                                 name="cs336sys-heartbeat").start()
        self._hook = on_step(self.tick)
        self._hook.__enter__()

    def resumed(self, skipped: int) -> None:
        typer.echo(f"--resume: skipping {skipped} point(s) already stored", err=True)

    # A sweep estimated to take longer than this says so before it starts.
    LONG_S = 60.0

    def estimated(self, seconds: float, points: int) -> None:
        """The sweep's estimated time (experiments/preflight.py), in one line when long."""
        if not self.on or seconds < self.LONG_S:
            return
        typer.echo(f"{self.label}: estimated about {format_duration(seconds)} for {points} "
                   "point(s), from their "
                   "FLOPs and this device's rate", err=True)

    def begin(self, spec: Any) -> None:
        self.current, self.step, self._last = spec, "", time.monotonic()
        self._began = self._last

    def _heartbeat(self, stop: Any) -> None:
        """Off a terminal: a line every EVERY_S seconds while a point runs without a step
        finishing (a long first step, a compile), from a timer, not the step loop."""
        while not stop.wait(max(0.05, min(1.0, self.EVERY_S / 4))):
            now = time.monotonic()
            if self.current is not None and now - self._last >= self.EVERY_S:
                self._last = now
                what = self.step or "running"
                typer.echo(f"{self.label} [{self.done + 1}/{self.total}] "
                           f"{self._name(self.current)}: {what}, {now - self._began:.0f} s in",
                           err=True)

    def tick(self, done: int, total: int, point: Any = None) -> None:
        """A step of the running point finished (`point` given by distributed runs)."""
        now = time.monotonic()
        if point is not None and point is not self.current:  # a rank's first step of it
            self.current, self._last, self._began = point, now, now
        self.step = f"{self._phase()} step {done}/{total}".lstrip()
        if self.bar is not None:
            if now - self._last >= 0.1 or done == total:
                self._last = now
                self.bar.render_progress()
        elif self.on and now - self._last >= self.EVERY_S:
            self._last = now
            typer.echo(f"{self.label} [{self.done + 1}/{self.total}] "
                       f"{self._name(self.current)}: {self.step}", err=True)

    def advance(self, point: Any) -> None:
        self.done += 1
        result = point.result
        if result.status == "error" and self.on:
            from cs336sys.report.sections import text

            # as the closing lines name a point: sorted, unset settings left out, yes/no
            brief = " ".join(f"{k}={text(v)}" for k, v in sorted(point.spec.settings().items())
                             if k not in ("device", "seed") and v is not None)
            typer.echo(f"\nerror at {brief}: {result.error.splitlines()[0]}", err=True)
        self.step, self.current = "", None
        if self.bar is not None:
            self.bar.update(1)
        elif self.on:
            took = f" in {result.duration_s:.1f} s" if result.duration_s is not None else ""
            typer.echo(f"{self.label} [{self.done}/{self.total}] {self._name(point.spec)}: "
                       f"{result.status}{took}", err=True)

    def finish(self) -> None:
        if self._stop is not None:
            self._stop.set()
            self._stop = None
        if self._hook is not None:
            self._hook.__exit__(None, None, None)
            self._hook = None
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None
