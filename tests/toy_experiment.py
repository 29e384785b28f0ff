"""Time an n x n matmul; one row per size.

A new experiment kind, written the way docs/architecture.md ("Adding an experiment") says:
this one module (Spec, `specs`, `run`, and `EXPERIMENT` with its `Command`; the first
paragraph above is the command's summary), then its name in the catalog's KINDS.
tests/test_new_experiment.py puts it into a copy of the package as experiments/matmul.py and
adds that line, nothing else.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from cs336sys.sweep.declaration import Column, Command, Experiment, Metric, Table
from cs336sys.sweep.options import list_option, option
from cs336sys.sweep.points import SpecError, listed
from cs336sys.sweep.result import Result


@dataclass(frozen=True)
class MatmulSpec:
    n: int  # the matrices are n x n
    warmup: int
    iters: int

    def settings(self) -> dict[str, Any]:
        return asdict(self)


def specs(*, n: list[str] | None = None, warmup: int | None = None,
          iters: int | None = None) -> list[MatmulSpec]:
    sizes = [int(v) for v in listed(n, "--n", default=[16, 32])]
    if any(v <= 0 for v in sizes):
        raise SpecError("--n: sizes must be positive")
    return [MatmulSpec(v, 1 if warmup is None else warmup, 3 if iters is None else iters)
            for v in sizes]


def run(spec: MatmulSpec) -> Result:
    import time

    import torch

    a = torch.randn(spec.n, spec.n, generator=torch.Generator().manual_seed(0))
    for _ in range(spec.warmup):
        a @ a
    times = []
    for _ in range(spec.iters):
        t0 = time.perf_counter()
        a @ a
        times.append((time.perf_counter() - t0) * 1e3)
    return Result("ok", metrics={"matmul_ms": min(times), "flops": 2 * spec.n**3})


def options(
    n: list_option("Matrix size(s). [default: 16,32]") = None,
    warmup: option("Untimed matmuls per point. [default: 1]", int | None) = None,
    iters: option("Timed matmuls per point. [default: 3]", int | None) = None,
) -> None:
    """The options of `matmul`, named as `specs` names its keywords."""


EXPERIMENT = Experiment(
    kind="matmul", title="Matmul", spec=MatmulSpec, specs=specs, run=run,
    metrics=(Metric("matmul_ms", "ms", "fastest timed matmul"),
             Metric("flops", "", "2 n^3 floating-point operations")),
    tables=(Table("Matmul time", (Column("n", "n", setting=True),
                                  Column("ms", "matmul_ms", "num"))),),
    compare="matmul_ms",
    command=Command(
        options=options, describe=lambda s: f"n={s.n}",
        help="Each point multiplies two random n x n matrices and keeps the fastest time.",
        examples=("cs336sys matmul --n 16,32",),
    ),
)
