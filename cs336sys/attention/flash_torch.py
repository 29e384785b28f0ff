"""`flash-torch`: FlashAttention-2 written in plain PyTorch.

    O = softmax(Q K^T / sqrt(d)) V

FlashAttention (Dao et al. 2022) never materialises the (T_q, T_k) score matrix. The forward
pass walks over tiles of queries and keys and keeps, per query row, a running max m, a running
sum l and an unnormalised output accumulator, rescaling them whenever a new key tile raises
the max: the "online softmax". FlashAttention-2 (Dao 2023, Algorithm 1) puts the query tile
in the outer loop and defers the division by l to the end of the row, so each query tile
finishes with one normalisation. For backward it saves only Q, K, V, O and the logsumexp
L = m + log(l) per query row: O(T d) memory instead of O(T^2), and the backward recomputes
P = exp(S - L) from L instead of storing it.

This module is the readable version of the algorithm; the loops over tiles run in Python, so
each tile is one batched matmul over every (batch, head) pair at once. The Triton kernel in
`flash_triton.py` runs the same algorithm with one program per query tile.

    o = flash_attention_torch(q, k, v, is_causal=True)   # q (B, [H,] T_q, D); k, v (B, [H,] T_k, D)
    o = FlashAttention2Torch.apply(q, k, v, True)         # the same, as an autograd.Function

The backward is a plain (untiled) PyTorch function, `flash_backward`, compiled with
torch.compile where a compiler is available. The environment variable
CS336SYS_FLASH_TORCH_COMPILE=0 forces the eager function and =1 forces compilation; unset,
it compiles on CUDA, and on CPU when a C++ compiler (which inductor needs) is on PATH.
"""

from __future__ import annotations

import functools
import math
import os
import shutil

import torch

from cs336sys.attention.opt_in import FLASH_TORCH_COMPILE
from cs336sys.measure.nvtx import nvtx_range

# Tile sizes (rows of Q and rows of K/V per tile). 64 is the textbook choice for head dims up
# to 128: a (64, 64) float32 score tile and a (64, 128) accumulator are small enough to stay
# in a GPU's on-chip memory, which is what the Triton kernel relies on. Here a larger tile
# only means fewer Python iterations, but we keep 64 so both implementations walk the same
# tiles. Each tile is clamped to the sequence length rounded up to 16 (the smallest shape a
# tensor-core matmul accepts), so a 20-token sequence uses one 32-row tile, not a 64-row one.
Q_TILE = 64
K_TILE = 64
MIN_TILE = 16

COMPILE_ENV = FLASH_TORCH_COMPILE


def _tile_size(requested: int, seq_len: int) -> int:
    """`requested` clamped to `seq_len` rounded up to a multiple of MIN_TILE."""
    if requested < MIN_TILE:
        raise ValueError(f"tile size must be at least {MIN_TILE}, got {requested}")
    return min(requested, MIN_TILE * math.ceil(seq_len / MIN_TILE))


# --------------------------------------------------------------------------------------------
# Forward: tiled, with the online softmax (Dao 2023, Algorithm 1)


