"""Time data-parallel training steps; store step time and the exposed gradient communication.

How much gradient communication each DDP variant exposes. One DDPSpec is one point: every rank
builds the Transformer LM from its own seed (the wrapper broadcasts rank 0's weights), takes its
equal slice of one global batch, and runs `warmup` untimed and `iters` timed steps of the training
step (experiments/training_step.py): forward, backward, finish_gradient_synchronization and
optimizer, each phase ending with a device sync. A phase's time per step is the slowest rank's
(every rank waits for it at the next collective), but for `comm_ms`, the least rank's (the others
also waited there for the last rank's backward); mean and std are over steps.

`comm_ms` is the time a step is blocked on gradient communication, except for fsdp:
- naive, flat, overlap, bucketed: the time in finish_gradient_synchronization (for naive and
  flat all of the all-reduce, and flat's flattening and copying back; for the others only
  what backward did not hide); `allreduce_ms`, the time with one of their all-reduces in
  flight (parallel/in_flight.py), is the collectives alone, hidden or not;
- torch: each timed backward less the median backward of as many steps under `no_sync()`
  (after the timed steps, no optimizer step), not clipped: a mean near 0 with a wide std is
  noise; torch-fsdp: the same with set_requires_gradient_sync(False): its reduce-scatters;
- fsdp: the time with at least one of its collectives in flight, launch to completion (the
  union of their intervals): all-gathers, reduce-scatters and the all-reduce of the
  replicated gradients, hidden behind compute or not (the launch-bound check reads
  finish_gradient_synchronization).
A sharded optimizer's broadcast of the updated parameters runs in the optimizer step: its
bytes are in comm_bytes, its time in opt_ms, not comm_ms.

One more step, after the warm-up and not timed, is measured for memory and traffic:
the bytes live on this rank (CUDA: the allocator; CPU: the live-tensor tracker, which has
watched since before the model was built) after the model and wrapper were made, directly
before and directly after the optimizer step, with the bytes held in parameters, gradients
and optimizer state beside each and the analytic expectation (experiments/ddp_setup.py);
and every collective of that step, counted by kind (parallel/comm_counter.py). Memory is
per rank: the row has rank 0's, and the max over ranks of the step's peak.
"""

from __future__ import annotations

import contextlib
import json
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cs336sys.experiments import (
    checks,
    ddp_command,
    ddp_section,
    ddp_setup,
    ddp_yours,
    fsdp_course_check,
)
from cs336sys.experiments.checks import CHECK_METRICS, before_timing, both
from cs336sys.experiments.ddp_setup import IMPLS, IN_FLIGHT, REPLICA_IMPLS
from cs336sys.experiments.ddp_toy_check import checked as toy_check
from cs336sys.experiments.model import check_model, preset_sizes
from cs336sys.experiments.training_check import first_step_grads, training_check, training_reference
from cs336sys.experiments.training_step import (
    Step,
    make_batch,
    make_model,
    optimizer_class,
    optimizer_option,
)
from cs336sys.measure.dtypes import autocast_dtype
from cs336sys.measure.memory import CudaProbe, TrackerProbe
from cs336sys.measure.progress import step_done
from cs336sys.measure.provenance import is_yours
from cs336sys.measure.stats import flatten
from cs336sys.measure.timing import launch_metrics
from cs336sys.models.config import ModelConfig, ModelShape, from_preset
from cs336sys.sweep.declaration import (
    Experiment,
    Metric,
    launch,
    metric_table,
    timing,
)
from cs336sys.sweep.points import (
    SpecError,
    check_seed,
    choices,
    counts,
    listed,
    one_value_options,
    positive_ints,
    positive_sizes,
    shape_error,
)
from cs336sys.sweep.ranks import backend_and_device, gather, over_ranks, world_sizes
from cs336sys.sweep.result import Result, Unfinished, first_line, free_memory
from cs336sys.yours.implementations import named_impls

