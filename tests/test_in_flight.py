"""parallel/in_flight.py: intervals of collectives, from launch to completion, and their
union (FSDP's comm_ms). Works stand in for collectives: one completes through its future
(as Gloo's all-gather does), one only through wait() (as Gloo's reduce-scatter does)."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from cs336sys.parallel.in_flight import InFlight, union_ms


@pytest.mark.parametrize(
    "spans, total",
    [
        ([], 0.0),
        ([(0.0, 2.0)], 2.0),
        ([(0.0, 2.0), (1.0, 3.0), (5.0, 6.0)], 4.0),  # overlap counted once, gap not at all
        ([(5.0, 6.0), (0.0, 10.0), (2.0, 3.0)], 10.0),  # nested, in any order
        ([(0.0, 1.0), (1.0, 2.0)], 2.0),  # touching
    ],
)
def test_union_of_intervals(spans, total):
    assert union_ms(spans) == total


class FutureWork:
    """Completes `after_s` after launch, through its future, without anyone waiting."""

    def __init__(self, after_s: float) -> None:
        self.future = torch.futures.Future()
        threading.Timer(after_s, self.future.set_result, args=(None,)).start()

    def get_future(self):
        return self.future

    def wait(self):
        self.future.wait()
        return True


class WaitOnlyWork:
    """Has no future; wait() takes `after_s` (or raises `error`)."""

    def __init__(self, after_s: float, error: Exception | None = None) -> None:
        self.after_s, self.error, self.waits = after_s, error, 0

    def get_future(self):
        raise RuntimeError("Work::getFuture not implemented.")

    def wait(self):
        self.waits += 1
        time.sleep(self.after_s)
        if self.error is not None:
            raise self.error
        return True


def test_a_step_is_the_union_of_its_collectives():
    timer, x = InFlight(), torch.zeros(1)
    assert timer.last_step_ms == 0.0  # no step closed yet
    t0 = time.perf_counter()
    a = timer.track(timer.start(x), FutureWork(0.20))  # 0 .. 200 ms
    b = timer.track(timer.start(x), FutureWork(0.10))  # 0 .. 100 ms, inside a's
    time.sleep(0.30)  # nothing in flight from 200 to 300 ms
    work = WaitOnlyWork(0.10)
    c = timer.track(timer.start(x), work)  # 300 .. 400 ms
    assert c is not work  # wait for the thread that waits for it
    for handle in (a, b, c):
        handle.wait()
    wall = (time.perf_counter() - t0) * 1e3
    timer.close_step()
    assert work.waits == 1  # the work itself was waited for once, by the thread
    # a's 200 ms and c's 100 ms: b's lie inside a's, and the gap before c is not counted
    # (later on a loaded machine, never earlier; the gap is union_ms's test above)
    assert 300 <= timer.last_step_ms <= wall

    timer.close_step()  # an empty step
    assert timer.last_step_ms == 0.0


def test_a_failed_wait_reaches_the_caller():
    timer = InFlight()
    handle = timer.track(timer.start(torch.zeros(1)), WaitOnlyWork(0.0, RuntimeError("peer gone")))
    with pytest.raises(RuntimeError, match="peer gone"):
        handle.wait()
