"""Triton kernel of the fused LM head + cross-entropy's per-chunk step (see fused_ce.py).

    row_loss = softmax_cross_entropy_(logits, targets, scale, ignore_index, write_grad)

For a chunk of logits (n, V) in their 16-bit (or float32) dtype, one program per row makes
two passes over the vocabulary in BLOCK_V slices:
  1. the online max and sum of exponentials (Milakov & Gimelshein 2018), in float32, giving
     the row's logsumexp and loss = lse - logit[target];
  2. dlogit = (exp(logit - lse) - [col == target]) * scale, written over the logits in place.
So the step reads the logits twice and writes them once, and needs no float32 copy of the
chunk (the torch version makes one). This is Liger-Kernel's cross-entropy kernel (Hsu et al.
2024, `liger_cross_entropy_kernel`), without its label smoothing and z-loss. The matmuls
around it stay in cuBLAS (fused_ce.py).

Pointer arithmetic and masks only (no block pointers), so the kernel compiles on Triton 3.6
and runs in the Triton 3.9 interpreter (TRITON_INTERPRET=1 set before this module is
imported), where it takes CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336sys.measure.triton_support import check_available as _available
from cs336sys.measure.triton_support import interpreted, round_bf16

__all__ = ["INTERPRETED", "check_available", "softmax_cross_entropy_"]

# Slice of the vocabulary one program holds at a time. On a GPU Liger-Kernel's choice: up to
# 32768 columns over 32 warps (32 float32 values a thread). In the interpreter, where a
# slice is a NumPy array, wider is faster; tests pass a small block_v to cover many slices.
GPU_BLOCK_V, GPU_WARPS = 32768, 32
INTERPRETER_BLOCK_V = 4096
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def _softmax_ce_kernel(
    logits_ptr, targets_ptr, loss_ptr, scale_ptr,
    stride_row, n_cols, ignore_index,
    BLOCK_V: tl.constexpr, WRITE_GRAD: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    """One row: loss_ptr[row] = lse - logit[target]; with WRITE_GRAD the row of logits
    becomes (softmax - onehot) * scale. Ignored rows get loss 0 and a zero gradient."""
    row = tl.program_id(0).to(tl.int64)
    row_ptr = logits_ptr + row * stride_row
    target = tl.load(targets_ptr + row)
    valid = target != ignore_index
    target = tl.where(valid, target, 0)  # an ignored row reads column 0, then is zeroed
    offs = tl.arange(0, BLOCK_V)

    # Pass 1: running max m and running sum s of exp(x - m), rescaled when m grows.
    m = float("-inf")
    s = 0.0
    for start in range(0, n_cols, BLOCK_V):
        cols = start + offs
        x = tl.load(row_ptr + cols, mask=cols < n_cols, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        s = s * tl.exp(m - m_new) + tl.sum(tl.exp(x - m_new), axis=0)
        m = m_new
    lse = m + tl.log(s)
    x_target = tl.load(row_ptr + target).to(tl.float32)
    tl.store(loss_ptr + row, tl.where(valid, lse - x_target, 0.0))

    # Pass 2: the gradient of scale * loss, over the logits it was computed from.
    if WRITE_GRAD:
        scale = tl.where(valid, tl.load(scale_ptr), 0.0)
        for start in range(0, n_cols, BLOCK_V):
            cols = start + offs
            mask = cols < n_cols
            x = tl.load(row_ptr + cols, mask=mask, other=0.0).to(tl.float32)
            grad = (tl.exp(x - lse) - tl.where(cols == target, 1.0, 0.0)) * scale
            grad = round_bf16(grad, ROUND_BF16)
            tl.store(row_ptr + cols, grad.to(logits_ptr.dtype.element_ty), mask=mask)


# The kernel was defined by Triton's interpreter (TRITON_INTERPRET=1 at import time), so it
# runs on CPU tensors only; otherwise it is compiled for CUDA.
INTERPRETED: bool = interpreted(_softmax_ce_kernel)


def check_available(device: torch.device | str) -> None:
    """Raise RuntimeError unless the kernel can run on tensors on `device`."""
    _available(device, INTERPRETED, "impl='triton'")


def softmax_cross_entropy_(
    logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int = -100,
    write_grad: bool = True, block_v: int | None = None,
) -> torch.Tensor:
    """Loss per row (n,) float32 of logits (n, V) against targets (n,); with `write_grad` the
    logits are overwritten by (softmax - onehot) * scale (zero on ignored rows).

    scale: a 0-dim float32 tensor on the logits' device (read by the kernel: no host sync).
    """
    check_available(logits.device)
    if logits.dim() != 2 or logits.stride(1) != 1:
        raise ValueError(
            f"logits must be (n, V) with unit column stride, got {tuple(logits.shape)}."
        )
    if logits.dtype not in DTYPES:
        raise ValueError(f"logits must be one of {DTYPES}, got {logits.dtype}.")
    n_rows, n_cols = logits.shape
    if targets.shape != (n_rows,):
        raise ValueError(f"targets must be ({n_rows},), got {tuple(targets.shape)}.")
    targets = targets.contiguous()
    scale = scale.to(device=logits.device, dtype=torch.float32).reshape(1)
    row_loss = torch.empty(n_rows, dtype=torch.float32, device=logits.device)
    if n_rows == 0:
        return row_loss
    if block_v is None:
        block_v = GPU_BLOCK_V if not INTERPRETED else INTERPRETER_BLOCK_V
    block_v = min(block_v, triton.next_power_of_2(n_cols))
    launch = {} if INTERPRETED else {"num_warps": GPU_WARPS if block_v >= 8192 else 8}
    _softmax_ce_kernel[(n_rows,)](
        logits, targets, row_loss, scale,
        logits.stride(0), n_cols, ignore_index,
        BLOCK_V=block_v, WRITE_GRAD=write_grad,
        ROUND_BF16=INTERPRETED and logits.dtype == torch.bfloat16,
        **launch,
    )
    return row_loss
