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
            "optimizer_sharding",
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
            *(f"{p}_ms_rank_{s}" for p in ("step", "comm") for s in ("mean", "min", "max")),
            "comm_fraction",
            "allreduce_calls",
            "comm_bytes",
            *(f"{k}_{u}" for k in ("allreduce", "broadcast", "allgather", "reducescatter")
              for u in ("calls", "bytes")),  # fmt: skip
            # per-rank memory (rank 0): live bytes, and what parameters, gradients and
            # optimizer state hold, after init and around the optimizer step (issue 7)
            *(f"mem_{w}{part}_bytes" for w in ("init", "before_opt", "after_opt")
              for part in ("", "_params", "_grads", "_opt_state")),  # fmt: skip
            "mem_peak_bytes",
            "mem_peak_bytes_max_rank",
            "expected_params_bytes",
            "expected_grads_bytes",
            "expected_opt_state_bytes",
            "buckets",
            "params",
            "tokens_per_s",
            "param_max_diff",
            "loss_first",
            "loss_last",
        ],
    ),
    "precision_runs": (
        "precision",
        [
            "kind",
            "variant",
            "accumulator_dtype",
            "value_dtype",
            "upcast",
            "additions",
            "value",
            "dtype",
            "in_features",
            "out_features",
            "batch_size",
            "device",
            "seed",
        ],
        [
            "result_dtype",
            "target",
            "result",
            "error_vs_target",
            "abs_error",
            "rel_error",
            "addend",
            "addend_error_total",
            "sum_rounding_error",
            "autocast_enabled",
            "param_dtype",
            "fc1_dtype",
            "relu_dtype",
            "ln_dtype",
            "logits_dtype",
            "loss_dtype",
            "grad_dtype",
            "loss",
            "native",
            "native_basis",
        ],
    ),
    "profile_runs": (
        "profile",
        [
            "target",
            "profiler",
            "top",
            # a model point (target = 'model')
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
            "steps",
            # an attention point (target = 'attention')
            "impl",
            "seq",
            "d_head",
            "heads",
            "batch",
            "dtype",
            "causal",
            "pass",
            "sdpa_backend",
            "iters",
            "warmup",
            "device",
            "seed",
        ],
        [
            "time_basis",
            "profiled_steps",
            "fwd_ms",
            "bwd_ms",
            "opt_ms",
            "step_ms",
            "fwd_profiled_ms",
            "bwd_profiled_ms",
            "opt_profiled_ms",
            *(f"{part}_{m}" for part in ("qk", "softmax", "pv") for m in ("ms", "flops", "gflops")),
            "trace_path",
        ],
    ),
    "memory_runs": (
        "memory",
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
            "attention",
            "optimizer",
            "checkpoint",
            "warmup",
            "steps",
            "device",
            "seed",
            "snapshot",
        ],
        [
            "peak_source",
            "init_bytes",
            "peak_bytes",
            "peak_reserved_bytes",
            "fwd_peak_bytes",
            "bwd_peak_bytes",
            "opt_peak_bytes",
            "before_opt_bytes",
            "after_opt_bytes",
            "saved_bytes",
            "params",
            "param_bytes",
            "grad_bytes",
            "optim_bytes",
            "act_bytes_analytic",
            "residual_bytes",
            "residual_dtype",
            "checkpoint_group",
            "lowest_peak",
            *_timing("fwd", "bwd", "opt", "step"),
            "loss",
            "snapshot_png",
            "snapshot_pickle",
        ],
    ),
    "memory_residuals_runs": (
        "memory-residuals",
        [
            "size",
            "d_model",
            "d_ff",
            "num_heads",
            "context_length",
            "batch_size",
            "precision",
            "impl",
            "attention",
            "device",
            "seed",
        ],
        [
            "saved_bytes",
            "walked_bytes",
            "analytic_bytes",
            "residual_bytes",
            "saved_per_residual",
            "nodes_saving",
            *(f"top{i}_{k}" for i in range(1, 6) for k in ("op", "bytes", "share")),
            "fwd_ms",
            "compile_s",
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


def typed(value: str) -> int | float | str:
    """A value typed on the command line, as a view column holds it: '16' -> 16, '0.5' ->
    0.5, anything else as text. View columns come from json_extract, so they are typed, and
    the text '16' would never equal the integer 16."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value
