"""SQLite results store (sqlite-utils): invocations, runs, one view per experiment.

The names below are imported on first use (PEP 562), so that `import cs336sys.store.views`
(what `cs336sys sql` needs) does not import sqlite-utils, which imports numpy.
"""

from __future__ import annotations

from cs336sys.bench.lazy import attributes

_LAZY = {
    "STATUSES": "cs336sys.store.db",
    "Store": "cs336sys.store.db",
    "StoreError": "cs336sys.store.db",
    "check_path": "cs336sys.store.db",
    "connect_readonly": "cs336sys.store.db",
    "now": "cs336sys.store.db",
    "point_key": "cs336sys.store.db",
    "Recorder": "cs336sys.store.recorder",
    "SCHEMA_VERSION": "cs336sys.store.schema",
}

__all__ = sorted(_LAZY)


__getattr__ = attributes(globals(), _LAZY)
