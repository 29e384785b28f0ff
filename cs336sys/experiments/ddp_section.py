"""What the ddp experiment shows: its declared table, and its report section beyond it:
memory per rank against the analytic figure, and the bucket-size sweep."""

from __future__ import annotations

import json
from collections.abc import Mapping
from functools import partial
from typing import Any

from cs336sys.experiments.ddp_setup import SHARES_COLUMN, stored_as_fsdp
from cs336sys.experiments.model_section import SIZE
from cs336sys.report.plots import Bar, Bars, Plot
from cs336sys.report.sections import (
    FilledTable,
    Row,
    Section,
    add_plot,
    left_out,
    median_or_mean,
    mib,
    series,
    several_gpus,
    status_or,
    text,
    varying,
)
from cs336sys.sweep.declaration import (
    HOST_BOUND,
    MODEL_COLUMN,
    SIZE_COLUMN,
    Column,
    Ratio,
    Table,
    column_table,
)
from cs336sys.sweep.points import told_apart


def _steps_note(impls: set[str]) -> str:
    """What the step plot's communication part is, for the implementations it shows (a
    2025 writeup, which has no FSDP problem, explained FSDP's)."""
    torch_ones = sorted(impls & {"torch", "torch-fsdp"})
    sharded = any(stored_as_fsdp(i) for i in impls - {"torch-fsdp"})
    return " ".join([
        "The step's mean time, the part spent waiting on gradient communication at the top "
        "(the least rank's: the others also waited there for its backward)"
        + ("; for fsdp, the time with one of its gathers or reduce-scatters in flight, "
           "hidden behind compute or not, so not the others' waiting" if sharded else "")
        + (f"; for {' and '.join(torch_ones)}, how much longer backward took than with the "
           "gradients' reduction switched off, its overheads included" if torch_ones else "")
        + ".", "Beside it, tokens per second across the ranks."])


def section(sec: Section, pts: list[Row]) -> None:
    """Memory per rank against the analytic figure, and the bucket-size sweep."""
    by_moment = memory_by_moment(pts)
    if by_moment is not None:  # rows stored before the sharding release have no memory figures
        sec.tables.append(by_moment)
    add_plot(sec, "Step time split into waiting on communication and the rest", "ddp-steps",
             _steps(pts), note=_steps_note({str(r["_settings"].get("impl")) for r in pts}))
    every = series(pts, "bucket_mb", "step_ms_mean", first=("impl", "world_size"))
    lines = {k: v for k, v in every.items() if len(v) > 1}  # the bucketed sweeps only
    add_plot(sec, "Bucket-size sweep", "ddp-buckets",
          Plot.lines(lines, "bucket size (MiB)", "step time (ms)", "Step time against bucket size",
                     logx=True),
          note=left_out(list(lines), list(every),
                        "series (those with one bucket size are in the table)"))


# The moments a step's memory is read at, and which parts the accounting expects there:
# after init only the parameters; AdamW's state exists from the first step on, so before
# and after the measured step (after warm-up) parameters, gradients and optimizer state.
MOMENTS = (("init", "after init", ("params",)),
           ("before_opt", "before the step", ("params", "grads", "opt_state")),
           ("after_opt", "after the step", ("params", "grads", "opt_state")))
PARTS = ("params", "grads", "opt_state")


def memory_by_moment(pts: list[Row]) -> FilledTable | None:
    """Per point, per rank and per moment (after init, before and after the optimizer step):
    the bytes live and those in parameters, gradients and optimizer state, each measured
    beside the accounting's figure; with and without sharding, as the points were run."""
    measured = [r for r in pts if r.get("mem_before_opt_params_bytes") is not None]
    if not measured:
        return None
    shown = ("impl", "shard_optimizer", "world_size", "bucket_mb", *SIZE)
    many = several_gpus(measured)
    extra = varying(measured, shown)
    body = []
    for r in measured:
        point = [*([text(r.get("gpu"))] if many else []), label(r), text(r["world_size"])]
        other = [" ".join(f"{k}={text(r['_settings'][k])}" for k in extra
                          if r["_settings"].get(k) is not None)] if extra else []
        for rank, memory in enumerate(_per_rank(r)):
            for moment, words, expected in MOMENTS:
                cells = [mib(memory.get(moment)), mib(memory.get(f"{moment}_peak"))]
                for part in PARTS:
                    value = mib(memory.get(f"{moment}_{part}"))
                    analytic = r.get(f"expected_{part}_bytes") if part in expected else 0
                    cells.append(f"{value} ({mib(analytic)})" if value else "")
                # a point whose check failed (the user's DDP): its values marked
                body.append([*point, text(rank), words, *(status_or(r, c) for c in cells),
                             *other])
    return FilledTable("Memory by moment, per rank: measured (analytic)",
                 [*(["gpu"] if many else []), "impl", "ranks", "rank", "moment", "live MiB",
                  "peak so far MiB", "parameters MiB", "gradients MiB", "optimizer state MiB",
                  *(["other settings"] if extra else [])], body,
                 note="In the step after warm-up; in brackets the accounting's bytes for that "
                 "moment (after init only the parameters: AdamW's state appears at the first "
                 "step). 'live' counts every tensor the rank holds; 'peak so far' the most it "
                 "held up to that moment (after init: while the model and wrapper were built; "
                 "then since the step began), the handout's peak at each moment. Rows stored "
                 "before the per-rank figures have rank 0's only.")


