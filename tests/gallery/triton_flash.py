"""FlashAttention-2 forwards in Triton as students write them, the backward in PyTorch from
the saved logsumexp (copied into a course-layout repository as
cs336_systems/gallery_triton_flash.py by tests/test_gallery_attention.py). Inputs (batch, seq, d),
as the course's tests give them.

`Pointers`: pointer arithmetic, right. `NoCausalMask`: the same kernel that never masks.
`BlockPointers`: the tiles through tl.make_block_ptr, as the course teaches (Triton <= 3.6).
The backward is gallery_attention's, beside it in the repository.
"""

import math

import torch
import triton
import triton.language as tl
from cs336_systems.gallery_attention import backward


@triton.jit
def _load_tile(base, rows, dims, N, stride_t, start, BLOCK_PTR: tl.constexpr,
               ROWS: tl.constexpr, D: tl.constexpr):
    """Rows `start`.. of an (N, D) matrix: through a block pointer, or pointer arithmetic."""
    if BLOCK_PTR:
        ptr = tl.make_block_ptr(base, (N, D), (stride_t, 1), (start, 0), (ROWS, D), (1, 0))
        return tl.load(ptr, boundary_check=(0, 1), padding_option="zero")
    return tl.load(base + rows[:, None] * stride_t + dims[None, :], mask=rows[:, None] < N,
                   other=0.0)


@triton.jit
def _fwd(Q, K, V, Out, L, stride_b, stride_t, N, scale, D: tl.constexpr, BQ: tl.constexpr,
         BK: tl.constexpr, CAUSAL: tl.constexpr, BLOCK_PTR: tl.constexpr):
    qi, b = tl.program_id(0), tl.program_id(1)
    rows = qi * BQ + tl.arange(0, BQ)
    dims = tl.arange(0, D)
    q = _load_tile(Q + b * stride_b, rows, dims, N, stride_t, qi * BQ, BLOCK_PTR, BQ, D)
    m = tl.full([BQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, D], tl.float32)
    for start in range(0, N, BK):
        cols = start + tl.arange(0, BK)
        k = _load_tile(K + b * stride_b, cols, dims, N, stride_t, start, BLOCK_PTR, BK, D)
        v = _load_tile(V + b * stride_b, cols, dims, N, stride_t, start, BLOCK_PTR, BK, D)
        s = tl.dot(q, tl.trans(k)) * scale
        s = tl.where(cols[None, :] < N, s, -1.0e6)
        if CAUSAL:
            s = tl.where(cols[None, :] <= rows[:, None], s, -1.0e6)
        m_new = tl.maximum(m, tl.max(s, 1))
        p = tl.exp(s - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l_i = alpha * l_i + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    tl.store(Out + b * stride_b + rows[:, None] * stride_t + dims[None, :],
             (acc / l_i[:, None]).to(Out.dtype.element_ty), mask=rows[:, None] < N)
    tl.store(L + b * N + rows, m + tl.log(l_i), mask=rows < N)


def _function(block_ptr: bool, mask: bool):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            q, k, v = (t.contiguous() for t in (q, k, v))
            b, n, d = q.shape  # (B, T, D)
            o = torch.empty_like(q)
            lse = torch.empty(b, n, device=q.device, dtype=torch.float32)
            _fwd[(triton.cdiv(n, 16), b)](q, k, v, o, lse, q.stride(0), q.stride(1), n,
                                          1 / math.sqrt(d), D=d, BQ=16, BK=16,
                                          CAUSAL=bool(is_causal and mask), BLOCK_PTR=block_ptr)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal = is_causal and mask
            return o

        @staticmethod
        def backward(ctx, do):  # in PyTorch, as the course allows
            return *backward(*ctx.saved_tensors, do, ctx.is_causal), None

    return Attention


Pointers = _function(block_ptr=False, mask=True)
NoCausalMask = _function(block_ptr=False, mask=False)
BlockPointers = _function(block_ptr=True, mask=True)
