"""The report section of one experiment: its declared tables, what its own `section` adds,
and why each point that is not ok is so. Above both the section parts (report/sections.py)
and the declared tables' writer (report/tables.py), which it puts together."""

from __future__ import annotations

from typing import Any

from cs336sys.report.sections import Row, Section, failures, latest
from cs336sys.report.tables import declared_tables


def build_section(experiment: Any, rows: list[Row],
                  linked: dict[str, list[dict[str, Any]]] | None = None,
                  counts: bool = True) -> Section:
    """The report section of one experiment (sweep/declaration.Experiment): its declared
    tables over the latest row of each point (with `counts`, an `n` column: how often each
    was stored), those its `apart` names in tables of their own, then what its `section`
    adds (tables, plots), then why each point that is not ok is so."""
    sec = Section(experiment.kind, experiment.title, linked=dict(linked or {}),
                  collapsed=experiment.analytic)
    pts = latest(rows)
    sec.tables.extend(declared_tables(experiment, pts, counts=counts, lift=1))
    if experiment.section is not None:
        experiment.section(sec, pts)
    sec.failures = failures(pts)
    return sec
