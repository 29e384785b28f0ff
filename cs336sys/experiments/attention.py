"""Attention benchmark: one implementation at one shape, forward/backward/end-to-end.

One AttentionSpec is one point of a sweep. `run(spec)` makes random Q, K, V (and an upstream
gradient), checks the implementation once against a float32 reference, measures the memory
in use before backward, then times the requested passes. FLOPs follow the FlashAttention-2
paper's convention (Dao 2023, §4.1): 4·B·H·Tq·Tk·d for the forward, halved when causal, and
2.5× that for the backward.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.bench.stats import STATS, summarize

EXPERIMENT = "attention"
DTYPES = ("fp32", "bf16", "fp16")
PASSES = ("forward", "backward", "both")
TIMERS = ("loop", "do-bench")
SDPA_BACKENDS = ("auto", "flash", "efficient", "math")
# Implementations whose kernels support only these head dims (the contract).
FLASH_IMPLS = ("flash-torch", "triton")
FLASH_D_RANGE = (16, 128)

_BACKEND_NAMES = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "MATH": "math",
    "CUDNN_ATTENTION": "cudnn",
    "OVERRIDEABLE": "overrideable",
}


@dataclass(frozen=True)
class AttentionSpec:
    impl: str
    seq: int
    d_head: int
    batch: int
    heads: int | None  # None: 3-D inputs (batch, seq, d)
    dtype: str
    causal: bool
    passes: str  # forward | backward | both
    warmup: int
    iters: int
    timer: str  # loop | do-bench
    sdpa_backend: str | None  # only for impl == "sdpa"
    device: str
    seed: int = 0

    def settings(self) -> dict[str, Any]:
        return {
            "impl": self.impl, "seq": self.seq, "d_head": self.d_head, "heads": self.heads,
            "batch": self.batch, "dtype": self.dtype, "causal": self.causal,
            "pass": self.passes, "warmup": self.warmup, "iters": self.iters,
            "timer": self.timer, "sdpa_backend": self.sdpa_backend, "device": self.device,
            "seed": self.seed,
        }  # fmt: skip

    @property
    def shape(self) -> tuple[int, ...]:
        if self.heads is None:
            return (self.batch, self.seq, self.d_head)
        return (self.batch, self.heads, self.seq, self.d_head)


def flops_forward(spec: AttentionSpec) -> float:
    """QKᵀ and PV: 2 matmuls of 2·Tq·Tk·d FLOPs per (batch, head); causal computes half."""
    heads = spec.heads or 1
    full = 4 * spec.batch * heads * spec.seq * spec.seq * spec.d_head
    return full / 2 if spec.causal else full


def _sdpa_context(spec: AttentionSpec):
    if spec.impl != "sdpa" or spec.sdpa_backend in (None, "auto"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
    }[spec.sdpa_backend]
    return sdpa_kernel(backend)


def sdpa_backend_used(q, k, v, is_causal: bool) -> str | None:
    """The backend SDPA's dispatcher picks for these inputs under the active sdpa_kernel."""
    import torch
    from torch.nn.attention import SDPBackend

    try:
        choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal))
    except (AttributeError, RuntimeError, TypeError):  # private API: degrade, never fail
        return None
    return _BACKEND_NAMES.get(choice.name, choice.name.lower())


