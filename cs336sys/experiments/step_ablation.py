"""What the step ablation needs beyond one point (docs/methodology.md): interleaved rounds
(sweep/runner.in_rounds), how one round's spec is cut from the point's and how the rounds'
Results become the point's; and the check that a switch saves no more than the phase it
acts on."""

from __future__ import annotations

import dataclasses
from typing import Any

from cs336sys.experiments.training_step import merged_rounds
from cs336sys.sweep import rounds
from cs336sys.sweep.result import Result

# The settings a switch set's speed-up varies over: a point's baseline is the `none` whose
# other settings are all its own (the table's ratio, the chart's bars).
VARY = ("switches", "optimizer", "loss", "attention", "compile", "warm_cache")


def split(spec: Any) -> list[Any]:
    """The spec of each round (sweep/rounds.share), after its own build, first step and
    warm-up. Only the first round compiles from an empty cache (the leaderboard's rule,
    which its wall_s and compile_s stand for); later rounds use the caches as they are. The
    course's do_bench timing (40 s a point) runs in the first round alone: merge keeps that
    round's figure."""
    first = rounds.share(spec)
    later = dataclasses.replace(first, warm_cache=first.compile, course_timing=False)
    return [first, *[later] * (spec.rounds - 1)]


def merge(spec: Any, results: list[Result]) -> Result:
    """One point from its rounds (training_step.merged_rounds): the rates from the merged
    median, the first round's build and compile figures (the cold one)."""
    return merged_rounds(results, ("step_ms", "opt_ms"), "median",
                         ("peak_allocated_mb", "peak_reserved_mb", "peak_tensor_mb"))


def impossible(none: Any, row: Any) -> str | None:
    """fused-adamw alone saving more than the whole optimizer step of the point without
    switches: the difference is noise (or drift), not the switch."""
    if row.get("switches") != "fused-adamw":
        return None
    phase, base, mine = none.get("opt_ms_median"), none.get("step_ms_median"), row.get("step_ms_median")
    if None in (phase, base, mine) or base - mine <= phase:
        return None
    return f"saves {base - mine:.3g} ms, the optimizer step takes {phase:.3g} ms"

