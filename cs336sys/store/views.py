"""One SQL view per experiment, flattening the JSON settings and metrics into columns.

Views are derived from this table of column names, so adding a column or an experiment is
a change here only: when the definitions differ from those a store was created with, the
views are dropped and re-created on the next write-open (the rows themselves never change).
"""

from __future__ import annotations

import hashlib
import json
import sqlite3

# Columns every view starts with: who, where and how the point ran.
_COMMON = [
    "r.id AS run_id",
    "r.invocation_id",
    "r.created",
    "i.gpu",
    "i.host",
    "i.git_commit",
    "i.git_dirty",
    "r.status",
    "r.error",
]

_STATS = ("mean", "std", "min", "median", "max")


def _timing(*phases: str) -> list[str]:
    return [f"{p}_ms_{s}" for p in phases for s in _STATS]


# view name -> (experiment, settings keys, metrics keys)
VIEWS: dict[str, tuple[str, list[str], list[str]]] = {
    "model_runs": (
        "model",
        [
            "size",
            "d_model",
            "d_ff",
            "num_layers",
            "num_heads",
            "vocab_size",
            "context_length",
            "batch_size",
            "mode",
            "precision",
            "compile",
            "attention",
            "optimizer",
            "checkpoint",
            "warmup",
            "steps",
            "device",
            "seed",
        ],
        [
            *_timing("fwd", "bwd", "opt", "step"),
            "params",
            "tokens_per_step",
            "tokens_per_s",
            "flops_per_step",
            "tflops",
            "peak_tflops",
            "mfu",
            "logits_dtype",
            "peak_allocated_mb",
            "peak_reserved_mb",
            "loss_first",
            "loss_last",
        ],
    ),
    "attention_runs": (
        "attention",
        [
            "impl",
            "seq",
            "d_head",
            "heads",
            "batch",
            "dtype",
            "causal",
            "pass",
            "timer",
            "sdpa_backend",
            "warmup",
            "iters",
            "device",
            "seed",
        ],
        [
            *(
                f"{p}_ms{s}"
                for p in ("fwd", "bwd", "e2e")
                for s in ("", "_std", "_min", "_median", "_max")
            ),
            "mem_before_bwd_bytes",
            "saved_bytes",
            "peak_bytes",
            "flops_fwd",
            "flops_bwd",
            "flops_e2e",
            "tflops_fwd",
            "tflops_bwd",
            "tflops_e2e",
            "max_err",
            "max_err_grad",
            "interpreted",
            "sdpa_backend_used",
        ],
    ),
    "comm_runs": (
        "comm",
        ["op", "backend", "device", "world_size", "size_bytes", "dtype", "warmup", "iters"],
        [
            "time_ms_mean",
            "time_ms_min",
            "time_ms_max",
            "time_ms_median",
            "algbw_gbps",
            "busbw_gbps",
            "wrong",
            "numel",
        ],
    ),
    "ddp_runs": (
        "ddp",
        [
            "impl",
            "bucket_mb",
            "world_size",
            "backend",
            "device",
            "size",
            "d_model",
            "num_layers",
            "context_length",
            "global_batch",
            "precision",
            "warmup",
            "steps",
            "seed",
        ],
        [
            *_timing("step", "fwd", "bwd", "comm", "opt"),
            "comm_fraction",
            "allreduce_calls",
            "comm_bytes",
            "buckets",
            "params",
            "tokens_per_s",
            "param_max_diff",
            "loss_first",
            "loss_last",
        ],
    ),
}


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def view_sql(name: str) -> str:
    experiment, settings, metrics = VIEWS[name]
    cols = list(_COMMON)
    cols += [f"json_extract(r.settings, '$.{k}') AS {_quote(k)}" for k in settings]
    cols += [f"json_extract(r.metrics, '$.{k}') AS {_quote(k)}" for k in metrics]
    body = ",\n       ".join(cols)
    return (
        f"CREATE VIEW {_quote(name)} AS\nSELECT {body}\n"
        f"  FROM runs r LEFT JOIN invocations i ON i.id = r.invocation_id\n"
        f" WHERE r.experiment = '{experiment}'"
    )


def signature() -> str:
    text = "\n".join(view_sql(n) for n in sorted(VIEWS))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def ensure_views(conn: sqlite3.Connection) -> None:
    """(Re-)create the views if their definitions changed. Autocommit connection."""
    sig = signature()
    if _meta(conn, "views") == sig:
        return
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Drop only the views cs336sys made (now or in an earlier version), never a user's own.
        ours = set(json.loads(_meta(conn, "view_names") or "[]")) | set(VIEWS)
        for name in sorted(ours):
            conn.execute(f"DROP VIEW IF EXISTS {_quote(name)}")
        for name in VIEWS:
            conn.execute(view_sql(name))
        conn.executemany(
            "INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
            [("views", sig), ("view_names", json.dumps(sorted(VIEWS)))],
        )
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise


def _meta(conn: sqlite3.Connection, key: str) -> str | None:
    row = conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
    return row[0] if row else None
