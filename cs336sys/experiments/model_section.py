"""The model experiment's report section beyond its declared table: the warm-up effect from
the raw samples, the fp32 -> bf16 and eager -> compiled speedups (the CS336 assignment 2
benchmarking tables), and step time by phase, tokens/s and MFU as stacked bars."""

from __future__ import annotations

import json
from typing import Any

from cs336sys.measure.device import MFU_NOTE
from cs336sys.report.intervals import (
    INTERPRETED_APART,
    NOT_INTERLEAVED,
    NOT_INTERLEAVED_NOTE,
    RUNS_APART,
    RUNS_APART_NOTE,
    interpreted,
    speedups,
)
from cs336sys.report.plots import Bar, Bars, Plot
from cs336sys.report.sections import (
    FilledTable,
    Row,
    Section,
    add_plot,
    left_out,
    num,
    pct,
    several_gpus,
    text,
    varying,
)
from cs336sys.sweep.declaration import model_size

SPEEDUP_NOTE = ("Medians of the timed steps. The ratio (above 1: the second faster) comes with "
                "its 95 % bootstrap interval from the raw samples, widened to the rounds' t "
                "interval with --rounds; too few samples to tell under 5 a side (4 against "
                "4 read 8 % of equal pairs as a change).")
WARMUP_LINES = 8  # lines on the warm-up plot; more are unreadable (the table has them all)
WARMUP_LOG = 10  # a first step this many times the fastest: the warm-up plot's y axis is log
SIZE = ("size", "d_model", "d_ff", "num_layers", "num_heads", "vocab_size")


# The settings a point's label names, in its own words (_model_label); any other that varies
# between the section's points is named as key=value.
LABELLED = ("size", "seq", "batch", "mode", "precision", "model", "attention", "checkpoint",
            "compile", "warmup")


def _model_label(r: Row, gpu: bool = False, warmup: bool = False,
                 also: tuple[str, ...] = ()) -> str:
    """`tiny T=32 B=2 train fp32`, with what else tells the point apart: `also`, the other
    settings that vary between the points shown (the optimizer, a --d-model override); two
    points read as one label, and the warm-up plot kept only one of their lines."""
    s = r["_settings"]
    extra = [f"{k}={s[k]}" for k in ("model", "attention", "checkpoint")
             if s.get(k) not in (None, "naive", "none")]
    extra += [f"warmup={s.get('warmup')}"] if warmup else []
    extra += [f"{k}={s.get(k)}" for k in also]
    return " ".join([
        f"{s.get('size')} T={s.get('seq')} B={s.get('batch')}",
        f"{s.get('mode')} {s.get('precision')}", *extra,
        *(["compiled"] if s.get("compile") else []), *([f"[{r.get('gpu')}]"] if gpu else []),
    ])


# Points shown in a table of their own (experiment_section): (which, title suffix).
APART = INTERPRETED_APART


