"""Schema of the results store and its migrations.

The schema version lives in SQLite's `PRAGMA user_version`. Each migration moves the store
from version N-1 to N; an old results.db is brought forward step by step on open, inside one
IMMEDIATE transaction so that two processes opening it at once do not both migrate it.
Views are derived, not migrated: see views.py.
"""

from __future__ import annotations

import functools
import re
import sqlite3
from typing import Any

from cs336sys.store.transaction import immediate
from cs336sys.sweep.points import point_key

_RUNS_INDEXES = ("runs_point_key", "runs_experiment_created", "runs_invocation")
# runs.status's CHECK as v1 made it, and as v6 widens it
_STATUSES_V1 = "CHECK (status IN ('ok', 'oom', 'error', 'skipped'))"
_STATUSES_V6 = "CHECK (status IN ('ok', 'wrong', 'oom', 'error', 'skipped'))"


def _quoted(name: str) -> str:
    """An SQL identifier, quoted: a column someone named `check` or `my note`."""
    return '"' + name.replace('"', '""') + '"'


def _wrong_and_user_code(conn: sqlite3.Connection) -> None:
    """v6: runs.status may be 'wrong' (measured, but the user's code failed its check), and
    each invocation records the user's code it measured. SQLite cannot change a CHECK
    constraint, so `runs` is rebuilt (same columns, same rows); `legacy_alter_table` keeps
    the rename from rewriting or re-checking the views and kernel_stats' reference, which
    name `runs` again once it is done. The views are re-created (meta 'views' forgotten).
    The table is rebuilt from its own CREATE statement, the status CHECK widened, so that
    columns someone added keep their definitions (NOT NULL, a default, a generated
    column), and their indexes and triggers are made again: a copy of the 12 columns
    alone dropped a column of notes, and an index on a generated column then named a
    column the table no longer had."""
    (table,) = conn.execute(
        "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = 'runs'").fetchone()
    widened = re.sub(r"^\s*CREATE\s+TABLE\s+(\"runs\"|runs)\b", "CREATE TABLE runs_v6",
                     table.replace(_STATUSES_V1, _STATUSES_V6), count=1, flags=re.I)
    if _STATUSES_V6 not in widened or "runs_v6" not in widened:
        raise sqlite3.DatabaseError("runs is not the table cs336sys made: its CREATE "
                                    "statement lacks the status check or its name")
    # stored columns only: a generated one (hidden 2 or 3) is computed again, not copied
    columns = ", ".join(_quoted(name) for _, name, *_, hidden in
                        conn.execute("PRAGMA table_xinfo(runs)") if hidden == 0)
    theirs = [sql for (sql,) in conn.execute(
        "SELECT sql FROM sqlite_master WHERE tbl_name = 'runs' AND type IN ('index', 'trigger') "
        "AND sql IS NOT NULL AND name NOT IN (?, ?, ?)", _RUNS_INDEXES)]
    conn.execute("PRAGMA legacy_alter_table = ON")
    try:
        conn.execute(widened)
        conn.execute(f"INSERT INTO runs_v6 ({columns}) SELECT {columns} FROM runs")
        conn.execute("DROP TABLE runs")
        conn.execute("ALTER TABLE runs_v6 RENAME TO runs")
    finally:
        conn.execute("PRAGMA legacy_alter_table = OFF")
    for statement in (
        "CREATE INDEX runs_point_key ON runs (point_key)",
        "CREATE INDEX runs_experiment_created ON runs (experiment, created)",
        "CREATE INDEX runs_invocation ON runs (invocation_id)",
        *theirs,
        # the user's repository (the folder its adapters file or one-off code came from),
        # its commit and whether its tracked files differed from it, and the adapters file
        "ALTER TABLE invocations ADD COLUMN user_repo TEXT",
        "ALTER TABLE invocations ADD COLUMN user_commit TEXT",
        "ALTER TABLE invocations ADD COLUMN user_dirty INTEGER",
        "ALTER TABLE invocations ADD COLUMN adapters TEXT",
        "ALTER TABLE invocations ADD COLUMN adapters_sha256 TEXT",
        "DELETE FROM meta WHERE key = 'views'",
    ):
        conn.execute(statement)


# v7: one name per concept, from option to stored setting (docs/store.md, "Renamed
# columns"): the settings keys each experiment stored under its 0.2 names, renamed.
_V7_RENAMES = {
    "model": {"context_length": "seq", "batch_size": "batch", "steps": "iters"},
    "memory": {"context_length": "seq", "batch_size": "batch", "steps": "iters"},
    "step": {"context_length": "seq", "batch_size": "batch", "steps": "iters"},
    "memory-residuals": {"context_length": "seq", "batch_size": "batch"},
    "ddp": {"context_length": "seq", "global_batch": "batch", "steps": "iters"},
    "profile": {"context_length": "seq", "batch_size": "batch", "steps": "iters",
                "dtype": "precision"},
    "attention": {"dtype": "precision"},
    "comm": {"dtype": "precision"},
    "precision": {"dtype": "precision", "batch_size": "batch"},
}


