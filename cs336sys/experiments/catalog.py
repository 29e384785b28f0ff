"""Every experiment's declaration, in the order reports show them.

Adding an experiment kind is its module (experiments/<kind>.py, with `EXPERIMENT`), one line
here, and its command (docs/architecture.md). The store's views and the report's sections
sit below experiments/ and are derived from these declarations: the commands pass this
catalog down (`Store(path, EXPERIMENTS)`, `report.render.build(..., EXPERIMENTS)`).
Importing this module imports no torch: experiments import it inside their `run`.
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
    step,
)
from cs336sys.sweep.declaration import Experiment

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
    step.EXPERIMENT,
)


def by_kind() -> dict[str, Experiment]:
    """The declarations by experiment kind."""
    return {e.kind: e for e in EXPERIMENTS}
