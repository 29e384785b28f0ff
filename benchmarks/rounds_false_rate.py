"""How often a ratio of two interleaved points is called a change, with and without the
rounds' interval (measure/sampling.rounds_interval), on equal points and on a real 1.3x.

    python benchmarks/rounds_false_rate.py [--trials 1000]

Each point runs `rounds` rounds of 10 samples (lognormal, sigma 0.1); with `--load` a round
of a point is slowed, with probability 0.3, by a factor drawn around 3x on 70 % of its
samples: what another process on a 2-core CPU did to `attention --rounds 2` (a function
against itself read 9.7x to 189x faster). The samples' bootstrap alone (`pooled`) against
the report's cell (`report/intervals.sample_interval`: the bootstrap widened by the rounds').
"""

from __future__ import annotations

import argparse
import math
import random
import statistics

from cs336sys.measure.sampling import ratio_interval, verdict
from cs336sys.report.intervals import sample_interval

SAMPLES = 10  # a round's, a point


def _round(rng: random.Random, effect: float, load: float) -> list[float]:
    slowed = math.exp(rng.gauss(math.log(3), 1.0)) if rng.random() < load else 1.0
    return [effect * rng.lognormvariate(0, 0.1) * (slowed if rng.random() < 0.7 else 1.0)
            for _ in range(SAMPLES)]


def _row(rounds: list[list[float]]) -> dict:
    return {"invocation_id": "a", "rounds_done": len(rounds),
            "_settings": {"rounds": len(rounds)},
            "_samples": {"e2e_ms": [x for r in rounds for x in r],
                         "round_medians": {"e2e_ms": [statistics.median(r) for r in rounds]}}}


def called(rounds: int, effect: float, load: float, trials: int) -> tuple[float, float]:
    """The shares of `trials` pairs called a change: by the pooled bootstrap, by the cell."""
    rng = random.Random(0)
    pooled = cell = 0
    for _ in range(trials):
        a = [_round(rng, 1.0, load) for _ in range(rounds)]
        b = [_round(rng, effect, load) for _ in range(rounds)]
        pooled += verdict(ratio_interval(sum(a, []), sum(b, []))) in ("faster", "slower")
        said = sample_interval("e2e_ms", _row(a), _row(b), False)
        cell += "faster" in said or "slower" in said
    return pooled / trials, cell / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=1000)
    trials = parser.parse_args().trials
    print("| effect | load | rounds | pooled bootstrap | report's cell |\n|---|---|---|---|---|")
    for effect in (1.0, 1.3):
        for load in (0.0, 0.3):
            for rounds in (2, 3, 5):
                pooled, cell = called(rounds, effect, load, trials)
                print(f"| {effect:g}x | {load:g} | {rounds} | {100 * pooled:.1f}% | "
                      f"{100 * cell:.1f}% |")


if __name__ == "__main__":
    main()