def flash_forward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    is_causal: bool = False,
    q_tile: int = Q_TILE,
    k_tile: int = K_TILE,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention output O and logsumexp L of q (..., T_q, D) against k, v (..., T_k, D).

    Returns O (..., T_q, D) in q's dtype and L (..., T_q) in float32 (natural log), where
    L[i] = log(sum_j exp(S[i, j])) over the keys query i may see. With `is_causal`, query i
    sees keys j <= i (top-left aligned, as torch SDPA, also when T_q != T_k).
    """
    *batch, n_queries, d = q.shape
    n_keys = k.shape[-2]
    scale = 1.0 / math.sqrt(d)
    bq, bk = _tile_size(q_tile, n_queries), _tile_size(k_tile, n_keys)

    # One leading batch dimension, so 3-D (B, T, D) and 4-D (B, H, T, D) inputs take the same
    # path: every tile below is one batched matmul over all (batch, head) pairs.
    q3 = q.reshape(-1, n_queries, d)  # (N, T_q, D), N = B or B*H
    k3 = k.reshape(-1, n_keys, d)  # (N, T_k, D)
    v3 = v.reshape(-1, n_keys, d)  # (N, T_k, D)
    n = q3.shape[0]

    o = torch.empty(n, n_queries, d, dtype=q.dtype, device=q.device)  # (N, T_q, D)
    lse = torch.empty(n, n_queries, dtype=torch.float32, device=q.device)  # (N, T_q)

    with nvtx_range("flash forward"):
        # Outer loop over query tiles (FlashAttention-2's order): each query tile reads every
        # key tile it needs and writes its rows of O and L exactly once. The last tile of a
        # sequence that is not a multiple of the tile size is simply shorter: slicing is
        # PyTorch's way of masking the tail, with no padded rows to mask out later.
        for q_start in range(0, n_queries, bq):
            q_end = min(q_start + bq, n_queries)
            # The scores are computed in float32 from the inputs' exact values, as a tensor
            # core multiplies low-precision operands into a float32 accumulator; rounding S
            # to bf16 would cost more accuracy in L than the whole rest of the algorithm.
            qi = q3[:, q_start:q_end].float()  # (N, bq, D)

            # Running statistics per query row, all in float32 (Algorithm 1, line 4):
            # m (running max) and l (running sum) in the paper's notation.
            m = torch.full((n, q_end - q_start), float("-inf"), device=q.device)  # (N, bq)
            row_sum = torch.zeros(n, q_end - q_start, device=q.device)  # (N, bq)
            acc = torch.zeros(n, q_end - q_start, d, device=q.device)  # (N, bq, D)

            # Causal: key tiles that start after this tile's last query are entirely masked,
            # so we stop before them rather than computing scores only to discard them. This
            # skips about half of all tiles when T_q = T_k.
            k_stop = min(n_keys, q_end) if is_causal else n_keys
            for k_start in range(0, k_stop, bk):
                k_end = min(k_start + bk, n_keys)
                kj = k3[:, k_start:k_end].float()  # (N, bk, D)
                vj = v3[:, k_start:k_end]  # (N, bk, D)

                s = qi @ kj.transpose(-2, -1) * scale  # (N, bq, bk)
                # Only tiles that straddle the diagonal need a mask; the others are either
                # fully visible or were skipped above.
                if is_causal and k_end - 1 > q_start:
                    rows = torch.arange(q_start, q_end, device=q.device)  # (bq,)
                    cols = torch.arange(k_start, k_end, device=q.device)  # (bk,)
                    s = s.masked_fill(cols[None, :] > rows[:, None], float("-inf"))

                # Online softmax (Algorithm 1, lines 8-10). Every row has a finite max after
                # the first key tile, because with top-left alignment every query sees key 0;
                # so m_new is finite and exp(-inf) = 0 handles masked entries.
                m_new = torch.maximum(m, s.amax(dim=-1))  # (N, bq)
                p = torch.exp(s - m_new[..., None])  # (N, bq, bk) P~, unnormalised
                alpha = torch.exp(m - m_new)  # (N, bq) rescales what was summed so far
                row_sum = alpha * row_sum + p.sum(dim=-1)  # (N, bq)
                # P~ is cast to V's dtype before the product, as the kernel feeds both
                # operands to a low-precision matmul; the accumulator stays in float32
                # (unlike a kernel's, this tile's product is rounded to V's dtype first).
                acc = alpha[..., None] * acc + (p.to(v.dtype) @ vj).float()  # (N, bq, D)
                m = m_new

            # Deferred normalisation (Algorithm 1, lines 12-13): divide by l once per row and
            # keep L = m + log(l), all the backward needs to rebuild P.
            o[:, q_start:q_end] = (acc / row_sum[..., None]).to(q.dtype)
            lse[:, q_start:q_end] = m + torch.log(row_sum)

    return o.reshape(q.shape), lse.reshape(*batch, n_queries)  # (..., T_q, D), (..., T_q)


# --------------------------------------------------------------------------------------------
# Backward: recompute P from L (Dao 2023, Section 3.1.2 and Algorithm 2)


def flash_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    o: torch.Tensor,
    lse: torch.Tensor,
    do: torch.Tensor,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients dQ, dK, dV of attention, recomputing P = exp(S - L) from the logsumexp.

    q, o, do (..., T_q, D); k, v (..., T_k, D); lse (..., T_q) float32. Returns gradients in
    the dtypes of q, k and v.

    This is the readable form: it materialises the (T_q, T_k) matrices for one call, which
    FlashAttention's tiled backward avoids. Under torch.compile, inductor fuses the
    elementwise steps between the matmuls, so S, P, dP and dS each cost one pass, not several.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d)
    qf, kf, vf = q.float(), k.float(), v.float()  # (..., T, D) in float32
    dof = do.float()  # (..., T_q, D)

    s = qf @ kf.transpose(-2, -1) * scale  # (..., T_q, T_k)
    if is_causal:  # the same top-left aligned mask as the forward
        keep = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
        s = s.masked_fill(~keep, float("-inf"))
    # Softmax rebuilt from the saved logsumexp: already normalised, no max or sum needed.
    p = torch.exp(s - lse[..., None])  # (..., T_q, T_k)

    # D_i = rowsum(dO_i * O_i) equals rowsum(P_i * dP_i), the term the softmax Jacobian
    # subtracts; computing it from O avoids a reduction over the (T_q, T_k) matrix
    # (Dao 2023, Algorithm 2, line 4).
    delta = (dof * o.float()).sum(dim=-1)  # (..., T_q)

    dv = p.transpose(-2, -1) @ dof  # (..., T_k, D)
    dp = dof @ vf.transpose(-2, -1)  # (..., T_q, T_k)
    ds = p * (dp - delta[..., None])  # (..., T_q, T_k)
    dq = ds @ kf * scale  # (..., T_q, D)
    dk = ds.transpose(-2, -1) @ qf * scale  # (..., T_k, D)
    return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype)


@functools.cache
def _compiled_backward():
    """flash_backward under torch.compile, built once per process (compiles on first call)."""
    return torch.compile(flash_backward)


def _should_compile(t: torch.Tensor) -> bool:
    """Whether the backward for tensors like `t` runs compiled; see the module docstring."""
    flag = os.environ.get(COMPILE_ENV, "")  # read per call, so tests and runs can flip it
    if flag == "0":
        return False
    if flag == "1":
        return True
    if flag:
        raise ValueError(f"{COMPILE_ENV} must be 0, 1 or unset, got {flag!r}")
    # Inductor generates Triton on CUDA, and C++ (built with the host compiler) on CPU.
    return t.is_cuda or any(shutil.which(cxx) for cxx in ("g++", "c++", "clang++"))


def attention_backward(q, k, v, o, lse, do, is_causal=False):
    """flash_backward, compiled or eager according to `_should_compile`."""
    fn = _compiled_backward() if _should_compile(q) else flash_backward
    with nvtx_range("flash backward"):
        return fn(q, k, v, o, lse, do, is_causal)


# --------------------------------------------------------------------------------------------
# The autograd.Function and the registry entry point


class FlashAttention2Torch(torch.autograd.Function):
    """FlashAttention-2 forward (tiled, online softmax) and a recomputing backward.

    FlashAttention2Torch.apply(q, k, v, is_causal=False) for q (B, T_q, D) or (B, H, T_q, D)
    and k, v (B, T_k, D) or (B, H, T_k, D). Saves exactly Q, K, V, O and L for backward.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = flash_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None


def flash_attention_torch(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v by FlashAttention-2 in PyTorch.

    q (B, T_q, D) or (B, H, T_q, D); k and v (B, T_k, D) or (B, H, T_k, D); D from 16 to 128;
    float32, bfloat16 or float16. Returns (B, [H,] T_q, D) in q's dtype. With `is_causal`,
    query i sees keys j <= i (top-left aligned, as torch SDPA).
    """
    return FlashAttention2Torch.apply(q, k, v, is_causal)
