"""The leaderboard's step on several GPUs: `step --world-size 2 --ddp fsdp`.

The leaderboard times a full training step on two GPUs with a global batch of 2. Each rank
builds the same point (experiments/step_build.py), wraps its model with the data-parallel
or sharding wrapper `--ddp` names (ours, torch's, or the user's: experiments/ddp_setup.py),
and trains its equal slice of one global batch that every rank draws alike; the wrapper's
gradient synchronisation runs between backward and the optimizer step. A step's time is the
slowest rank's: the others wait for it at the next collective.

Every rank runs the same number of steps, each between two barriers: the timer is the loop
(a sync before and after each step), never do_bench, whose number of calls is decided on
each rank by its own estimate and would leave the ranks' collectives unmatched.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from cs336sys import yours
from cs336sys.experiments import ddp_setup, ddp_yours
from cs336sys.experiments.checks import before_timing, both, judged, user_code
from cs336sys.experiments.ddp_setup import IMPLS
from cs336sys.experiments.ddp_toy_check import checked as toy_check
from cs336sys.experiments.step_build import (
    build,
    empty_compile_cache,
    once_per_process,
    within_limit,
)
from cs336sys.experiments.training_step import interpreted, throughput
from cs336sys.measure.device import synchronize
from cs336sys.measure.dtypes import matmul_precision
from cs336sys.measure.memory import held
from cs336sys.measure.progress import step_done
from cs336sys.measure.stats import flatten
from cs336sys.sweep.points import SpecError
from cs336sys.sweep.ranks import gather
from cs336sys.sweep.result import Result, Unfinished, first_line, is_oom


def ranks_wrapper(ddp: str, worlds: list[int], batches: list[int]) -> str:
    """The `--ddp` wrapper of points on several ranks, checked against the other options."""
    (wrapper,) = ddp_yours.user_impls([ddp.strip()], list(IMPLS), "--ddp")
    for w in worlds:
        for b in batches:
            if w > 1 and b % w:
                raise SpecError(f"--batch {b}: the global batch is split evenly over "
                                f"--world-size {w} ranks; give a multiple of {w}")
    return wrapper


class CompiledUnderYourFSDP(RuntimeError):
    """A compiled step under the user's FSDP failed: what failed, and the likely cause."""


def compiled_under_yours(wrapper: str, exc: Exception) -> CompiledUnderYourFSDP:
    """The failure of a compiled step under the user's FSDP `wrapper`, in words. A compiled
    block calls the wrapper's hooks inside its graph, and dynamo traces them with the
    tensors of that moment; a hook that swaps a weight's `.data` (gather, release) leaves the
    graph expecting the shard's shape or the full one. Run eager
    (`torch.compiler.disable`), each hook is a graph break instead, as in cs336sys's fsdp."""
    return CompiledUnderYourFSDP(
        f"compile under --ddp {wrapper}: the compiled step failed "
        f"({type(exc).__name__}: {first_line(exc)}); a compiled block runs your FSDP's "
        "hooks inside its graph, so a hook that swaps a weight's .data is traced with the "
        "shapes of that moment: register your hooks wrapped in torch.compiler.disable (each "
        "is then a graph break, as in cs336sys's fsdp), or measure without compile")


def fused_loss_refusal(wrapped: Any) -> str | None:
    """Why the model the user's DDP or FSDP returned cannot take the fused loss, or None
    (a DDP whose forward takes x alone raised TypeError on a rank). The step
    calls it as `wrapped(x, targets=y, ce_impl=...)` and the loss is computed inside
    cs336sys's LM head (models/transformer.py, LMHead), where the wrapper has gathered the
    head's weight: its forward must pass keywords on, and the head must still be there."""
    import inspect

    from cs336sys.models.transformer import LMHead

    params = inspect.signature(wrapped.forward).parameters.values()
    if not any(p.kind is p.VAR_KEYWORD for p in params) and \
            not {"targets", "ce_impl"} <= {p.name for p in params}:
        return (f"{type(wrapped).__name__}.forward takes no keywords to pass on to the model "
                "(targets=, ce_impl=), which compute the fused loss inside its LM head")
    if not any(isinstance(m, LMHead) for m in wrapped.modules()):
        return (f"{type(wrapped).__name__} replaced the model's LM head, which computes the fused "
                "loss (cs336sys.models.transformer.LMHead)")
    return None


def run_on_ranks(ctx: Any, spec: Any) -> Result:
    """One point of `step` on this rank of a process group of spec.world_size ranks. A
    compiled point compiles from this rank's own empty caches, as the one-process step does
    (the leaderboard's rule)."""
    with empty_compile_cache(spec.compile and not spec.warm_cache):
        return _on_rank(ctx, spec)