def run(spec: AttentionSpec) -> Result:
    import torch

    from cs336sys.attention import registry
    from cs336sys.attention.reference import attention_reference
    from cs336sys.bench.memory import saved_tensor_bytes
    from cs336sys.bench.timing import time_do_bench, time_loop

    device = spec.device
    on_cuda = device.startswith("cuda")
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[spec.dtype]
    backward = spec.passes != "forward"

    gen = torch.Generator(device=device).manual_seed(spec.seed)
    q, k, v, dout = (
        torch.randn(spec.shape, generator=gen, device=device, dtype=dtype) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(backward)
    fn = registry.get(spec.impl)

    def forward():
        return fn(q, k, v, is_causal=spec.causal)

    def fresh_forward():
        q.grad = k.grad = v.grad = None
        return forward()

    metrics: dict[str, Any] = {"interpreted": _interpreted(spec.impl)}
    samples: dict[str, list[float]] = {}
    with _sdpa_context(spec):
        if spec.impl == "sdpa":
            metrics["sdpa_backend_used"] = sdpa_backend_used(q, k, v, spec.causal)
        # One checked pass first: correctness, saved bytes, memory before backward. It also
        # serves as the first warm-up (compilation, autotuning happen here).
        try:
            out, saved = saved_tensor_bytes(forward)
        except RuntimeError as exc:
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            if spec.impl == "sdpa" and (
                "No available kernel" in message or "No viable backend" in message
            ):
                # A backend that cannot take these inputs (e.g. flash with 3-D inputs on CPU)
                # is a fact about the backend, not a failure of the benchmark.
                return Result(
                    "skipped",
                    error=f"sdpa backend {spec.sdpa_backend!r} cannot run these inputs: {message}",
                )
            raise
        if backward:
            metrics["saved_bytes"] = saved
            metrics["mem_before_bwd_bytes"] = (
                torch.cuda.memory_allocated(device) if on_cuda else saved
            )
            out.backward(dout)
        # The float32 reference only after memory was read, so its tensors never count.
        out = out.detach()
        ref_o, ref_grads = attention_reference(q, k, v, spec.causal, do=dout if backward else None)
        metrics["max_err"] = (out.float() - ref_o).abs().max().item()
        if backward:
            metrics["max_err_grad"] = max(
                (g.float() - r).abs().max().item()
                for g, r in zip((q.grad, k.grad, v.grad), ref_grads, strict=True)
            )
        del out, ref_o, ref_grads
        q.grad = k.grad = v.grad = None
        if on_cuda:  # the peak is that of the timed passes: inputs, activations, gradients
            torch.cuda.reset_peak_memory_stats(device)

        if spec.passes in ("forward", "both"):
            samples["fwd_ms"] = _time(spec, forward, time_loop, time_do_bench, (q, k, v))
        if backward:
            if spec.timer == "do-bench":
                out = fresh_forward()
                samples["bwd_ms"] = time_do_bench(
                    lambda: out.backward(dout, retain_graph=True), grad_to_none=[q, k, v]
                )
                del out
            else:
                samples["bwd_ms"] = time_loop(
                    lambda out: out.backward(dout), spec.warmup, spec.iters, device,
                    setup=fresh_forward,
                )  # fmt: skip
        if spec.passes == "both":
            samples["e2e_ms"] = _time(
                spec, lambda: fresh_forward().backward(dout), time_loop, time_do_bench, (q, k, v)
            )

    fwd = flops_forward(spec)
    flops = {"fwd": fwd, "bwd": 2.5 * fwd, "e2e": 3.5 * fwd}
    for phase, values in samples.items():
        stats = summarize(values)
        metrics[phase] = stats["mean"]  # fwd_ms, bwd_ms, e2e_ms: the mean
        metrics.update({f"{phase}_{s}": stats[s] for s in STATS if s != "mean"})
        short = phase.removesuffix("_ms")
        metrics[f"tflops_{short}"] = flops[short] / (stats["median"] / 1e3) / 1e12
    metrics.update(flops_fwd=flops["fwd"], flops_bwd=flops["bwd"], flops_e2e=flops["e2e"])
    metrics["peak_bytes"] = torch.cuda.max_memory_allocated(device) if on_cuda else None
    return Result("ok", metrics=metrics, samples=samples)


def _time(spec, fn, time_loop, time_do_bench, grads) -> list[float]:
    if spec.timer == "do-bench":
        return time_do_bench(fn, grad_to_none=list(grads))
    return time_loop(fn, spec.warmup, spec.iters, spec.device)


def _interpreted(impl: str) -> bool:
    if impl != "triton":
        return False
    from cs336sys.attention import flash_triton

    return bool(flash_triton.INTERPRETED)
