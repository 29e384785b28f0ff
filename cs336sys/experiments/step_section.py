"""The step experiment's table and report section: what each optimisation buys.

One chart per configuration (model shape, context, batch, precision, weights, checkpointing,
GPU): a bar per switch set, the median step time, with the speed-up over no switch written
above its tokens/s bar. The table above it has every figure; the chart shows the ranking.
"""

from __future__ import annotations

from typing import Any

from cs336sys.experiments import ddp_setup
from cs336sys.experiments.model import CHECK_NOTE
from cs336sys.experiments.step_ablation import VARY, impossible
from cs336sys.experiments.step_build import LIMIT_S
from cs336sys.report.intervals import INTERPRETED_APART, interpreted, sample_interval
from cs336sys.report.plots import Bar, Bars
from cs336sys.report.sections import Figure, Row, Section, left_out, skey, text, varying
from cs336sys.report.tables import which
from cs336sys.sweep.declaration import (
    MODEL_COLUMN,
    SIZE_COLUMN,
    Column,
    Ratio,
    Table,
    column_table,
    setting_columns,
)

MAX_CHARTS = 6
# The settings the chart's title names; a chart holds the points the table compares with one
# another (every setting equal but VARY's), and a setting that tells two charts apart beyond
# these is named after them (`d_ff=4096`).
_TITLED = ("size", "num_layers", "seq", "batch", "precision", "param_dtype", "checkpoint",
           "world_size", "ddp", "model")
# what a switch set's bar is named by, beyond its switches, where two bars share them (two
# `none` of different --optimizer, fused-ce of --ce torch and triton)
_BASELINE = tuple(k for k in VARY if k != "switches")


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


# Points shown in a table of their own (experiment_section): (which, title suffix).
APART = INTERPRETED_APART


def section(sec: Section, pts: list[Row]) -> None:
    """A bar chart of step time per switch set, one per configuration (native points: an
    interpreted Triton kernel's time is the emulator's)."""
    ok = [r for r in pts if r.get("status") == "ok" and r.get("step_ms_median")
          and not interpreted(r)]
    charts: dict[tuple, list[Row]] = {}
    for r in ok:  # as the table pairs a row with its `none` (step.TABLE's Ratio); a row
        # stored before steps ran on ranks ran on one
        point = {"_settings": {**r["_settings"], "world_size": r["_settings"].get("world_size")
                               or 1}}
        charts.setdefault((r.get("gpu"), skey(point, drop=VARY)), []).append(r)
    apart = varying([g[0] for g in charts.values()], shown=(*_TITLED, *VARY))
    titles = [" ".join([_title(g[0]["_settings"], g[0].get("gpu")),
                        *(f"{k}={g[0]['_settings'].get(k)}" for k in apart)])
              for g in charts.values()]
    for i, g in enumerate(list(charts.values())[:MAX_CHARTS]):
        g = sorted(g, key=lambda r: _order(r["_settings"].get("switches", "")))
        first = next((r for r in g if r["_settings"].get("switches") == "none"), None)
        bars = tuple(
            Bar("", _label(r, g), (r["step_ms_median"],), r["step_ms_median"],
                r.get("tokens_per_s"),
                _speedup(r if r["_settings"].get("switches") == "none" else first, r)
                if first else "")
            for r in g
        )
        plot = Bars(bars, ("step",), "step time (ms, median)", "tokens/s",
                    f"Step time per switch set ({titles[i]})",
                    side_title="speed-up (? no verdict, ! impossible)"
                    if first else "")
        if not plot.informative:
            continue
        note = (
            left_out(titles[:MAX_CHARTS], titles, "configurations") if i == MAX_CHARTS - 1 else ""
        )
        sec.figures.append(Figure(f"What each switch buys: {text(titles[i])}",
                                  "step-switches" + (f"-{i + 1}" if i else ""), plot=plot,
                                  note=note))


TABLE = Table(
    "One training step, each optimisation switched on",
    (
        SIZE_COLUMN,
        MODEL_COLUMN,
        *setting_columns("layers=num_layers seq batch precision params=param_dtype ckpt=checkpoint "
                         "switches ranks=world_size ddp"),
        Column("step ms", "step_ms", "mean_std"),
        Column("median ms", "step_ms_median", "num"),
        Column(
            "vs none",
            ratio=Ratio(
                lambda r: r.get("step_ms_median"),
                {"switches": "none"},
                VARY,
                samples="step_ms",
                impossible=impossible,
            ),
            note="vs none: the median step time with no switch over this one's, at the same "
            "settings (2.00x = twice as fast), with the 95 % bootstrap interval of that ratio "
            "from both points' samples, widened to the rounds' t interval: faster or slower "
            "only when the interval excludes 1, else no difference; too few samples to tell "
            "under 5 a side.",
            notes_if=(("IMPOSSIBLE", "IMPOSSIBLE: fused-adamw saved more than the optimizer "
                       "step takes (noise or drift, not the switch)."),),
        ),
        *column_table("""
            tokens/s         tokens_per_s       num
            MFU              mfu                pct
            peak MiB         peak_allocated_mb  num  optional
            tensor peak MiB  peak_tensor_mb     num  optional
            compile s        compile_s          num  optional
            wall s           wall_s             num
            leaderboard s    leaderboard_s      num  optional
        """),
        Column("course ms", "course_ms", "num", optional=True,
               note="course ms: the leaderboard test's own timing (do_bench, 30 s of "
               "repetitions after 10 s of warm-up), beside ours (--course-timing)."),
        ddp_setup.SHARES_COLUMN,
        Column("check", "check", optional=True, note=CHECK_NOTE + " On ranks, the user's DDP "
               "first runs the course's test_ddp.py, as in ddp."),
    ),
    note="wall s: the point from model build to its last timed step, compile included; "
    "leaderboard s: the leaderboard's own timing run, the model built and its first step "
    "as here, then do_bench's 5 calls and the whole calls that fit in 10 s of warm-up "
    "and in 30 s of repetitions (one at least), which "
    f"the leaderboard allows {LIMIT_S} s from an empty cache.",
)