def _on_rank(ctx: Any, spec: Any) -> Result:
    import torch
    import torch.distributed as dist

    from cs336sys.measure.nvtx import measured
    from cs336sys.parallel.ddp import DEFAULT_BUCKET_MB

    # the user's model or attention kernel (on this rank's device) and AdamW, on every rank
    # alike and before anything is built: the cold-cache wall time starts after them
    config = dataclasses.replace(spec.config(), attention=spec.attention)
    checked = before_timing(config, spec.optimizer, ctx.device, spec.seed, spec.batch)
    device = torch.device(ctx.device)
    # the user's DDP: the course's own test_ddp.py, as ddp runs it (docs/yours.md), or a
    # wrapper that never all-reduces is timed ok here, faster for the work it skips
    # a bucketed DDP takes torch's 25 MB buckets, ours and yours alike (`step` has no
    # --bucket-mb); yours is checked at the course test's own bucket sizes
    bucket_mb = DEFAULT_BUCKET_MB if spec.ddp == "yours-bucketed" else None
    try:
        checked = both(checked, toy_check(spec.ddp, bucket_mb, ctx.rank, ctx.world_size,
                                          device))
    except Unfinished as exc:  # its getter raised NotImplementedError, on every rank alike
        return Result("skipped", error=str(exc))
    once_per_process(spec.compile, ctx.device)  # (the process's one-time work: before the clock)

    t_start = time.perf_counter()
    on_cuda = device.type == "cuda"
    local = spec.batch // ctx.world_size
    rows = slice(ctx.rank * local, (ctx.rank + 1) * local)

    whole: dict[str, int] = {}

    def wrap(model: Any, make_optimizer: Any) -> Any:
        whole["params"] = sum(p.numel() for p in model.parameters())  # before any sharding
        return ddp_setup.build(spec.ddp, None, bucket_mb, spec.precision, model, device,
                               make_optimizer=make_optimizer,
                               num_layers=spec.num_layers, blocks=spec.blocks)

    at_rank = spec.__class__(**{**vars(spec), "device": ctx.device})
    try:
        model, optimizer, train_step = build(
            at_rank, seed=ddp_setup.init_seed(spec.ddp, spec.seed, ctx.rank), wrap=wrap, rows=rows)
    except Unfinished as exc:  # the user's getter raised NotImplementedError on every rank
        return Result("skipped", error=str(exc))
    if spec.loss != "materialised" and yours.is_yours(spec.ddp):  # a DDP's forward(x) too
        why = fused_loss_refusal(model)  # the same on every rank: the same code wrapped it
        if why is not None:
            return Result("skipped", error=f"fused-ce under --ddp {spec.ddp}: {why}")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    losses: list[Any] = []
    total = 1 + spec.warmup + spec.iters

    def timed(i: int) -> float:
        dist.barrier()
        synchronize(ctx.device)
        t0 = time.perf_counter()
        losses.append(train_step())
        synchronize(ctx.device)
        step_done(i + 1, total)
        return (time.perf_counter() - t0) * 1e3

    try:
        first_ms = timed(0)  # compile, autotuning, the allocator's first requests
        to_first_s = time.perf_counter() - t_start
    except Exception as exc:
        if spec.compile and ddp_yours.kind_of(spec.ddp) == "fsdp" and not is_oom(exc):
            raise compiled_under_yours(spec.ddp, exc) from exc
        raise
    warm = [timed(1 + i) for i in range(spec.warmup)]
    with measured():  # what --nsys records: the timed steps, on every rank
        mine = [timed(1 + spec.warmup + i) for i in range(spec.iters)]
    wall_s = time.perf_counter() - t_start
    peak = torch.cuda.max_memory_allocated(device) if on_cuda else None
    # what each rank holds after its steps: an FSDP that shards none of this model's layers
    # (the course's wraps cs336_basics' Linear, not torch's) ran as replicas, unsaid. In
    # elements: with bf16 weights an FSDP keeps fp32 master shards and AdamW fp32 state,
    # which in bytes read as two bf16 copies
    holds = held(list(model.parameters()), optimizer, elements=True)
    per_rank = gather({"times": mine, "peak": peak, "wall_s": wall_s, "first_ms": first_ms,
                       "to_first_s": to_first_s, "losses": [float(v) for v in losses],
                       "holds": holds})
    slowest = [max(r["times"][i] for r in per_rank) for i in range(spec.iters)]
    # each rank's loss is the mean over its slice's tokens: the slices are equal, so their
    # mean is the global batch's, what the one-process step stores (rank 0's alone was one
    # slice's)
    batch_losses = [sum(r["losses"][i] for r in per_rank) / len(per_rank)
                    for i in range(len(losses))]
    metrics: dict[str, Any] = flatten("step_ms", slowest)
    # one step of the whole model on the global batch: tokens and FLOPs across the ranks
    metrics.update(throughput(model, config, spec.batch, spec.seq, "train",
                              metrics["step_ms_median"], ctx.device,
                              matmul_precision(spec.precision, spec.param_dtype)))
    metrics["params"] = whole["params"]
    metrics.update(ddp_setup.shares(spec.ddp, None, [r["holds"]["params"] for r in per_rank],
                                    [r["holds"]["opt_state"] for r in per_rank], whole["params"],
                                    spec.model))
    if metrics.get("mfu") is not None:
        metrics["mfu"] /= ctx.world_size  # the peak is one GPU's; the step used all of them
    walls = [r["wall_s"] for r in per_rank]
    first_ms = max(r["first_ms"] for r in per_rank)  # the slowest rank's first step
    metrics.update(
        peak_allocated_mb=max(r["peak"] for r in per_rank) / 2**20 if on_cuda else None,
        first_step_s=first_ms / 1e3,
        compile_s=max(first_ms - metrics["step_ms_median"], 0.0) / 1e3 if spec.compile else None,
        wall_s=max(walls),
        **within_limit(max(r["to_first_s"] for r in per_rank), metrics["step_ms_median"] / 1e3),
        loss_first=batch_losses[0],
        loss_last=batch_losses[-1],
        interpreted=interpreted(spec),
    )
    if checked is not None or yours.is_yours(spec.ddp):  # the wrapper, the model it wraps
        metrics["code"] = user_code(config, model, getattr(model, "module", None), optimizer)
    del model
    # the user's FSDP, checked against one process by `ddp` alone: its losses finite here
    return judged(checked, metrics, batch_losses, theirs=yours.is_yours(spec.ddp),
                  samples={"step_ms": slowest, "warmup": {"step_ms": warm}, "loss": batch_losses})

