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
  after the timed steps, with no optimizer step).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.bench.stats import flatten
from cs336sys.experiments.ranks import gather, over_ranks, serve
from cs336sys.models.config import ModelConfig

EXPERIMENT = "ddp"
IMPLS = ("naive", "flat", "overlap", "bucketed", "torch")
PRECISIONS = ("fp32", "bf16")
TORCH_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb, recorded as what ran
PHASES = ("fwd", "bwd", "comm", "opt", "step")


@dataclass(frozen=True)
class DDPSpec:
    impl: str
    bucket_mb: float | None
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
    from cs336sys.models.adamw import AdamW
    from cs336sys.models.transformer import TransformerLM
    from cs336sys.parallel.ddp import make_ddp

    device = torch.device(ctx.device)
    torch.manual_seed(spec.seed + 1000 * ctx.rank)  # distinct on purpose: the wrapper syncs
    with device:
        model = TransformerLM(spec.config())
    ddp = make_ddp(spec.impl, model, bucket_size_mb=spec.bucket_mb)
    optimizer = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    x, y = _batch(spec, ctx.rank, device)
    amp = torch.bfloat16 if spec.precision == "bf16" else None

    def sync() -> None:
        synchronize(ctx.device)

    def forward_backward() -> tuple[float, float, Any]:
        t0 = time.perf_counter()
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            logits = ddp(x)  # (B / world, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        sync()
        t1 = time.perf_counter()
        loss.backward()
        sync()
        return (t1 - t0) * 1e3, (time.perf_counter() - t1) * 1e3, loss.detach()

    times: dict[str, list[float]] = {p: [] for p in PHASES}
    losses = []
    calls0 = bytes0 = 0
    for i in range(spec.warmup + spec.steps):
        if i == spec.warmup:
            calls0, bytes0 = ddp.comm_calls, ddp.comm_bytes
        t0 = time.perf_counter()
        fwd, bwd, loss = forward_backward()
        t2 = time.perf_counter()
        ddp.finish_gradient_synchronization()
        sync()
        t3 = time.perf_counter()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        sync()
        t4 = time.perf_counter()
        losses.append(loss)
        if i >= spec.warmup:
            for phase, ms in zip(
                PHASES, (fwd, bwd, (t3 - t2) * 1e3, (t4 - t3) * 1e3, (t4 - t0) * 1e3), strict=True
            ):
                times[phase].append(ms)
    calls = (ddp.comm_calls - calls0) / spec.steps
    nbytes = (ddp.comm_bytes - bytes0) / spec.steps

    if spec.impl == "torch":
        # Backward without gradient reduction, to see how much of backward was waiting on it.
        nosync = []
        with ddp.no_sync():
            for _ in range(spec.steps):
                nosync.append(forward_backward()[1])
                model.zero_grad(set_to_none=True)
        times["comm"] = [max(0.0, b - c) for b, c in zip(times["bwd"], nosync, strict=True)]

    diff = _param_spread(model)
    per_rank = gather(times)
    # Per step, the slowest rank's time: the others wait for it at the next collective.
    slowest = {p: [max(r[p][s] for r in per_rank) for s in range(spec.steps)] for p in PHASES}
    metrics: dict[str, Any] = {}
    for phase in PHASES:
        metrics.update(flatten(f"{phase}_ms", slowest[phase]))
    for phase in ("step", "comm"):  # how far the ranks drift apart: each rank's own mean
        metrics.update(over_ranks(f"{phase}_ms_rank", [statistics.fmean(r[phase]) for r in per_rank]))
    n_params = sum(p.numel() for p in model.parameters())
    metrics.update(
        comm_fraction=metrics["comm_ms_mean"] / metrics["step_ms_mean"],
        allreduce_calls=calls,
        comm_bytes=nbytes,
        buckets=len(getattr(ddp, "buckets", ())) or None,
        params=n_params,
        tokens_per_s=spec.global_batch * spec.context_length / (metrics["step_ms_mean"] / 1e3),
        param_max_diff=diff,
        loss_first=float(losses[0]),
        loss_last=float(losses[-1]),
    )
    samples = {"ranks": per_rank, "loss": [float(v) for v in losses]}
    return Result("ok", metrics=metrics, samples=samples)


def _param_spread(model) -> float:
    """Largest difference of any parameter element between ranks: 0 when DDP did its job.
    One parameter at a time, so the check costs two copies of the largest, not of all."""
    import torch.distributed as dist

    spread = 0.0
    for p in model.parameters():
        hi = p.detach().float().clone()
        lo = hi.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        spread = max(spread, float((hi - lo).max()))
    return spread
