"""The memory experiment's report section beyond its declared table: the checkpointing
trade-off (Chen et al. 2016), peaks against context length, and the memory timelines."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cs336sys.experiments.model_section import SIZE
from cs336sys.report.intervals import sample_interval
from cs336sys.report.plots import Bar, Bars, Plot
from cs336sys.report.sections import (
    Figure,
    FilledTable,
    Row,
    Section,
    add_plot,
    median_or_mean,
    mib,
    series,
    several_gpus,
    skey,
    status_or,
    text,
    varying,
)
from cs336sys.sweep.declaration import model_size


def section(sec: Section, pts: list[Row]) -> None:
    """The checkpointing trade-off, peaks against context length, the timelines."""
    for table in (_checkpoint_tradeoff(pts), around_the_step(pts)):
        if table:
            sec.tables.append(table)
    lines = series(pts, "seq", "peak_bytes", scale=2**-20, first=("size", "mode"))
    add_plot(sec, "Peak memory against context length", "memory-peak",
          Plot.lines(lines, "context length (tokens)", "peak memory (MiB)", "Peak memory"))
    add_plot(sec, "Peak memory, its parts and the step time, point by point", "memory-parts",
             _parts(pts), note="The stacked parts are the accounting (parameters, gradients, "
             "AdamW's moments, the activations saved for backward where modelled); the black "
             "line across each bar is the measured peak, its number above, and grey the part of "
             "it the accounting leaves out. Parts stacked above the line are never all live at "
             "once (a training step frees the activations as its backward makes the "
             "gradients). Beside it, the step time: what checkpointing costs for what it saves.")
    left_out, gpus = 0, several_gpus(pts)
    for i, point in enumerate(pts):
        # a later run of the point without --snapshot (another problem's) keeps its timeline
        r = next((run for run in [point, *reversed(point.get("_earlier", []))]
                  if run.get("snapshot_png")), None)
        if r is None:
            continue
        png = timeline_png(r)
        if png is None:
            left_out += 1
            continue
        s = r["_settings"]
        what = f"checkpoint={text(s.get('checkpoint') or 'none')}{whose(s)}"
        sec.figures.append(Figure(
            f"Memory timeline: {model_size(r)} T={r['seq']} B={s.get('batch')} {s.get('mode')} "
            f"{s.get('precision')} {what}" + (f" [{r.get('gpu')}]" if gpus else "")
            + (f" (the run of {str(r.get('created'))[:16]})" if r is not point else ""),
            f"memory-timeline-{i}", png=png,
            note=memory_viz_line(r.get("snapshot_pickle"))))
    if left_out:
        sec.notes.append(f"{left_out} memory timeline(s) left out: the stored path is not a PNG "
                         "that cs336sys wrote into the point's --snapshot folder on this machine.")


# Settings that say whose code a point ran, and each one's value where it is cs336sys's own.
_OURS = {"model": None, "attention": "naive", "optimizer": "adamw"}


def whose(settings: dict[str, Any], keys: tuple[str, ...] = ("model", "attention")) -> str:
    """` model=cs336_basics attention=yours-torch`: those of `keys` that are not cs336sys's
    own, for a caption or a row to tell the user's points from ours."""
    return "".join(f" {k}={text(settings[k])}" for k in keys
                   if settings.get(k) not in (None, _OURS[k]))


def memory_viz_line(pickle: str | None) -> str:
    """The one line that opens a point's CUDA snapshot in PyTorch's memory_viz."""
    if not pickle:
        return ""
    return (f"The allocator's own record of this step: {pickle}. Drag it onto "
            "https://pytorch.org/memory_viz for the Active Memory Timeline, with the stack "
            "of every allocation.")


# The parts held just after the optimizer step, each beside the accounting's bytes for it.
_PARTS_AFTER_STEP = (("after_opt_params_bytes", "param_bytes"),
                     ("after_opt_grads_bytes", "grad_bytes"),
                     ("after_opt_opt_state_bytes", "optim_bytes"))


