"""Run under torchrun by tests/test_comm.py: a two-point sweep whose second point raises on
every rank, through the same rank-0 recording and run_groups the `comm` and `ddp` commands
use. Usage: torchrun --nproc-per-node 2 tests/torchrun_failing_sweep.py DB"""

import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cs336sys.bench.result import Result
from cs336sys.cli.distributed import rank0_recording, run_groups
from cs336sys.experiments.ranks import serve


@dataclass(frozen=True)
class Point:
    n: int

    def settings(self):
        return asdict(self)


def point(ctx, spec):
    if spec.n == 2:
        raise RuntimeError(f"boom at point {spec.n} on rank {ctx.rank}")
    return Result("ok", metrics={"n": spec.n})


def worker(ctx, specs):
    serve(ctx, specs, point)


if __name__ == "__main__":
    with rank0_recording(Path(sys.argv[1]), "fixture", "cpu", resume=False) as rec:
        run_groups(rec, "comm", {2: [Point(1), Point(2), Point(3)]}, worker, "gloo")
