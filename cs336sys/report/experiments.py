"""One section builder per experiment: the tables and plots the field expects for it.

model: the per-phase breakdown of the training step with throughput and MFU (as in the
CS336 assignment 2 benchmarking tables), the warm-up effect from raw samples, and the
fp32->bf16 and eager->compiled speedups. attention: forward/backward latency and memory by
implementation and sequence length (FlashAttention-2 paper, Fig. 4-5 style, log-log).
comm: bus bandwidth against message size (nccl-tests). ddp: step time, exposed
communication, bucket-size sweep. memory: peaks and the checkpointing trade-off.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

from cs336sys.report.plots import Plot
from cs336sys.report.sections import (
    Figure,
    Row,
    Section,
    Table,
    generic,
    latest,
    mean_std,
    mib,
    num,
    panels,
    pct,
    series,
    skey,
    speedups,
    status_or,
    text,
    with_gpu,
)
from cs336sys.store.views import VIEWS

TITLES = {
    "model": "Model: end-to-end training step",
    "attention": "Attention: implementations by sequence length",
    "memory": "Memory: peaks and activation checkpointing",
    "memory-residuals": "Memory: saved residuals per block",
    "comm": "Collectives: bus bandwidth",
    "ddp": "DDP: step time and communication",
    "profile": "Profile: top kernels",
    "precision": "Precision: accumulation and autocast",
}
ORDER = list(TITLES)
# The experiments whose sections draw plots (memory timelines are PNGs already).
PLOTTED = frozenset({"model", "attention", "memory", "comm", "ddp"})


_SIZE = ("size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
_MODEL_SHOWN = (*_SIZE, "context_length", "batch_size", "mode", "precision", "compile",
                "checkpoint", "attention", "optimizer")  # fmt: skip


def _model_label(r: Row, gpu: bool = False) -> str:
    s = r["_settings"]
    extra = [f"{k}={s[k]}" for k in ("attention", "checkpoint")
             if s.get(k) not in (None, "naive", "none")]  # fmt: skip
    return " ".join([
        f"{s.get('size')} T={s.get('context_length')} B={s.get('batch_size')}",
        f"{s.get('mode')} {s.get('precision')}", *extra,
        *(["compiled"] if s.get("compile") else []), *([f"[{r.get('gpu')}]"] if gpu else []),
    ])  # fmt: skip


def model(rows: list[Row]) -> Section:
    sec = Section("model", TITLES["model"])
    pts = latest(rows)
    heads = ["size", "ctx", "batch", "mode", "precision", "compile", "ckpt", "attention",
             "optimizer", "fwd ms", "bwd ms", "opt ms", "step ms", "tokens/s", "TFLOP/s", "MFU",
             "n"]  # fmt: skip
    t = with_gpu(pts, heads, lambda r: [
        text(r["size"]), text(r["context_length"]), text(r["batch_size"]), text(r["mode"]),
        text(r["precision"]), num(bool(r["compile"])), text(r["checkpoint"]), text(r["attention"]),
        text(r["optimizer"]),
        *(mean_std(r, f"{p}_ms_mean", f"{p}_ms_std") for p in ("fwd", "bwd", "opt", "step")),
        status_or(r, num(r["tokens_per_s"])), status_or(r, num(r["tflops"])),
        status_or(r, pct(r["mfu"])), str(r["_n"]),
    ], shown=_MODEL_SHOWN)  # fmt: skip
    t.title = "Time per phase (mean ± std over timed steps)"
    t.note = "MFU is shown only where the GPU's peak is known."
    sec.tables.append(t)

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
    return sec


def attention(rows: list[Row]) -> Section:
    sec = Section("attention", TITLES["attention"])
    pts = latest(rows)
    heads = ["impl", "d", "seq", "heads", "batch", "dtype", "pass", "fwd ms", "bwd ms", "e2e ms",
             "mem before bwd MiB", "n"]  # fmt: skip
    t = with_gpu(pts, heads, lambda r: [
        text(r["impl"]), text(r["d_head"]), text(r["seq"]), text(r["heads"]), text(r["batch"]),
        text(r["dtype"]), text(r["pass"]),
        *(mean_std(r, f"{p}_ms", f"{p}_ms_std") for p in ("fwd", "bwd", "e2e")),
        status_or(r, mib(r["mem_before_bwd_bytes"])), str(r["_n"]),
    ], shown=("impl", "d_head", "seq", "heads", "batch", "dtype", "pass"))  # fmt: skip
    t.title = "Latency (mean ± std) and memory held before backward"
    sec.tables.append(t)
    for r in pts:  # forward-only sweeps have no e2e time: plot what was measured
        r["_ms"] = r["e2e_ms"] if r["e2e_ms"] is not None else r["fwd_ms"]
    first = ("impl", "dtype")
    lat = panels(pts, "seq", "_ms", facet="d_head", first=first)
    mem = panels(pts, "seq", "mem_before_bwd_bytes", facet="d_head", scale=2**-20, first=first)
    _plot(sec, "Latency against sequence length", "attention-latency",
          Plot(lat, "sequence length (tokens)", "forward+backward (or forward) time (ms)",
               "Attention latency", logx=True, logy=True))  # fmt: skip
    _plot(sec, "Memory held before backward", "attention-memory",
          Plot(mem, "sequence length (tokens)", "memory before backward (MiB)",
               "Attention memory", logx=True))  # fmt: skip
    return sec


def memory(rows: list[Row]) -> Section:
    sec = Section("memory", TITLES["memory"])
    pts = latest(rows)
    heads = ["size", "ctx", "batch", "mode", "precision", "ckpt", "peak MiB", "fwd peak MiB",
             "bwd peak MiB", "opt peak MiB", "activations MiB (analytic)", "step ms", "n"]  # fmt: skip
    t = with_gpu(pts, heads, lambda r: [
        text(r["size"]), text(r["context_length"]), text(r["batch_size"]), text(r["mode"]),
        text(r["precision"]), text(r["checkpoint"]),
        *(status_or(r, mib(r[k])) for k in ("peak_bytes", "fwd_peak_bytes", "bwd_peak_bytes",
                                            "opt_peak_bytes", "act_bytes_analytic")),
        mean_std(r, "step_ms_mean", "step_ms_std"), str(r["_n"]),
    ], shown=(*_SIZE, "context_length", "batch_size", "mode", "precision", "checkpoint"))  # fmt: skip
    t.title = "Peak memory by context length and mode"
    sec.tables.append(t)
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
    return sec


def _plot(sec: Section, title: str, name: str, plot: Plot) -> None:
    """Add the plot to the section unless it is only lone points (see Plot.informative)."""
    if plot.informative:
        sec.figures.append(Figure(title, name, plot=plot))


def _checkpoint_tradeoff(pts: list[Row]) -> list[list[str]]:
    """Each point measured with and without checkpointing: peak and step time against `none`,
    the checkpointing with the lowest peak marked (issue 5: the sweep over K)."""
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


def comm(rows: list[Row]) -> Section:
    sec = Section("comm", TITLES["comm"])
    pts = latest(rows)
    heads = ["op", "backend", "world", "size bytes", "dtype", "time ms", "algbw GB/s",
             "busbw GB/s", "wrong", "n"]  # fmt: skip
    t = with_gpu(pts, heads, lambda r: [
        text(r["op"]), text(r["backend"]), text(r["world_size"]), text(r["size_bytes"]),
        text(r["dtype"]), status_or(r, num(r["time_ms_mean"])), status_or(r, num(r["algbw_gbps"])),
        status_or(r, num(r["busbw_gbps"])), text(r["wrong"]), str(r["_n"]),
    ], shown=("op", "backend", "world_size", "size_bytes", "dtype"))  # fmt: skip
    t.title = "Collectives (nccl-tests formulas for bus bandwidth)"
    sec.tables.append(t)
    lines = series(pts, "size_bytes", "busbw_gbps", first=("op", "backend", "world_size"))
    _plot(sec, "Bus bandwidth against message size", "comm-busbw",
          Plot.lines(lines, "message size (bytes)", "bus bandwidth (GB/s)", "Bus bandwidth",
                     logx=True))  # fmt: skip
    return sec


def ddp(rows: list[Row]) -> Section:
    sec = Section("ddp", TITLES["ddp"])
    pts = latest(rows)
    heads = ["impl", "opt sharding", "world", "backend", "bucket MB", "size", "step ms",
             "comm ms", "comm fraction", "comm MiB/step", "tokens/s", "n"]  # fmt: skip
    t = with_gpu(pts, heads, lambda r: [
        text(r["impl"]), text(r["optimizer_sharding"]), text(r["world_size"]), text(r["backend"]),
        text(r["bucket_mb"]), text(r["size"]), mean_std(r, "step_ms_mean", "step_ms_std"),
        mean_std(r, "comm_ms_mean", "comm_ms_std"), status_or(r, pct(r["comm_fraction"])),
        status_or(r, mib(r["comm_bytes"])), status_or(r, num(r["tokens_per_s"])), str(r["_n"]),
    ], shown=("impl", "optimizer_sharding", "world_size", "backend", "bucket_mb", *_SIZE))  # fmt: skip
    t.title = "Step time and exposed communication per implementation"
    sec.tables.append(t)
    measured = [r for r in pts if r.get("mem_before_opt_params_bytes") is not None]
    if measured:  # rows from before issue 7 have no memory figures
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
    return sec


def profile(rows: list[Row], kernels: dict[str, list[dict[str, Any]]]) -> Section:
    sec = Section("profile", TITLES["profile"])
    pts = latest(rows)
    t = generic(pts, ["target", "size", "impl", "seq", "context_length", "mode", "precision"],
                ["time_basis", "fwd_ms", "bwd_ms", "opt_ms", "step_ms"])  # fmt: skip
    t.title = "Profiled points"
    sec.tables.append(t)
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
    return sec


def _generic_section(exp: str, rows: list[Row]) -> Section:
    view = next(v for v, (e, _, _) in VIEWS.items() if e == exp)
    _, settings, metrics = VIEWS[view]
    sec = Section(exp, TITLES.get(exp, exp))
    t = generic(latest(rows), settings, metrics)
    t.title = f"All points ({view})"
    sec.tables.append(t)
    return sec


def build(exp: str, rows: list[Row], kernels: dict[str, list[dict[str, Any]]]) -> Section:
    builders = {"model": model, "attention": attention, "memory": memory, "comm": comm,
                "ddp": ddp}  # fmt: skip
    if exp == "profile":
        return profile(rows, kernels)
    if exp in builders:
        return builders[exp](rows)
    return _generic_section(exp, rows)


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