def around_the_step(pts: list[Row]) -> FilledTable | None:
    """Per training point, the bytes in use after the model was built, just before and just
    after the optimizer step, and what parameters, gradients and the optimizer's state hold
    after it, measured beside the accounting: optimizer_state_sharding_accounting (a) asks
    for this."""
    # a point whose check failed (the user's AdamW) is shown, its values marked, as the
    # other tables show it
    kept = [r for r in pts if r.get("status") in ("ok", "wrong") and r.get("before_opt_bytes")
            is not None and r["_settings"].get("mode") == "train"]
    gpus = ["gpu"] * several_gpus(kept)  # a column where they differ
    body = []
    for r in kept:
        s = r["_settings"]
        body.append([*(text(r.get(g)) for g in gpus),
                     f"{model_size(r)} T={text(s.get('seq'))} B={text(s.get('batch'))} "
                     f"{text(s.get('precision'))} ckpt={text(s.get('checkpoint'))}"
                     + whose(s, ("model", "attention", "optimizer")),
                     *(status_or(r, cell) for cell in (
                         *(mib(r.get(k)) for k in ("init_bytes", "before_opt_bytes",
                                                   "after_opt_bytes")),
                         # rows stored before the parts were measured: the accounting alone
                         *(f"{mib(r[held])} ({mib(r.get(want))})" if r.get(held) is not None
                           else f"({mib(r.get(want))})" for held, want in _PARTS_AFTER_STEP),
                         mib(r.get("peak_bytes"))))])
    if not body:
        return None
    return FilledTable("Memory around the optimizer step (MiB): measured (accounting)",
                 [*gpus, "point", "after init", "before step", "after step", "parameters",
                  "gradients", "optimizer state", "peak"], body,
                 note="after init, before step, after step: the bytes in use at those moments "
                 "(CUDA: allocated; CPU: live tensors); parameters, gradients, optimizer "
                 "state: what they hold just after the step, by inspection, and in brackets "
                 "the accounting (4, 4 and 8 bytes a parameter in fp32, AdamW's two moments).")


# The analytic parts of a point's memory (experiments/memory.py), bottom first.
PARTS = (("param_bytes", "parameters"), ("grad_bytes", "gradients"),
         ("optim_bytes", "AdamW state"), ("act_bytes_analytic", "activations (analytic)"))


def _parts(pts: list[Row]) -> Bars:
    """Per measured point, the analytic parts stacked with the measured peak written above,
    beside its step time: what checkpointing saves in memory and what it costs in time, even
    for one sequence length (the line plot needs two)."""
    measured = [r for r in pts if r.get("status") == "ok" and r.get("peak_bytes") is not None]
    # Where bars share size, T, mode and checkpointing, the settings that tell them apart
    # (precision, batch, the user's model, ...) and the GPU go into every label: no two bars
    # read as one point, and none carries a setting that its mode already says.
    shown = ("size", "seq", "mode", "checkpoint")
    alike: dict[tuple, list[Row]] = {}
    for r in measured:
        alike.setdefault(tuple(text(r["_settings"].get(k)) for k in shown), []).append(r)
    clashes = [rows for rows in alike.values() if len(rows) > 1]
    extra = sorted({k for rows in clashes for k in varying(rows, shown=shown)})
    gpus = any(several_gpus(rows) for rows in clashes)
    bars = []
    for r in measured:
        s = r["_settings"]
        label = f"T={text(s.get('seq'))} {text(s.get('mode'))} {text(s.get('checkpoint'))}"
        label += "".join(f" {text(s[k])}" if k == "precision" else f" {k}={text(s[k])}"
                         for k in extra if s.get(k) is not None)
        label += f" [{r.get('gpu')}]" if gpus else ""
        bars.append(Bar(text(s.get("size")), label,
                        tuple(None if r.get(k) is None else r[k] / 2**20 for k, _ in PARTS),
                        total=r["peak_bytes"] / 2**20, side=r.get("step_ms_mean")))
    return Bars(tuple(bars), tuple(name for _, name in PARTS),
                "memory (MiB)",
                "step time (ms, mean)", "Memory: accounted parts against the measured peak",
                "Step time", rest="not in the accounting", total_mark="measured peak")


PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
MAX_PNG_BYTES = 32 * 2**20


def timeline_png(row: Row) -> bytes | None:
    """The timeline PNG a memory point wrote, or None. A stored run names the file, and a
    store merged from elsewhere could name any file on this machine, which the report would
    then publish: only a regular file (no symlink) directly in the point's own `snapshot`
    folder, named .png, of a plausible size and starting with PNG's signature, is read. A
    relative `snapshot` was the folder of the run's working directory, which the stored
    absolute path ends with."""
    where, folder = row.get("snapshot_png"), row.get("snapshot")
    if not where or not folder:
        return None
    path = Path(where)
    try:
        if (path.suffix != ".png" or path.is_symlink() or not path.is_file()
                or not _in_folder(path, Path(folder))
                or path.stat().st_size > MAX_PNG_BYTES):
            return None
        with open(path, "rb") as f:
            data = f.read(MAX_PNG_BYTES + 1)
    except OSError:
        return None
    return data if data.startswith(PNG_MAGIC) else None



