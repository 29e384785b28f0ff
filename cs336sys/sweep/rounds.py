"""What every experiment that runs in interleaved rounds (sweep/runner.in_rounds) does alike:
cut a round's share from its point, and put the rounds' Results back together."""

from __future__ import annotations

import dataclasses
from typing import Any

from cs336sys.sweep.declaration import Metric
from cs336sys.sweep.result import Result

ROUNDS_DONE = Metric("rounds_done", "", "interleaved rounds the timed steps came from (--rounds)")


def share(spec: Any) -> Any:
    """One round's spec: its share of the point's timed samples (`iters`, rounded up) and of
    its minimum time, where it has one (the model's points have none)."""
    shares: dict[str, Any] = {"iters": -(-spec.iters // spec.rounds)}
    if hasattr(spec, "min_time"):
        shares["min_time"] = spec.min_time / spec.rounds
    return dataclasses.replace(spec, **shares)


def checked_first(spec: Any) -> list[Any]:
    """The spec of each of a point's rounds (`share`): the first checks the user's code (or
    the implementation against float64), the later ones only time it (`check_round`)."""
    first = share(spec)
    return [first, *[dataclasses.replace(first, check_round=False)] * (spec.rounds - 1)]


def joined(results: list[Result]) -> dict[str, list]:
    """Every list of samples the rounds kept, each round's in the order taken, by key."""
    keys = dict.fromkeys(k for r in results for k, v in r.samples.items() if isinstance(v, list))
    return {k: [x for r in results for x in r.samples.get(k, [])] for k in keys}


def highest(results: list[Result], metric: str) -> Any:
    """The largest value of `metric` over the rounds that have one (a peak), else None."""
    values = [r.metrics[metric] for r in results if r.metrics.get(metric) is not None]
    return max(values) if values else None


def merged(results: list[Result], status: str, metrics: dict[str, Any],
           samples: dict[str, Any]) -> Result:
    """The point's Result: started with its first round, as long as all of them together."""
    return Result(status, metrics={**metrics, "rounds_done": len(results)},
                  error=next((r.error for r in results if r.error), None), samples=samples,
                  started=results[0].started,
                  duration_s=sum(r.duration_s or 0 for r in results))
