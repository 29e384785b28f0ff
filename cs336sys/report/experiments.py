"""A report section per experiment: its declared tables, then what the field expects
beside them.

Each section opens with the experiment's own tables (bench/declaration.py, drawn by
report/tables.py exactly as the command prints them). Then, per experiment:
model: the warm-up effect from raw samples and the fp32->bf16 and eager->compiled speedups
(as in the CS336 assignment 2 benchmarking tables). attention: latency and memory against
sequence length (FlashAttention-2 paper, Fig. 4-5 style, log-log). memory: the
checkpointing trade-off, peaks against context length, timelines. comm: bus bandwidth
against message size (nccl-tests). ddp: memory per rank against the analytic figure, the
bucket-size sweep. profile: the top kernels of each phase.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cs336sys.bench.declaration import Experiment
from cs336sys.report.plots import Plot
from cs336sys.report.sections import (
    Figure,
    Row,
    Section,
    Table,
    latest,
    mib,
    num,
    panels,
    pct,
    series,
    skey,
    speedups,
    text,
    with_gpu,
)
from cs336sys.report.tables import point_tables

# The experiments whose sections draw plots (memory timelines are PNGs already).
PLOTTED = frozenset({"model", "attention", "memory", "comm", "ddp"})
_SIZE = ("size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")


def _model_label(r: Row, gpu: bool = False) -> str:
    s = r["_settings"]
    extra = [f"{k}={s[k]}" for k in ("attention", "checkpoint")
             if s.get(k) not in (None, "naive", "none")]  # fmt: skip
    return " ".join([
        f"{s.get('size')} T={s.get('context_length')} B={s.get('batch_size')}",
        f"{s.get('mode')} {s.get('precision')}", *extra,
        *(["compiled"] if s.get("compile") else []), *([f"[{r.get('gpu')}]"] if gpu else []),
    ])  # fmt: skip


def model(sec: Section, pts: list[Row]) -> None:
    """The warm-up effect and the fp32 -> bf16 and eager -> compiled speedups."""
    many = len({r.get("gpu") for r in pts}) > 1

    def label(r: Row) -> str:
        return _model_label(r, gpu=many)

    warm, lines = [], {}
    for r in pts:
        smp = r.get("_samples")
        if r["status"] != "ok" or not smp:
            continue
        smp = json.loads(smp)
        w, timed = smp.get("warmup", {}).get("step_ms", []), smp.get("step_ms", [])
        if not w or not timed:
            continue
        mean = sum(timed) / len(timed)
        warm.append([label(r), num(w[0]), num(mean), f"{w[0] / mean:.2f}×"])
        if len(lines) < 8:  # more lines than this are unreadable; the table has them all
            lines[label(r)] = list(enumerate(w + timed, start=1))
    if warm:
        sec.tables.append(Table("Warm-up effect: first step against timed mean",
                                ["point", "first step ms", "timed mean ms", "first/mean"], warm))  # fmt: skip
        _plot(sec, "Step time per step, warm-up included", "model-warmup",
              Plot.lines(lines, "step (1 = first warm-up step)", "step time (ms)",
                         "Warm-up effect", logx=False))  # fmt: skip
    for key, a, b, title in (
        ("precision", "fp32", "bf16", "Speedup fp32 → bf16 (step time)"),
        ("compile", False, True, "Speedup eager → compiled (step time)"),
    ):
        body = speedups(pts, key, a, b, "step_ms_mean", label)
        if body:
            sec.tables.append(Table(title, ["point (A)", f"A={a} ms", f"B={b} ms", "A/B"], body))


def attention(sec: Section, pts: list[Row]) -> None:
    """Latency and memory against sequence length, one panel per head dim."""
    for r in pts:  # forward-only sweeps have no e2e time: plot what was measured
        r["_ms"] = r["e2e_ms_mean"] if r["e2e_ms_mean"] is not None else r["fwd_ms_mean"]
    first = ("impl", "dtype")
    lat = panels(pts, "seq", "_ms", facet="d_head", first=first)
    mem = panels(pts, "seq", "mem_before_bwd_bytes", facet="d_head", scale=2**-20, first=first)
    _plot(sec, "Latency against sequence length", "attention-latency",
          Plot(lat, "sequence length (tokens)", "forward+backward (or forward) time (ms)",
               "Attention latency", logx=True, logy=True))  # fmt: skip
    _plot(sec, "Memory held before backward", "attention-memory",
          Plot(mem, "sequence length (tokens)", "memory before backward (MiB)",
               "Attention memory", logx=True))  # fmt: skip


def memory(sec: Section, pts: list[Row]) -> None:
    """The checkpointing trade-off, peaks against context length, the timelines."""
    trade = _checkpoint_tradeoff(pts)
    if trade:
        sec.tables.append(Table("Checkpointing trade-off against no checkpointing",
                                ["point", "checkpoint", "peak MiB", "peak ratio",
                                 "step time ratio", ""], trade))  # fmt: skip
    lines = series(pts, "context_length", "peak_bytes", scale=2**-20, first=("size", "mode"))
    _plot(sec, "Peak memory against context length", "memory-peak",
          Plot.lines(lines, "context length (tokens)", "peak memory (MiB)", "Peak memory"))
    for i, r in enumerate(pts):
        png = r.get("snapshot_png")
        if png and Path(png).is_file():
            sec.figures.append(Figure(f"Memory timeline: {r['size']} T={r['context_length']}",
                                      f"memory-timeline-{i}", png=Path(png).read_bytes()))  # fmt: skip


def _plot(sec: Section, title: str, name: str, plot: Plot) -> None:
    """Add the plot to the section unless it is only lone points (see Plot.informative)."""
    if plot.informative:
        sec.figures.append(Figure(title, name, plot=plot))


def _checkpoint_tradeoff(pts: list[Row]) -> list[list[str]]:
    """Each point measured with and without checkpointing: peak and step time against `none`,
    the checkpointing with the lowest peak marked (README, "Activation checkpointing trade-off";
    Chen et al. 2016 for the sweep over K)."""
    many = len({r.get("gpu") for r in pts}) > 1
    groups: dict[tuple, list[Row]] = {}
    for r in pts:
        if r["status"] == "ok" and r["peak_bytes"]:
            groups.setdefault((r.get("gpu"), skey(r, drop=("checkpoint",))), []).append(r)
    out = []
    for grp in groups.values():
        base = next((r for r in grp if r["checkpoint"] in (None, "none")), None)
        if base is None or len(grp) < 2:
            continue
        lowest = min(r["peak_bytes"] for r in grp)  # ties all marked, as `cs336sys memory` does
        where = f"{base['size']} T={base['context_length']} {base['mode']}"
        where += f" {base['precision']}" + (f" [{base.get('gpu')}]" if many else "")
        for r in grp:
            t_ratio = (f"{r['step_ms_mean'] / base['step_ms_mean']:.2f}×"
                       if r["step_ms_mean"] and base["step_ms_mean"] else "")  # fmt: skip
            out.append([where, text(r["checkpoint"] or "none"), mib(r["peak_bytes"]),
                        f"{r['peak_bytes'] / base['peak_bytes']:.2f}×", t_ratio,
                        "lowest peak" if r["peak_bytes"] == lowest else ""])  # fmt: skip
    return out


def comm(sec: Section, pts: list[Row]) -> None:
    """Bus bandwidth against message size."""
    lines = series(pts, "size_bytes", "busbw_gbps", first=("op", "backend", "world_size"))
    _plot(sec, "Bus bandwidth against message size", "comm-busbw",
          Plot.lines(lines, "message size (bytes)", "bus bandwidth (GB/s)", "Bus bandwidth",
                     logx=True))  # fmt: skip


def ddp(sec: Section, pts: list[Row]) -> None:
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
        ], shown=("impl", "optimizer_sharding", "world_size", "bucket_mb", *_SIZE))  # fmt: skip
        m.title = "Memory per rank: measured (analytic expectation)"
        m.note = ("Rank 0, in the step after warm-up. Parameters and gradients just before the "
                  "optimizer step, optimizer state just after it; 'live' counts everything.")
        sec.tables.append(m)
    lines = series(pts, "bucket_mb", "step_ms_mean", first=("impl", "world_size"))
    lines = {k: v for k, v in lines.items() if len(v) > 1}  # the bucketed sweeps only
    _plot(sec, "Bucket-size sweep", "ddp-buckets",
          Plot.lines(lines, "bucket size (MB)", "step time (ms)", "Step time against bucket size",
                     logx=True))  # fmt: skip


def profile(sec: Section, pts: list[Row], kernels: dict[str, list[dict[str, Any]]]) -> None:
    """The top kernels (or ops) of each phase of each profiled point."""
    for r in pts:
        ks = kernels.get(r["run_id"], [])
        if not ks:
            continue
        what = r["size"] if r["target"] == "model" else f"{r['impl']} seq={r['seq']}"
        sec.tables.append(Table(
            f"Top kernels: {r['target']} {what} ({ks[0]['time_basis']} time)",
            ["phase", "rank", "name", "calls", "total ms", "mean ms", "share"],
            [[k["phase"], str(k["rank"]), k["name"], str(k["calls"]), num(k["total_ms"]),
              num(k["mean_ms"]), pct(k["share"])] for k in ks],
        ))  # fmt: skip


_EXTRAS = {"model": model, "attention": attention, "memory": memory, "comm": comm, "ddp": ddp}


def build(experiment: Experiment, rows: list[Row], kernels: dict[str, list[dict[str, Any]]]) -> Section:
    """The section of one experiment: its declared tables over the latest row of each point,
    then its extra tables and plots."""
    sec = Section(experiment.kind, experiment.title)
    pts = latest(rows)
    sec.tables.extend(point_tables(experiment.tables, pts, counts=True))
    if experiment.kind == "profile":
        profile(sec, pts, kernels)
    elif experiment.kind in _EXTRAS:
        _EXTRAS[experiment.kind](sec, pts)
    return sec


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