def _per_rank(r: Row) -> list[dict[str, Any]]:
    """Each rank's memory by moment (the stored JSON), else rank 0's from its metrics."""
    stored = r.get("mem_per_rank")
    if stored:
        return json.loads(stored) if isinstance(stored, str) else stored
    return [{f"{m}{'_' + p if p else ''}": r.get(f"mem_{m}{'_' + p if p else ''}_bytes")
             for m, _, _ in MOMENTS for p in ("", "peak", *PARTS)}]


def _steps(pts: list[Row]) -> Bars:
    """Per measured point: its step time, the communication it waited on stacked on the
    rest, grouped by world size; tokens per second beside."""
    bars = []
    drawn = [r for r in pts if r.get("status") == "ok" and r.get("step_ms_mean") is not None]
    # named as the table names it (`torch 25MiB`, `overlap +sharded opt`), and by what else
    # differs where two of one group would read alike (`naive seq=16`, `naive seq=32`)
    names = told_apart([f"{r['_settings'].get('world_size')}|{label(r)}" for r in drawn],
                       [r["_settings"] for r in drawn])
    for r, name in zip(drawn, names, strict=True):
        step, comm = r.get("step_ms_mean"), r.get("comm_ms_mean")
        s = r["_settings"]
        # torch's comm_ms (backward less backward without the reduction) is not clipped
        # and comes out below 0 now and then: no wait, not a bar drawn down into the step
        wait = min(max(comm, 0.0), step) if comm is not None else None
        rest = None if wait is None else step - wait
        # fsdp's comm_ms is the time with a collective in flight, hidden behind compute or
        # not; torch's, backward less backward without the reduction, overheads included:
        # each a part of its own, not the waiting of the others
        at = {"fsdp": 2, "torch": 3, "torch-fsdp": 3}.get(s.get("impl"), 1)
        parts = tuple(rest if i == 0 else wait if i == at else None for i in range(4))
        bars.append(Bar(f"{text(s.get('world_size'))} ranks", name.split("|", 1)[1], parts,
                        total=step, side=r.get("tokens_per_s")))
    return Bars(tuple(bars), ("the rest (fsdp: no collective in flight)",
                              "waiting on communication", "fsdp: a collective in flight",
                              "torch: backward beyond its no-reduction backward"),
                "step time (ms, mean)", "tokens/s", "DDP: step time and what it waits on",
                "Throughput")


def _other(row: Mapping[str, Any]) -> int | None:
    """Rank 0's live bytes just before the optimizer step beyond its parameters, gradients
    and optimizer state; None where a part was not stored."""
    parts = [row.get(f"mem_before_opt{k}_bytes") for k in ("", "_params", "_grads", "_opt_state")]
    return None if None in parts else parts[0] - sum(parts[1:])


def label(row: Mapping[str, Any]) -> str:
    """`bucketed 10MiB +ZeRO`: the impl with its bucket cap and optimizer sharding (the
    user's: `+yours sharded opt`)."""
    out = str(row.get("impl")) + (f" {row['bucket_mb']:g}MiB" if row.get("bucket_mb") else "")
    sharding = row.get("shard_optimizer") or "none"
    named = {"ours": " +sharded opt", "zero": " +ZeRO", "none": ""}
    return out + named.get(sharding, f" +{sharding} sharded opt")


