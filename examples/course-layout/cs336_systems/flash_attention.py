"""FlashAttention-2's forward pass in plain PyTorch (Dao 2023, Algorithm 1), with a
backward that recomputes P from the saved logsumexp L: what the course asks for first."""

import math

import torch

TILE_Q = 32
TILE_K = 32


class FlashAttentionPytorch(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        # q: (..., Nq, d); k, v: (..., Nk, d)
        n_q, d = q.shape[-2], q.shape[-1]
        n_k = k.shape[-2]
        scale = 1.0 / math.sqrt(d)
        o = torch.empty_like(q)
        logsumexp = torch.empty(q.shape[:-1], device=q.device, dtype=torch.float32)
        for i in range(0, n_q, TILE_Q):
            q_i = q[..., i : i + TILE_Q, :].float()
            rows = q_i.shape[-2]
            m = torch.full((*q.shape[:-2], rows), float("-inf"), device=q.device)
            row_sum = torch.zeros((*q.shape[:-2], rows), device=q.device)  # the paper's l
            acc = torch.zeros((*q.shape[:-2], rows, d), device=q.device)
            for j in range(0, n_k, TILE_K):
                k_j, v_j = k[..., j : j + TILE_K, :].float(), v[..., j : j + TILE_K, :].float()
                s = q_i @ k_j.transpose(-1, -2) * scale
                if is_causal:
                    qi = torch.arange(i, i + rows, device=q.device)[:, None]
                    kj = torch.arange(j, j + k_j.shape[-2], device=q.device)[None, :]
                    s = s.masked_fill(kj > qi, float("-inf"))
                m_new = torch.maximum(m, s.amax(dim=-1))
                p = torch.exp(s - m_new[..., None])
                correction = torch.exp(m - m_new)
                row_sum = correction * row_sum + p.sum(dim=-1)
                acc = correction[..., None] * acc + p @ v_j
                m = m_new
            o[..., i : i + rows, :] = (acc / row_sum[..., None]).to(q.dtype)
            logsumexp[..., i : i + rows] = m + torch.log(row_sum)
        ctx.save_for_backward(q, k, v, o, logsumexp)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, o, logsumexp = ctx.saved_tensors
        scale = 1.0 / math.sqrt(q.shape[-1])
        qf, kf, vf, of, do = (t.float() for t in (q, k, v, o, grad_out))
        s = qf @ kf.transpose(-1, -2) * scale
        if ctx.is_causal:
            n_q, n_k = q.shape[-2], k.shape[-2]
            mask = torch.arange(n_k, device=q.device)[None, :] > torch.arange(n_q, device=q.device)[:, None]
            s = s.masked_fill(mask, float("-inf"))
        p = torch.exp(s - logsumexp[..., None])
        dv = p.transpose(-1, -2) @ do
        dp = do @ vf.transpose(-1, -2)
        d_row = (of * do).sum(dim=-1, keepdim=True)
        ds = p * (dp - d_row)
        dq = ds @ kf * scale
        dk = ds.transpose(-1, -2) @ qf * scale
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None
