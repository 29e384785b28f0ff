"""Fused LM head + cross-entropy: the loss of `h @ W^T` without the (N, V) logits.

    loss = linear_cross_entropy(h, lm_head.weight, targets)     # h (..., C), W (V, C), targets (...)
    # == F.cross_entropy((h @ W.T).float().flatten(0, -2), targets.flatten()), and its gradients

Why: the LM head's logits are the largest activation of a long-context step. At vocab
V = 151936, context 32768 and batch 2 (N = 65536 rows) they are 65536 x 151936 x 4 B = 39.8 GB
in float32, plus the 16-bit copy autocast makes and the gradient of the same size, while
the hidden states h are N x C (1 GB at C = 4096). The loss needs only one number per row.

How (the "forward and backward in one pass" of Liger-Kernel, Hsu et al. 2024, and Cut Your
Losses, Wijmans et al. 2024): the rows are processed in chunks of `chunk_rows`. For each
chunk, in the forward pass,

    logits = h_c @ W^T                       (n, V) in the compute dtype (autocast's, or h's)
    lse    = logsumexp(logits)               float32, one per row
    loss  += lse - logits[target]            float32
    dlogits = (softmax(logits) - onehot) * s (n, V), s = 1/N_valid for "mean", 1 for "sum"
    grad_h[chunk] = dlogits @ W              (n, C)
    grad_W       += dlogits^T @ h_c          (V, C), accumulated in float32

so each chunk's logits are made once and dropped before the next chunk: the extra memory is
one chunk's logits, not N x V. Only grad_h and grad_W are kept for backward, which multiplies
them by the upstream gradient (a scalar, since the loss is). The price: the gradients are
computed even when backward never runs (use torch.no_grad() for evaluation, which skips
them), and grad_W's float32 accumulator (V x C x 4 B) lives from forward to backward.

Precision matches the materialised baseline of cs336sys/experiments/training_step.py: under
torch.autocast the matmuls run in autocast's dtype (h and W are cast explicitly, chunk by
chunk for h, since autocast would cast them for `lm_head` too), and the softmax, logsumexp
and loss in float32. Without autocast the matmuls run in h's and W's promoted dtype.

Two implementations of the per-chunk softmax/cross-entropy step, chosen by `impl`:
  "torch"   readable PyTorch (below); holds a float32 copy of the chunk's logits.
  "triton"  one Triton kernel (fused_ce_triton.py) that reads the 16-bit logits, computes
            the loss and writes dlogits over the logits in place: no float32 copy.
The matmuls stay in cuBLAS (torch.mm) in both.

Two ways to sum grad_W over the chunks when the matmuls run in 16 bits, chosen by
`grad_w_sum`:
  "add"     each chunk's (V, C) product is made in 16 bits, as the baseline's one matmul
            makes it, then added into the float32 accumulator: a (V, C) temporary written
            and read per chunk (1.24 GB at the leaderboard's V and C).
  "addmm"   cuBLAS adds the product straight into the float32 accumulator (16-bit inputs,
            float32 output, beta 1: torch.addmm's out_dtype, CUDA): no temporary, and the
            product is not rounded to 16 bits. CUDA only, and only where torch's addmm takes
            a float32 input beside 16-bit operands (refused in words where it does not);
            benchmarks/fused_ce.py sets the two side by side.

Targets equal to `ignore_index` (-100, as F.cross_entropy) add nothing to the loss or the
gradients, and "mean" divides by the number of the other targets (NaN when there are none,
as F.cross_entropy).
"""

from __future__ import annotations

import functools

import torch
from torch.autograd.function import once_differentiable

__all__ = ["GRAD_W_SUMS", "IMPLS", "REDUCTIONS", "default_chunk_rows", "linear_cross_entropy"]

REDUCTIONS = ("mean", "sum")
IMPLS = ("torch", "triton")
GRAD_W_SUMS = ("add", "addmm")
# A chunk's float32 logits are kept at most this big by default: a few hundred MB, small
# next to the logits of a long-context batch.
CHUNK_BYTES = 512 * 2**20
# ...and chunks are at least this many rows where that limit allows: the chunk's matmuls
# (n x C x V) then still fill a GPU's 128-row tiles, and the per-chunk launches stay few.
MIN_CHUNK_ROWS = 256