def precision(row: Mapping[str, Any]) -> Any:
    """The point's precision (as stored: None where a store has none), and `(ran fp32)`
    where the user's FSDP computed in fp32 at a 16-bit point (it ignored compute_dtype:
    fsdp_course_check)."""
    asked, ran = row.get("precision"), row.get("forward_dtype")
    return f"{asked} (ran {ran})" if ran == "fp32" and asked not in (None, "fp32") else asked


# What comm ms of the user's DDP or FSDP holds: cs336sys cannot time collectives it does not
# launch, and a DDP that reduces inside its hooks read 0.0 % beside naive's 13.5 %
YOURS_COMM = ("{ms} of your code (yours...): the time in its finish_gradient_synchronization "
              "alone; what it communicates inside backward (in its hooks) or forward is in "
              "the other phases' time, not in {ms} or {share}.")


TABLE = Table(
    "Step time, exposed communication and memory per rank",
    (
        Column("impl", cell=label, setting=True, covers=("impl", "bucket_mb", "shard_optimizer"),
               notes_if=(("yours", YOURS_COMM.format(ms="comm ms", share="comm %")),)),
        SIZE_COLUMN,
        MODEL_COLUMN,
        Column("ranks", "world_size", setting=True),
        Column("seq", "seq", setting=True),
        Column("batch", "batch", setting=True),
        Column("precision", cell=precision, setting=True, covers=("precision",)),
        *column_table("""
            step ms        step_ms                        mean_std
            bwd ms         bwd_ms                         mean_std  optional
            comm ms        comm_ms                        mean_std
            all-reduce ms  allreduce_ms                   mean_std  optional
            comm %         comm_fraction                  pct
            comm MiB/step  comm_bytes                     mib
        """),
        Column("sent MiB/step", "sent_bytes", "mib", optional=True,
               note="comm MiB/step: the size S of every collective of a step, summed "
               "(nccl-tests' S); sent MiB/step: what a rank sends of them, the ranks' mean, in "
               "ring algorithms (all-reduce 2(n-1)/n S, all-gather, reduce-scatter and "
               "broadcast (n-1)/n S): the communication volume that compares DDP, a sharded "
               "optimizer and FSDP."),
        *column_table("""
            params MiB     mem_before_opt_params_bytes    mib
            grads MiB      mem_before_opt_grads_bytes     mib
            opt state MiB  mem_after_opt_opt_state_bytes  mib
        """),
        Column("other MiB", None, "mib", cell=_other, optional=True,
               note="other MiB: what rank 0 holds just before the optimizer step beside its "
               "parameters, gradients and optimizer state (the batch, buffers): an FSDP that "
               "keeps its gathered weights after use (the handout: \"free the gathered "
               "weights\") holds about the whole model's weights here."),
        *column_table("""
            peak MiB       mem_peak_bytes                 mib
        """),
        Column("check", "check", optional=True,
               note="check (the user's code): rank 0's first-step gradients and the "
               "parameters after the timed steps against single-process training of the same "
               "steps, per tensor |g - g_ref| / |g_ref| and |p - p_ref| / |p_ref - p_0| at "
               "most 1e-3 in fp32 (0.1 under bf16 autocast); a point that fails is wrong."),
        Column("vs torch", ratio=Ratio(partial(median_or_mean, base="step_ms"),
                                       {"impl": "torch", "shard_optimizer": "none"},
                                       ("impl", "bucket_mb", "shard_optimizer"),
                                       speedup=False, samples="step_ms"),
               note="vs torch: median step time over torch DDP's at the same world size and "
               "precision (above 1: slower), with its 95 % interval where each side has 5 "
               "steps or more (with fewer, too few samples to tell), and no verdict: the "
               "points run one after the other."),
        SHARES_COLUMN,
        HOST_BOUND,
    ),
    note="comm ms: the time a step waits on gradient communication (a sharded optimizer's "
    "parameter broadcast is in its optimizer step, its bytes in comm MiB/step); overlap and "
    "bucketed: the wait for their reductions after the backward, while what launching them "
    "costs the backward (copies, a rank's threads) is in bwd ms; torch and torch-fsdp: "
    "backward less backward without the gradients' reduction, that cost included (torch-fsdp's "
    "all-gathers run in both), so compare their step ms, not comm ms, with the others'; fsdp: "
    "the time any of its collectives is in flight, overlapped with compute or not. all-reduce "
    "ms (naive, flat, overlap, bucketed): the time one of the gradients' all-reduces is in "
    "flight, launch to completion, hidden or not: the collectives alone, where comm ms also "
    "holds flat's and bucketed's copies into and out of their buffers. Memory is rank 0's.",
)
