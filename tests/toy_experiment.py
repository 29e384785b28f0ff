"""A new experiment kind, written the way docs/architecture.md ("Adding an experiment") says:
this module (Spec, `specs`, `run`, `EXPERIMENT`, and its command), then one line in the
catalog and the command registered (tests/test_new_experiment.py does those two).

What it measures: the time of a matmul of two random square matrices, per size.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Annotated, Any

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, run_experiment
from cs336sys.cli.options import Iters, Label, Resume, Warmup
from cs336sys.sweep.declaration import Column, Experiment, Metric, Table, settings_keys
from cs336sys.sweep.points import SpecError, listed
from cs336sys.sweep.result import Result


# -- 1. the module: Spec, specs, run, EXPERIMENT ----------------------------------------------
@dataclass(frozen=True)
class MatmulSpec:
    n: int  # the matrices are n x n
    warmup: int
    iters: int
    device: str = "cpu"

    def settings(self) -> dict[str, Any]:
        return asdict(self)


def specs(*, n: list[str] | None = None, warmup: int | None = None, iters: int | None = None,
          device: str = "cpu") -> list[MatmulSpec]:
    sizes = [int(v) for v in listed(n, "--n", default=[16, 32])]
    if any(v <= 0 for v in sizes):
        raise SpecError("--n: sizes must be positive")
    return [MatmulSpec(v, 1 if warmup is None else warmup, 3 if iters is None else iters, device)
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


EXPERIMENT = Experiment(
    kind="matmul", view="matmul_runs", title="Matmul", spec=MatmulSpec, run=run,
    settings=settings_keys(MatmulSpec),
    metrics=(Metric("matmul_ms", "ms", "fastest timed matmul"),
             Metric("flops", "", "2 n^3 floating-point operations")),
    tables=(Table("Matmul time", (Column("n", "n", setting=True),
                                  Column("ms", "matmul_ms", "num"))),),
    compare="matmul_ms",
)


# -- 3. its command ----------------------------------------------------------------------------
def command(
    n: Annotated[list[str] | None, typer.Option(help="Matrix size(s). [default: 16,32]")] = None,
    warmup: Warmup = None,
    iters: Iters = None,
    device: Annotated[str, typer.Option(help="cpu.")] = "cpu",
    resume: Resume = False,
    label: Label = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time an n x n matmul; one row per size.

    Example:

        cs336sys matmul --n 16,32
    """
    options = dict(locals())
    run_experiment(EXPERIMENT, specs, options, describe=lambda s: f"n={s.n}", emulation=False)
