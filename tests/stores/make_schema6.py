"""How tests/stores/schema6.db was made (run again by the commit that last changed it): a
store at schema version 6 holding what cs336sys 0.2 stored, with its names and values
(settings before v7, v8 and v9, attention's metrics before 0.2's naming rule). The file is committed so that the test
reading it does not depend on today's migrations to build it.

    python tests/stores/make_schema6.py tests/stores/schema6.db
"""

from __future__ import annotations

import json
import sqlite3
import sys

from cs336sys.store import schema
from cs336sys.sweep.points import point_key

INVOCATIONS = [("i-model", "model", "2026-11-20 10:00:00", "NVIDIA H100 80GB HBM3"),
               ("i-more", "ddp", "2026-11-20 11:00:00", "cpu")]
RUNS = [
    ("i-model", "model", {"size": "small", "context_length": 256, "batch_size": 4, "steps": 5,
                          "mode": "train", "precision": "bf16", "device": "cuda"},
     {"step_ms_mean": 41.5, "step_ms_median": 41.0, "fwd_ms_mean": 12.0}),
    ("i-model", "attention", {"impl": "sdpa", "seq": 1024, "d_head": 64, "dtype": "bf16",
                              "causal": True, "pass": "both", "device": "cuda"},
     {"fwd_ms": 0.25, "bwd_ms": 0.5, "e2e_ms": 0.75}),
    ("i-more", "ddp", {"impl": "flat", "size": "tiny", "context_length": 64, "global_batch": 4,
                       "steps": 3, "optimizer_sharding": "own", "world_size": 2,
                       "device": "cpu"},
     {"step_ms_mean": 300.0}),
    ("i-more", "comm", {"op": "all-reduce", "size_bytes": 4000, "dtype": "fp32",
                        "world_size": 2, "backend": "gloo", "device": "cpu"},
     {"time_ms_mean": 0.5, "busbw_gbps": 0.016}),
    ("i-more", "memory-residuals", {"size": "tiny", "seq": 128, "batch": 1, "precision": "fp32",
                                    "impl": "compiled", "device": "cpu"},
     {"saved_bytes": 1048576}),
    ("i-more", "step", {"switches": "compile", "compile": True, "cold_cache": True,
                        "size": "tiny", "context_length": 32, "batch_size": 2, "steps": 3,
                        "device": "cpu"},
     {"step_ms_median": 150.0}),
]


def main(path: str) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, target=6)
    for inv, command, started, gpu in INVOCATIONS:
        conn.execute("INSERT INTO invocations (id, command, started, gpu, device) "
                     "VALUES (?, ?, ?, ?, ?)", (inv, command, started, gpu, "cpu"))
    for i, (inv, kind, settings, metrics) in enumerate(RUNS):
        conn.execute("INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, "
                     "point_key, created) VALUES (?, ?, ?, 'ok', ?, ?, ?, ?)",
                     (f"r{i}", inv, kind, json.dumps(settings), json.dumps(metrics),
                      point_key(kind, settings), f"2026-11-20 12:00:0{i}"))
    conn.execute("VACUUM")
    conn.close()


if __name__ == "__main__":
    main(sys.argv[1])
