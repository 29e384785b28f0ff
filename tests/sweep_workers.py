"""A toy experiment for tests/test_sweep.py, in a module of its own because spawned ranks
import its run function by name."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cs336sys.sweep.declaration import Experiment, Metric, settings_keys
from cs336sys.sweep.result import Result


@dataclass(frozen=True)
class Toy:
    n: int  # a label for the test to find the point by, not a setting
    size: int = 1
    family: str = "a"
    world_size: int = 1
    backend: str = "gloo"

    def settings(self):
        return {k: v for k, v in asdict(self).items() if k != "n"}


def run(spec: Toy) -> Result:
    """Out of memory from size 64 on (family a only); n = 13 is a plain failure."""
    if spec.family == "a" and spec.size >= 64:
        raise MemoryError(f"size {spec.size} does not fit")
    if spec.n == 13:
        raise ValueError("unlucky")
    return Result("ok", metrics={"twice": 2 * spec.n})


def run_ranks(ctx, spec: Toy) -> Result:
    """The sum of every rank's n + rank, by all-reduce; rank 1 fails at n = 2, runs out of
    memory as numpy says it at n = 4, and raises KeyboardInterrupt (no key pressed) at 5."""
    import torch
    import torch.distributed as dist

    if spec.n == 2 and ctx.rank == 1:
        raise RuntimeError(f"rank {ctx.rank} gives up at n={spec.n}")
    if spec.n == 4 and ctx.rank == 1:
        raise MemoryError("Unable to allocate 1.00 EiB for an array with shape (2**60,)")
    if spec.n == 5 and ctx.rank == 1:
        raise KeyboardInterrupt
    x = torch.tensor([float(spec.n + ctx.rank)])
    dist.all_reduce(x)
    return Result("ok", metrics={"sum": x.item(), "ranks": ctx.world_size})


TOY = Experiment(kind="toy", view="toy_runs", title="Toy", spec=Toy, run=run,
                 settings=settings_keys(Toy, drop=("n",)), metrics=(Metric("twice", "", "2n"),), tables=(),
                 oom_axis="size")
TOY_RANKS = Experiment(kind="toy-ranks", view="toy_ranks_runs", title="Toy ranks", spec=Toy,
                       run=run_ranks, settings=settings_keys(Toy, drop=("n",)),
                       metrics=(Metric("sum", "", "all-reduced"), Metric("ranks", "", "world")),
                       tables=(), distributed=True)