PRECISIONS = ("fp32", "bf16")
TORCH_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb, recorded as what ran
PHASES = ("fwd", "bwd", "comm", "opt", "step")
DEFAULT_BUCKETS = [1.0, 10.0, 100.0, 1000.0]
# A laptop finishes a tiny-model step in about a second; a GPU gets the handout's DDP setting
# (the xl model, batch 4, context 512).
DEFAULTS = {
    "cpu": dict(size="tiny", seq=128, batch=4, warmup=2, iters=5),
    "cuda": dict(size="xl", seq=512, batch=4, warmup=3, iters=10),
}


@dataclass(frozen=True)
class DDPSpec(ModelShape):
    impl: str
    bucket_mb: float | None
    # none, own (ours), zero, or the user's (yours, ...) for the replica impls; None for FSDPs
    shard_optimizer: str | None
    world_size: int
    backend: str
    device: str  # "cpu" or "cuda": each rank uses its own cuda:<local_rank>
    batch: int  # the global batch, over all ranks
    precision: str
    warmup: int
    iters: int
    seed: int
    model: str | None = None  # None: cs336sys's TransformerLM; else the user's (--model)
    # every rank's AdamW, sharded or not: None for ours (the points stored before it was a
    # setting stay the same points), torch-adamw or the user's
    optimizer: str | None = None

    @classmethod
    def of(cls, config: ModelConfig, size: str, **point: Any) -> DDPSpec:
        """The point `point` (impl, world_size, iters, ...) for a model `config` of `size`."""
        return cls(**ModelShape.of(size, config), model=config.model, **point)


@one_value_options
def specs(
    *,
    impl: Iterable[str] | None = None,
    shard_optimizer: Iterable[str] | bool | None = None,
    zero: bool = False,
    bucket_mb: Iterable[Any] | None = None,
    size: Iterable[str] | str | None = None,
    seq: Iterable[Any] | int | None = None,
    batch: Iterable[Any] | int | None = None,
    world_size: Iterable[Any] | None = None,
    backend: str | None = None,
    precision: Iterable[str] | None = None,
    warmup: int | None = None,
    iters: int | None = None,
    device: str = "auto",
    seed: int = 0,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    vocab_size: int | None = None,
    model: str | None = None,
    optimizer: str | None = None,
) -> list[DDPSpec]:
    """The points of a data-parallel sweep, world size slowest. SpecError names a bad option.

    `size`, `seq` and `batch` (the global batch) are lists (a single value is one point) and
    sweep like every list option. Each replica impl runs with each optimizer sharding asked
    for (none; `shard_optimizer`: ours, the user's yours or yours=package.module:Class, True
    meaning ours; zero), bucketed once per bucket cap; the FSDPs have neither. The user's
    implementations (experiments/ddp_yours.py) are named like ours."""
    impls = ddp_yours.user_impls(listed(impl, "--impl", REPLICA_IMPLS), list(IMPLS))
    if shard_optimizer is True:
        shard_optimizer = ["ours"]
    sharded_by = named_impls(listed(shard_optimizer or None, "--shard-optimizer", []), "optimizer",
                             "--shard-optimizer", ["ours"])
    shardings = ["none", *sharded_by, *["zero"] * zero]
    adamw = optimizer_option(optimizer)
    adamw = None if adamw == "adamw" else adamw
    if bucket_mb is not None and not {"bucketed", "yours-bucketed"} & set(impls):
        raise SpecError(f"--bucket-mb is a setting of the bucketed DDPs, which --impl "
                        f"{','.join(impls)} leaves out")
    if len(shardings) > 1 and all(ddp_setup.fully_sharded(i) for i in impls):  # ignored
        raise SpecError(f"--{'shard-optimizer' if sharded_by else 'zero'} shards a replica's "
                        f"optimizer state; the FSDPs of --impl {','.join(impls)} shard theirs")
    buckets = []
    for b in listed(bucket_mb, "--bucket-mb", DEFAULT_BUCKETS):
        try:
            buckets.append(float(b))
        except ValueError:
            raise SpecError(f"--bucket-mb: {b!r} is not a number") from None
        if not 0 < buckets[-1] < float("inf"):  # nan too: it reached the ranks
            raise SpecError(f"--bucket-mb must be a positive number of MB, got {b}")
    precisions = choices(precision, (*PRECISIONS, "fp16"), "--precision", default=["fp32"])
    replicas = [i for i in impls if i in REPLICA_IMPLS or ddp_yours.kind_of(i) == "ddp"]
    if "fp16" in precisions and replicas:
        raise SpecError(f"--precision fp16 is an FSDP's compute dtype (as the course's FSDP test "
                        f"runs it); the replicas ({', '.join(replicas)}) train under fp32 or "
                        f"bf16 autocast, since fp16 autocast needs loss scaling")
    check_seed(seed)
    be, dev = backend_and_device(backend, device)
    worlds = world_sizes(world_size, be, [2])
    defaults = DEFAULTS[dev]
    warmup = defaults["warmup"] if warmup is None else warmup
    iters = defaults["iters"] if iters is None else iters
    counts(warmup, iters)
    sizes = preset_sizes(_items(size), defaults["size"])
    ctx_lens = positive_ints(_items(seq), "--seq", [defaults["seq"]])
    batches = positive_ints(_items(batch), "--batch", [defaults["batch"]])
    for gb in batches:
        for n in worlds:
            if gb % n:
                raise SpecError(f"--batch {gb} does not split evenly over {n} ranks")
    overrides = positive_sizes(d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                num_heads=num_heads, vocab_size=vocab_size)
    if model is not None:
        check_model(model)
    configs = {}
    for s in sizes:
        for t in ctx_lens:
            try:
                configs[s, t] = from_preset(s, context_length=t, model=model, **overrides)
            except ValueError as exc:
                raise shape_error(exc) from None
    return [
        DDPSpec.of(configs[s, t], s, impl=name, bucket_mb=b, shard_optimizer=sharding,
                   world_size=n, backend=be, device=dev, batch=gb, precision=prec,
                   warmup=warmup, iters=iters, seed=seed, optimizer=adamw)
        for n in worlds
        for s in sizes
        for t in ctx_lens
        for gb in batches
        for prec in precisions
        for name in impls
        for b, sharding in _points(name, buckets, shardings)
    ]


