"""Reference attention: the textbook formula and PyTorch's fused kernel.

    Attention(Q, K, V) = softmax(Q K^T / sqrt(d)) V        (Vaswani et al. 2017, eq. 1)

`naive_attention` materialises the full (T_q, T_k) score matrix, which is exactly what makes
its memory grow quadratically with sequence length; it is the baseline that FlashAttention
(Dao et al. 2022) is measured against. `sdpa_attention` is PyTorch's dispatcher to its
fused kernels (flash / memory-efficient / math) and serves as the "vendor" baseline.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from cs336sys.measure.nvtx import nvtx_range


def naive_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v for q (..., T_q, D), k and v (..., T_k, D).

    With `is_causal`, query i sees keys j <= i. When T_q != T_k the mask is aligned to the
    top-left corner, as `torch.nn.functional.scaled_dot_product_attention` does, so the two
    functions are interchangeable.
    """
    d = q.shape[-1]
    n_queries, n_keys = q.shape[-2], k.shape[-2]

    with nvtx_range("scores"):
        scores = q @ k.transpose(-2, -1) / math.sqrt(d)  # (..., T_q, T_k)
        if is_causal:
            allowed = torch.ones(n_queries, n_keys, dtype=torch.bool, device=q.device).tril()
            scores = scores.masked_fill(~allowed, float("-inf"))

    with nvtx_range("softmax"):
        # torch.softmax subtracts the row max first, so large scores do not overflow exp.
        probs = torch.softmax(scores, dim=-1)  # (..., T_q, T_k)

    with nvtx_range("final matmul"):
        return probs @ v  # (..., T_q, D)


def sdpa_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """`torch.nn.functional.scaled_dot_product_attention` with the registry's signature."""
    return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)


def attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    do: torch.Tensor | None = None,
    max_elements: int = 2**26,
    dtype: torch.dtype = torch.float32,
    scale: float | None = None,
    diagonal: int = 0,
    backward_unmasked: bool = False,
    tile: int = 0,
    inverted: bool = False,
) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None]:
    """O in `dtype` (float32, or float64 for the benchmark's check), and (dQ, dK, dV) when
    the upstream gradient `do` is given. `scale` multiplies the scores (1/√d unless given:
    another one is what a wrong kernel computes, attention/diagnosis.py), and with
    `is_causal` query i sees keys j <= i + `diagonal` (0; 1: the off-by-one mask of a wrong
    kernel; with `tile`, query i sees every key of its own `tile`-key tile and those before:
    a kernel that masks whole tiles and not inside the diagonal one; `inverted`: only the
    keys j > i, a mask read the wrong way round). `backward_unmasked`:
    the gradients of a wrong backward that recomputes
    P = exp(S − L) over every key with the causal forward's L (is_causal not kept for it).

    The benchmark's per-point correctness check. It walks over chunks of queries so that at
    most `max_elements` scores exist at once: checking a 65536-long sequence must not need
    the (T, T) matrix that the kernel under test was written to avoid. Gradients follow
    FlashAttention-2's backward (Dao 2023, eq. after Alg. 1): dV = Pᵀ dO, dP = dO Vᵀ,
    dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = dS K / √d, dK = dSᵀ Q / √d.
    """
    q32, k32, v32 = (t.detach().to(dtype) for t in (q, k, v))
    do32 = None if do is None else do.detach().to(dtype)
    scale = 1.0 / math.sqrt(q32.shape[-1]) if scale is None else scale

    o = torch.empty_like(q32)
    if do32 is not None:
        dq, dk, dv = torch.empty_like(q32), torch.zeros_like(k32), torch.zeros_like(v32)
    for start, end, s in _score_chunks(q32, k32, is_causal, scale, max_elements, diagonal,
                                       tile, inverted):
        q_c = q32[..., start:end, :]  # (..., c, D)
        p = torch.softmax(s, dim=-1)  # (..., c, Tk)
        o_c = p @ v32  # (..., c, D)
        o[..., start:end, :] = o_c
        if do32 is not None:
            if backward_unmasked and is_causal:  # the causal L, the scores unmasked
                lse = torch.logsumexp(s, dim=-1, keepdim=True)  # (..., c, 1)
                p = torch.exp(q_c @ k32.transpose(-2, -1) * scale - lse)  # (..., c, Tk)
            do_c = do32[..., start:end, :]  # (..., c, D)
            dv += p.transpose(-2, -1) @ do_c
            dp = do_c @ v32.transpose(-2, -1)  # (..., c, Tk)
            ds = p * (dp - (do_c * o_c).sum(dim=-1, keepdim=True))
            dq[..., start:end, :] = ds @ k32 * scale
            dk += ds.transpose(-2, -1) @ q_c * scale
    return o, (None if do32 is None else (dq, dk, dv))


def logsumexp_reference(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False,
                        max_elements: int = 2**26, dtype: torch.dtype = torch.float64,
                        scale: float | None = None, diagonal: int = 0,
                        tile: int = 0, inverted: bool = False) -> torch.Tensor:
    """L = logsumexp over the keys of the scaled (and masked) scores, (..., T_q): what a
    FlashAttention forward saves for its backward (Dao 2023, Alg. 1, L_i = m_i + log l_i),
    natural log; chunked and masked as attention_reference."""
    q32, k32 = (t.detach().to(dtype) for t in (q, k))
    scale = 1.0 / math.sqrt(q32.shape[-1]) if scale is None else scale
    lse = torch.empty(q32.shape[:-1], dtype=dtype, device=q32.device)  # (..., T_q)
    for start, end, s in _score_chunks(q32, k32, is_causal, scale, max_elements, diagonal,
                                       tile, inverted):
        lse[..., start:end] = torch.logsumexp(s, dim=-1)
    return lse


def _score_chunks(q: torch.Tensor, k: torch.Tensor, is_causal: bool, scale: float,
                  max_elements: int, diagonal: int = 0, tile: int = 0, inverted: bool = False):
    """(start, end, scores of queries start..end) with at most `max_elements` scores at
    once, the causal mask top-left aligned, like naive_attention and SDPA (query i sees keys
    j <= i + `diagonal`; with `tile`, keys j with j // tile <= i // tile; `inverted`, the
    keys j > i)."""
    n_queries, d = q.shape[-2:]
    n_keys = k.shape[-2]
    rows = max(1, q.numel() // (n_queries * d))  # batch (x heads)
    chunk = max(1, min(n_queries, max_elements // max(1, rows * n_keys)))
    for start in range(0, n_queries, chunk):
        end = min(start + chunk, n_queries)
        s = q[..., start:end, :] @ k.transpose(-2, -1) * scale  # (..., c, Tk)
        if is_causal:
            i = torch.arange(start, end, device=q.device)[:, None]
            j = torch.arange(n_keys, device=q.device)[None, :]
            hidden = (j // tile > i // tile) if tile else (j > i + diagonal)
            hidden = ~hidden if inverted else hidden
            s = s.masked_fill(hidden, float("-inf"))
        yield start, end, s
