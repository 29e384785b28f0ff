"""Timing an attention point's passes: forward, backward and end to end, each by the loop
timer (a warm-up, then timed calls) or by do_bench, inside the NVTX range --nsys records.

Under NVTX (`--nsys`, `--nvtx`) every pass's warm-up calls run first, before the range
opens, and the passes are timed after, so that the report holds the timed calls only
(docs/nsys.md); otherwise each pass is warmed up just before it is timed. do_bench warms
up inside its own call (its 25 ms of calls and the L2 flush between calls are in the
range)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any

from cs336sys.measure.memory import CudaProbe
from cs336sys.measure.progress import phase
from cs336sys.measure.timing import time_do_bench, time_loop


def time_passes(spec: Any, forward: Callable[[], Any], fresh_forward: Callable[[], Any],
                dout: Any, grads: tuple) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """The samples of each pass the point asks for, and each call's host time (until it
    returned, before the sync), for the launch-bound flag: from the loop timer's own calls,
    or from a few more after do_bench."""
    from cs336sys.measure.nvtx import measured, nvtx_on

    backward = spec.passes != "forward"
    if nvtx_on() and spec.timer != "do-bench" and spec.warmup:
        # every pass's warm-up outside the recorded range, then none inside it
        for _ in range(spec.warmup):
            if spec.passes in ("forward", "both"):
                forward()
            if backward:
                fresh_forward().backward(dout)
                if spec.passes == "both":
                    fresh_forward().backward(dout)
        spec = replace(spec, warmup=0)
    samples: dict[str, list[float]] = {}
    host: dict[str, list[float]] = {}
    with measured():  # what --nsys records: the timed passes
        if spec.passes in ("forward", "both"):
            with phase("forward"):
                samples["fwd_ms"] = _time(spec, forward, grads, host.setdefault("fwd_host_ms", []))
        if backward:
            with phase("backward"):
                samples["bwd_ms"] = _time_backward(spec, fresh_forward, dout, grads,
                                                   host.setdefault("bwd_host_ms", []))
        if spec.passes == "both":
            with phase("forward+backward"):
                samples["e2e_ms"] = _time(spec, lambda: fresh_forward().backward(dout), grads,
                                          host.setdefault("e2e_host_ms", []))
    return samples, host


def _time_backward(spec, fresh_forward, dout, grads, host: list[float]) -> list[float]:
    """The backward alone: each timed call is the backward of a fresh untimed forward
    (do_bench, which cannot run a setup between calls, retains one forward's graph)."""
    if spec.timer == "do-bench":
        out = fresh_forward()
        return time_do_bench(lambda: out.backward(dout, retain_graph=True),
                             grad_to_none=list(grads), host=host, min_count=spec.iters,
                             min_seconds=spec.min_time)
    return time_loop(lambda out: out.backward(dout), spec.warmup, spec.iters, spec.device,
                     setup=fresh_forward, host=host, min_seconds=spec.min_time)


def _time(spec, fn, grads, host: list[float]) -> list[float]:
    if spec.timer == "do-bench":
        return time_do_bench(fn, grad_to_none=list(grads), host=host, min_count=spec.iters,
                             min_seconds=spec.min_time)
    return time_loop(fn, spec.warmup, spec.iters, spec.device, host=host,
                     min_seconds=spec.min_time)


def warm_blas_and_probe(device: str, dtype) -> CudaProbe:
    """A CudaProbe whose base holds cuBLAS's workspace: a matmul and a batched one in the
    point's dtype allocate it (once per handle and stream) before the base is read."""
    import torch

    a = torch.ones(2, 16, 16, device=device, dtype=dtype)
    products = (a[0] @ a[0], a @ a)  # run for what they allocate
    torch.cuda.synchronize(device)
    del a, products
    return CudaProbe(device)
