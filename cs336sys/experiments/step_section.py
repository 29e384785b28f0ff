"""The step experiment's report section beyond its declared table: what each optimisation
buys.

One chart per configuration (model shape, context, batch, precision, weights, checkpointing,
GPU): a bar per switch set, the median step time, with the speed-up over no switch written
above its tokens/s bar. The table above it has every figure; the chart shows the ranking.
"""

from __future__ import annotations

from typing import Any

from cs336sys.experiments.step_ablation import impossible
from cs336sys.report.plots import Bar, Bars
from cs336sys.report.sections import Figure, Row, Section, left_out, text
from cs336sys.report.tables import sample_interval, which

MAX_CHARTS = 6
# What makes two step points the same configuration (the switches vary within a chart).
_CONFIG = ("size", "num_layers", "seq", "batch", "precision", "param_dtype",
           "checkpoint", "d_model", "vocab_size", "world_size", "ddp", "model")
# what a switch set's bar is named by, beyond its switches, where two bars share them (two
# `none` of different --optimizer or --attention, in one configuration)
_BASELINE = ("optimizer", "attention")


def _setting(s: dict[str, Any], key: str) -> str:
    """A configuration setting; rows stored before steps ran on ranks ran on one."""
    value = s.get(key)
    return "1" if key == "world_size" and value is None else str(value)


def _order(switches: str) -> int:
    """none first, then single switches, then larger sets; within a size, the order the
    sweep ran them (experiments/step.py expands --switches in SWITCHES order)."""
    return 0 if switches == "none" else len(switches.split("+"))


def _title(s: dict[str, Any], gpu: Any) -> str:
    """The chart's configuration, the defaults (fp32 weights, no checkpointing) left out."""
    ranks = s.get("world_size") or 1
    return " ".join(
        [f"{s.get('size')} L={s.get('num_layers')} T={s.get('seq')} B={s.get('batch')} "
         f"{s.get('precision')}",
         *([f"weights={s.get('param_dtype')}"] if s.get("param_dtype") not in (None, "fp32")
           else []),
         *([f"ckpt={s.get('checkpoint')}"] if s.get("checkpoint") not in (None, "none") else []),
         *([f"{ranks} ranks {s.get('ddp')}"] if ranks > 1 else []),
         *([f"model={s.get('model')}"] if s.get("model") else []),
         *([f"[{gpu}]"] if gpu else [])])


def _label(r: Row, g: list[Row]) -> str:
    """A bar's switches, with the baseline settings that tell it from a bar of the same
    switches (`none optimizer=torch-adamw`)."""
    switches = r["_settings"].get("switches")
    same = [o for o in g if o["_settings"].get("switches") == switches]
    return " ".join(w for w in (str(switches or ""), which(r, same, _BASELINE)) if w)


def _speedup(base: Row, r: Row) -> str:
    """`2.27×` over the first `none`, marked as the table's cell reads it: `?` where the
    bootstrap interval gives no verdict (too few samples, not interleaved, runs apart, no
    difference), `!` where it is impossible (step_ablation.impossible)."""
    ratio = f"{base['step_ms_median'] / r['step_ms_median']:.2f}×"
    if r is base:
        return ratio
    if impossible(base, r):
        return ratio + "!"
    said = sample_interval("step_ms", base, r, True)
    return ratio + ("" if " faster " in said or " slower " in said else "?")


def section(sec: Section, pts: list[Row]) -> None:
    """A bar chart of step time per switch set, one per configuration."""
    ok = [r for r in pts if r.get("status") == "ok" and r.get("step_ms_median")]
    charts: dict[tuple, list[Row]] = {}
    for r in ok:
        s = r["_settings"]
        charts.setdefault((r.get("gpu"), *(_setting(s, k) for k in _CONFIG)), []).append(r)
    titles = [_title(g[0]["_settings"], g[0].get("gpu")) for g in charts.values()]
    for i, g in enumerate(list(charts.values())[:MAX_CHARTS]):
        g = sorted(g, key=lambda r: _order(r["_settings"].get("switches", "")))
        first = next((r for r in g if r["_settings"].get("switches") == "none"), None)
        base = first["step_ms_median"] if first else None
        bars = tuple(
            Bar("", _label(r, g), (r["step_ms_median"],), r["step_ms_median"],
                r.get("tokens_per_s"), _speedup(first, r) if base else "")
            for r in g
        )
        plot = Bars(bars, ("step",), "step time (ms, median)", "tokens/s",
                    f"Step time per switch set ({titles[i]})",
                    side_title="speed-up (? no verdict, ! impossible)"
                    if base else "")
        if not plot.informative:
            continue
        note = (
            left_out(titles[:MAX_CHARTS], titles, "configurations") if i == MAX_CHARTS - 1 else ""
        )
        sec.figures.append(Figure(f"What each switch buys: {text(titles[i])}",
                                  "step-switches" + (f"-{i + 1}" if i else ""), plot=plot,
                                  note=note))
