"""Every experiment's declaration, in the order reports show them.

The package root points bench.declaration.catalog() here, so that the store's views and the
report's sections, which sit below experiments/, are derived from these declarations
without importing experiments/ (docs/architecture.md). Importing this module imports no
torch: experiments import it inside their `run`.
"""

from __future__ import annotations

from cs336sys.experiments import (
    attention,
    comm,
    ddp,
    memory,
    memory_residuals,
    model,
    plan,
    precision,
    profile,
    speedrun,
)

EXPERIMENTS = (
    model.EXPERIMENT,
    attention.EXPERIMENT,
    memory.EXPERIMENT,
    memory_residuals.EXPERIMENT,
    comm.EXPERIMENT,
    ddp.EXPERIMENT,
    plan.EXPERIMENT,
    profile.EXPERIMENT,
    precision.EXPERIMENT,
    speedrun.EXPERIMENT,
)
