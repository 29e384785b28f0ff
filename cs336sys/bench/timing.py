"""Timers: a host loop with a device sync around every call, or Triton's do_bench."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cs336sys.bench.device import synchronize


def time_loop(
    fn: Callable[..., Any],
    warmup: int,
    iters: int,
    device: str,
    setup: Callable[[], Any] | None = None,
) -> list[float]:
    """Milliseconds of `iters` calls after `warmup` untimed ones.

    `setup()` runs untimed before each call and its result is passed to `fn` (e.g. a forward
    pass whose output the timed backward consumes). The device is synchronised before the
    clock starts and before it stops, so the time is the device's, not the launch's.
    """
    samples = []
    for i in range(warmup + iters):
        arg = setup() if setup is not None else None
        synchronize(device)
        t0 = time.perf_counter()
        fn(arg) if setup is not None else fn()
        synchronize(device)
        if i >= warmup:
            samples.append((time.perf_counter() - t0) * 1e3)
    return samples


def time_do_bench(fn: Callable[[], Any], grad_to_none: list | None = None) -> list[float]:
    """Milliseconds per call from `triton.testing.do_bench` (CUDA events, L2 flushed)."""
    from triton.testing import do_bench

    try:
        times = do_bench(fn, grad_to_none=grad_to_none, return_mode="all")
    except (AssertionError, TypeError, ValueError):  # older Triton: no return_mode="all"
        times = do_bench(fn, grad_to_none=grad_to_none, quantiles=[0.2, 0.5, 0.8])
    return [float(t) for t in (times if isinstance(times, (list, tuple)) else [times])]
