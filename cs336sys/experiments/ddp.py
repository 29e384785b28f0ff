"""Data-parallel training step: how much gradient communication each DDP variant exposes.

One DDPSpec is one point: every rank builds the Transformer LM from its own seed (the wrapper
broadcasts rank 0's weights), takes its equal slice of one global batch, and runs `warmup`
untimed and `steps` timed steps of forward, backward, finish_gradient_synchronization and
optimizer, each phase ending with a device sync. A phase's time per step is the slowest
rank's (every rank waits for it at the next collective); mean and std are over steps.

`comm_ms` is the time a step is blocked on gradient communication:
- naive, flat, overlap, bucketed: the time in finish_gradient_synchronization (all of the
  all-reduce for naive and flat; only the part not hidden behind backward for the others);
- torch: DistributedDataParallel reduces inside backward, so its exposed communication is
  its backward time minus the backward time of the same steps under `no_sync()` (measured
  after the timed steps, with no optimizer step);
- fsdp: the time in finish_gradient_synchronization (waiting for the reduce-scatters started
  in backward, and the all-reduce of the replicated parameters' gradients);
- torch-fsdp: FSDP2 reduce-scatters inside backward: backward time minus the backward time
  with set_requires_gradient_sync(False), as for torch.

One more step, after the warm-up and not timed, is measured for memory and traffic (issue 7):
the bytes live on this rank (CUDA: the allocator; CPU: the live-tensor tracker, which has
watched since before the model was built) after the model and wrapper were made, directly
before and directly after the optimizer step, with the bytes held in parameters, gradients
and optimizer state beside each and the analytic expectation (experiments/ddp_setup.py);
and every collective of that step, counted by kind (parallel/comm_counter.py). Memory is
per rank: the row has rank 0's, and the max over ranks of the step's peak.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.bench.stats import flatten
from cs336sys.experiments.ddp_setup import IMPLS, REPLICA_IMPLS, SHARDINGS  # noqa: F401
from cs336sys.experiments.ranks import gather, over_ranks, serve
from cs336sys.models.config import ModelConfig

EXPERIMENT = "ddp"
PRECISIONS = ("fp32", "bf16")
TORCH_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb, recorded as what ran
PHASES = ("fwd", "bwd", "comm", "opt", "step")


@dataclass(frozen=True)
class DDPSpec:
    impl: str
    bucket_mb: float | None
    optimizer_sharding: str | None  # none, own or zero for the replica impls; None for FSDPs
    world_size: int
    backend: str
    device: str  # "cpu" or "cuda": each rank uses its own cuda:<local_rank>
    size: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int
    context_length: int
    global_batch: int
    precision: str
    warmup: int
    steps: int
    seed: int

    @classmethod
    def of(cls, config: ModelConfig, size: str, **point: Any) -> DDPSpec:
        """The point `point` (impl, world_size, steps, ...) for a model `config` of `size`."""
        return cls(size=size, d_model=config.d_model, d_ff=config.d_ff,
                   num_layers=config.num_layers, num_heads=config.num_heads,
                   vocab_size=config.vocab_size, context_length=config.context_length, **point)  # fmt: skip

    def config(self) -> ModelConfig:
        return ModelConfig(
            d_model=self.d_model,
            d_ff=self.d_ff,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
        )

    def settings(self) -> dict[str, Any]:
        return asdict(self)


def worker(ctx: Any, specs: list[DDPSpec]) -> None:
    """Launcher entry point: every point of one world size, on every rank."""
    serve(ctx, specs, run)


def run_specs(specs: list[DDPSpec], key: Callable[[DDPSpec], Any]) -> dict[Any, list[dict]]:
    """Run `specs` (one world size) in one local process group, as the benchmarks do:
    {key(spec): [metrics, ...]} in the order the points finish; a point that is not ok raises.
    Progress goes to stderr."""
    import sys

    from cs336sys.parallel.launcher import launch

    got: dict[Any, list[dict]] = {}

    def keep(message):
        index, _, result = message
        spec = specs[index]
        if result.status != "ok":
            raise RuntimeError(f"{key(spec)}: {result.status} {result.error}")
        got.setdefault(key(spec), []).append(result.metrics)
        print(f"  {key(spec)}: {result.metrics['step_ms_mean']:.0f} ms", file=sys.stderr)

    launch(worker, specs[0].world_size, specs[0].backend, args=(specs,), on_emit=keep)
    return got


def _batch(spec: DDPSpec, rank: int, device):
    """This rank's equal, contiguous slice of one global batch that every rank draws alike."""
    import torch

    g = torch.Generator().manual_seed(spec.seed + 1)
    shape = (spec.global_batch, spec.context_length)
    x = torch.randint(0, spec.vocab_size, shape, generator=g)  # (B, T)
    y = torch.randint(0, spec.vocab_size, shape, generator=g)  # (B, T)
    local = spec.global_batch // spec.world_size
    part = slice(rank * local, (rank + 1) * local)
    return x[part].to(device), y[part].to(device)  # (B / world, T)