# An old setting's name -> its name now, whatever the experiment (--where's hint).
RENAMED_SETTINGS = {old: new for renames in _V7_RENAMES.values() for old, new in renames.items()}


def _rewrite_settings(conn: sqlite3.Connection, kind: str, change: Any) -> None:
    """Each run of experiment `kind` whose settings `change(dict)` changes gets the new
    settings and the point key computed from them (what --resume matches)."""
    import json

    rows = conn.execute("SELECT id, settings FROM runs WHERE experiment = ?", (kind,)).fetchall()
    for run_id, text in rows:
        try:
            settings = json.loads(text)
        except ValueError:
            continue
        if not isinstance(settings, dict):
            continue
        changed = change(dict(settings))
        if changed != settings:
            conn.execute("UPDATE runs SET settings = ?, point_key = ? WHERE id = ?",
                         (json.dumps(changed), point_key(kind, changed), run_id))


def _renamed(settings: dict, renames: dict[str, str]) -> dict:
    for old, new in renames.items():
        if old in settings:
            value = settings.pop(old)
            settings.setdefault(new, value)
    return settings


def _one_name_per_concept(conn: sqlite3.Connection) -> None:
    """v7: rename the stored settings of _V7_RENAMES in every run."""
    for kind, renames in _V7_RENAMES.items():
        _rewrite_settings(conn, kind, lambda s, r=renames: _renamed(s, r))


def _warm_cache(settings: dict) -> dict:
    """step's cold_cache (compile from empty caches) as warm_cache, its option's sense: a
    compiled point that was not cold; False for a point that compiles nothing."""
    if "cold_cache" in settings:
        cold = settings.pop("cold_cache")
        settings.setdefault("warm_cache", bool(settings.get("compile")) and not cold)
    return settings


def _compile_flag(settings: dict) -> dict:
    """memory residuals' impl (eager | compiled) as compile, the flag every other kind has."""
    if "impl" in settings:
        settings.setdefault("compile", settings.pop("impl") == "compiled")
    return settings


def _the_options_words(conn: sqlite3.Connection) -> None:
    """v8: the last settings stored under another word than their option's: ddp's
    optimizer_sharding is shard_optimizer (--shard-optimizer), comm's size_bytes is bytes
    (--bytes), step's cold_cache is warm_cache (--warm-cache, the value inverted), memory
    residuals' impl is compile (--compile/--no-compile)."""
    _rewrite_settings(conn, "ddp", lambda s: _renamed(s, {"optimizer_sharding": "shard_optimizer"}))
    _rewrite_settings(conn, "comm", lambda s: _renamed(s, {"size_bytes": "bytes"}))
    _rewrite_settings(conn, "step", _warm_cache)
    _rewrite_settings(conn, "memory-residuals", _compile_flag)


def _ours(conn: sqlite3.Connection) -> None:
    """v9: ddp's shard_optimizer `own` is `ours`, the value --shard-optimizer takes."""
    _rewrite_settings(conn, "ddp", lambda s: {**s, "shard_optimizer": "ours"}
                      if s.get("shard_optimizer") == "own" else s)