def section(sec: Section, pts: list[Row]) -> None:
    """The warm-up effect and the fp32 -> bf16 and eager -> compiled speedups, of native
    points (an interpreted Triton kernel's time is the emulator's: APART)."""
    pts = [r for r in pts if not interpreted(r)]
    many = several_gpus(pts)
    warmups = len({r["_settings"].get("warmup") for r in pts}) > 1
    also: tuple[str, ...] = ()
    for key in varying(pts, shown=LABELLED):  # those that split a label, in turn
        values: dict[str, set[str]] = {}
        for r in pts:  # (the optimizer goes with the mode: none forward, adamw train)
            values.setdefault(_model_label(r, many, warmups, also), set()).add(
                repr(r["_settings"].get(key)))
        if any(len(v) > 1 for v in values.values()):
            also += (key,)

    def label(r: Row) -> str:
        return _model_label(r, gpu=many, warmup=warmups, also=also)

    _step_bars(sec, pts)
    warm, lines, every = [], {}, []
    for r in pts:
        smp = r.get("_samples")
        if r["status"] != "ok" or not smp:
            continue
        smp = json.loads(smp)
        w, timed = smp.get("warmup", {}).get("step_ms", []), smp.get("step_ms", [])
        # Without warm-up the first step is a timed one: the point the handout's
        # benchmarking_script (c) asks about. (A store older than the warm-up samples has
        # none for a point that warmed up: left out.)
        if not timed or (not w and r["_settings"].get("warmup") != 0):
            continue
        steps, mean = w + timed, sum(timed) / len(timed)
        # in rounds, the first round's steps in a row: a later round warmed up a model of its
        # own, untimed, before its timed steps
        in_a_row = w + timed[:len(timed) // (r.get("rounds_done") or 1)]
        warm.append([label(r), num(steps[0]), num(mean), f"{steps[0] / mean:.2f}×"])
        every.append(label(r))
        if len(lines) < WARMUP_LINES:  # more are unreadable; the table has them all
            lines[label(r)] = list(enumerate(in_a_row, start=1))
    if warm:
        sec.tables.append(FilledTable("Warm-up effect: first step against timed mean",
                                ["point", "first step ms", "timed mean ms", "first/mean"], warm))
        # a first step 10x the rest (3,659 ms before steps of 48 on an H100) flattens every
        # timed step into one band on a linear axis: a log one keeps them apart
        ys = [y for pts in lines.values() for _, y in pts if y]
        add_plot(sec, "Step time per step, warm-up included", "model-warmup",
              Plot.lines(lines, "step (1 = the first, warm-up or timed)", "step time (ms)",
                         "Warm-up effect", logx=False,
                         logy=bool(ys) and max(ys) > WARMUP_LOG * min(ys)),
              note=left_out(list(lines), every, "series (the table above has every point)"))
    for key, (a, a_name), (b, b_name) in (
        ("precision", ("fp32", "fp32"), ("bf16", "bf16")),
        ("compile", (False, "eager"), (True, "compiled")),
    ):
        body = speedups(pts, key, a, b, "step_ms", label)
        if body:
            sec.tables.append(FilledTable(
                f"Speedup {a_name} → {b_name} (median step time)",
                [f"point ({a_name})", f"{a_name} ms", f"{b_name} ms", f"{a_name}/{b_name}"], body,
                note=" ".join([SPEEDUP_NOTE] + [
                    note for mark, note in ((RUNS_APART, RUNS_APART_NOTE),
                                            (NOT_INTERLEAVED, NOT_INTERLEAVED_NOTE))
                    if any(mark in row[-1] for row in body)])))


# Steps per size and precision drawn as stacked bars: the parts, bottom first.
_PHASES = (("fwd_ms_mean", "forward"), ("bwd_ms_mean", "backward"), ("opt_ms_mean", "optimizer"))
_PRECISIONS = ("fp32", "tf32", "fp16", "bf16")
_MODES = ("train", "forward-backward", "forward")
# A chart per GPU and these settings; the other settings (precision first, then attention,
# compile, ...) tell the bars of one size apart.
_CHART = ("mode", "seq", "batch")
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
    length and batch size; within one, a group of bars per size. Where that leaves every
    chart one bar (one size and precision over several contexts: a laptop's sweep), one
    chart per mode holds them all, a bar per context and batch."""
    ok = [r for r in pts if r.get("status") == "ok" and r.get("step_ms_mean")]
    for chart_keys in (_CHART, _CHART[:1]):
        charts: dict[tuple, list[Row]] = {}
        for r in ok:
            s = r["_settings"]
            charts.setdefault((r.get("gpu"), *(json.dumps(s.get(k)) for k in chart_keys)),
                              []).append(r)
        if any(len(g) > 1 for g in charts.values()):
            break
    heads = [g[0] for g in charts.values()]
    many = several_gpus(heads)
    keys = [k for k in chart_keys if k in varying(heads)]

    def title(r: Row) -> str:
        s = r["_settings"]
        what = [f"{k}={text(s[k])}" for k in keys if s.get(k) is not None]
        return " ".join(what + ([text(r.get("gpu"))] if many else []))

    ordered = sorted(charts.values(), key=lambda g: _rank(g[0]["_settings"].get("mode"), _MODES))
    names = [title(g[0]) for g in ordered]
    for i, g in enumerate(ordered[:MAX_BAR_CHARTS]):
        def model(r: Row) -> tuple:  # its size preset and shape: one name held two models
            return (r["_settings"].get("size"),
                    json.dumps([r["_settings"].get(k) for k in SIZE[1:]]))

        size_rank: dict[Any, Any] = {}
        for r in g:  # smallest model first, by parameters where stored
            size_rank.setdefault(model(r), (r.get("params") or 0, len(size_rank)))
        within = [k for k in varying(g, shown=(*SIZE, *chart_keys)) if k != "precision"]
        within = ["precision", *within]
        # then by the other settings' numbers (warmup=0, 1, 2, 5, not the order they ran in);
        # names keep that order (checkpoint none before every:1)
        g = sorted(g, key=lambda r: (size_rank[model(r)],
                                     _rank(r["_settings"].get("precision"), _PRECISIONS),
                                     *(_by_number(r["_settings"].get(k)) for k in within[1:])))
        # a size name over two shapes (the 2025 and 2026 xl, --d-model given) says its shape
        shaped = len({model(r) for r in g}) > len({model(r)[0] for r in g})
        bars = [Bar(model_size({**r, **r["_settings"]}).replace(" (", "\n(", 1) if shaped
                    else text(r["_settings"].get("size")),
                    _bar_label(r["_settings"], within),
                    tuple(r.get(k) for k, _ in _PHASES), r["step_ms_mean"], r.get("tokens_per_s"),
                    pct(r["mfu"]) if r.get("mfu") is not None else "")
                for r in g]
        shown = bars[:MAX_BARS]
        said = [f"{b.group} {b.label}".replace("\n", " ") for b in bars]
        notes = [left_out(said[:MAX_BARS], said, "bars")]
        if i == min(len(ordered), MAX_BAR_CHARTS) - 1:
            notes.append(left_out(names[:MAX_BAR_CHARTS], names, "charts"))
        name = names[i]
        mfu = " and MFU" if any(b.side_note for b in shown) else ""  # none on a CPU
        add_plot(sec, f"Step time by phase, tokens/s{mfu}" + (f": {name}" if name else ""),
              "model-steps" + (f"-{i + 1}" if i else ""),
              Bars(tuple(shown), tuple(p for _, p in _PHASES), "step time (ms, mean)", "tokens/s",
                   "Step time by phase per size and precision" + (f" ({name})" if name else ""),
                   side_title="MFU above each bar" if any(b.side_note for b in shown) else ""),
              # the MFU's note where a bar has one (none on a CPU, whose peak is unknown)
              note=" ".join(n for n in [*notes, MFU_NOTE if any(b.side_note for b in shown)
                                        else ""] if n))


def _by_number(v: Any) -> tuple:
    return (0, v) if isinstance(v, (int, float)) else (1, 0)


def _rank(v: Any, order: tuple) -> int:
    return order.index(v) if v in order else len(order)
