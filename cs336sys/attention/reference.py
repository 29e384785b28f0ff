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

from cs336sys.models.nvtx import nvtx_range


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
