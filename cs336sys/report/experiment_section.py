"""The report section of one experiment: its declared tables, what its own `section` adds,
and why each point that is not ok is so. Above both the section parts (report/sections.py)
and the declared tables' writer (report/tables.py), which it puts together."""

from __future__ import annotations

from typing import Any

from cs336sys.report.sections import Row, Section, failures, latest
from cs336sys.report.tables import point_tables


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
    which, suffix = experiment.apart or (lambda r: False, "")
    sec.tables.extend(point_tables(experiment.tables, pts, counts=counts, lift=1,
                                   keep=lambda r: not which(r)))
    for t in point_tables(experiment.tables, pts, counts=counts, lift=1, keep=which):
        t.title += suffix
        sec.tables.append(t)
    if experiment.section is not None:
        experiment.section(sec, pts)
    sec.failures = failures(pts)
    return sec