def default_chunk_rows(n_rows: int, vocab_size: int, d_model: int) -> int:
    """Rows per chunk: as many as make no more logits than h has elements (N C / V rows,
    Liger-Kernel's rule) but at least MIN_CHUNK_ROWS, and at most CHUNK_BYTES of float32
    logits; rounded down to a power of two, or all N rows when that is fewer."""
    by_h = -(-n_rows * d_model // vocab_size)  # ceil(N C / V)
    by_bytes = CHUNK_BYTES // (4 * vocab_size)
    rows = max(1, min(max(by_h, MIN_CHUNK_ROWS), by_bytes))
    if rows >= n_rows:
        return max(n_rows, 1)
    return 1 << (rows.bit_length() - 1)


# --------------------------------------------------------------------------------------------
# The per-chunk step: logits (n, V) -> loss per row, and dlogits


def _softmax_ce_torch(
    logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
    write_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss per row (n,) float32, dlogits (n, V) in the logits' dtype, or None).

    dlogits = (softmax(logits) - onehot(targets)) * scale, zero on ignored rows: the gradient
    of scale * sum(loss) with respect to the logits. The caller must hold no other reference
    to `logits`: float32 logits are overwritten in place.
    """
    dtype = logits.dtype
    valid = targets != ignore_index  # (n,)
    safe = torch.where(valid, targets, 0)  # (n,) an ignored row reads column 0, then is zeroed
    # (n, V) in float32 (float64 stays float64); the same tensor when the logits are float32
    z = logits.to(torch.promote_types(dtype, torch.float32))
    del logits  # a 16-bit chunk is freed here, before the float32 work
    z_target = z.gather(1, safe[:, None]).squeeze(1)  # (n,)
    # logsumexp = m + log(sum(exp(z - m))), in place: no second (n, V) buffer
    m = z.amax(dim=1, keepdim=True)  # (n, 1)
    z.sub_(m).exp_()  # (n, V) exp(z - m)
    total = z.sum(dim=1, keepdim=True)  # (n, 1)
    lse = (m + total.log()).squeeze(1)  # (n,)
    row_loss = torch.where(valid, lse - z_target, 0.0)  # (n,)
    if not write_grad:
        return row_loss, None
    z.div_(total)  # (n, V) softmax
    z[torch.arange(z.shape[0], device=z.device), safe] -= 1.0  # softmax - onehot
    z.mul_(torch.where(valid, scale, 0.0)[:, None])  # (n, V) * (n, 1)
    return row_loss, z.to(dtype)


def _softmax_ce_triton(
    logits: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor, ignore_index: int,
    write_grad: bool,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As _softmax_ce_torch, by one Triton kernel that writes dlogits over the logits."""
    from cs336sys.models import fused_ce_triton

    row_loss = fused_ce_triton.softmax_cross_entropy_(
        logits, targets, scale, ignore_index, write_grad
    )
    return row_loss, (logits if write_grad else None)


_STEPS = {"torch": _softmax_ce_torch, "triton": _softmax_ce_triton}


# --------------------------------------------------------------------------------------------
# The chunked pass, forward and backward together


def _fused_pass(
    h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, scale: torch.Tensor,
    chunk_rows: int, compute_dtype: torch.dtype, ignore_index: int, impl: str,
    need_h: bool, need_w: bool, grad_w_sum: str = "add",
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(loss, grad_h or None, grad_W or None) for h (N, C), weight (V, C), targets (N,).

    The gradients are those of the loss itself (upstream gradient 1).
    """
    step = _STEPS[impl]
    n_rows = h.shape[0]
    write_grad = need_h or need_w
    acc_dtype = torch.promote_types(compute_dtype, torch.float32)  # of the loss and grad_W
    w = weight.to(compute_dtype)  # (V, C); autocast makes the same copy for lm_head
    loss = torch.zeros((), dtype=acc_dtype, device=h.device)
    grad_h = torch.empty_like(h) if need_h else None  # (N, C)
    # float32 accumulator: summing many chunks' products in 16 bits would lose precision
    grad_w = torch.zeros(weight.shape, dtype=acc_dtype, device=weight.device) if need_w else None

    for start in range(0, n_rows, chunk_rows):
        end = min(start + chunk_rows, n_rows)
        h_c = h[start:end].to(compute_dtype)  # (n, C)
        row_loss, dlogits = step(h_c @ w.T, targets[start:end], scale, ignore_index, write_grad)
        loss += row_loss.sum()
        if grad_h is not None:
            grad_h[start:end] = dlogits @ w  # (n, V) @ (V, C) -> (n, C), cast to h's dtype
        if grad_w is not None:
            if dlogits.dtype == grad_w.dtype:
                grad_w.addmm_(dlogits.T, h_c)  # (V, n) @ (n, C), no temporary
            elif grad_w_sum == "addmm":
                # 16-bit operands, float32 product added into grad_w by the GEMM (beta 1)
                torch.addmm(grad_w, dlogits.T, h_c, out_dtype=grad_w.dtype, out=grad_w)
            else:
                # a 16-bit (V, C) product, as the baseline's single matmul makes, added in fp32
                grad_w += dlogits.T @ h_c
        del dlogits  # the chunk's logits are gone before the next chunk's are made
    return loss * scale, grad_h, grad_w


class _LinearCrossEntropy(torch.autograd.Function):
    """Loss of the LM head, with the gradients computed in the forward pass and kept.

    forward(h (N, C), weight (V, C), targets (N,), scale 0-dim, chunk_rows, compute_dtype,
    ignore_index, impl, grad_w_sum) -> loss 0-dim fp32. backward scales the kept gradients
    by grad_loss.
    """

    @staticmethod
    def forward(ctx, h, weight, targets, scale, chunk_rows, compute_dtype, ignore_index, impl,
                grad_w_sum):
        need_h, need_w = ctx.needs_input_grad[:2]
        # The casts to compute_dtype are explicit; autocast must not re-cast anything inside.
        with torch.autocast(h.device.type, enabled=False):
            loss, grad_h, grad_w = _fused_pass(
                h, weight, targets, scale, chunk_rows, compute_dtype, ignore_index, impl,
                need_h, need_w, grad_w_sum,
            )
        ctx.weight_dtype = weight.dtype
        ctx.save_for_backward(grad_h, grad_w)
        return loss

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        grad_h, grad_w = ctx.saved_tensors
        # The usual upstream gradient is exactly 1 (loss.backward()); then the kept gradients
        # are returned as they are instead of copied: grad_W alone is V x C x 4 bytes. Asking
        # costs one device sync per step, at the LM head, before the layers' backward.
        if not torch.equal(grad_loss, torch.ones_like(grad_loss)):
            grad_h = grad_h * grad_loss if grad_h is not None else None
            grad_w = grad_w * grad_loss if grad_w is not None else None
        if grad_w is not None:
            grad_w = grad_w.to(ctx.weight_dtype)
        return grad_h, grad_w, None, None, None, None, None, None, None


@functools.cache
def _addmm_adds_into_float32(device: torch.device) -> bool:
    """Whether this torch's addmm takes a float32 input with 16-bit operands and out_dtype
    float32 on `device` (the "addmm" sum): asked once, on 2 x 2 tensors. The CUDA kernel of
    the releases read so far requires the input in the operands' dtype."""
    acc = torch.zeros(2, 2, dtype=torch.float32, device=device)
    a = torch.ones(2, 2, dtype=torch.bfloat16, device=device)
    try:
        torch.addmm(acc, a, a, out_dtype=torch.float32, out=acc)
    except (RuntimeError, TypeError):
        return False
    return bool(torch.all(acc == 2))


def _check(h, weight, targets, reduction, chunk_rows, impl, grad_w_sum) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"reduction must be one of {REDUCTIONS}, got {reduction!r}.")
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}.")
    if grad_w_sum not in GRAD_W_SUMS:
        raise ValueError(f"grad_w_sum must be one of {GRAD_W_SUMS}, got {grad_w_sum!r}.")
    if grad_w_sum == "addmm" and h.device.type != "cuda":
        # torch.addmm's out_dtype (16-bit operands, float32 result) has CUDA kernels only
        raise ValueError(f"grad_w_sum='addmm' needs CUDA, got a tensor on {h.device.type}.")
    if grad_w_sum == "addmm" and not _addmm_adds_into_float32(h.device):
        raise ValueError(
            f"grad_w_sum='addmm': torch {torch.__version__}'s addmm(..., out_dtype=float32) "
            "takes its added input in the operands' 16-bit dtype only, so it cannot add into "
            "the float32 accumulator; use grad_w_sum='add'."
        )
    if h.dim() < 2:
        raise ValueError(f"h must be (..., C) with at least 2 dims, got shape {tuple(h.shape)}.")
    if weight.dim() != 2 or weight.shape[1] != h.shape[-1]:
        raise ValueError(
            f"weight must be (V, C) with C = h.shape[-1] = {h.shape[-1]}, got {tuple(weight.shape)}."
        )
    if targets.shape != h.shape[:-1]:
        raise ValueError(
            f"targets must have h's shape without its last dim, {tuple(h.shape[:-1])}, got "
            f"{tuple(targets.shape)}."
        )
    if targets.dtype.is_floating_point or targets.dtype.is_complex or targets.dtype == torch.bool:
        raise ValueError(f"targets must be integer class indices, got {targets.dtype}.")
    if chunk_rows is not None and chunk_rows < 1:
        raise ValueError(f"chunk_rows must be a positive number of rows, got {chunk_rows}.")


def linear_cross_entropy(
    h: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    *,
    reduction: str = "mean",
    chunk_rows: int | None = None,
    impl: str = "torch",
    ignore_index: int = -100,
    grad_w_sum: str = "add",
) -> torch.Tensor:
    """Cross-entropy of the logits h @ weight^T against targets, never holding all the logits.

    h (..., C): hidden states after the final norm; weight (V, C): the LM head's; targets
    (...) int64 class ids. Returns a 0-dim float32 loss (float64 for float64 inputs) equal to
    `F.cross_entropy((h @ weight.T).float().flatten(0, -2), targets.flatten(), reduction=...,
    ignore_index=...)`, with the same gradients for h and weight; under torch.autocast the
    matmuls run in autocast's dtype, as `lm_head(h)` would. `chunk_rows` rows of logits exist
    at a time (default: `default_chunk_rows`); `impl` is "torch" or "triton" (CUDA, or CPU
    with TRITON_INTERPRET=1); `grad_w_sum` how grad_W is summed over the chunks, "add" or
    "addmm" (CUDA; see the module's docstring). Higher-order gradients are not supported.
    """
    _check(h, weight, targets, reduction, chunk_rows, impl, grad_w_sum)
    device_type = h.device.type
    if torch.is_autocast_enabled(device_type):
        compute_dtype = torch.get_autocast_dtype(device_type)
    else:
        compute_dtype = torch.promote_types(h.dtype, weight.dtype)
    if impl == "triton":
        from cs336sys.models import fused_ce_triton

        fused_ce_triton.check_available(h.device)

    c = h.shape[-1]
    h2 = h.reshape(-1, c)  # (N, C)
    t = targets.reshape(-1)  # (N,)
    n_rows = h2.shape[0]
    rows = chunk_rows or default_chunk_rows(n_rows, weight.shape[0], c)
    acc_dtype = torch.promote_types(compute_dtype, torch.float32)
    if reduction == "mean":
        # 1 / N_valid as a tensor: no host sync to learn the count
        scale = (t != ignore_index).sum().to(acc_dtype).reciprocal()
    else:
        scale = torch.ones((), dtype=acc_dtype, device=h.device)

    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _LinearCrossEntropy.apply(
            h2, weight, t, scale, rows, compute_dtype, ignore_index, impl, grad_w_sum
        )
    with torch.autocast(device_type, enabled=False):
        loss, _, _ = _fused_pass(
            h2, weight, t, scale, rows, compute_dtype, ignore_index, impl, False, False
        )
    return loss
