"""What the plan reads from stored runs: this GPU's measured C and W (`cs336sys plan
--measured`), and the ddp runs a planned point can be set beside.

SQL over a read-only connection to the store that the command opens and passes in (this
module imports no store code, and no torch). experiments/plan.py computes the points.
"""

from __future__ import annotations

import sqlite3
from dataclasses import dataclass
from typing import Any

from cs336sys.experiments.ddp_setup import FSDP_IMPLS, REPLICA_IMPLS


class NoMeasurement(LookupError):
    """The store holds no row to measure C or W on this GPU; the message says what to run."""


@dataclass(frozen=True)
class Measured:
    """C and W as this GPU achieved them, and the runs they come from."""

    gpu: str
    flops: float  # best model TFLOP/s x 1e12
    egress: float  # best comm busbw x 1e9
    memory_bytes: int
    model_run: str
    comm_run: str
    precision: str  # of the model run
    comm_op: str

    @property
    def source(self) -> str:
        return (f"measured: model run {self.model_run[:8]} ({self.precision}, "
                f"{self.flops / 1e12:.4g} TFLOP/s), comm run {self.comm_run[:8]} "
                f"({self.comm_op}, busbw {self.egress / 1e9:.4g} GB/s)")


def _rows(conn: sqlite3.Connection, sql: str, params: tuple) -> list[dict[str, Any]]:
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur]


def measured(conn: sqlite3.Connection, gpu: str, host_memory: int | None = None) -> Measured:
    """C from the ok `model` row with the highest TFLOP/s on `gpu` (the invocations' GPU
    name, 'cpu' for CPU runs), W from the ok `comm` row with the highest bus bandwidth that
    got every element right, among the ring collectives the plan's formulas are for
    (all-reduce, all-gather, reduce-scatter: their busbw is nccl-tests' W) when there are
    any, else among every op; NoMeasurement names the command to run when either is
    missing. Memory is the GPU's as the model run recorded it (`host_memory` for 'cpu')."""
    model = _rows(conn, """
        SELECT r.id, i.gpu_memory_gb, json_extract(r.metrics, '$.tflops') AS tflops,
               json_extract(r.settings, '$.precision') AS precision
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'model' AND r.status = 'ok' AND i.gpu = ?
           AND json_extract(r.metrics, '$.tflops') > 0
         ORDER BY tflops DESC, r.created DESC LIMIT 1""", (gpu,))
    comm = _rows(conn, """
        SELECT r.id, json_extract(r.metrics, '$.busbw_gbps') AS busbw,
               json_extract(r.settings, '$.op') AS op
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'comm' AND r.status = 'ok' AND i.gpu = ?
           AND json_extract(r.metrics, '$.busbw_gbps') > 0
           AND coalesce(json_extract(r.metrics, '$.wrong'), 0) = 0
         ORDER BY op IN ('all-reduce', 'all-gather', 'reduce-scatter') DESC, busbw DESC,
                  r.created DESC LIMIT 1""", (gpu,))
    if not model or not comm:
        first = ("cs336sys model --precision bf16" if not model else
                 "cs336sys comm --op all-reduce,all-gather,reduce-scatter")
        what = "model" if not model else "comm"
        # the other GPUs that have what this one lacks (not this one: it has none)
        stored = [r[0] for r in conn.execute(
            "SELECT DISTINCT i.gpu FROM runs r JOIN invocations i ON i.id = r.invocation_id "
            "WHERE r.experiment = ? AND r.status = 'ok' AND i.gpu IS NOT ? ORDER BY 1",
            (what, gpu))]
        others = (
            f" (it has rows of: {', '.join(map(str, stored))}; --gpu picks one)" if stored else ""
        )
        if what == "comm" and conn.execute(
                "SELECT 1 FROM runs r JOIN invocations i ON i.id = r.invocation_id WHERE "
                "r.experiment = 'comm' AND r.status = 'ok' AND i.gpu = ? AND "
                "json_extract(r.settings, '$.world_size') = 1 LIMIT 1",
                (gpu,)).fetchone():  # one rank's rows: no link crossed, no bus bandwidth
            others = (" with a bus bandwidth (its comm rows of one rank cross no link: give "
                      "--world-size 2 or more)" + others)
        raise NoMeasurement(f"--measured: the store has no ok {what} rows for {gpu}{others}; "
                            f"run `{first}` on this GPU first")
    m, c = model[0], comm[0]
    gib = m["gpu_memory_gb"]
    memory = int(gib * 2**30) if gib else (host_memory or 0)
    return Measured(gpu, m["tflops"] * 1e12, c["busbw"] * 1e9, memory, m["id"], c["id"],
                    str(m["precision"]), str(c["op"]))


