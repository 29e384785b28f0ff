"""SQLite results store (sqlite-utils): invocations, runs, one view per experiment."""

from cs336sys.store.db import (
    STATUSES,
    Store,
    StoreError,
    check_path,
    connect_readonly,
    now,
    point_key,
)
from cs336sys.store.schema import SCHEMA_VERSION

__all__ = [
    "SCHEMA_VERSION",
    "STATUSES",
    "Store",
    "StoreError",
    "check_path",
    "connect_readonly",
    "now",
    "point_key",
]
