"""The assignment's handout, problem by problem: each release's problems as declarations
(handout/problem.py), their status in a store (status.py), their tables in the handout's
shapes (pivot.py) and the writeup starter that collects them (writeup.py).

Above the experiments (a problem names the commands and experiments that answer it), below
the CLI (`cs336sys handout`). Importing this package imports no torch.
"""

from __future__ import annotations

from cs336sys.handout import y2025, y2026
from cs336sys.handout.problem import Problem
from cs336sys.models.config import HANDOUTS, handout, handout_release
from cs336sys.sweep.points import SpecError, unknown


def problems(year: object | None = None) -> tuple[Problem, ...]:
    """The problems of handout release `year` (default: the release in use, 2026 unless
    CS336SYS_HANDOUT says otherwise), in the handout's order; SpecError for an unknown one."""
    release = handout_release(year, "--year") if year is not None else handout()
    return {y2026.YEAR: y2026.PROBLEMS, y2025.YEAR: y2025.PROBLEMS}[release]


def named(names: list[str], year: object | None = None) -> list[Problem]:
    """The problems called `names` (in the handout's order); SpecError naming the closest
    for one that is not a problem of that release."""
    every = problems(year)
    by_name = {p.name: p for p in every}
    for name in names:
        if name not in by_name:
            other = next((r for r in HANDOUTS if r != (year or handout())
                          and name in {p.name for p in problems(r)}), None)
            if other is not None:  # a problem of the other release: say which
                raise SpecError(f"PROBLEM: {name} is a problem of the {other} handout, not of "
                                f"the {year or handout()} one: give --year {other}")
            raise unknown("PROBLEM", name, by_name, "problem")
    return [p for p in every if p.name in names]


__all__ = ["HANDOUTS", "Problem", "named", "problems"]
