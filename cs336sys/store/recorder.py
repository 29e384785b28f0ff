"""A sweep's sink that writes to a results store: one invocation row, one run row per point.

The sweep runner (sweep/runner.py) hands every finished point to a sink; this is the
one that stores it, used by every `cs336sys` command and by anyone running a sweep from
Python:

    from cs336sys.experiments import model, run_sweep
    from cs336sys.store import Recorder

    with Recorder("db/results.db", command="notebook", device="cpu") as rec:
        points = run_sweep(model.EXPERIMENT, model.specs(size=["tiny"]), rec)

The rows are those the CLI writes for the same sweep: same experiment, settings, metrics,
samples, provenance. The invocation records how the block ended: 0, 1 when a point was
stored as `error`, 130 on Ctrl-C, 143 on SIGTERM and 129 on SIGHUP (where the CLI's handler
turns them into Terminated), 1 on any other exception (the rows already written stay).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cs336sys.measure.provenance import collect
from cs336sys.store.db import Store
from cs336sys.sweep.stopping import Terminated


class Recorder:
    """One invocation in the store at `db`; `add` writes a point as soon as it finished."""

    def __init__(
        self,
        db: str | Path,
        command: str,
        device: str = "cpu",
        argv: list[str] | None = None,
        label: str | None = None,
        experiments: Sequence[Any] | None = None,
    ) -> None:
        self.provenance = collect(device)
        # StoreError: not a results store, newer schema, ...; with `experiments` (the whole
        # catalog) every view is brought up to date, else each as its first point arrives
        self.store = Store(db, experiments)
        self._viewed = {e.view for e in experiments or ()}
        self.path = Path(db)
        self.invocation_id = self.store.begin_invocation(
            self.provenance, list(sys.argv if argv is None else argv), command, label
        )
        self.label = label
        self.errors = 0
        self.added = 0  # points stored by this invocation

    # -- the sink the sweep runner writes to ------------------------------------------------

    def add(self, experiment: Any, spec: Any, result: Any) -> str:
        """Store one point (`experiment` is its declaration); returns the run id."""
        if experiment.view not in self._viewed:
            self.store.ensure_views([experiment])
            self._viewed.add(experiment.view)
        if result.status == "error":
            self.errors += 1
        run_id = self.store.add_run(
            self.invocation_id,
            experiment.kind,
            result.status,
            spec.settings(),
            metrics=result.metrics,
            samples=result.samples,
            error=result.error,
            started=result.started,
            duration_s=result.duration_s,
            tables=result.tables,
            committed=self._counted,
        )
        return run_id

    def _counted(self) -> None:
        self.added += 1

    def update(self, run_id: str, result: Any) -> None:
        """Store metrics set after the point was written (across a group of points)."""
        self.store.update_metrics(run_id, result.metrics)

    def done(self, experiment: Any) -> set[str]:
        """Point keys stored ok by this code on this machine, under this invocation's label
        when it has one (for `--resume`)."""
        return self.store.done_points(experiment.kind, self.provenance, self.label)

    # -- the invocation -----------------------------------------------------------------------

    def close(self, exit_status: int | None = None, busy_s: float | None = None) -> None:
        """Record how the invocation ended (default: 1 if a point failed, else 0), waiting
        for another program's write lock at most `busy_s` (default: the store's timeout)."""
        if exit_status is None:
            exit_status = 1 if self.errors else 0
        try:
            self.store.finish_invocation(self.invocation_id, exit_status, busy_s)
        finally:
            self.store.close()

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, kind: type | None, exc: BaseException | None, tb: Any) -> None:
        if kind is None:
            self.close()
        elif issubclass(kind, KeyboardInterrupt):
            self.close(130)
        elif issubclass(kind, Terminated):
            self.close(128 + getattr(exc, "signum", 15))  # 143 for SIGTERM, 129 for SIGHUP
        elif issubclass(kind, SystemExit):
            code = exc.code if isinstance(exc, SystemExit) else 1
            self.close(code if isinstance(code, int) else 1)
        else:
            self.close(1)
