"""What the Transformer LM saves for backward, counted tensor by tensor: one block's bytes
and the whole model's, checkpointing included. Arithmetic on shapes, no torch: the memory
experiment sets it beside the measured bytes and the pre-flight estimate uses it
(experiments/memory.py, experiments/preflight.py)."""

from __future__ import annotations

from cs336sys.models.config import ModelConfig, checkpoint_groups


def block_saved_bytes(batch: int, seq: int, d_model: int, d_ff: int, num_heads: int) -> int:
    """Bytes one fp32 TransformerBlock with naive causal attention saves for backward.

    Counted from cs336sys/models/transformer.py, each storage once, parameters excluded:
      - each RMSNorm keeps its input x, the normalised x/rms (both B·T·d) and rms (B·T);
      - the q, k, v projections share their (normed) input, B·T·d; the rotated q and k and
        v are kept by the two attention matmuls, 3·B·T·d; the output projection keeps its
        input, B·T·d; the FFN's w1 and w3 share their input, B·T·d. With the two norms'
        2·2·B·T·d that is 10·B·T·d;
      - SwiGLU keeps w1 x (for SiLU), SiLU(w1 x) and w3 x (for the product) and the product
        (for w2): 4·B·T·d_ff;
      - softmax keeps its output P, B·H·T² (the P·V matmul keeps the same storage);
      - RoPE keeps its cos and sin rows for q and for k: 4 tables of T·D/2 = 2·T·d_head;
      - the causal mask, T² booleans (1 byte each).
    """
    elements = (
        10 * batch * seq * d_model
        + 4 * batch * seq * d_ff
        + batch * num_heads * seq * seq
        + 2 * batch * seq  # the two norms' rms
        + 2 * seq * (d_model // num_heads)  # RoPE cos/sin rows
    )
    return 4 * elements + seq * seq


def model_saved_bytes(config: ModelConfig, batch: int, seq: int) -> int:
    """Bytes the fp32 LM with naive attention saves for backward, cross-entropy included.

    Without checkpointing: every block (`block_saved_bytes`). With groups of K blocks
    checkpointed (non-reentrant), only each group's input (the residual stream, B·T·d) and
    the positions (T int64) are saved; the group is recomputed in backward. Outside the
    blocks: the token ids (B·T int64, for the embedding), the final norm (2·B·T·d + B·T),
    the LM head's input (B·T·d), the log-softmax output (B·T·V), the targets (B·T int64)
    and nll_loss's total weight (one fp32 scalar).
    """
    B, T, d, V = batch, seq, config.d_model, config.vocab_size
    groups = checkpoint_groups(config.checkpoint, config.num_layers)
    if groups is None:
        blocks = config.num_layers * block_saved_bytes(B, T, d, config.d_ff, config.num_heads)
    else:
        blocks = len(groups) * 4 * B * T * d + 8 * T
    outside = 8 * B * T + 4 * (2 * B * T * d + B * T) + 4 * B * T * d + 4 * B * T * V + 8 * B * T
    return blocks + outside + 4  # + nll_loss's total_weight, one fp32 scalar
