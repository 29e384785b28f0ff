"""The clock every stored time is read from: UTC, in SQLite's own datetime format."""

from __future__ import annotations

from datetime import datetime, timezone


def now() -> str:
    """UTC as 'YYYY-MM-DD HH:MM:SS.ffffff', so `created >= datetime('now', '-1 day')` works in
    SQL and the text sorts like the instants it names."""
    return datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
