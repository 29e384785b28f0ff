"""The profile experiment's report section: attention's parts in the forward against their
FLOPs, then each profiled point's top kernels (or ops) per phase, a table and a plot; and
the point's label, told apart from its neighbours' by the settings that differ."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cs336sys.experiments.model_command import ATTENTION_FUNCTION, optimizer_word
from cs336sys.experiments.profile_events import STEP
from cs336sys.report.kernel_names import readable_all
from cs336sys.report.plots import Ranked
from cs336sys.report.sections import FilledTable, add_plot, num, pct, several_gpus, text
from cs336sys.sweep.declaration import model_size
from cs336sys.sweep.points import told_apart


def section(sec: Any, pts: list) -> None:
    """Attention's parts, then the top kernels (or ops) of each phase of each profiled
    point (kernel_stats): a table, calls per step beside the totals, and a plot of them by
    total time, one colour per phase."""
    split = attention_parts(pts)
    if split:
        sec.tables.append(split)
    gpus = several_gpus(pts)  # the same point on two GPUs: two titles
    # every linked row: a --compare report's other side too, whose section is built apart
    every = {k["name"] for ks in sec.linked.values() for k in ks}
    labels = labelled(pts)
    for i, r in enumerate(pts):
        ks = sec.linked.get(r["run_id"], [])
        if not ks:
            continue
        # CPU: aten ops by their self time; CUDA: kernels by their device time
        cuda = ks[0]["time_basis"] == "cuda"
        what, basis = ("kernels", "kernel time") if cuda else ("ops", "CPU self time")
        on = f" [{r.get('gpu')}]" if gpus else ""
        title = f"Top {what}: {r['target']} {labels[i]}{on} ({basis})"
        steps = r.get("profiled_steps") or 1
        names = readable_all([k["name"] for k in ks], among=every)  # stored whole
        sec.tables.append(FilledTable(
            title, ["phase", "rank", "name", "calls/step", "ms/step", "ms/call", "share"],
            [[k["phase"], str(k["rank"]), name, num(k["calls"] / steps),
              num(k["total_ms"] / steps), num(k["mean_ms"]), pct(k["share"])]
             for k, name in zip(ks, names, strict=True)],
            note=f"Per step: the mean over the {steps} profiled step(s) (kernel_stats keeps "
            f"the totals); ms/call: the mean of one call; share: of the phase's summed "
            f"{basis}, not its wall time; phase step: every phase together (a "
            f"forward-backward point's: forward and backward alone; a train point's has the "
            f"optimizer's kernels too).",
        ))
        add_plot(sec, title, f"profile-top-{i}", Ranked(
            tuple((name, k["total_ms"] / steps, k["phase"])
                  for k, name in zip(ks, names, strict=True)
                  if k["total_ms"] and k["phase"] != STEP),
            f"{basis} per step in the phase (ms)", title))


def attention_parts(pts: list) -> Any:
    """Attention's QKᵀ, softmax and PV in the forward (naive attention's, or the user's
    model's) per point: time per step, FLOPs and GFLOP/s (None when no point has them)."""
    def cells(r: Mapping[str, Any], part: str) -> list[str]:
        return [num(r.get(f"{part}_{key}")) for key in ("ms_mean", "flops", "gflops")]

    split = [r for r in pts if r.get("status") == "ok" and r.get("qk_ms_mean") is not None]
    gpus = ["gpu"] * several_gpus(split)  # a column where they differ
    body = [[*(text(r.get(g)) for g in gpus), name, *cells(r, "qk"),
             num(r.get("mask_ms_mean")), *cells(r, "softmax"), *cells(r, "pv")]
            for r, name in zip(split, labelled(split), strict=True)]
    if not body:
        return None
    # the FLOPs beside the times: the handout sets the parts' runtime gap against their
    # FLOPs gap (softmax: few FLOPs, much time)
    units = ("ms", "FLOPs", "GFLOP/s")
    return FilledTable("Attention's parts in the forward (per step)",
                 [*gpus, "point", *(f"QKᵀ {u}" for u in units), "scale, mask ms",
                  *(f"{part} {u}" for part in ("softmax", "PV") for u in units)], body,
                 note="Inside the ranges naive attention opens (scores, softmax, final matmul), "
                 "or, in your model (--model), inside each call of its "
                 f"{ATTENTION_FUNCTION}, split at its softmax; QKᵀ: the matmuls before the "
                 "softmax, scale, mask: the other ops before it; PV: the matmuls after it (the "
                 "copies of their operands left out, as QKᵀ's are). FLOPs: 2·T·T·d per (batch, "
                 "head) for each matmul, 5 a score for the softmax (experiments/profile.py). "
                 "A model point sums them over its layers. A row stored without a scale, mask "
                 "time holds it in its QKᵀ time.")


def labelled(rows: list) -> list[str]:
    """Each row's label, told apart by its settings where two read the same."""
    return told_apart([label(r) for r in rows], [r.get("_settings") or {} for r in rows])


def label(row: Mapping[str, Any]) -> str:
    """The profiled point in a few words."""
    def named(key: str, value: Any) -> str | None:
        return None if value is None else f"{key}={value}"

    if row.get("target") == "model":  # the user's model by its name (--model)
        words = [row.get("model"), model_size(row), named("T", row.get("seq")), row.get("mode"),
                 row.get("precision")]
        words.append(optimizer_word(row.get("mode"), row.get("optimizer")))
    else:
        words = [row.get("impl"), named("seq", row.get("seq")), named("d", row.get("d_head")),
                 row.get("precision"), "(Triton interpreted)" if row.get("interpreted") else None]
    return " ".join(str(w) for w in words if w)
