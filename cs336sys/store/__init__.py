"""SQLite results store (sqlite-utils): invocations, runs, one view per experiment.

The names below are imported on first use (PEP 562), so that `import cs336sys.store.views`
(what `cs336sys sql` needs) does not import sqlite-utils, which imports numpy.
"""

from __future__ import annotations

from typing import Any

_DB = ("STATUSES", "Store", "StoreError", "check_path", "connect_readonly", "now", "point_key")

__all__ = sorted([*_DB, "Recorder", "SCHEMA_VERSION"])


def __getattr__(name: str) -> Any:
    if name in _DB:
        from cs336sys.store import db

        return getattr(db, name)
    if name == "Recorder":
        from cs336sys.store.recorder import Recorder

        return Recorder
    if name == "SCHEMA_VERSION":
        from cs336sys.store.schema import SCHEMA_VERSION

        return SCHEMA_VERSION
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
