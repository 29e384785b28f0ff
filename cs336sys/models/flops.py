"""Model FLOPs of a step, counting matrix multiplications only.

This is the convention of PaLM (Chowdhery et al. 2022, Appendix B) used for model FLOPs
utilisation (MFU): a multiply-accumulate is 2 FLOPs, element-wise work (norms, softmax, SiLU,
RoPE, the embedding lookup) is ignored, and the backward pass costs twice the forward pass
(one matmul for the gradient of the input, one for the gradient of the weight).

The attention term counts the full T x T score matrix for both QK^T and PV, *not* halved for
the causal mask: that is what PaLM does, it is what a dense kernel executes, and it makes
the number independent of the attention implementation, so MFU compares implementations on
equal terms (a kernel that skips masked blocks simply reaches a higher MFU).

torch-free, so the CLI can print it without importing torch.
"""

from __future__ import annotations

from cs336sys.models.config import ModelConfig

STEP_MODES: tuple[str, ...] = ("forward", "forward-backward", "train")


def forward_flops(config: ModelConfig, batch: int, seq: int) -> int:
    """Matmul FLOPs of one forward pass over `batch` sequences of `seq` tokens."""
    b, t = batch, seq
    d, d_ff, n_layers, vocab = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    # Per token: q, k, v, o projections (4 d x d), SwiGLU w1, w3, w2 (3 d x d_ff), LM head.
    dense = b * t * (n_layers * (2 * 4 * d * d + 2 * 3 * d * d_ff) + 2 * d * vocab)
    return dense + attention_matmul_flops(config, batch, seq)


def attention_matmul_flops(config: ModelConfig, batch: int, seq: int) -> int:
    """The attention's part of forward_flops: per layer and head, QKᵀ is (T, D) @ (D, T) and
    PV is (T, T) @ (T, D), 2·T·T·D each (full T x T, as PaLM counts)."""
    t = seq
    return config.num_layers * batch * config.num_heads * (2 * t * t * config.d_head) * 2


def attention_forward_flops(batch: int, heads: int, seq: int, d_head: int, causal: bool) -> float:
    """One attention call's forward: QKᵀ and PV, 2 matmuls of 2·T·T·d FLOPs per (batch,
    head); a causal call computes half (what the attention benchmarks count, unlike the
    model's PaLM convention above)."""
    full = 4 * batch * heads * seq * seq * d_head
    return full / 2 if causal else full


def step_flops(config: ModelConfig, batch: int, seq: int, mode: str) -> int:
    """Matmul FLOPs of one benchmark step in `mode` ("forward", "forward-backward", "train").

    Backward is 2x forward, so forward-backward is 3x. "train" adds the optimizer step, whose
    element-wise FLOPs (about 10 per parameter for AdamW) are ignored, as PaLM does.
    """
    if mode not in STEP_MODES:
        raise ValueError(f"unknown mode {mode!r}; choose from {', '.join(STEP_MODES)}")
    forward = forward_flops(config, batch, seq)
    return forward if mode == "forward" else 3 * forward