def chip(point: dict[str, Any]) -> str:
    """The GPU a planned point is for, as it appears in stored GPU names: the measured
    GPU's name, or a preset's chip ('H100' of 'H100 SXM 80GB')."""
    if point["hardware"] == "measured":
        return point["device_name"]
    return point["device_name"].split()[0]


def ddp_match(conn: sqlite3.Connection, point: dict[str, Any]) -> dict[str, Any] | None:
    """The ddp run to set beside a planned dp or fsdp point (`point` its settings): ok, the
    same model, sequence length, batch tokens and world size, an impl of the strategy
    (dp: the replica impls without optimizer sharding; fsdp: fsdp, torch-fsdp), on the
    point's GPU; bf16 runs first (the plan is bf16), then the fastest step."""
    impls = {"dp": REPLICA_IMPLS, "fsdp": FSDP_IMPLS}.get(point["strategy"])
    if impls is None:
        return None
    keys = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
    s = "json_extract(r.settings, '$.{}')".format
    found = _rows(conn, f"""
        SELECT r.id, i.gpu, {s('impl')} AS impl, {s('precision')} AS precision,
               {s('bucket_mb')} AS bucket_mb,
               json_extract(r.metrics, '$.step_ms_mean') AS step_ms,
               json_extract(r.metrics, '$.comm_ms_mean') AS comm_ms,
               json_extract(r.metrics, '$.comm_bytes') AS comm_bytes,
               json_extract(r.metrics, '$.sent_bytes') AS sent_bytes
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'ddp' AND r.status = 'ok'
           AND {' AND '.join(f"{s(k)} = ?" for k in keys)}
           AND {s('seq')} = ? AND {s('batch')} * {s('seq')} = ?
           AND {s('world_size')} = ?
           AND {s('impl')} IN ({', '.join('?' * len(impls))})
           AND coalesce({s('shard_optimizer')}, 'none') = 'none'
           AND json_extract(r.metrics, '$.step_ms_mean') > 0""",
        (*(point[k] for k in keys), point["seq"], point["batch_tokens"], point["n"], *impls))
    name = chip(point).lower()
    exact = point["hardware"] == "measured"
    found = [r for r in found if (r["gpu"] == point["device_name"] if exact
                                  else name in str(r["gpu"]).lower())]
    if not found:
        return None
    return min(found, key=lambda r: (r["precision"] != "bf16", r["step_ms"]))


def beside(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The metrics a planned point gets from the ddp run set beside it."""
    ratio = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    bucket = f" {run['bucket_mb']:g}MiB" if run.get("bucket_mb") is not None else ""
    return {
        "measured_run_id": run["id"],
        "measured_impl": f"{run['impl']}{bucket} {run['precision']}",
        "measured_step_ms": run["step_ms"],
        "measured_comm_ms": run["comm_ms"],
        "measured_comm_bytes": run["comm_bytes"],
        "measured_sent_bytes": run.get("sent_bytes"),
        "measured_step_ratio": ratio(run["step_ms"], plan.get("step_ms")),
        # only where the run's comm ms is all of its collectives' time, as the plan's is: an
        # overlapping DDP's is the part left exposed, which over the whole is no error
        "measured_comm_ratio": ratio(run["comm_ms"], plan.get("comm_ms"))
        if run["impl"] in WHOLE_COMM else None,
    }


# The ddp impls whose comm_ms is the whole time of their collectives: naive and flat wait
# on all of it after backward; fsdp's is the time any collective is in flight.
WHOLE_COMM = ("naive", "flat", "fsdp")
