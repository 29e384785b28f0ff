"""The CS336 "basics" Transformer LM, read top to bottom.

A pre-norm decoder-only Transformer (Vaswani et al. 2017; pre-norm as in GPT-2, Radford et
al. 2019) with the choices of modern LMs such as LLaMA (Touvron et al. 2023):

  - RMSNorm instead of LayerNorm (Zhang & Sennrich 2019),
  - rotary position embeddings on queries and keys (Su et al. 2021, RoFormer),
  - a SwiGLU feed-forward network (Shazeer 2020),
  - no biases, and an LM head that is not tied to the token embeddings.

Weights live in plain nn.Linear / nn.Embedding modules so that FSDP, activation
checkpointing and mixed-precision code can find them by type. The attention kernel is chosen
by name from `cs336sys.attention.registry`, so the benchmarks swap kernels without touching
this file.

Shapes: B batch, T sequence length, H heads, D = d_head, C = d_model, V = vocab size.
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from cs336sys.attention import registry
from cs336sys.measure.nvtx import nvtx_range
from cs336sys.models.config import ModelConfig, checkpoint_groups
from cs336sys.models.fused_ce import linear_cross_entropy


class RMSNorm(nn.Module):
    """x / sqrt(mean(x^2) + eps) * g   (Zhang & Sennrich 2019).

    Computed in float32 and cast back: squaring bf16/fp16 activations loses precision or
    overflows, and the cost is negligible next to the matmuls.
    """

    def __init__(self, d_model: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        in_dtype = x.dtype
        x = x.float()
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)  # (..., 1)
        return (x / rms * self.weight.float()).to(in_dtype)


class RotaryEmbedding(nn.Module):
    """Rotary position embedding (Su et al. 2021, RoFormer, eq. 34).

    Dimension pair (x[..., 2i], x[..., 2i+1]) at position p is rotated by the angle
    p * theta^(-2i/D). Rotating q at position m and k at position n makes <q, k> depend on
    m - n only, which is how RoPE injects relative position into attention.
    """

    def __init__(self, d_head: int, max_seq_len: int, theta: float = 10_000.0) -> None:
        super().__init__()
        if d_head % 2 != 0:
            raise ValueError(f"RoPE needs an even d_head, got {d_head}.")
        self.d_head = d_head
        self.max_seq_len = max_seq_len
        self.theta = theta
        cos, sin = self._tables(device=None)
        # Non-persistent: derived from the config, so they stay out of checkpoints.
        self.register_buffer("cos", cos, persistent=False)  # (max_seq_len, D/2)
        self.register_buffer("sin", sin, persistent=False)  # (max_seq_len, D/2)

    def _tables(self, device: torch.device | None) -> tuple[torch.Tensor, torch.Tensor]:
        # Angles in float64: p * freq reaches thousands of radians, where the float32
        # rounding of the angle alone is ~1e-4; only the final cos/sin are stored as float32.
        i = torch.arange(0, self.d_head, 2, dtype=torch.float64, device=device)  # (D/2,)
        inv_freq = self.theta ** (-i / self.d_head)  # (D/2,)
        positions = torch.arange(self.max_seq_len, dtype=torch.float64, device=device)
        angles = torch.outer(positions, inv_freq)  # (max_seq_len, D/2)
        return angles.cos().float(), angles.sin().float()

    def _apply(self, fn, recurse=True):
        # Rebuild the tables after every .to() / .cuda() / .to_empty(): model.to(bfloat16)
        # would otherwise put every angle at bf16 precision, and a model built on the meta
        # device and materialised with to_empty() would otherwise hold garbage here.
        super()._apply(fn, recurse)
        self.cos, self.sin = self._tables(device=self.cos.device)
        return self

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        """x (..., T, D), token_positions (..., T) or (T,) -> rotated x, same shape and dtype."""
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        cos = self.cos[token_positions].to(compute_dtype)  # (..., T, D/2)
        sin = self.sin[token_positions].to(compute_dtype)  # (..., T, D/2)
        pairs = x.to(compute_dtype).unflatten(-1, (-1, 2))  # (..., T, D/2, 2)
        x_even, x_odd = pairs[..., 0], pairs[..., 1]  # (..., T, D/2) each
        rotated = torch.stack(
            (x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1
        )  # (..., T, D/2, 2)
        return rotated.flatten(-2).to(x.dtype)  # (..., T, D)


class CausalSelfAttention(nn.Module):
    """Multi-head causal self-attention with RoPE; the kernel comes from the registry."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        d = config.d_model
        self.num_heads = config.num_heads
        self.d_head = config.d_head
        self.q_proj = nn.Linear(d, d, bias=False)
        self.k_proj = nn.Linear(d, d, bias=False)
        self.v_proj = nn.Linear(d, d, bias=False)
        self.output_proj = nn.Linear(d, d, bias=False)
        self.rope = RotaryEmbedding(config.d_head, config.context_length, config.rope_theta)
        # fn(q, k, v, is_causal=...) on (B, H, T, D); resolved once, not per call.
        self.attention_fn = registry.get(config.attention)
        self.attention_name = config.attention

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        with nvtx_range("attention"):
            B, T, C = x.shape
            # (B, T, C) -> (B, T, H, D) -> (B, H, T, D)
            q = self.q_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)
            k = self.k_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)
            v = self.v_proj(x).view(B, T, self.num_heads, self.d_head).transpose(1, 2)

            # Positions (B, T) -> (B, 1, T) to broadcast over heads; (T,) broadcasts as is.
            if token_positions.dim() > 1:
                token_positions = token_positions.unsqueeze(-2)
            q = self.rope(q, token_positions)  # (B, H, T, D)
            k = self.rope(k, token_positions)  # (B, H, T, D)

            y = self.attention_fn(q, k, v, is_causal=True)  # (B, H, T, D)
            if y.shape != q.shape:  # a user's kernel: said so, not as the reshape's error
                raise ValueError(f"{self.attention_name} returned O of shape {tuple(y.shape)}, "
                                 f"expected (B, H, T, D) = {tuple(q.shape)}")
            y = y.transpose(1, 2).reshape(B, T, C)  # (B, T, H, D) -> (B, T, C)
            return self.output_proj(y)