def run(ctx: Any, spec: DDPSpec) -> Result:
    import torch
    import torch.nn.functional as F

    from cs336sys.bench.device import synchronize
    from cs336sys.bench.live_tensors import LiveTensorTracker
    from cs336sys.bench.memory import CudaProbe, TrackerProbe
    from cs336sys.experiments import ddp_setup
    from cs336sys.models.transformer import TransformerLM
    from cs336sys.parallel.comm_counter import CommCounter

    device = torch.device(ctx.device)
    on_cuda = device.type == "cuda"
    tracker = None if on_cuda else LiveTensorTracker()
    probe = CudaProbe(device) if on_cuda else TrackerProbe(tracker)
    if tracker is not None:
        tracker.__enter__()  # watches from before the model exists; left before timing
    try:
        torch.manual_seed(spec.seed + 1000 * ctx.rank)  # distinct on purpose: the wrapper syncs
        with device:
            model = TransformerLM(spec.config())
        # Counted, not kept: a list of the parameters would keep the full weights alive
        # after FSDP has sharded them.
        n_params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        n_1d = sum(p.numel() for p in model.parameters() if p.requires_grad and p.dim() < 2)
        setup = ddp_setup.build(spec.impl, spec.optimizer_sharding, spec.bucket_mb,
                                spec.precision, model, device)  # fmt: skip
        memory = {"init": probe.current(), **_prefixed("init", ddp_setup.split(setup))}
        x, y = _batch(spec, ctx.rank, device)
        amp = torch.bfloat16 if spec.precision == "bf16" and setup.autocast else None

        def sync() -> None:
            synchronize(ctx.device)

        def forward_backward() -> tuple[float, float, Any]:
            t0 = time.perf_counter()
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                logits = setup.module(x)  # (B / world, T, V)
                loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
            sync()
            t1 = time.perf_counter()
            loss.backward()
            sync()
            return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3, loss.detach()

        def step(before_optimizer=lambda: None, after_optimizer=lambda: None):
            t0 = time.perf_counter()
            fwd, bwd, loss = forward_backward()
            t2 = time.perf_counter()
            setup.finish()
            sync()
            t3 = time.perf_counter()
            before_optimizer()
            setup.optimizer.step()
            after_optimizer()
            setup.optimizer.zero_grad(set_to_none=True)
            sync()
            t4 = time.perf_counter()
            return (fwd, bwd, (t3 - t2) * 1e3, (t4 - t3) * 1e3, (t4 - t0) * 1e3), loss

        losses = []
        for _ in range(spec.warmup):
            losses.append(step()[1])

        # The measured step: memory at the optimizer step, and every collective of a step.
        def read(when):
            return lambda: memory.update({when: probe.current(), **_prefixed(when, ddp_setup.split(setup))})  # fmt: skip

        probe.reset_peak()
        with CommCounter() as comm:
            losses.append(step(read("before_opt"), read("after_opt"))[1])
        memory["peak"] = probe.peak()
    finally:
        if tracker is not None:
            tracker.__exit__(None, None, None)

    times: dict[str, list[float]] = {p: [] for p in PHASES}
    for _ in range(spec.steps):
        phase_ms, loss = step()
        losses.append(loss)
        for phase, ms in zip(PHASES, phase_ms, strict=True):
            times[phase].append(ms)

    if spec.impl in ("torch", "torch-fsdp"):
        # Backward without gradient reduction, to see how much of backward was waiting on it.
        nosync = []
        for _ in range(spec.steps):
            with _no_grad_sync(spec.impl, setup.module):
                nosync.append(forward_backward()[1])
            setup.optimizer.zero_grad(set_to_none=True)
        times["comm"] = [max(0.0, b - c) for b, c in zip(times["bwd"], nosync, strict=True)]

    diff = _param_spread(setup)
    per_rank = gather({"times": times, "peak": memory["peak"]})
    # Per step, the slowest rank's time: the others wait for it at the next collective.
    slowest = {p: [max(r["times"][p][s] for r in per_rank) for s in range(spec.steps)] for p in PHASES}  # fmt: skip
    metrics: dict[str, Any] = {}
    for phase in PHASES:
        metrics.update(flatten(f"{phase}_ms", slowest[phase]))
    for phase in ("step", "comm"):  # how far the ranks drift apart: each rank's own mean
        means = [statistics.fmean(r["times"][phase]) for r in per_rank]
        metrics.update(over_ranks(f"{phase}_ms_rank", means))
    metrics.update({f"mem_{k}_bytes": v for k, v in memory.items() if k != "peak"})
    metrics["mem_peak_bytes"] = memory["peak"]
    metrics["mem_peak_bytes_max_rank"] = max(r["peak"] for r in per_rank)
    world = ctx.world_size
    shard = spec.optimizer_sharding
    for k, v in ddp_setup.expected(spec.impl, shard, world, n_params, n_1d).items():
        metrics[f"expected_{k}_bytes"] = v
    for kind in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        metrics[f"{kind.replace('_', '')}_bytes"] = comm.bytes[kind]
        metrics[f"{kind.replace('_', '')}_calls"] = comm.calls[kind]
    metrics.update(
        comm_fraction=metrics["comm_ms_mean"] / metrics["step_ms_mean"],
        comm_bytes=sum(comm.bytes.values()),
        buckets=len(getattr(setup.module, "buckets", ())) or None,
        params=n_params,
        tokens_per_s=spec.global_batch * spec.context_length / (metrics["step_ms_mean"] / 1e3),
        param_max_diff=diff,
        loss_first=float(losses[0]),
        loss_last=float(losses[-1]),
    )
    samples = {"ranks": [r["times"] for r in per_rank], "loss": [float(v) for v in losses]}
    return Result("ok", metrics=metrics, samples=samples)


def _prefixed(when: str, split: dict[str, int]) -> dict[str, int]:
    return {f"{when}_{k}": v for k, v in split.items()}


def _no_grad_sync(impl: str, module):
    """Backward without the gradient reduction: torch DDP's no_sync(), FSDP2's switch."""
    import contextlib

    if impl == "torch":
        return module.no_sync()

    @contextlib.contextmanager
    def fsdp2():
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return fsdp2()


def _param_spread(setup) -> float | None:
    """Largest difference of any replicated parameter element between ranks: 0 when the
    wrapper did its job (None when every parameter is sharded). One parameter at a time:
    the check costs two copies of the largest."""
    import torch.distributed as dist

    if not setup.replicated:
        return None
    spread = 0.0
    for p in setup.replicated:
        hi = p.detach().float().clone()
        lo = hi.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        spread = max(spread, float((hi - lo).max()))
    return spread
