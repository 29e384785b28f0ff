"""End-to-end timing of the Transformer LM: forward, backward and optimizer step.

One ModelSpec is one point of a sweep; `run(spec)` builds the model with random weights,
feeds it random tokens, runs `warmup` untimed steps and `steps` timed ones, and returns a
Result. Each phase ends with a device sync, so the host timer measures the device's work
(DESIGN.md, "Measuring honestly"); raw samples of warm-up and timed steps are kept.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import asdict, dataclass
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.bench.stats import flatten
from cs336sys.models.config import ModelConfig

MODES = ("forward", "forward-backward", "train")
PRECISIONS = ("fp32", "bf16", "fp16")
OPTIMIZERS = ("adamw", "torch-adamw")
EXPERIMENT = "model"


@dataclass(frozen=True)
class ModelSpec:
    size: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int
    context_length: int
    batch_size: int
    mode: str
    precision: str
    compile: bool
    attention: str
    optimizer: str
    warmup: int
    steps: int
    device: str
    seed: int
    nvtx: bool = False
    checkpoint: str = "none"

    def config(self) -> ModelConfig:
        return ModelConfig(
            d_model=self.d_model,
            d_ff=self.d_ff,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            vocab_size=self.vocab_size,
            context_length=self.context_length,
            attention=self.attention,
            checkpoint=self.checkpoint,
        )

    def settings(self) -> dict[str, Any]:
        return asdict(self)


def _make_optimizer(name: str, params):
    import torch

    from cs336sys.models.adamw import AdamW

    if name == "adamw":
        return AdamW(params, lr=1e-4, weight_decay=0.01)
    return torch.optim.AdamW(params, lr=1e-4, weight_decay=0.01)


def run(spec: ModelSpec) -> Result:
    import torch
    import torch.nn.functional as F

    from cs336sys.bench.device import device_name, peak_tflops, synchronize
    from cs336sys.models.flops import step_flops
    from cs336sys.models.nvtx import nvtx_enabled, nvtx_range
    from cs336sys.models.transformer import TransformerLM

    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    config = spec.config()
    with device:  # initialise on the device: a 10B model would take minutes on the host
        model = TransformerLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    fwd_model = torch.compile(model) if spec.compile else model
    optimizer = (
        _make_optimizer(spec.optimizer, model.parameters()) if spec.mode == "train" else None
    )

    B, T = spec.batch_size, spec.context_length
    x = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)

    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(spec.precision)
    # fp16 needs loss scaling so small gradients do not flush to zero (Micikevicius et al. 2018).
    scaler = (
        torch.amp.GradScaler(device.type)
        if spec.precision == "fp16" and spec.mode != "forward"
        else None
    )
    training = spec.mode != "forward"
    logits_dtype: list[str] = []
    losses: list = []

    def sync() -> None:
        synchronize(spec.device)

    def one_step() -> dict[str, float]:
        t0 = time.perf_counter()
        grad_mode = contextlib.nullcontext() if training else torch.no_grad()
        autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
        with nvtx_range("forward"), grad_mode, autocast:
            logits = fwd_model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        sync()
        t1 = time.perf_counter()
        times = {"fwd_ms": (t1 - t0) * 1e3}
        losses.append(loss.detach())  # read back after the loop: no extra sync per step
        if not logits_dtype:
            logits_dtype.append(str(logits.dtype).removeprefix("torch."))
        if training:
            with nvtx_range("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
            sync()
            t2 = time.perf_counter()
            times["bwd_ms"] = (t2 - t1) * 1e3
            if optimizer is not None:
                with nvtx_range("optimizer"):
                    if scaler:
                        scaler.step(optimizer)
                        scaler.update()
                    else:
                        optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
                sync()
                t3 = time.perf_counter()
                times["opt_ms"] = (t3 - t2) * 1e3
            times["step_ms"] = (time.perf_counter() - t0) * 1e3
            if optimizer is None:
                model.zero_grad(set_to_none=True)  # untimed: forward-backward has no optimizer
        else:
            times["step_ms"] = times["fwd_ms"]
        return times

    on_cuda = device.type == "cuda"
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(device)
    warm: dict[str, list[float]] = {}
    timed: dict[str, list[float]] = {}
    with nvtx_enabled(spec.nvtx):
        for i in range(spec.warmup + spec.steps):
            target = warm if i < spec.warmup else timed
            for k, v in one_step().items():
                target.setdefault(k, []).append(v)

    metrics: dict[str, Any] = {}
    for phase in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
        metrics.update(flatten(phase, timed.get(phase, [])))
    step_s = metrics["step_ms_mean"] / 1e3
    flops = step_flops(config, B, T, spec.mode)
    tflops = flops / step_s / 1e12
    tf32 = bool(torch.backends.cuda.matmul.allow_tf32)
    peak = peak_tflops(device_name(spec.device), spec.precision, tf32=tf32)
    metrics.update(
        params=n_params,
        tokens_per_step=B * T,
        tokens_per_s=B * T / step_s,
        flops_per_step=flops,
        tflops=tflops,
        peak_tflops=peak,
        mfu=tflops / peak if peak else None,
        logits_dtype=logits_dtype[0],
        # CUDA only: peak bytes held by tensors (allocated) and by the caching allocator
        # (reserved) over warm-up and timed steps. CPU memory is the memory experiment's job.
        peak_allocated_mb=torch.cuda.max_memory_allocated(device) / 2**20 if on_cuda else None,
        peak_reserved_mb=torch.cuda.max_memory_reserved(device) / 2**20 if on_cuda else None,
    )
    loss_values = [float(v) for v in losses]  # warm-up and timed steps, in order
    metrics.update(loss_first=loss_values[0], loss_last=loss_values[-1])
    return Result("ok", metrics=metrics, samples={**timed, "loss": loss_values, "warmup": warm})
