"""BasicsTransformerLM with the course's constructor, written in plain PyTorch: a pre-norm
decoder with RMSNorm, RoPE on interleaved pairs, SwiGLU and an untied LM head."""

import math

import torch
from torch import nn


class Linear(nn.Module):
    def __init__(self, d_in, d_out):
        super().__init__()
        std = math.sqrt(2 / (d_in + d_out))
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(d_out, d_in), std=std, a=-3 * std, b=3 * std))

    def forward(self, x):
        return x @ self.weight.T


class Embedding(nn.Module):
    def __init__(self, vocab_size, d_model):
        super().__init__()
        self.weight = nn.Parameter(nn.init.trunc_normal_(torch.empty(vocab_size, d_model), std=1, a=-3, b=3))

    def forward(self, token_ids):
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    def __init__(self, d_model, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x):
        dtype = x.dtype
        x = x.float()
        return (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight).to(dtype)


class RotaryEmbedding(nn.Module):
    def __init__(self, context_length, dim, theta=10000.0):
        super().__init__()
        freqs = theta ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)
        angles = torch.outer(torch.arange(context_length, dtype=torch.float64), freqs)
        self.register_buffer("_cos", angles.cos().float(), persistent=False)
        self.register_buffer("_sin", angles.sin().float(), persistent=False)

    def forward(self, x, positions):
        cos, sin = self._cos[positions], self._sin[positions]
        x1, x2 = x[..., 0::2].float(), x[..., 1::2].float()
        rotated = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)
        return rotated.flatten(-2).to(x.dtype)


def scaled_dot_product_attention(q, k, v, mask=None):
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model, num_heads, positional_encoder):
        super().__init__()
        self.num_heads = num_heads
        self.q_proj, self.k_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.v_proj, self.output_proj = Linear(d_model, d_model), Linear(d_model, d_model)
        self.positional_encoder = positional_encoder

    def forward(self, x):
        b, t, d = x.shape
        heads = lambda y: y.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)  # noqa: E731
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        positions = torch.arange(t, device=x.device)
        q, k = self.positional_encoder(q, positions), self.positional_encoder(k, positions)
        mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        y = scaled_dot_product_attention(q, k, v, mask)
        return self.output_proj(y.transpose(1, 2).reshape(b, t, d))


class SwiGLU(nn.Module):
    def __init__(self, d_model, d_ff):
        super().__init__()
        self.w1, self.w2, self.w3 = Linear(d_model, d_ff), Linear(d_ff, d_model), Linear(d_model, d_ff)

    def forward(self, x):
        return self.w2(nn.functional.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, d_model, num_heads, d_ff, positional_encoder):
        super().__init__()
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, positional_encoder)
        self.ffn = SwiGLU(d_model, d_ff)
        self.ln1, self.ln2 = RMSNorm(d_model), RMSNorm(d_model)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class BasicsTransformerLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        self.context_length = context_length
        self.token_embeddings = Embedding(vocab_size, d_model)
        rope = RotaryEmbedding(context_length, d_model // num_heads, rope_theta)
        self.layers = nn.ModuleList(TransformerBlock(d_model, num_heads, d_ff, rope) for _ in range(num_layers))
        self.ln_final = RMSNorm(d_model)
        self.lm_head = Linear(d_model, vocab_size)

    def forward(self, x):
        h = self.token_embeddings(x)
        for layer in self.layers:
            h = layer(h)
        return self.lm_head(self.ln_final(h))
