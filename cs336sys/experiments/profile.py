"""Profiling: where the measured steps of a model or attention point spend their time.

One ProfileSpec wraps one point of `cs336sys model` (a ModelSpec) or `cs336sys attention`
(an AttentionSpec). `run(spec)` builds the point the way those experiments do, runs the
warm-up steps *outside* the profiler, then the measured steps inside `torch.profiler`, each
phase (forward, backward, optimizer) in a range of its own that ends with a device sync.
profile_events.py attributes every op (CPU: self CPU time) or kernel (CUDA: device time) to
its phase and ranks them; the rows go to the `kernel_stats` table, linked to the run.

For naive attention the QKᵀ, softmax and PV parts of the forward pass are set against their
FLOPs. Convention (per call, B batch, H heads, T queries = keys, d head dim):

    QKᵀ:     2·B·H·T²·d   the full (T, T) matrix, as the naive code computes it even when
                          causal; its range also holds the 1/√d scaling and the causal mask
    softmax: 5·B·H·T²     per score: max, subtract, exp, sum, divide (element-wise work)
    PV:      2·B·H·T²·d

In a model step the parts are summed over the layers. With `nvtx=True` torch.profiler is
not used (Nsight Systems cannot share CUPTI with it): the phases become NVTX ranges and the
measured steps sit inside one range, MEASURED_RANGE, which `nsys --capture-range=nvtx`
captures, so warm-up never enters the report.
"""

from __future__ import annotations

import contextlib
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.experiments.attention import AttentionSpec
from cs336sys.experiments.model import ModelSpec
from cs336sys.experiments.profile_events import PHASES, summarize

EXPERIMENT = "profile"
TARGETS = ("model", "attention")
MEASURED_RANGE = "measured_steps"
SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt"}


@dataclass(frozen=True)
class ProfileSpec:
    target: str  # model | attention
    point: ModelSpec | AttentionSpec
    top: int  # names kept per phase in kernel_stats; the rest become one (other) row
    nvtx: bool = False  # NVTX ranges for nsys instead of torch.profiler
    trace: str | None = None  # Chrome trace file to write (an output, not a setting)

    def settings(self) -> dict[str, Any]:
        base = dict(self.point.settings())
        base.pop("nvtx", None)  # the model's own NVTX switch; `profiler` says what ran
        base.pop("timer", None)  # the attention benchmark's timer: not used here
        return {
            "target": self.target,
            "profiler": "nvtx" if self.nvtx else "torch",
            "top": self.top,
            **base,
        }

    @property
    def steps(self) -> tuple[int, int]:
        """(warm-up, measured) steps of the point."""
        p = self.point
        return p.warmup, (p.steps if isinstance(p, ModelSpec) else p.iters)


@dataclass
class ProfileResult(Result):
    kernels: list[dict[str, Any]] = field(default_factory=list)  # kernel_stats rows


@dataclass
class _Steps:
    """A built point: one step runs its phases through `phase(name, times)`."""

    one_step: Callable[[Callable], dict[str, float]]
    context: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)
    part_flops: dict[str, float] = field(default_factory=dict)  # per step, naive attention


def run(spec: ProfileSpec) -> Result:
    from cs336sys.bench.device import synchronize
    from cs336sys.models.nvtx import nvtx_enabled, nvtx_range, profiler_ranges

    device = spec.point.device
    on_cuda = device.startswith("cuda")
    n_warmup, n_steps = spec.steps
    built = _model(spec.point) if spec.target == "model" else _attention(spec.point)

    @contextlib.contextmanager
    def phase(name: str, times: dict[str, float]) -> Iterator[None]:
        t0 = time.perf_counter()
        with nvtx_range(name):
            yield
            synchronize(device)  # inside the range: its kernels finish within it
        times[name] = (time.perf_counter() - t0) * 1e3

    warm: dict[str, list[float]] = {}
    timed: dict[str, list[float]] = {}

    def collect(target: dict[str, list[float]]) -> None:
        for name, ms in built.one_step(phase).items():
            target.setdefault(name, []).append(ms)

    prof = None
    try:
        with built.context, nvtx_enabled(spec.nvtx):
            for _ in range(n_warmup):
                collect(warm)
            if spec.nvtx:
                with nvtx_range(MEASURED_RANGE):
                    for _ in range(n_steps):
                        collect(timed)
            else:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CPU]
                if on_cuda:
                    activities.append(ProfilerActivity.CUDA)
                with profiler_ranges(True), profile(activities=activities) as prof:
                    for _ in range(n_steps):
                        collect(timed)
    except RuntimeError as exc:
        skipped = _unsupported_sdpa(spec, exc)
        if skipped is None:
            raise
        return Result("skipped", error=skipped)

    metrics: dict[str, Any] = {
        "time_basis": "cuda" if on_cuda else "cpu",
        "profiled_steps": n_steps,
    }
    for name in PHASES:
        if name in timed:
            metrics[f"{SHORT[name]}_ms"] = statistics.fmean(timed[name])
    step = [sum(ms) for ms in zip(*timed.values(), strict=True)]
    metrics["step_ms"] = statistics.fmean(step)
    kernels: list[dict[str, Any]] = []
    if prof is not None:
        kernels, totals, parts = summarize(prof.events(), on_cuda, spec.top)
        for name, ms in totals.items():
            metrics[f"{SHORT[name]}_profiled_ms"] = ms / n_steps
        for key, ms in parts.items():
            per_step = ms / n_steps
            flops = built.part_flops.get(key)
            metrics[f"{key}_ms"] = per_step
            metrics[f"{key}_flops"] = flops
            metrics[f"{key}_gflops"] = (
                flops / (per_step / 1e3) / 1e9 if flops and per_step else None
            )
        if spec.trace:
            prof.export_chrome_trace(spec.trace)
            metrics["trace_path"] = spec.trace
    samples = {f"{SHORT[k]}_ms": v for k, v in timed.items()}
    samples["warmup"] = {f"{SHORT[k]}_ms": v for k, v in warm.items()}
    return ProfileResult("ok", metrics=metrics, samples=samples, kernels=kernels)


