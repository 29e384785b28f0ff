"""FlashAttention-2 forwards in Triton as students write them, the backward in PyTorch from
the saved logsumexp (copied into a course-layout repository as
cs336_systems/gallery_triton.py by tests/test_gallery_attention.py). Inputs (batch, seq, d),
as the course's tests give them.

`Pointers`: pointer arithmetic, right. `NoCausalMask`: the same kernel that never masks.
`BlockPointers`: tl.make_block_ptr and tl.advance, as the course teaches (Triton <= 3.6).
"""

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _fwd_pointers(Q, K, V, Out, L, stride_b, stride_t, N, scale, D: tl.constexpr,
                  BQ: tl.constexpr, BK: tl.constexpr, CAUSAL: tl.constexpr):
    qi, b = tl.program_id(0), tl.program_id(1)
    rows = qi * BQ + tl.arange(0, BQ)
    dims = tl.arange(0, D)
    q = tl.load(Q + b * stride_b + rows[:, None] * stride_t + dims[None, :],
                mask=rows[:, None] < N, other=0.0)
    m = tl.full([BQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, D], tl.float32)
    for start in range(0, N, BK):
        cols = start + tl.arange(0, BK)
        k = tl.load(K + b * stride_b + cols[:, None] * stride_t + dims[None, :],
                    mask=cols[:, None] < N, other=0.0)
        v = tl.load(V + b * stride_b + cols[:, None] * stride_t + dims[None, :],
                    mask=cols[:, None] < N, other=0.0)
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


@triton.jit
def _fwd_block_pointers(Q, K, V, Out, L, stride_b, stride_t, N, scale, D: tl.constexpr,
                        BQ: tl.constexpr, BK: tl.constexpr, CAUSAL: tl.constexpr):
    qi, b = tl.program_id(0), tl.program_id(1)
    q_ptr = tl.make_block_ptr(Q + b * stride_b, (N, D), (stride_t, 1), (qi * BQ, 0), (BQ, D), (1, 0))
    k_ptr = tl.make_block_ptr(K + b * stride_b, (N, D), (stride_t, 1), (0, 0), (BK, D), (1, 0))
    v_ptr = tl.make_block_ptr(V + b * stride_b, (N, D), (stride_t, 1), (0, 0), (BK, D), (1, 0))
    rows = qi * BQ + tl.arange(0, BQ)
    q = tl.load(q_ptr, boundary_check=(0, 1), padding_option="zero")
    m = tl.full([BQ], float("-inf"), tl.float32)
    l_i = tl.zeros([BQ], tl.float32)
    acc = tl.zeros([BQ, D], tl.float32)
    for start in range(0, N, BK):
        cols = start + tl.arange(0, BK)
        k = tl.load(k_ptr, boundary_check=(0, 1), padding_option="zero")
        v = tl.load(v_ptr, boundary_check=(0, 1), padding_option="zero")
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
        k_ptr = tl.advance(k_ptr, (BK, 0))
        v_ptr = tl.advance(v_ptr, (BK, 0))
    o_ptr = tl.make_block_ptr(Out + b * stride_b, (N, D), (stride_t, 1), (qi * BQ, 0), (BQ, D), (1, 0))
    tl.store(o_ptr, (acc / l_i[:, None]).to(Out.dtype.element_ty), boundary_check=(0, 1))
    tl.store(L + b * N + rows, m + tl.log(l_i), mask=rows < N)


def _function(kernel, mask: bool):
    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            q, k, v = (t.contiguous() for t in (q, k, v))
            b, n, d = q.shape  # (B, T, D)
            o = torch.empty_like(q)
            lse = torch.empty(b, n, device=q.device, dtype=torch.float32)
            kernel[(triton.cdiv(n, 16), b)](q, k, v, o, lse, q.stride(0), q.stride(1), n,
                                            1 / math.sqrt(d), D=d, BQ=16, BK=16,
                                            CAUSAL=bool(is_causal and mask))
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal = is_causal
            return o

        @staticmethod
        def backward(ctx, do):
            q, k, v, o, lse = ctx.saved_tensors
            qf, kf, vf, of, dof = (t.float() for t in (q, k, v, o, do))
            scale = 1 / math.sqrt(q.shape[-1])
            s = qf @ kf.transpose(-1, -2) * scale
            if ctx.is_causal and mask:
                above = torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1)
                s = s.masked_fill(above, float("-inf"))
            p = torch.exp(s - lse[..., None])
            dv = p.transpose(-1, -2) @ dof
            ds = p * (dof @ vf.transpose(-1, -2) - (of * dof).sum(-1, keepdim=True))
            return ((ds @ kf * scale).to(q.dtype), (ds.transpose(-1, -2) @ qf * scale).to(k.dtype),
                    dv.to(v.dtype), None)

    return Attention


Pointers = _function(_fwd_pointers, mask=True)
NoCausalMask = _function(_fwd_pointers, mask=False)
BlockPointers = _function(_fwd_block_pointers, mask=True)