def _items(value: Any) -> list[Any] | None:
    """A list option given as one value (the Python API's `size="tiny"`) or as a list."""
    if value is None or isinstance(value, (list, tuple)):
        return value
    return [value]


def _points(impl: str, buckets: list[float], shardings: list[str]) -> list:
    """(bucket cap, optimizer sharding) pairs to sweep for `impl`: bucket caps for bucketed
    and the user's yours-bucketed (torch DDP's own cap recorded for torch), each sharding for
    the replica impls; the FSDPs have neither (they shard the optimizer state anyway)."""
    if ddp_setup.fully_sharded(impl):
        return [(None, None)]
    caps = (buckets if impl in ("bucketed", "yours-bucketed") else [TORCH_BUCKET_MB] if impl == "torch"
            else [None])
    return [(b, sh) for b in caps for sh in shardings]


def _batch(spec: DDPSpec, rank: int | None, device):
    """This rank's equal, contiguous slice of one global batch that every rank draws alike
    (the whole batch for rank None)."""
    x, y = make_batch(spec.seed, spec.batch, spec.seq, spec.vocab_size)
    if rank is None:
        return x.to(device), y.to(device)  # (B, T)
    local = spec.batch // spec.world_size
    part = slice(rank * local, (rank + 1) * local)
    return x[part].to(device), y[part].to(device)  # (B / world, T)


