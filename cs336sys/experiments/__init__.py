"""One module per experiment kind. Each declares its `EXPERIMENT` (sweep/declaration.py):
a frozen Spec dataclass (one sweep point), `specs(...)` that validates a sweep's options and
expands them, `run(spec) -> Result` (a pure function of the spec plus the device), its
metrics and its table. `run_sweep` (sweep/runner.py) runs the points of any of them:

    from cs336sys.experiments import model, run_sweep
    points = run_sweep(model.EXPERIMENT, model.specs(size=["tiny"], seq=[64]))

Importing this package imports neither torch nor the sweep runner (`cs336sys --help` reads
the catalog below it): `run_sweep` and `Point` are imported on first use (PEP 562).
"""

from cs336sys.measure.lazy import attach

__getattr__, __dir__, __all__ = attach(__name__, {"cs336sys.sweep.runner": ("Point", "run_sweep")})