class SwiGLU(nn.Module):
    """W2 (SiLU(W1 x) * W3 x)   (Shazeer 2020, "GLU Variants Improve Transformer")."""

    def __init__(self, d_model: int, d_ff: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(d_model, d_ff, bias=False)
        self.w2 = nn.Linear(d_ff, d_model, bias=False)
        self.w3 = nn.Linear(d_model, d_ff, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))  # (B, T, d_ff) -> (B, T, C)


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attn(norm(x)), then x + ffn(norm(x)) (Xiong et al. 2020)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.ln1 = RMSNorm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.ln2 = RMSNorm(config.d_model)
        self.ffn = SwiGLU(config.d_model, config.d_ff)

    def forward(self, x: torch.Tensor, token_positions: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x), token_positions)
        return x + self.ffn(self.ln2(x))


class LMHead(nn.Linear):
    """Hidden states (B, T, C) -> logits (B, T, V); given the targets, the cross-entropy
    summed over tokens instead, with the head and the loss fused (models/fused_ce.py) so the
    logits never exist whole.

    The fused loss reads the weight inside this module's forward, not beside it: a wrapper
    that gathers a unit's weights around its forward (an FSDP) has gathered them then, and
    one that hooks the model's forward (torch's DDP) has seen the whole step.
    """

    def forward(
        self, x: torch.Tensor, targets: torch.Tensor | None = None, ce_impl: str = "torch"
    ) -> torch.Tensor:
        if targets is None:
            return super().forward(x)  # (B, T, V)
        return linear_cross_entropy(x, self.weight, targets, reduction="sum", impl=ce_impl)


class TransformerLM(nn.Module):
    """Token ids (B, T) -> next-token logits (B, T, V); with the targets, the summed loss."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        config.validate()
        self.config = config
        self.token_embeddings = nn.Embedding(config.vocab_size, config.d_model)
        # A plain ModuleList so activation checkpointing can wrap groups of layers.
        self.layers = nn.ModuleList(TransformerBlock(config) for _ in range(config.num_layers))
        self.ln_final = RMSNorm(config.d_model)
        self.lm_head = LMHead(config.d_model, config.vocab_size, bias=False)
        self.reset_parameters()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """The CS336 initialisation: truncated normals cut at 3 standard deviations.

        Linear: std = sqrt(2 / (d_in + d_out)) (Glorot & Bengio 2010); embedding: std = 1.
        RMSNorm gains are 1 (set in RMSNorm).
        """
        for module in self.modules():
            if isinstance(module, nn.Linear):
                std = math.sqrt(2.0 / (module.in_features + module.out_features))
                nn.init.trunc_normal_(module.weight, mean=0.0, std=std, a=-3 * std, b=3 * std)
            elif isinstance(module, nn.Embedding):
                nn.init.trunc_normal_(module.weight, mean=0.0, std=1.0, a=-3.0, b=3.0)

    def _run_layers(self, x: torch.Tensor, positions: torch.Tensor, start: int, end: int):
        for layer in self.layers[start:end]:
            x = layer(x, positions)  # (B, T, C)
        return x

    def forward(
        self,
        token_ids: torch.Tensor,
        token_positions: torch.Tensor | None = None,
        targets: torch.Tensor | None = None,
        ce_impl: str = "torch",
    ) -> torch.Tensor:
        """The logits (B, T, V); given `targets` (B, T), the cross-entropy summed over the
        tokens from the fused LM head and loss (`ce_impl` "torch" or "triton"), the training
        step's loss without the (B, T, V) logits."""
        h = self.hidden(token_ids, token_positions)  # (B, T, C)
        if targets is None:
            return self.lm_head(h)  # (B, T, V)
        return self.lm_head(h, targets, ce_impl)  # (,)

    def hidden(
        self, token_ids: torch.Tensor, token_positions: torch.Tensor | None = None
    ) -> torch.Tensor:
        """The final-norm hidden states (B, T, C) the LM head reads: what a fused LM head +
        cross-entropy takes instead of the (B, T, V) logits (models/fused_ce.py)."""
        B, T = token_ids.shape
        if T > self.config.context_length:
            raise ValueError(
                f"sequence length {T} exceeds context_length={self.config.context_length}."
            )
        if token_positions is None:
            token_positions = torch.arange(T, device=token_ids.device)  # (T,)

        x = self.token_embeddings(token_ids)  # (B, T, C)
        groups = checkpoint_groups(self.config.checkpoint, len(self.layers))
        if groups is None or not torch.is_grad_enabled():
            for layer in self.layers:
                x = layer(x, token_positions)  # (B, T, C)
        else:
            # Keep only each group's input for backward and recompute the group's activations
            # then: memory for one group at a time, at the cost of a second forward.
            start = 0
            for size in groups:
                x = checkpoint(
                    self._run_layers,
                    x,
                    token_positions,
                    start,
                    start + size,
                    use_reentrant=False,  # the recommended mode: works with kwargs and no-grad inputs
                )  # (B, T, C)
                start += size
        return self.ln_final(x)  # (B, T, C)
