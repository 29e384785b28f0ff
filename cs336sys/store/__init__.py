"""SQLite results store (sqlite-utils): invocations, runs, one view per experiment.

The names below are imported on first use (PEP 562), so that `import cs336sys.store.views`
(what `cs336sys sql` needs) does not import sqlite-utils, which imports numpy.
"""

from cs336sys.measure.lazy import attach

__getattr__, __dir__, _ON_FIRST_USE = attach(__name__, {
    "cs336sys.store.db": ("STATUSES", "Store", "StoreError", "check_path", "connect_readonly",
                          "now", "point_key"),
    "cs336sys.store.recorder": ("Recorder",),
    "cs336sys.store.schema": ("SCHEMA_VERSION",),
})

__all__ = sorted(_ON_FIRST_USE)
