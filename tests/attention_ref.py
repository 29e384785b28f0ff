"""Independent float64 reference for attention tests, shared by every implementation.

`reference` differentiates the textbook formula with autograd in float64, so it shares no
code with the kernels under test. Low-precision tolerances are set relative to PyTorch's own
error: the same formula evaluated by PyTorch in that dtype, against the same float64 truth.
"""

from __future__ import annotations

import math

import torch


def make_inputs(shape_q, shape_kv, dtype, seed=0, device="cpu"):
    """q (..., Tq, D), k and v (..., Tk, D) and an upstream gradient dO like q."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(shape_q, generator=g, dtype=torch.float32)
    k = torch.randn(shape_kv, generator=g, dtype=torch.float32)
    v = torch.randn(shape_kv, generator=g, dtype=torch.float32)
    do = torch.randn(shape_q, generator=g, dtype=torch.float32)
    return [t.to(device=device, dtype=dtype) for t in (q, k, v, do)]


def _scores(q, k, is_causal):
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (..., Tq, Tk)
    if is_causal:  # top-left aligned, as torch SDPA: query i sees keys j <= i
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    return s


def reference(q, k, v, do, is_causal):
    """float64 {o, lse, dq, dk, dv} of softmax(q k^T / sqrt(d)) v, by autograd."""
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    s = _scores(q64, k64, is_causal)
    o = torch.softmax(s, dim=-1) @ v64
    o.backward(do.double())
    return {
        "o": o.detach(),
        "lse": torch.logsumexp(s, dim=-1).detach(),
        "dq": q64.grad,
        "dk": k64.grad,
        "dv": v64.grad,
    }


def torch_error(q, k, v, do, is_causal, ref):
    """Max abs error of PyTorch's own evaluation of the formula in q's dtype."""
    ql, kl, vl = (t.detach().clone().requires_grad_() for t in (q, k, v))
    s = _scores(ql, kl, is_causal)
    o = torch.softmax(s, dim=-1) @ vl
    o.backward(do)
    got = {"o": o, "dq": ql.grad, "dk": kl.grad, "dv": vl.grad}
    return {n: (got[n].double() - ref[n]).abs().max().item() for n in got}


FP32_ATOL = 2e-4  # flash and naive float32 land ~1e-6 from float64 on these sizes


def assert_close(got: dict, ref: dict, dtype, torch_err: dict | None = None, factor=2.0):
    """Each tensor in `got` within tolerance of `ref`.

    float32: FP32_ATOL scaled by the reference's magnitude. bf16/fp16: `factor` times
    PyTorch's own error for that tensor (lse: float32 accuracy, since kernels compute it in
    float32 from exact low-precision products).
    """
    for name, tensor in got.items():
        r = ref[name]
        err = (tensor.double() - r).abs().max().item()
        scale = max(1.0, r.abs().max().item())
        if dtype == torch.float32 or name == "lse":
            tol = FP32_ATOL * scale * (1 if dtype == torch.float32 else 10)
        else:
            tol = factor * torch_err[name] + 1e-3 * scale
        assert err <= tol, f"{name}: max abs error {err:.3g} > tolerance {tol:.3g}"
