"""Timers: a host loop with a device sync around every call, or Triton's do_bench; and the
launch-bound rule.

A call on CUDA returns as soon as its kernels are queued; the sync then waits for the GPU.
The host time (until the call returns) beside the synced wall time says who waited for
whom: when the host time is most of the wall time, the GPU was starved by Python and kernel
launches, and the point measures the host, not the GPU. Larger batches, torch.compile or
CUDA graphs help such a point; faster kernels do not.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from cs336sys.measure.device import synchronize
from cs336sys.measure.progress import step_done
from cs336sys.measure.sampling import MAX_SAMPLES, Enough

# A phase whose host time is at least this share of its wall time is launch-bound.
LAUNCH_BOUND = 0.9
# Calls timed on the host alone after do_bench, for the launch-bound flag (time_do_bench).
HOST_CALLS = 5


def launch_bound(host_ms: float | None, wall_ms: float | None, device: str) -> bool | None:
    """Whether a phase was launch-bound: only on CUDA (elsewhere work is synchronous and the
    host time is the wall time), None without both times."""
    if not device.startswith("cuda") or host_ms is None or not wall_ms:
        return None
    return host_ms >= LAUNCH_BOUND * wall_ms


def launch_metrics(samples: dict[str, list[float]], phases: tuple[str, ...], device: str) -> dict[str, Any]:
    """From samples {<phase>_ms: [...], <phase>_host_ms: [...]}: `<phase>_host_ms_mean` per
    phase, `launch_bound` (any phase; None off CUDA) and `launch_bound_phases` ("fwd,bwd")."""
    out: dict[str, Any] = {}
    bound = []
    for phase in phases:
        host, wall = samples.get(f"{phase}_host_ms"), samples.get(f"{phase}_ms")
        if not host or not wall:
            continue
        out[f"{phase}_host_ms_mean"] = sum(host) / len(host)
        if launch_bound(out[f"{phase}_host_ms_mean"], sum(wall) / len(wall), device):
            bound.append(phase)
    cuda = device.startswith("cuda") and any(f"{p}_host_ms_mean" in out for p in phases)
    out["launch_bound"] = bool(bound) if cuda else None
    out["launch_bound_phases"] = ",".join(bound) if cuda else None
    return out


def time_loop(
    fn: Callable[..., Any],
    warmup: int,
    iters: int,
    device: str,
    setup: Callable[[], Any] | None = None,
    host: list[float] | None = None,
    min_seconds: float = 0.0,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """Milliseconds of at least `iters` calls after `warmup` untimed ones, and more until
    the timed calls add up to `min_seconds` (at most measure/sampling.MAX_SAMPLES calls).

    `setup()` runs untimed before each call and its result is passed to `fn` (e.g. a forward
    pass whose output the timed backward consumes). The device is synchronised before the
    clock starts and before it stops, so the time is the device's, not the launch's. `host`,
    when given, gets each timed call's host time (until it returned, before the sync).
    `clock` (seconds) is for tests.
    """
    enough = Enough(iters, min_seconds, max(iters, MAX_SAMPLES))
    samples: list[float] = []
    i = 0
    while i < warmup or not enough(samples):
        arg = setup() if setup is not None else None
        synchronize(device)
        t0 = clock()
        fn(arg) if setup is not None else fn()
        returned = clock()
        synchronize(device)
        if i >= warmup:
            samples.append((clock() - t0) * 1e3)
            if host is not None:
                host.append((returned - t0) * 1e3)
        i += 1
        step_done(i, max(warmup + iters, i))
    return samples


def time_do_bench(
    fn: Callable[[], Any],
    grad_to_none: list | None = None,
    *,
    calls: int | None = None,
    call_ms: float | None = None,
    host: list[float] | None = None,
    device: str = "cuda",
    min_count: int = 1,
    min_seconds: float = 0.0,
) -> list[float]:
    """Milliseconds per call from `triton.testing.do_bench` (CUDA events, L2 flushed).

    do_bench repeats for 100 ms after 25 ms of warm-up, whatever a call costs; a training step
    of seconds then gets one timed call. With `calls` and `call_ms` (an estimate of one call),
    the repetition time asks for about `calls` timed calls after one warm-up call.

    Its events see the GPU only: the host queues the next call while the GPU clears the L2
    before it, so a call whose launches cost more host time than its kernels run still
    times as the kernels. On an H200 our attention forward at seq 1024 timed 25 us while
    each call cost 77 to 99 us of host time. `host`, when given, gets the host time of
    HOST_CALLS more calls (synced before each, as time_loop), for launch_metrics.

    do_bench chooses its own count; it is called again until the samples number at least
    `min_count` and add up to `min_seconds` (measure/sampling.py), and every sample it
    returned is kept.
    """
    from triton.testing import do_bench

    budget: dict[str, float] = {}
    if calls is not None and call_ms is not None:
        budget = dict(warmup=max(call_ms, 1.0), rep=max(calls * call_ms, 1.0))
    if min_seconds:
        budget["rep"] = max(budget.get("rep", 100.0), min_seconds * 1e3)
    enough = Enough(min_count, min_seconds, max(min_count, MAX_SAMPLES))
    samples: list[float] = []
    while not samples or not enough(samples):
        times, every = _do_bench_all(do_bench, fn, grad_to_none, budget)
        samples += times
        if not every:  # quantiles, not samples: asking again would only repeat them
            break
    if host is not None:
        def call():
            for t in grad_to_none or ():  # as do_bench does between its calls
                t.grad = None
            fn()

        time_loop(call, 0, HOST_CALLS, device, host=host)
    return samples


def _do_bench_all(do_bench: Callable, fn: Callable, grad_to_none: list | None,
                  budget: dict[str, float]) -> tuple[list[float], bool]:
    """(every time do_bench took, True); an older Triton, without return_mode="all":
    (its quantiles, False)."""
    try:
        times = do_bench(fn, grad_to_none=grad_to_none, return_mode="all", **budget)
        every = True
    except (AssertionError, TypeError, ValueError):
        times = do_bench(fn, grad_to_none=grad_to_none, quantiles=[0.2, 0.5, 0.8], **budget)
        every = False
    return [float(t) for t in (times if isinstance(times, (list, tuple)) else [times])], every
