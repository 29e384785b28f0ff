"""What the benchmark scripts share: run their points through cs336sys's sweep runner (the
same one every command uses) and collect the metrics by a key of the spec."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

from cs336sys.sweep.runner import Point, run_sweep


class Lines:
    """Progress as one line per finished point on stderr."""

    def __init__(self, key: Callable[[Any], Any]) -> None:
        self.key = key

    def start(self, experiment: Any, total: int) -> None:
        print(f"{experiment.kind}: {total} points", file=sys.stderr)

    def resumed(self, skipped: int) -> None:
        pass

    def advance(self, point: Point) -> None:
        m = point.result.metrics
        ms = m.get("step_ms_mean")
        print(f"  {self.key(point.spec)}: {point.result.status}"
              + (f" {ms:.0f} ms" if ms is not None else ""), file=sys.stderr)

    def finish(self) -> None:
        pass


def collect(experiment: Any, specs: list, key: Callable[[Any], Any]) -> dict[Any, list[dict]]:
    """{key(spec): [metrics, ...]} in the order the points finished; raises if one failed."""
    got: dict[Any, list[dict]] = {}
    for p in run_sweep(experiment, specs, progress=Lines(key)):
        if p.result.status != "ok":
            raise RuntimeError(f"{key(p.spec)}: {p.result.status} {p.result.error}")
        got.setdefault(key(p.spec), []).append(p.result.metrics)
    return got
