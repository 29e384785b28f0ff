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
from cs336sys.report.plan import section as plan_section
from cs336sys.report.plots import Bar, Bars, Plot
from cs336sys.report.sections import (
    Figure,
    Row,
    Section,
    Table,
    failures,
    latest,
    left_out,
    mib,
    num,
    panels,
    pct,
    series,
    skey,
    speedups,
    text,
    varying,
    with_gpu,
)
from cs336sys.report.speedrun import section as step_section
from cs336sys.report.tables import point_tables

# The experiments whose sections draw plots (memory timelines are PNGs already).
PLOTTED = frozenset({"model", "attention", "memory", "comm", "ddp", "plan", "step"})
WARMUP_LINES = 8  # lines on the warm-up plot; more are unreadable (the table has them all)
_SIZE = ("size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")


def _model_label(r: Row, gpu: bool = False) -> str:
    s = r["_settings"]
    extra = [f"{k}={s[k]}" for k in ("model", "attention", "checkpoint")
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

    _step_bars(sec, pts)
    warm, lines, every = [], {}, []
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
        every.append(label(r))
        if len(lines) < WARMUP_LINES:  # more are unreadable; the table has them all
            lines[label(r)] = list(enumerate(w + timed, start=1))
    if warm:
        sec.tables.append(Table("Warm-up effect: first step against timed mean",
                                ["point", "first step ms", "timed mean ms", "first/mean"], warm))  # fmt: skip
        _plot(sec, "Step time per step, warm-up included", "model-warmup",
              Plot.lines(lines, "step (1 = first warm-up step)", "step time (ms)",
                         "Warm-up effect", logx=False),
              note=left_out(list(lines), every, "series (the table above has every point)"))  # fmt: skip
    for key, a, b, title in (
        ("precision", "fp32", "bf16", "Speedup fp32 → bf16 (step time)"),
        ("compile", False, True, "Speedup eager → compiled (step time)"),
    ):
        body = speedups(pts, key, a, b, "step_ms_mean", label)
        if body:
            sec.tables.append(Table(title, ["point (A)", f"A={a} ms", f"B={b} ms", "A/B"], body))


# Steps per size and precision drawn as stacked bars: the parts, bottom first.
_PHASES = (("fwd_ms_mean", "forward"), ("bwd_ms_mean", "backward"), ("opt_ms_mean", "optimizer"))
_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_MODES = ("train", "forward-backward", "forward")
# A chart per GPU and these settings; the other settings (precision first, then attention,
# compile, ...) tell the bars of one size apart.
_CHART = ("mode", "context_length", "batch_size")
MAX_BAR_CHARTS = 6
MAX_BARS = 24  # bars in one chart; the table has every point


def _bar_label(s: dict[str, Any], keys: list[str]) -> str:
    """`bf16`, `bf16 sdpa`, `fp32 compiled ckpt=sqrt`: what tells a bar from its neighbours."""
    out = []
    for k in keys:
        v = s.get(k)
        if k == "compile":
            out += ["compiled"] if v else []
        elif k in ("precision", "attention"):
            out += [text(v)] if v is not None else []
        elif v is not None:
            out.append(f"{k}={text(v)}")
    return " ".join(out)


def _step_bars(sec: Section, pts: list[Row]) -> None:
    """Step time per size and precision, stacked by phase (forward, backward, optimizer),
    beside tokens/s with the MFU above each bar: one chart per mode (train first), context
    length and batch size; within one, a group of bars per size."""
    ok = [r for r in pts if r.get("status") == "ok" and r.get("step_ms_mean")]
    charts: dict[tuple, list[Row]] = {}
    for r in ok:
        s = r["_settings"]
        charts.setdefault((r.get("gpu"), *(json.dumps(s.get(k)) for k in _CHART)), []).append(r)
    heads = [g[0] for g in charts.values()]
    many = len({r.get("gpu") for r in heads}) > 1
    keys = [k for k in _CHART if k in varying(heads)]

    def title(r: Row) -> str:
        s = r["_settings"]
        what = [f"{k}={text(s[k])}" for k in keys if s.get(k) is not None]
        return " ".join(what + ([text(r.get("gpu"))] if many else []))

    ordered = sorted(charts.values(), key=lambda g: _rank(g[0]["_settings"].get("mode"), _MODES))
    names = [title(g[0]) for g in ordered]
    for i, g in enumerate(ordered[:MAX_BAR_CHARTS]):
        size_rank: dict[Any, Any] = {}
        for r in g:  # smallest model first, by parameters where stored
            size_rank.setdefault(r["_settings"].get("size"), (r.get("params") or 0, len(size_rank)))
        within = [k for k in varying(g, shown=(*_SIZE, *_CHART)) if k != "precision"]
        within = ["precision", *within]
        g = sorted(g, key=lambda r: (size_rank[r["_settings"].get("size")],
                                     _rank(r["_settings"].get("precision"), _PRECISIONS)))  # fmt: skip
        bars = [Bar(text(r["_settings"].get("size")), _bar_label(r["_settings"], within),
                    tuple(r.get(k) for k, _ in _PHASES), r["step_ms_mean"], r.get("tokens_per_s"),
                    pct(r["mfu"]) if r.get("mfu") is not None else "")
                for r in g]  # fmt: skip
        shown = bars[:MAX_BARS]
        notes = [left_out([f"{b.group} {b.label}" for b in shown],
                          [f"{b.group} {b.label}" for b in bars], "bars")]  # fmt: skip
        if i == min(len(ordered), MAX_BAR_CHARTS) - 1:
            notes.append(left_out(names[:MAX_BAR_CHARTS], names, "charts"))
        name = names[i]
        _plot(sec, "Step time by phase, tokens/s and MFU" + (f": {name}" if name else ""),
              "model-steps" + (f"-{i + 1}" if i else ""),
              Bars(tuple(shown), tuple(p for _, p in _PHASES), "step time (ms, mean)", "tokens/s",
                   "Step time by phase per size and precision" + (f" ({name})" if name else ""),
                   side_title="MFU above each bar" if any(b.side_note for b in shown) else ""),
              note=" ".join(n for n in [*notes, "MFU is shown where the GPU's peak is known."]
                            if n))  # fmt: skip


def _rank(v: Any, order: tuple) -> int:
    return order.index(v) if v in order else len(order)


def interpreted(r: Row) -> bool:
    """A point timed under TRITON_INTERPRET=1: the CPU emulating the kernel (the stored
    `interpreted` metric), not comparable to native timings."""
    return bool(r.get("interpreted"))


def attention(sec: Section, pts: list[Row]) -> None:
    """Latency and memory against sequence length, one panel per head dim, native points only
    (interpreted ones have their own table)."""
    native = [r for r in pts if not interpreted(r)]
    for r in native:  # forward-only sweeps have no e2e time: plot what was measured
        r["_ms"] = r["e2e_ms_mean"] if r["e2e_ms_mean"] is not None else r["fwd_ms_mean"]
    first = ("impl", "dtype")
    lat = panels(native, "seq", "_ms", facet="d_head", first=first)
    mem = panels(native, "seq", "mem_before_bwd_bytes", facet="d_head", scale=2**-20, first=first)
    n = len(pts) - len(native)
    note = (f"Left out: {n} interpreted point{'s' * (n != 1)} (Triton under TRITON_INTERPRET=1, "
            "in their own table above): their times are the CPU emulator's.") if n else ""  # fmt: skip
    _plot(sec, "Latency against sequence length", "attention-latency",
          Plot(lat, "sequence length (tokens)", "forward+backward (or forward) time (ms)",
               "Attention latency", logx=True, logy=True), note=note)  # fmt: skip
    _plot(sec, "Memory held before backward", "attention-memory",
          Plot(mem, "sequence length (tokens)", "memory before backward (MiB)",
               "Attention memory", logx=True), note=note)  # fmt: skip


def memory(sec: Section, pts: list[Row]) -> None:
    """The checkpointing trade-off, peaks against context length, the timelines."""
    trade = _checkpoint_tradeoff(pts)
    if trade:
        sec.tables.append(trade)
    lines = series(pts, "context_length", "peak_bytes", scale=2**-20, first=("size", "mode"))
    _plot(sec, "Peak memory against context length", "memory-peak",
          Plot.lines(lines, "context length (tokens)", "peak memory (MiB)", "Peak memory"))
    for i, r in enumerate(pts):
        png = r.get("snapshot_png")
        if png and Path(png).is_file():
            sec.figures.append(Figure(f"Memory timeline: {r['size']} T={r['context_length']}",
                                      f"memory-timeline-{i}", png=Path(png).read_bytes()))  # fmt: skip


def _plot(sec: Section, title: str, name: str, plot: Plot | Bars, note: str = "") -> None:
    """Add the plot to the section unless it is only lone points (see Plot.informative)."""
    if plot.informative:
        sec.figures.append(Figure(title, name, plot=plot, note=note))


_PHASE_NAMES = {"fwd_peak_bytes": "forward", "bwd_peak_bytes": "backward",
                "opt_peak_bytes": "optimizer"}  # fmt: skip
# What identifies a checkpointing group in its label; settings beyond these that differ
# between groups are added to it.
_POINT = ("size", "context_length", "batch_size", "mode", "precision", "checkpoint")


def _ratio(x: Any, base: Any) -> str:
    return f"{x / base:.2f}×" if x is not None and base else ""


def _checkpoint_tradeoff(pts: list[Row]) -> Table | None:
    """Each point measured with and without checkpointing, against `none`: the forward and
    backward peaks and the bytes saved for backward (what checkpointing changes; Chen et al.
    2016), the step time (what it costs), and apart from them the optimizer step's peak and
    the optimizer state, which checkpointing does not touch: where the optimizer step sets
    the step's peak, checkpointing lowers the activation peaks but not the step's."""
    many = len({r.get("gpu") for r in pts}) > 1
    groups: dict[tuple, list[Row]] = {}
    for r in pts:
        if r["status"] == "ok" and r["peak_bytes"]:
            groups.setdefault((r.get("gpu"), skey(r, drop=("checkpoint",))), []).append(r)
    bases = {k: next((r for r in g if r["checkpoint"] in (None, "none")), None)
             for k, g in groups.items()}  # fmt: skip
    keep = {k: g for k, g in groups.items() if bases[k] is not None and len(g) > 1}
    extra = varying([bases[k] for k in keep], shown=(*_POINT, *_SIZE[1:]))
    body = []
    for k, grp in keep.items():
        base = bases[k]
        s = base["_settings"]
        where = (f"{base['size']} T={base['context_length']} B={s.get('batch_size')} "
                 f"{base['mode']} {base['precision']}")  # fmt: skip
        where += "".join(f" {e}={text(s[e])}" for e in extra if s.get(e) is not None)
        where += f" [{base.get('gpu')}]" if many else ""
        grp = [base, *(r for r in grp if r is not base)]  # `none` first
        for r in grp:
            phases = {m: r.get(m) for m in _PHASE_NAMES if r.get(m) is not None}
            body.append([
                where, text(r["checkpoint"] or "none"),
                mib(r.get("fwd_peak_bytes")), _ratio(r.get("fwd_peak_bytes"), base.get("fwd_peak_bytes")),
                mib(r.get("bwd_peak_bytes")), _ratio(r.get("bwd_peak_bytes"), base.get("bwd_peak_bytes")),
                mib(r.get("saved_bytes")), _ratio(r.get("saved_bytes"), base.get("saved_bytes")),
                _ratio(r.get("step_ms_mean"), base.get("step_ms_mean")),
                mib(r.get("opt_peak_bytes")), mib(r.get("optim_bytes")),
                _PHASE_NAMES[max(phases, key=lambda m: phases[m])] if phases else "",
            ])  # fmt: skip
    if not body:
        return None
    return Table(
        "Checkpointing trade-off: activation peaks and saved bytes against no checkpointing",
        ["point", "checkpoint", "fwd peak MiB", "fwd peak vs none", "bwd peak MiB",
         "bwd peak vs none", "saved MiB", "saved vs none", "step time vs none",
         "optimizer step peak MiB", "optimizer state MiB (AdamW, 8P)", "step peak set by"],
        body,
        note="Checkpointing changes the forward and backward peaks and the bytes autograd "
        "saves for backward; each is compared with the same point without checkpointing "
        "(none = 1.00×), beside the step time it costs. The optimizer step (its peak, and "
        "AdamW's two fp32 moments, 8 bytes per parameter) is shown apart: checkpointing does "
        "not change it, and where it sets the step's peak ('step peak set by: optimizer') "
        "checkpointing cannot lower the whole step's peak.",
    )  # fmt: skip


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
    every = series(pts, "bucket_mb", "step_ms_mean", first=("impl", "world_size"))
    lines = {k: v for k, v in every.items() if len(v) > 1}  # the bucketed sweeps only
    _plot(sec, "Bucket-size sweep", "ddp-buckets",
          Plot.lines(lines, "bucket size (MiB)", "step time (ms)", "Step time against bucket size",
                     logx=True),
          note=left_out(list(lines), list(every),
                        "series (those with one bucket size are in the table)"))  # fmt: skip


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


# Points a section shows in tables of their own: (which, title suffix).
_APART = {
    "attention": (interpreted, " — Triton interpreted (TRITON_INTERPRET=1): the CPU emulates "
                  "the kernel, so these times are not comparable to native ones"),
}
_EXTRAS = {"model": model, "attention": attention, "memory": memory, "comm": comm, "ddp": ddp,
           "plan": plan_section, "step": step_section}  # fmt: skip


def build(experiment: Experiment, rows: list[Row], kernels: dict[str, list[dict[str, Any]]]) -> Section:
    """The section of one experiment: its declared tables over the latest row of each point,
    then its extra tables and plots."""
    sec = Section(experiment.kind, experiment.title)
    pts = latest(rows)
    apart = _APART.get(experiment.kind)
    if apart is None:
        sec.tables.extend(point_tables(experiment.tables, pts, counts=True, lift=True))
    else:  # e.g. interpreted Triton: a table of its own, never mixed with native points
        which, suffix = apart
        sec.tables.extend(point_tables(experiment.tables, pts, counts=True, lift=True,
                                       keep=lambda r: not which(r)))  # fmt: skip
        for t in point_tables(experiment.tables, pts, counts=True, lift=True, keep=which):
            t.title += suffix
            sec.tables.append(t)
    if experiment.kind == "profile":
        profile(sec, pts, kernels)
    elif experiment.kind in _EXTRAS:
        _EXTRAS[experiment.kind](sec, pts)
    sec.failures = failures(pts)
    return sec


def data_uri(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode()
