"""One module per experiment kind. Each declares its `EXPERIMENT` (sweep/declaration.py):
a frozen Spec dataclass (one sweep point), `specs(...)` that validates a sweep's options and
expands them, `run(spec) -> Result` (a pure function of the spec plus the device), its
metrics and its table. `run_sweep` (sweep/runner.py) runs the points of any of them:

    from cs336sys.experiments import model, run_sweep
    points = run_sweep(model.EXPERIMENT, model.specs(size=["tiny"], seq=[64]))

Importing this package does not import torch.
"""

from cs336sys.sweep.runner import Point, run_sweep

__all__ = ["Point", "run_sweep"]