def run(ctx: Any, spec: DDPSpec) -> Result:
    import torch

    from cs336sys.measure.live_tensors import LiveTensorTracker
    from cs336sys.measure.nvtx import measured
    from cs336sys.parallel.comm_counter import CommCounter

    device = torch.device(ctx.device)
    on_cuda = device.type == "cuda"
    adamw_cls = optimizer_class(spec.optimizer or "adamw")
    user = ddp_yours.uses_user_code(spec)
    if user:
        unfinished = ddp_yours.not_implemented(spec)
        if unfinished:  # known from the adapters file: every rank skips alike, nothing runs
            return Result("skipped", error=unfinished)
    # their model (--model) and AdamW first, every rank alike, before the point's model exists
    checked = before_timing(spec.config(), spec.optimizer, ctx.device, spec.seed, spec.batch)
    # the course's own DDP test, on every rank alike; said after the training check's cause
    toy = toy_check(spec.impl, spec.bucket_mb, ctx.rank, ctx.world_size, device,
                    spec.shard_optimizer)
    # The user's code is checked against single-process training of the same steps: rank 0
    # trains the reference first, alone, so that it never shares memory with the point.
    reference = None
    if user and ctx.rank == 0:
        x_all, y_all = _batch(spec, None, device)
        reference = training_reference(spec.config(), ctx.device, spec.seed, x_all, y_all,
                                       spec.precision, spec.warmup + 1 + spec.iters,
                                       ctx.world_size, adamw_cls)
        del x_all, y_all
        free_memory()
    tracker = None if on_cuda else LiveTensorTracker()
    probe = CudaProbe(device) if on_cuda else TrackerProbe(tracker)
    probe.reset_peak()  # the check's reference above is no part of init's peak
    if tracker is not None:
        tracker.__enter__()  # watches from before the model exists; left before timing
    record = None  # the user's FSDP's gradients after the first step (fsdp_course_check)
    try:
        model = make_model(spec.config(), ctx.device, ddp_setup.init_seed(spec.impl, spec.seed, ctx.rank))
        # Counted, not kept: a list of the parameters would keep the full weights alive
        # after FSDP has sharded them.
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        n_1d = sum(p.numel() for p in model.parameters() if p.requires_grad and p.dim() < 2)
        # one whole copy of the parameters, what a sharded rank holds a share of
        whole_bytes = sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)
        try:
            setup = ddp_setup.build(spec.impl, spec.shard_optimizer, spec.bucket_mb,
                                    spec.precision, model, device, num_layers=spec.num_layers,
                                    optimizer_cls=adamw_cls)
        except Unfinished as exc:  # the getter raised NotImplementedError on every rank
            return Result("skipped", error=str(exc))
        del model
        memory = {"init": probe.current(), "init_peak": probe.peak(),
                  **ddp_setup.split(setup, "init")}
        x, y = _batch(spec, ctx.rank, device)
        step = Step(
            model=setup.module, forward_module=setup.module, x=x, y=y, mode="train",
            device=ctx.device, optimizer=setup.optimizer, finish=setup.finish, start=setup.start,
            amp_dtype=autocast_dtype(spec.precision) if setup.autocast else None,  # FSDPs: own
            clear_grads=is_yours(spec.shard_optimizer))
        losses = []
        total = spec.warmup + 1 + spec.iters  # warm-up, the measured step, the timed steps
        # rank 0's gradients after the first step's synchronization, and an FSDP's shards
        first: tuple[dict, dict | None] = ({}, {} if ddp_setup.fully_sharded(spec.impl) else None)
        copy_grads = first_step_grads(setup.module, *first) if reference is not None else None
        # every rank's, for what the course's FSDP test asserts besides training
        record = (fsdp_course_check.Record(setup.module)
                  if user and ddp_setup.fully_sharded(spec.impl) else None)

        def keep_grads() -> None:  # the check's copy: not the point's memory (CUDA: on the CPU)
            with tracker.aside() if tracker is not None else contextlib.nullcontext():
                for keep in (copy_grads, record):
                    if keep is not None:
                        keep()
        for i in range(spec.warmup):
            step(before_optimizer=keep_grads if i == 0 else lambda: None)
            losses.append(step.last_loss)
            step_done(i + 1, total)

        # The measured step: memory at the optimizer step, and every collective of a step.
        def read(when):  # live, the step's peak so far (the handout's "peak ... before")
            return lambda: memory.update({when: probe.current(), f"{when}_peak": probe.peak(),
                                          **ddp_setup.split(setup, when)})

        def before_opt():
            read("before_opt")()
            if not spec.warmup:
                keep_grads()

        probe.reset_peak()
        with CommCounter() as comm:
            step(before_optimizer=before_opt, after_optimizer=read("after_opt"))
            losses.append(step.last_loss)
        memory["peak"] = probe.peak()
    except Exception as exc:  # a misshapen gradient the record kept: its cause said first
        named = fsdp_course_check.why_failed(record, exc)
        if named is None:
            raise
        raise named from exc
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)
    # the course's test gathers after every step and trains on: so does the point, once
    changed = record and fsdp_course_check.gather_changes(setup.module, setup.full_params)
    times: dict[str, list[float]] = {p: [] for p in PHASES}  # and <phase>_host
    in_flight = []  # ours: each step's time with a collective in flight
    with measured():  # what --nsys records: the timed steps, on every rank
        try:
            for i in range(spec.iters):
                for phase, ms in step().items():
                    times.setdefault(phase.removesuffix("_ms"), []).append(ms)
                if spec.impl in IN_FLIGHT:
                    in_flight.append(getattr(setup.module, IN_FLIGHT[spec.impl]))
                losses.append(step.last_loss)
                step_done(spec.warmup + 2 + i, total)
        except Exception as exc:
            if not changed:
                raise
            raise RuntimeError(f"{changed}; the next step failed: {type(exc).__name__}: "
                               f"{first_line(exc)}") from exc
    # this rank's host time per phase (measure/timing.py), before comm is replaced below
    host_bound = launch_metrics({f"{k}_ms": v for k, v in times.items()},
                                ("fwd", "bwd", "comm", "opt"), ctx.device)

    if in_flight:
        times["comm" if spec.impl == "fsdp" else "allreduce"] = in_flight
    if spec.impl in ("torch", "torch-fsdp"):  # how much of backward waited on the reduction
        times["comm"] = ddp_setup.exposed_comm(spec.impl, step, setup.module, spec.iters,
                                               times["bwd"])

    diff = ddp_setup.param_spread(setup)
    if user:
        full = setup.full_params()  # on every rank: a collective for an FSDP
        whole = reference.final if reference is not None else {}
        course = record and fsdp_course_check.verdict(record, full, device, spec.precision, whole)
        if reference is not None:
            tests = ddp_yours.course_tests(spec.impl, spec.shard_optimizer)
            # the wrapper's comparison before the model's check (a writeup cuts the detail)
            checked = both(both(both(training_check(
                full, reference, spec.precision, *first, diff, tests, losses), checked),
                course), toy)
            checked = ddp_yours.with_causes(checked, changed, spec.shard_optimizer, setup)
        del full
    per_rank = gather({"times": times, "peak": memory["peak"],
                       "memory": {k: v for k, v in memory.items() if k != "peak"}})
    # Per step, the slowest rank's time (the others wait for it); the communication the least
    # rank's: one that reached the collective first also waited for the others' backward.
    per_step = {p: [(min if p in ("comm", "allreduce") else max)(r["times"][p][s]
                                                                for r in per_rank)
                    for s in range(spec.iters)] for p in (*PHASES, "allreduce") if p in times}
    metrics: dict[str, Any] = {}
    for phase, per in per_step.items():
        metrics.update(flatten(f"{phase}_ms", per))
    for phase in ("step", "comm"):  # how far the ranks drift apart: each rank's own mean
        means = [statistics.fmean(r["times"][phase]) for r in per_rank]
        metrics.update(over_ranks(f"{phase}_ms_rank", means))
    metrics.update({f"mem_{k}_bytes": v for k, v in memory.items() if k != "peak"})
    metrics["mem_peak_bytes"] = memory["peak"]
    metrics["mem_peak_bytes_max_rank"] = max(r["peak"] for r in per_rank)
    metrics["mem_per_rank"] = json.dumps([r["memory"] for r in per_rank])
    metrics.update(ddp_setup.shares(
        spec.impl, spec.shard_optimizer, [r["memory"]["before_opt_params"] for r in per_rank],
        [r["memory"]["after_opt_opt_state"] for r in per_rank], whole_bytes, spec.model))
    expected = ddp_setup.expected(spec.impl, spec.shard_optimizer, ctx.world_size, n_params, n_1d)
    for k, v in expected.items():
        metrics[f"expected_{k}_bytes"] = v
    metrics.update(comm.figures(ctx.world_size))
    metrics.update(
        comm_fraction=metrics["comm_ms_mean"] / metrics["step_ms_mean"],
        buckets=ddp_yours.bucket_count(setup.module),
        params=n_params,
        tokens_per_s=spec.batch * spec.seq / (metrics["step_ms_mean"] / 1e3),
        param_max_diff=diff,
        loss_first=float(losses[0]),
        loss_last=float(losses[-1]),
    )
    metrics.update(host_bound)  # rank 0's
    samples = {"ranks": [r["times"] for r in per_rank], "loss": [float(v) for v in losses]}
    if checked is not None:  # a NaN loss first: it explains any comparison after it
        metrics["code"] = checks.user_code(spec.config(), setup.module, setup.optimizer,
                                           getattr(setup.module, "module", None))
    return checks.judged(checked and both(checks.finite_losses(losses), checked), metrics,
                         samples=samples)


