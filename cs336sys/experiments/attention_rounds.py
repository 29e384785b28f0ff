"""Attention points in interleaved rounds (sweep/runner.in_rounds, docs/methodology.md): the
implementations of one command at one shape run round 1 each, then round 2 each, so that a
GPU's drift falls on all of them alike. How the rounds' Results become the point's (a
round's spec: sweep/rounds.checked_first), and the figures both compute from timed samples.
"""

from __future__ import annotations

from typing import Any

from cs336sys.measure.stats import STATS, summarize
from cs336sys.measure.timing import launch_metrics
from cs336sys.sweep import rounds
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


def merge(spec: Any, results: list[Result]) -> Result:
    """One point from its rounds: every round's samples in the order taken and the figures
    from them; the first round's check, memory and what ran; the highest CUDA peak."""
    samples = rounds.joined(results)
    timed = {k: v for k, v in samples.items() if k.removesuffix("_ms") in PHASES}
    host = {k: v for k, v in samples.items() if k.endswith("_host_ms")}
    metrics = {**results[0].metrics, **timed_metrics(timed, host, results[0].metrics["flops_fwd"],
                                                     spec.device),
               "peak_bytes": rounds.highest(results, "peak_bytes")}
    return rounds.merged(results, results[0].status, metrics, {**samples, "round_medians": {
        k: [r.metrics.get(f"{k}_median") for r in results] for k in timed}})