# Version N is reached by running MIGRATIONS[N - 1]: SQL statements, or a function of the
# connection for what SQL alone cannot say.
MIGRATIONS: list[list[str] | Any] = [
    # v1: invocations (one per CLI call) and runs (one per measured point of a sweep).
    [
        """
        CREATE TABLE invocations (
            id TEXT PRIMARY KEY,            -- UUID, so stores from several machines merge
            command TEXT,
            argv TEXT,                      -- JSON list
            started TEXT,                   -- UTC, 'YYYY-MM-DD HH:MM:SS.ffffff'
            finished TEXT,
            exit_status INTEGER,            -- NULL while running (or if the process was killed)
            host TEXT,
            device TEXT,                    -- the device the command measured on: 'cuda:0', 'cpu'
            gpu TEXT,                       -- GPU name, or 'cpu'
            gpu_count INTEGER,
            gpu_memory_gb REAL,
            cpu TEXT,                       -- CPU model
            cuda_version TEXT,
            driver_version TEXT,
            torch_version TEXT,
            triton_version TEXT,
            python_version TEXT,
            cs336sys_version TEXT,
            git_commit TEXT,                -- NULL outside a git checkout
            git_dirty INTEGER
        )
        """,
        """
        CREATE TABLE runs (
            id TEXT PRIMARY KEY,            -- UUID
            invocation_id TEXT REFERENCES invocations(id),
            experiment TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('ok', 'oom', 'error', 'skipped')),
            error TEXT,
            settings TEXT NOT NULL,         -- JSON object: the point of the sweep
            metrics TEXT NOT NULL,          -- JSON object: what was measured or derived
            samples TEXT,                   -- JSON object: raw samples, warm-up included
            started TEXT,
            created TEXT,                   -- when the row was written
            duration_s REAL
        )
        """,
        "CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT)",
    ],
    # v2: a key per point, so `--resume` finds points already measured; indexes for reports.
    [
        "ALTER TABLE runs ADD COLUMN point_key TEXT",
        "CREATE INDEX runs_point_key ON runs (point_key)",
        "CREATE INDEX runs_experiment_created ON runs (experiment, created)",
        "CREATE INDEX runs_invocation ON runs (invocation_id)",
    ],
    # v3: the op/kernel summary of a profiled run (`cs336sys profile`), rows linked to runs.
    [
        """
        CREATE TABLE kernel_stats (
            id INTEGER PRIMARY KEY,
            run_id TEXT NOT NULL REFERENCES runs(id),
            phase TEXT NOT NULL,            -- forward | backward | optimizer | step (all)
            rank INTEGER NOT NULL,          -- 1 = most time in the phase; '(other)' comes last
            name TEXT NOT NULL,             -- kernel name (CUDA) or op name (CPU)
            calls INTEGER NOT NULL,         -- over all profiled steps
            total_ms REAL NOT NULL,         -- over all profiled steps
            mean_ms REAL NOT NULL,          -- per call
            share REAL NOT NULL,            -- of the phase's summed op/kernel time
            time_basis TEXT NOT NULL CHECK (time_basis IN ('cuda', 'cpu'))
                                            -- cuda: kernel time on the GPU; cpu: op self time
        )
        """,
        "CREATE INDEX kernel_stats_run ON kernel_stats (run_id, phase, rank)",
    ],
    # v4: a free-text label per invocation (`--label`), for --where and reports.
    ["ALTER TABLE invocations ADD COLUMN label TEXT"],
    # v5: the environment variables that change what runs (CS336SYS_TRITON_TMA=1, say), as a
    # JSON object, or NULL: part of what --resume matches (measure/provenance.measurement_env).
    ["ALTER TABLE invocations ADD COLUMN env TEXT"],
    # v6: status 'wrong' and the user's code on each invocation (see the function).
    _wrong_and_user_code,
    # v7: stored settings renamed to one name per concept (see the function).
    _one_name_per_concept,
    # v8: the last stored settings renamed to their option's word
    _the_options_words,
    # v9: the last stored value renamed to its option's word
    _ours,
    # v10: the sha256 of the user's uncommitted Python code (measure/provenance.uncommitted),
    # NULL when none: part of what --resume matches, so an edit not committed is measured
    ["ALTER TABLE invocations ADD COLUMN user_changes TEXT"],
]

SCHEMA_VERSION = len(MIGRATIONS)


class SchemaError(Exception):
    """The database cannot be used by this version of cs336sys."""


def version(conn: sqlite3.Connection) -> int:
    return conn.execute("PRAGMA user_version").fetchone()[0]


@functools.cache
def _columns_at(v: int) -> dict[str, frozenset[str]]:
    """Every table of a store at version `v` and its columns: a new in-memory store migrated
    to `v`, the reference a file claiming that version is held to."""
    conn = sqlite3.connect(":memory:", isolation_level=None)
    try:
        migrate(conn, v)
        return {t: _columns(conn, t) for (t,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def _columns(conn: sqlite3.Connection, table: str) -> frozenset[str]:
    # PRAGMA takes no parameters; `table` comes from our own reference schema.
    return frozenset(r[1] for r in conn.execute(f'PRAGMA main.table_info("{table}")'))


def lacking(conn: sqlite3.Connection) -> str | None:
    """What the store behind `conn` lacks of the tables and columns its version number
    promises (a file that claims a version it does not have: forged, or cut by hand), in
    words; None when nothing is missing, or for a version this code does not know."""
    found = version(conn)
    if not 0 < found <= SCHEMA_VERSION:
        return None
    for table, expected in _columns_at(found).items():
        have = _columns(conn, table)
        if not have:
            return f"it lacks the table {table} that schema version {found} has"
        if expected - have:
            missing = ", ".join(sorted(expected - have))
            return f"its table {table} lacks {missing}, which schema version {found} has"
    return None


def migrate(conn: sqlite3.Connection, target: int = SCHEMA_VERSION) -> int:
    """Bring the schema to `target`; returns the version found before migrating.

    `conn` must be in autocommit mode (isolation_level=None).
    """
    with immediate(conn):
        found = version(conn)
        if found > SCHEMA_VERSION:
            raise SchemaError(
                f"the store has schema version {found}, newer than this cs336sys knows "
                f"({SCHEMA_VERSION}); upgrade cs336sys"
            )
        for v in range(found, target):
            if callable(MIGRATIONS[v]):
                MIGRATIONS[v](conn)
                continue
            for statement in MIGRATIONS[v]:
                conn.execute(statement)
        if target > found:
            # PRAGMA does not take parameters; target is an int we computed.
            conn.execute(f"PRAGMA user_version = {int(target)}")
    return found
