"""Run under torchrun by tests/test_comm.py: a three-point sweep whose second point raises on
every rank, through the same recording and sweep runner the `comm` and `ddp` commands use.
Usage: torchrun --nproc-per-node 2 tests/torchrun_failing_sweep.py DB"""

import sys
from dataclasses import dataclass
from pathlib import Path

from cs336sys.cli.common import recording
from cs336sys.sweep.declaration import Experiment
from cs336sys.sweep.ranks import torchrun_rank
from cs336sys.sweep.result import Result
from cs336sys.sweep.runner import run_sweep


@dataclass(frozen=True)
class Point:
    n: int
    world_size: int = 2
    backend: str = "gloo"

    def settings(self):
        return {"n": self.n}


def point(ctx, spec):
    if spec.n == 2:
        raise RuntimeError(f"boom at point {spec.n} on rank {ctx.rank}")
    return Result("ok", metrics={"n": spec.n})


FIXTURE = Experiment(kind="comm", view="comm_runs", title="fixture", spec=Point, run=point,
                     settings=("n",), metrics=(), tables=(), distributed=True)

if __name__ == "__main__":
    with recording(Path(sys.argv[1]), "fixture", "cpu", torchrun_rank()) as rec:
        run_sweep(FIXTURE, [Point(1), Point(2), Point(3)], rec)
