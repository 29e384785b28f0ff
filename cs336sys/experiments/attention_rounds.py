"""Attention points in interleaved rounds (sweep/runner.in_rounds, docs/methodology.md): the
implementations of one command at one shape run round 1 each, then round 2 each, so that a
GPU's drift falls on all of them alike. How one round's spec is cut from the point's, how
the rounds' Results become the point's, and the figures both compute from timed samples.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from cs336sys.measure.stats import STATS, summarize
from cs336sys.measure.timing import launch_metrics
from cs336sys.sweep.result import Result

PHASES = ("fwd", "bwd", "e2e")


def timed_metrics(samples: dict[str, list[float]], host: dict[str, list[float]],
                  flops_fwd: float, device: str) -> dict[str, Any]:
    """The statistics of each pass's samples, TFLOP/s from their medians (FLOPs: forward
    `flops_fwd`, backward 2.5x, end to end 3.5x, FlashAttention-2 §4.1), the launch-bound
    flags and `host_us`, the host's time per call of the main pass (docs/methodology.md,
    "Host cost": do_bench's events see the GPU only)."""
    flops = {"fwd": flops_fwd, "bwd": 2.5 * flops_fwd, "e2e": 3.5 * flops_fwd}
    out: dict[str, Any] = {"flops_fwd": flops["fwd"], "flops_bwd": flops["bwd"],
                           "flops_e2e": flops["e2e"]}
    for phase, values in samples.items():
        stats = summarize(values)
        out.update({f"{phase}_{s}": stats[s] for s in STATS})
        short = phase.removesuffix("_ms")
        out[f"tflops_{short}"] = flops[short] / (stats["median"] / 1e3) / 1e12
    out.update(launch_metrics({**samples, **host}, PHASES, device))
    main = next((p for p in ("e2e", "fwd", "bwd") if host.get(f"{p}_host_ms")), None)
    out["host_us"] = 1e3 * sum(host[f"{main}_host_ms"]) / len(host[f"{main}_host_ms"]) if main else None
    return out


def split(spec: Any) -> list[Any]:
    """The spec of each round: its share of the timed calls and of the minimum time. The
    first round checks the implementation against float64; later rounds time it only."""
    share = dataclasses.replace(spec, iters=-(-spec.iters // spec.rounds),
                                min_time=spec.min_time / spec.rounds)
    return [share, *[dataclasses.replace(share, check_round=False)] * (spec.rounds - 1)]


def merge(spec: Any, results: list[Result]) -> Result:
    """One point from its rounds: every round's samples in the order taken and the figures
    from them; the first round's check, memory and what ran; the highest CUDA peak."""
    first = results[0]
    keys = dict.fromkeys(k for r in results for k, v in r.samples.items() if isinstance(v, list))
    samples = {k: [x for r in results for x in r.samples.get(k, [])] for k in keys}
    timed = {k: v for k, v in samples.items() if k.removesuffix("_ms") in PHASES}
    host = {k: v for k, v in samples.items() if k.endswith("_host_ms")}
    metrics = {**first.metrics, **timed_metrics(timed, host, first.metrics["flops_fwd"],
                                                spec.device)}
    peaks = [r.metrics["peak_bytes"] for r in results if r.metrics.get("peak_bytes") is not None]
    metrics.update(peak_bytes=max(peaks) if peaks else None, rounds_done=len(results))
    return Result(first.status, metrics=metrics, error=first.error,
                  samples={**samples, "round_medians": {
                      k: [r.metrics.get(f"{k}_median") for r in results] for k in timed}},
                  started=first.started, duration_s=sum(r.duration_s or 0 for r in results))