def attention_part_flops(batch: int, heads: int, seq: int, d_head: int) -> dict[str, float]:
    """FLOPs of one naive-attention call, by part (convention in the module docstring)."""
    scores = batch * heads * seq * seq
    return {"qk": 2.0 * scores * d_head, "softmax": 5.0 * scores, "pv": 2.0 * scores * d_head}


def _model(spec: ModelSpec) -> _Steps:
    """A model step as experiments/model.py runs it, phases marked for the profiler."""
    import torch
    import torch.nn.functional as F

    from cs336sys.experiments.model import _make_optimizer
    from cs336sys.models.transformer import TransformerLM

    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    config = spec.config()
    with device:
        model = TransformerLM(config)
    fwd_model = torch.compile(model) if spec.compile else model
    training = spec.mode != "forward"
    optimizer = (
        _make_optimizer(spec.optimizer, model.parameters()) if spec.mode == "train" else None
    )
    B, T = spec.batch_size, spec.context_length
    x = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)
    # fp16 needs loss scaling so small gradients do not flush to zero (Micikevicius et al. 2018).
    scaler = torch.amp.GradScaler(device.type) if spec.precision == "fp16" and training else None

    def one_step(phase: Callable) -> dict[str, float]:
        times: dict[str, float] = {}
        grad_mode = contextlib.nullcontext() if training else torch.no_grad()
        autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
        with phase("forward", times), grad_mode, autocast:
            logits = fwd_model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        if training:
            with phase("backward", times):
                (scaler.scale(loss) if scaler else loss).backward()
            if optimizer is None:
                model.zero_grad(set_to_none=True)  # outside every phase: not profiled
            else:
                with phase("optimizer", times):
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
        return times

    parts: dict[str, float] = {}
    if spec.attention == "naive" and not spec.compile:
        per_call = attention_part_flops(B, config.num_heads, T, config.d_head)
        parts = {k: v * config.num_layers for k, v in per_call.items()}
    return _Steps(one_step, part_flops=parts)


def _attention(spec: AttentionSpec) -> _Steps:
    """An attention call (and its backward) as experiments/attention.py times it."""
    import torch

    from cs336sys.attention import registry
    from cs336sys.experiments.attention import _sdpa_context

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
    backward = spec.passes != "forward"
    gen = torch.Generator(device=spec.device).manual_seed(spec.seed)
    q, k, v, dout = (
        torch.randn(spec.shape, generator=gen, device=spec.device, dtype=dtype) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(backward)
    fn = registry.get(spec.impl)

    def one_step(phase: Callable) -> dict[str, float]:
        times: dict[str, float] = {}
        q.grad = k.grad = v.grad = None
        with phase("forward", times):
            out = fn(q, k, v, is_causal=spec.causal)  # (..., T, d)
        if backward:
            with phase("backward", times):
                out.backward(dout)
        return times

    parts = attention_part_flops(spec.batch, spec.heads or 1, spec.seq, spec.d_head)
    return _Steps(one_step, context=_sdpa_context(spec), part_flops=parts)


def _unsupported_sdpa(spec: ProfileSpec, exc: RuntimeError) -> str | None:
    """The reason to store a point as skipped, where an SDPA backend cannot take the inputs."""
    message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    point = spec.point
    if isinstance(point, AttentionSpec) and point.impl == "sdpa":
        if "No available kernel" in message or "No viable backend" in message:
            return f"sdpa backend {point.sdpa_backend!r} cannot run these inputs: {message}"
    return None
