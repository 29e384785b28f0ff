"""One module per experiment kind. Each declares its `EXPERIMENT` (sweep/declaration.py):
a frozen Spec dataclass (one sweep point), `specs(...)` that validates a sweep's options and
expands them, `run(spec) -> Result` (a pure function of the spec plus the device), its
metrics and its table. `run_sweep` (sweep/runner.py) runs the points of any of them:

    from cs336sys.experiments import model, run_sweep
    points = run_sweep(model.EXPERIMENT, model.specs(size=["tiny"], seq=[64]))

Importing this package imports neither torch nor the sweep runner (`cs336sys --help` reads
the catalog below it): `run_sweep` and `Point` are imported on first use (PEP 562).
"""

from typing import Any

__all__ = ["Point", "run_sweep"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from cs336sys.sweep import runner

        return getattr(runner, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
