"""The Triton FlashAttention-2 launchers as two torch.library custom ops, for torch.compile.

Traced directly, a launcher hands its Triton kernel to inductor, which compiles the kernel
again under its own rules (its own constexpr specialisation, its own pass over the
autotuner's configs). On an H200 with Triton 3.6 that compile failed inside `tl.dot` for a
kernel that runs as it is (`cs336sys step --size xl --switches all`, reports/nvidia-h200).
As custom ops the launchers are opaque to dynamo and inductor: a compiled graph calls them
with real tensors, their plans and tuned tiles as in eager mode, and compiles the rest around
them without a graph break (the PyTorch custom-ops tutorial, "Custom Python operators":
https://docs.pytorch.org/tutorials/advanced/python_custom_ops.html).

Eager calls skip the ops and call the launchers straight away: an op's dispatch costs host
time on every call (flash_triton.py, "Launch plans").

    o, lse = torch.ops.cs336sys.flash_attention_forward(q, k, v, is_causal)
    dq, dk, dv = torch.ops.cs336sys.flash_attention_backward(q, k, v, o, lse, do, is_causal)

The fake implementations allocate what the launchers allocate (`forward_outputs`,
`_new_like`), so the strides
a compiled graph plans for are the ones the kernels write. flash_triton.py imports this
module (registering the ops); the ops reach back into it only when called.
"""

from __future__ import annotations

import torch


@torch.library.custom_op("cs336sys::flash_attention_forward", mutates_args=())
def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (..., T_q, D) and the float32 logsumexp L (..., T_q)."""
    from cs336sys.attention.flash_triton import attention_forward

    return attention_forward(q, k, v, is_causal)


@flash_attention_forward.register_fake
def _(q, k, v, is_causal):
    from cs336sys.attention.flash_triton import forward_outputs

    return forward_outputs(q)


@torch.library.custom_op("cs336sys::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV, shaped and typed like q, k, v."""
    from cs336sys.attention.flash_triton import attention_backward

    return attention_backward(q, k, v, o, lse, do, is_causal)


@flash_attention_backward.register_fake
def _(q, k, v, o, lse, do, is_causal):
    from cs336sys.attention.flash_triton import _new_like

    return _new_like(q), _new_like(k), _new_like(v)
