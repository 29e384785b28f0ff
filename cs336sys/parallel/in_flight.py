"""How long a step has a collective in flight (FSDP's `comm_ms`).

Each async collective is one interval, from just before its launch to its completion; a
step's communication time is the union of its intervals: the wall time during which at
least one collective was running. Collectives that overlap each other are not counted
twice; time they overlap compute *is* counted (this is not the exposed time a DDP's
`finish_gradient_synchronization` measures, which is what compute could not hide).

Completion is observed through the work's future, whose `then` callback
- on CPU (Gloo) runs in Gloo's worker thread once the collective has finished, and reads the
  clock there, whether or not anyone has called `wait()` yet;
- on CUDA (NCCL) runs at once, on a stream ordered after the collective, and records an
  event on it, which the device stamps when the collective finishes.
Gloo's reduce-scatter returns a work without a future, which does not report completion
before `wait()` (torch 2.13; its `wait()` still has tens of ms of work to do): a thread calls
`wait()` and reads the clock, and the caller waits for that thread instead of the work.
The start is the clock (CPU) or an event on the current stream (CUDA), taken before launch.

    timer = InFlight()
    interval = timer.start(shard)          # before launching
    work = timer.track(interval, all_gather_flat(out, shard, async_op=True))  # wait() on it
    ...
    timer.close_step()                     # every collective of the step was launched
    timer.last_step_ms                     # union of that step's intervals, ms
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from typing import Any

import torch


@dataclass
class Interval:
    """One collective: start and end as clock seconds (CPU) or CUDA events."""

    cuda: bool
    start: Any = None
    end: Any = None
    done: Any = None  # the future of the callback that sets `end`


class InFlight:
    """Intervals of the collectives of the step being recorded, and of the last closed one."""

    def __init__(self) -> None:
        self._open: list[Interval] = []
        self._closed: list[Interval] = []
        self._ms: float | None = 0.0

    def start(self, tensor: torch.Tensor) -> Interval:
        """Call just before launching a collective on `tensor`."""
        interval = Interval(cuda=tensor.is_cuda)
        if interval.cuda:
            interval.start = torch.cuda.Event(enable_timing=True)
            interval.start.record()
        else:
            interval.start = time.perf_counter()
        return interval

    def track(self, interval: Interval, work):
        """The collective of `interval` was launched as `work` (async_op=True); returns what
        to `wait()` on for it: `work`, or the thread watching it."""

        def finished(_future=None):
            if interval.cuda:  # on a stream that runs after the collective
                interval.end = torch.cuda.Event(enable_timing=True)
                interval.end.record()
            else:
                interval.end = time.perf_counter()

        self._open.append(interval)
        try:
            future = work.get_future()
        except RuntimeError:  # "Work::getFuture not implemented"
            interval.done = _Watched(work, finished)
            return interval.done
        interval.done = future.then(finished)
        return work

    def close_step(self) -> None:
        """The step's collectives are all launched: its intervals become the last step's."""
        self._closed, self._open = self._open, []
        self._ms = None  # computed when asked (on CUDA that waits for the events)

    @property
    def last_step_ms(self) -> float:
        """Milliseconds of the last closed step with at least one collective in flight."""
        if self._ms is None:
            self._ms = union_ms(self._spans(self._closed))
        return self._ms

    @staticmethod
    def _spans(intervals: list[Interval]) -> list[tuple[float, float]]:
        """(start, end) of each interval in ms; on CUDA from the first start event."""
        for interval in intervals:
            interval.done.wait()  # the callback has set `end`
        if not intervals:
            return []
        if intervals[0].cuda:
            ref = intervals[0].start
            for interval in intervals:
                interval.end.synchronize()
            return [(ref.elapsed_time(i.start), ref.elapsed_time(i.end)) for i in intervals]
        return [(i.start * 1e3, i.end * 1e3) for i in intervals]


class _Watched:
    """A thread that waits for a work without a future, then calls `finished`; `wait()` joins
    it (and raises what the work's wait raised), so the work is waited for once."""

    def __init__(self, work, finished) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(work, finished), daemon=True)
        self._thread.start()

    def _run(self, work, finished) -> None:
        try:
            work.wait()
        except BaseException as exc:  # handed to whoever waits
            self._error = exc
        finished()

    def wait(self) -> bool:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return True


def union_ms(spans: list[tuple[float, float]]) -> float:
    """Length of the union of the intervals `spans`: overlaps count once."""
    total, reach = 0.0, float("-inf")
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total
