"""How often the ratio cells' bootstrap calls two samples of one distribution a change
(measure/sampling.py: BOOTSTRAP_MIN, the fewest samples a side given a verdict).

    python benchmarks/bootstrap_false_rate.py [--trials 5000]

For each count of samples a side, `--trials` pairs of samples drawn from one lognormal
distribution (timings: a floor and a long tail), each pair's `ratio_interval` and `verdict`:
the share of pairs read `faster` or `slower`, which a 95 % interval should keep near 5 %.
"""

from __future__ import annotations

import argparse
import random

from cs336sys.measure.sampling import ratio_interval, verdict

COUNTS = ((3, 3), (3, 5), (4, 4), (5, 5), (6, 6), (10, 10))


def false_rate(n_a: int, n_b: int, trials: int, seed: int = 0) -> float:
    """The share of `trials` equal pairs of n_a and n_b samples that get a verdict."""
    rng = random.Random(seed)
    called = 0
    for trial in range(trials):
        a = [rng.lognormvariate(0, 0.3) for _ in range(n_a)]
        b = [rng.lognormvariate(0, 0.3) for _ in range(n_b)]
        called += verdict(ratio_interval(a, b, seed=trial)) in ("faster", "slower")
    return called / trials


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=5000)
    trials = parser.parse_args().trials
    print(f"{'samples a side':>16}  {'called a change':>16}  ({trials} equal pairs each)")
    for n_a, n_b in COUNTS:
        print(f"{f'{n_a} vs {n_b}':>16}  {100 * false_rate(n_a, n_b, trials):>15.1f}%")


if __name__ == "__main__":
    main()
