"""What the ddp experiment shows: its declared table, and its report section beyond it:
memory per rank against the analytic figure, and the bucket-size sweep."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cs336sys.experiments.ddp_setup import shares_cell
from cs336sys.experiments.model_section import SIZE
from cs336sys.report.plots import Bar, Bars, Plot
from cs336sys.report.sections import Row, Section, add_plot, left_out, mib, series, text, with_gpu
from cs336sys.sweep.declaration import HOST_BOUND, SIZE_COLUMN, Column, Ratio, Table


def section(sec: Section, pts: list[Row]) -> None:
    """Memory per rank against the analytic figure, and the bucket-size sweep."""
    measured = [r for r in pts if r.get("mem_before_opt_params_bytes") is not None]
    if measured:  # rows stored before the sharding release have no memory figures
        m = with_gpu(measured, ["impl", "opt sharding", "world", "params MiB", "grads MiB",
                                "opt state MiB", "live before step MiB", "peak MiB"], lambda r: [
            text(r["impl"]), text(r["optimizer_sharding"]), text(r["world_size"]),
            *(f"{mib(r[f'mem_{w}_{k}_bytes'])} ({mib(r[f'expected_{k}_bytes'])})"
              for w, k in (("before_opt", "params"), ("before_opt", "grads"),
                           ("after_opt", "opt_state"))),
            mib(r["mem_before_opt_bytes"]), mib(r["mem_peak_bytes"]),
        ], shown=("impl", "optimizer_sharding", "world_size", "bucket_mb", *SIZE))
        m.title = "Memory per rank: measured (analytic expectation)"
        m.note = ("Rank 0, in the step after warm-up. Parameters and gradients just before the "
                  "optimizer step, optimizer state just after it; 'live' counts everything.")
        sec.tables.append(m)
    add_plot(sec, "Step time split into waiting on communication and the rest", "ddp-steps",
             _steps(pts), note="The step's mean time, the part rank 0 was blocked on gradient "
             "communication at the top (fsdp: its gathers and reduce-scatters); beside it, "
             "tokens per second across the ranks.")
    every = series(pts, "bucket_mb", "step_ms_mean", first=("impl", "world_size"))
    lines = {k: v for k, v in every.items() if len(v) > 1}  # the bucketed sweeps only
    add_plot(sec, "Bucket-size sweep", "ddp-buckets",
          Plot.lines(lines, "bucket size (MiB)", "step time (ms)", "Step time against bucket size",
                     logx=True),
          note=left_out(list(lines), list(every),
                        "series (those with one bucket size are in the table)"))


def _steps(pts: list[Row]) -> Bars:
    """Per measured point: its step time, the communication it waited on stacked on the
    rest, grouped by world size; tokens per second beside."""
    bars = []
    for r in pts:
        step, comm = r.get("step_ms_mean"), r.get("comm_ms_mean")
        if r.get("status") != "ok" or step is None:
            continue
        s = r["_settings"]
        label = " ".join(x for x in (text(s.get("impl")), _bucket(s), _sharded(s)) if x)
        wait = min(comm, step) if comm is not None else None
        bars.append(Bar(f"{text(s.get('world_size'))} ranks", label,
                        (None if wait is None else step - wait, wait), total=step,
                        side=r.get("tokens_per_s")))
    return Bars(tuple(bars), ("compute and the rest", "waiting on communication"),
                "step time (ms, mean)", "tokens/s", "DDP: step time and what it waits on",
                "Throughput")


def _bucket(s: dict) -> str:
    return f"{text(s['bucket_mb'])} MiB" if s.get("impl") == "bucketed" and s.get("bucket_mb") else ""


def _sharded(s: dict) -> str:
    sharding = s.get("optimizer_sharding")
    return f"opt {text(sharding)}" if sharding not in (None, "none", "") else ""


def label(row: Mapping[str, Any]) -> str:
    """`bucketed 10MiB +ZeRO`: the impl with its bucket cap and optimizer sharding (the
    user's: `+yours sharded opt`)."""
    out = str(row.get("impl")) + (f" {row['bucket_mb']:g}MiB" if row.get("bucket_mb") else "")
    sharding = row.get("optimizer_sharding") or "none"
    named = {"own": " +sharded opt", "zero": " +ZeRO", "none": ""}
    return out + named.get(sharding, f" +{sharding} sharded opt")


TABLE = Table(
    "Step time, exposed communication and memory per rank",
    (
        Column("impl", cell=label, setting=True, covers=("impl", "bucket_mb", "optimizer_sharding")),
        SIZE_COLUMN,
        Column("ranks", "world_size", setting=True),
        Column("precision", "precision", setting=True),
        Column("step ms", "step_ms", "mean_std"),
        Column("comm ms", "comm_ms", "mean_std"),
        Column("comm %", "comm_fraction", "pct"),
        Column("comm MiB/step", "comm_bytes", "mib"),
        Column("params MiB", "mem_before_opt_params_bytes", "mib"),
        Column("grads MiB", "mem_before_opt_grads_bytes", "mib"),
        Column("opt state MiB", "mem_after_opt_opt_state_bytes", "mib"),
        Column("peak MiB", "mem_peak_bytes", "mib"),
        Column("check", "check", optional=True,
               note="check (the user's code): rank 0's first-step gradients and the "
               "parameters after the timed steps against single-process training of the same "
               "steps, per tensor |g - g_ref| / |g_ref| and |p - p_ref| / |p_ref - p_0| at "
               "most 1e-3 in fp32 (0.1 under bf16 autocast); a point that fails is wrong."),
        Column("vs torch", ratio=Ratio(lambda r: r.get("step_ms_mean"),
                                       {"impl": "torch", "optimizer_sharding": "none"},
                                       ("impl", "bucket_mb", "optimizer_sharding"),
                                       speedup=False)),
        Column("rank 0 holds", cell=shares_cell, optional=True,
               note="rank 0 holds: its share of one whole copy of the parameters and of "
               "AdamW's state, where the point shards them; NOT SHARDED past 1/N + 10 %."),
        HOST_BOUND,
    ),
    note="comm ms: the time a step waits on gradient communication; fsdp: the time any of "
    "its collectives is in flight, overlapped with compute or not. Memory is rank 0's. "
    "vs torch: step time over torch DDP's at the same world size and precision.",
)