# -- the declaration ------------------------------------------------------------------------


EXPERIMENT = Experiment(
    kind="ddp",
    title="DDP: step time and communication",
    spec=DDPSpec, specs=specs, run=run,
    metrics=(
        *timing("step_ms", "whole step, the slowest rank's"),
        *timing("fwd_ms", "forward pass with the loss"),
        *timing("bwd_ms", "backward pass"),
        *timing("comm_ms", "time waiting on gradient communication, the least rank's "
                "(fsdp: time with any of its collectives in flight)"),
        *timing("opt_ms", "optimizer step and zero_grad"),
        *timing("allreduce_ms", "naive, flat, overlap, bucketed: time with an all-reduce of "
                "the gradients in flight, launch to completion, the least rank's"),
        *(Metric(f"{p}_ms_rank_{s}", "ms", f"{s} over ranks of each rank's mean {p} time")
          for p in ("step", "comm") for s in ("mean", "min", "max")),
        Metric("comm_fraction", "", "comm_ms_mean / step_ms_mean"),
        Metric("comm_bytes", "bytes", "bytes of every collective in one step (nccl-tests' S)"),
        Metric("sent_bytes", "bytes", "bytes a rank sends in one step, the ranks' mean (ring)"),
        *(Metric(f"{k}_{u}", "bytes" if u == "bytes" else "", f"{k} {u} in one step")
          for k in ("allreduce", "broadcast", "allgather", "reducescatter")
          for u in ("calls", "bytes")),
        # per-rank memory (rank 0): live bytes, and what parameters, gradients and optimizer
        # state hold, after init and around the optimizer step
        *(Metric(f"mem_{w}{part}_bytes", "bytes", f"rank 0, {w.replace('_', ' ')}: "
                 f"{part.strip('_').replace('_', ' ') or 'live'}")
          for w in ("init", "before_opt", "after_opt")
          for part in ("", "_peak", "_params", "_grads", "_opt_state")),
        *metric_table("""
            mem_peak_bytes            bytes     rank 0's peak in the measured step
            mem_peak_bytes_max_rank   bytes     the highest peak over ranks
            mem_per_rank              -         every rank's bytes after init, before and after
                                                  the step, live and by part (JSON)
            expected_params_bytes     bytes     analytic parameter bytes per rank
            expected_grads_bytes      bytes     analytic gradient bytes per rank
            expected_opt_state_bytes  bytes     analytic optimizer-state bytes per rank
            buckets                   -         gradient buckets (bucketed)
            params                    -         trainable parameters of the model
            tokens_per_s              tokens/s  global batch tokens / mean step time
            param_max_diff            -         largest difference of a replicated weight between
                                                  ranks
            loss_first                -         loss of the first step (rank 0)
            loss_last                 -         loss of the last timed step (rank 0)
            check_worst               -         the largest |p - p_ref| / |p_ref - p_0| over
                                                  parameters
        """),
        *ddp_setup.SHARE_METRICS,
        *CHECK_METRICS, *fsdp_course_check.METRICS,
        *launch(("fwd", "bwd", "comm", "opt")),
    ),
    tables=(ddp_section.TABLE,),
    compare="step_ms",
    distributed=True,
    section=ddp_section.section,
    draws=True,
    command=ddp_command.COMMAND,
)