def _in_folder(path: Path, folder: Path) -> bool:
    """Whether `path` lies directly in `folder`. A relative folder was given under the
    run's working directory, which the stored absolute (unresolved) `path` names: its
    parent ends with the folder as given (`.`: any parent; `../x`: `..`, then `x`)."""
    if folder.is_absolute() or not path.is_absolute():
        return path.parent.resolve() == folder.resolve()
    tail, parent = folder.parts, path.parent.parts
    return parent[len(parent) - len(tail):] == tail


_PHASE_NAMES = {"fwd_peak_bytes": "forward", "bwd_peak_bytes": "backward",
                "opt_peak_bytes": "optimizer"}
# What identifies a checkpointing group in its label; settings beyond these that differ
# between groups are added to it.
_POINT = ("size", "seq", "batch", "mode", "precision", "checkpoint")


def _ratio(x: Any, base: Any) -> str:
    return f"{x / base:.2f}×" if x is not None and base else ""


def _step_ratio(row: Row, base: Row) -> str:
    """The point's median step time over `base`'s, with the interval of their raw samples
    (no verdict: memory runs its points one after the other). Means of two steps a side,
    6,337 and 1,843 ms against 1,865 and 4,849, read checkpointing 0.82x, faster."""
    if row is base:
        return "1.00×"
    ratio = _ratio(median_or_mean(row, "step_ms"), median_or_mean(base, "step_ms"))
    return ratio + sample_interval("step_ms", base, row, False) if ratio else ""


def _checkpoint_tradeoff(pts: list[Row]) -> FilledTable | None:
    """Each point measured with and without checkpointing, against `none`: the forward and
    backward peaks and the bytes saved for backward (what checkpointing changes; Chen et al.
    2016), the step time (what it costs), and apart from them the optimizer step's peak and
    the optimizer state, which checkpointing does not touch: where the optimizer step sets
    the step's peak, checkpointing lowers the activation peaks but not the step's."""
    many = several_gpus(pts)
    groups: dict[tuple, list[Row]] = {}
    for r in pts:
        if r["status"] == "ok" and r["peak_bytes"]:
            groups.setdefault((r.get("gpu"), skey(r, drop=("checkpoint",))), []).append(r)
    bases = {k: next((r for r in g if r["checkpoint"] in (None, "none")), None)
             for k, g in groups.items()}
    keep = {k: g for k, g in groups.items() if bases[k] is not None and len(g) > 1}
    mine = ("model", "attention", "optimizer")  # named by `whose` where not ours
    extra = varying([bases[k] for k in keep], shown=(*_POINT, *SIZE[1:], *mine))
    body = []
    for k, grp in keep.items():
        base = bases[k]
        s = base["_settings"]
        # the shape as every memory table gives it: two models of one size name apart
        where = (f"{model_size(base)} T={base['seq']} B={s.get('batch')} "
                 f"{base['mode']} {base['precision']}") + whose(s, mine)
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
                _step_ratio(r, base),
                mib(r.get("opt_peak_bytes")), mib(r.get("optim_bytes")),
                _PHASE_NAMES[max(phases, key=lambda m: phases[m])] if phases else "",
            ])
    if not body:
        return None
    return FilledTable(
        "Checkpointing trade-off: activation peaks and saved bytes against no checkpointing",
        ["point", "checkpoint", "fwd peak MiB", "fwd peak vs none", "bwd peak MiB",
         "bwd peak vs none", "saved MiB", "saved vs none", "step time vs none",
         "optimizer step peak MiB", "optimizer state MiB (AdamW)", "step peak set by"],
        body,
        note="Checkpointing changes the forward and backward peaks and the bytes autograd "
        "saves for backward; each is compared with the same point without checkpointing "
        "(none = 1.00×), beside the step time it costs (medians, with the 95 % interval of the "
        "raw samples, too few to tell under 5 a side; no verdict, as the points ran one after "
        "the other). The optimizer step (its peak, and "
        "AdamW's two moments: 8 bytes per parameter in cs336sys's, fp32; twice the parameter's "
        "bytes in torch's and yours) is shown apart: checkpointing does "
        "not change it, and where it sets the step's peak ('step peak set by: optimizer') "
        "checkpointing cannot lower the whole step's peak.",
    )
