"""The Triton kernels of AdamW: one pass over memory updates param, m and v together.

    _adamw_kernel        one tensor: a program per BLOCK elements
    _adamw_multi_kernel  many tensors in one launch: a program per CHUNK elements of one of
                         them, found through tables of addresses (torch's multi_tensor_apply)

The reference optimizer (adamw.py) runs 8 elementwise kernels per parameter, each reading and
writing whole tensors: about 21 tensor-sized reads and writes where 7 suffice. These kernels do the same arithmetic in the same order (so the results
agree to float rounding) in registers, so an fp32 parameter costs 16 bytes read and 12 written per
element, the least AdamW can move. One launch for all ~435 tensors of the xl model instead of one per tensor
also saves ~435 kernel launches, and the gaps between them, per step.

The host side (state, step counts, the optimizer class) is in `adamw_fused.py`; this file
holds the kernels and their launchers.

Conventions:
- Every tensor is contiguous. Offsets are int64 (the 8B model's embedding has 622M
  elements; a larger one would pass 2^31).
- Pointer arithmetic with masks only (no block pointers), for Triton 3.6 and 3.9 alike. The
  multi-tensor kernel turns an int64 address into a typed pointer, as Triton's grouped-GEMM
  tutorial does. The compiler cannot see the alignment of such a pointer, nor that a chunk
  ends inside its tensor, so the launcher sends only 16-byte-aligned tensors and the kernel
  says so (tl.multiple_of), and full chunks run without masks: both let loads be 16 bytes
  wide. The few tensors that are not aligned go through the one-tensor kernel, whose
  pointers Triton specialises itself.
- The arithmetic is float32 whatever the parameter's dtype: a bfloat16 or float16 parameter
  is loaded, widened, updated with its float32 moments, and rounded to its dtype once, at
  the store (adamw.py, "Mixed precision"). Scalars arrive as float32, as torch casts a
  Python scalar to a float32 tensor's dtype.
- sqrt and the division are the IEEE round-to-nearest ones (sqrt_rn, div_rn), as torch's;
  the default `/` and `sqrt` on NVIDIA GPUs are approximations. The kernels are bound by
  memory, so the exact forms cost nothing measurable.
- ROUND_BF16 works around the Triton 3.9 interpreter's float32 -> bfloat16 cast, which
  truncates: the value is rounded to nearest-even on its bit pattern first, so the
  truncating cast is exact (measure/triton_support.round_bf16, which the attention and
  cross-entropy kernels use too). GPUs round natively.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from cs336sys.measure.triton_support import check_available as _available
from cs336sys.measure.triton_support import interpreted, round_bf16

# BLOCK elements per step of a program: 8 per thread with 8 warps, two 16-byte fp32 loads.
# A multi-tensor program owns CHUNK elements of one tensor (torch uses 65536 per block).
BLOCK, CHUNK, NUM_WARPS = 2048, 16384, 8
PARAM_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
ALIGN = 16  # bytes: what a 16-byte vector load needs of its tensor's address
TL_DTYPES = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}


@triton.jit
def _adamw_block(
    p_ptr, g_ptr, m_ptr, v_ptr, offs, n_elements,
    decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size,
    MASKED: tl.constexpr, LERP_SMALL: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    """The update of the elements `offs` of one tensor (only those < n_elements if MASKED)."""
    if MASKED:
        mask = offs < n_elements
    else:
        mask = None
    p_in = tl.load(p_ptr + offs, mask=mask)
    p = p_in.to(tl.float32)
    g = tl.load(g_ptr + offs, mask=mask).to(tl.float32)
    m = tl.load(m_ptr + offs, mask=mask)
    v = tl.load(v_ptr + offs, mask=mask)

    # Decoupled weight decay first (Loshchilov & Hutter 2019, Algorithm 2, line 12).
    p = p * decay
    # m.lerp_(g, 1 - beta1), in the form torch's lerp picks for the weight (ATen Lerp.h).
    if LERP_SMALL:
        m = m + one_minus_beta1 * (g - m)
    else:
        m = g - (g - m) * (1.0 - one_minus_beta1)
    # v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    v = v * beta2 + one_minus_beta2 * g * g
    # p.addcdiv_(m, sqrt(v) / sqrt(1 - beta2^t) + eps, value=-lr / (1 - beta1^t))
    denom = tl.div_rn(tl.sqrt_rn(v), bias_correction2_sqrt) + eps
    p = p + tl.div_rn(neg_step_size * m, denom)

    p = round_bf16(p, ROUND_BF16)
    tl.store(p_ptr + offs, p.to(p_in.dtype), mask=mask)
    tl.store(m_ptr + offs, m, mask=mask)  # the moments are float32 (the launchers check)
    tl.store(v_ptr + offs, v, mask=mask)


@triton.jit
def _adamw_kernel(
    p_ptr, g_ptr, m_ptr, v_ptr,
    n_elements,
    decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size,
    BLOCK_SIZE: tl.constexpr, LERP_SMALL: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_SIZE + tl.arange(0, BLOCK_SIZE)
    _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, offs, n_elements,
                 decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps,
                 neg_step_size, True, LERP_SMALL, ROUND_BF16)


@triton.jit
def _pointer(addresses, row, n_tensors, t, DTYPE: tl.constexpr):
    """addresses[row, t] as a pointer to DTYPE. The address is 16-byte aligned, as the
    launcher made sure, and the hint says so on the pointer itself: put on the integer
    before the cast, it is lost, and every load and store of the sm_90 build is 4 bytes
    wide under Triton 3.6 and 3.9 alike (benchmarks/sm90_compile.py counts them)."""
    return tl.multiple_of(tl.load(addresses + row * n_tensors + t).to(tl.pointer_type(DTYPE)), 16)


@triton.jit
def _adamw_multi_kernel(
    addresses, numels, chunk_tensor, chunk_start, n_tensors,
    decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt, eps, neg_step_size,
    P_DTYPE: tl.constexpr, CHUNK_SIZE: tl.constexpr, BLOCK_SIZE: tl.constexpr,
    LERP_SMALL: tl.constexpr, ROUND_BF16: tl.constexpr,
):
    """addresses (4, n_tensors) int64: rows p, g, m, v; numels (n_tensors,); per program the
    tensor it works on and the first element of its chunk."""
    pid = tl.program_id(0)
    t = tl.load(chunk_tensor + pid)
    start = tl.multiple_of(tl.load(chunk_start + pid), CHUNK_SIZE)
    n = tl.load(numels + t)
    p_ptr = _pointer(addresses, 0, n_tensors, t, P_DTYPE)
    g_ptr = _pointer(addresses, 1, n_tensors, t, P_DTYPE)
    m_ptr = _pointer(addresses, 2, n_tensors, t, tl.float32)
    v_ptr = _pointer(addresses, 3, n_tensors, t, tl.float32)
    if start + CHUNK_SIZE <= n:  # a full chunk: no masks
        for i in range(0, CHUNK_SIZE, BLOCK_SIZE):
            offs = start + i + tl.arange(0, BLOCK_SIZE)
            _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, offs, n,
                         decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt,
                         eps, neg_step_size, False, LERP_SMALL, ROUND_BF16)
    else:  # the tensor's last chunk
        for i in range(0, CHUNK_SIZE, BLOCK_SIZE):
            offs = start + i + tl.arange(0, BLOCK_SIZE)
            _adamw_block(p_ptr, g_ptr, m_ptr, v_ptr, offs, n,
                         decay, one_minus_beta1, beta2, one_minus_beta2, bias_correction2_sqrt,
                         eps, neg_step_size, True, LERP_SMALL, ROUND_BF16)


# Defined by Triton's interpreter (TRITON_INTERPRET=1 at import time): runs on CPU tensors only.
INTERPRETED: bool = interpreted(_adamw_kernel)


def check_available(device: torch.device | str) -> None:
    """Raise RuntimeError unless the kernels can run on tensors on `device`."""
    _available(device, INTERPRETED, "adamw-triton")


def _check(p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor) -> None:
    if (p.device.type == "cuda") == INTERPRETED:
        check_available(p.device)
    if p.dtype not in PARAM_DTYPES:
        raise ValueError(f"adamw-triton takes float32, bfloat16 or float16 params, not {p.dtype}")
    for name, t in (("grad", g), ("exp_avg", m), ("exp_avg_sq", v)):
        if t.shape != p.shape or t.device != p.device:
            raise ValueError(f"{name} must have the parameter's shape and device")
    if g.dtype != p.dtype:
        raise ValueError(f"adamw-triton needs a grad of its parameter's dtype, {p.dtype}")
    if m.dtype != torch.float32 or v.dtype != torch.float32:
        raise ValueError("adamw-triton keeps its moments in float32")
    if not (p.is_contiguous() and m.is_contiguous() and v.is_contiguous()):
        raise ValueError("adamw-triton needs contiguous parameters and moments")


def _scalars(lr: float, beta1: float, beta2: float, eps: float, weight_decay: float,
             step: int) -> tuple[float, ...]:
    """The kernels' float arguments for step t = `step` (already counted for this step)."""
    bias_correction1 = 1 - beta1**step
    bias_correction2 = 1 - beta2**step
    return (1 - lr * weight_decay, 1 - beta1, beta2, 1 - beta2, bias_correction2**0.5, eps,
            -lr / bias_correction1)


def adamw_update(
    p: torch.Tensor, g: torch.Tensor, m: torch.Tensor, v: torch.Tensor, *,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> None:
    """One AdamW step of `p` in place, with its float32 moments `m` and `v`, from gradient
    `g`, by the one-tensor kernel."""
    g = g.contiguous()  # a no-op for the gradients autograd accumulates
    _check(p, g, m, v)
    n = p.numel()
    if n == 0:
        return
    _adamw_kernel[(triton.cdiv(n, BLOCK),)](
        p, g, m, v,
        n,
        *_scalars(lr, beta1, beta2, eps, weight_decay, step),
        BLOCK_SIZE=BLOCK, LERP_SMALL=(1 - beta1) < 0.5,
        ROUND_BF16=INTERPRETED and p.dtype == torch.bfloat16,
        num_warps=NUM_WARPS,
    )


@functools.lru_cache(maxsize=8)
def _chunks(numels: tuple[int, ...], device: torch.device) -> tuple[torch.Tensor, ...]:
    """The tables of the multi-tensor kernel that depend only on the tensors' sizes: their
    numels, and per program its tensor (int32) and the first element of its chunk (int64).
    Cached: the same parameters give the same tables at every step."""
    counts = torch.tensor([triton.cdiv(n, CHUNK) for n in numels])  # (n_tensors,)
    tensor = torch.repeat_interleave(torch.arange(len(numels)), counts)  # (n_chunks,)
    first = torch.cumsum(counts, 0) - counts  # each tensor's first chunk
    start = (torch.arange(len(tensor)) - first[tensor]) * CHUNK  # (n_chunks,)
    sizes = torch.tensor(numels, dtype=torch.int64)
    return sizes.to(device), tensor.to(device, torch.int32), start.to(device)


def adamw_update_many(
    params: list[torch.Tensor], grads: list[torch.Tensor], exp_avgs: list[torch.Tensor],
    exp_avg_sqs: list[torch.Tensor], *,
    lr: float, beta1: float, beta2: float, eps: float, weight_decay: float, step: int,
) -> None:
    """adamw_update of every tensor, all on one device, in one launch per parameter dtype
    (tensors not 16-byte aligned, or empty, go through the one-tensor kernel or are skipped)."""
    scalars = _scalars(lr, beta1, beta2, eps, weight_decay, step)
    hyper = dict(lr=lr, beta1=beta1, beta2=beta2, eps=eps, weight_decay=weight_decay, step=step)
    by_dtype: dict[torch.dtype, list[tuple[torch.Tensor, ...]]] = {}
    for p, g, m, v in zip(params, grads, exp_avgs, exp_avg_sqs, strict=True):
        g = g.contiguous()
        _check(p, g, m, v)
        if p.numel() == 0:
            continue
        if any(t.data_ptr() % ALIGN for t in (p, g, m, v)):
            adamw_update(p, g, m, v, **hyper)
            continue
        by_dtype.setdefault(p.dtype, []).append((p, g, m, v))
    for dtype, group in by_dtype.items():
        device = group[0][0].device
        if any(t[0].device != device for t in group):
            raise ValueError("adamw_update_many takes tensors on one device")
        n_tensors = len(group)
        # (4, n_tensors): the addresses of p, g, m, v. Rebuilt every step: the gradients are
        # new tensors after zero_grad(set_to_none=True). Copied from pinned memory, so the
        # host does not wait for the GPU's queue to drain.
        rows = [[t.data_ptr() for t in column] for column in zip(*group, strict=True)]
        addresses = torch.tensor(rows, dtype=torch.int64)
        if device.type == "cuda":
            addresses = addresses.pin_memory().to(device, non_blocking=True)
        numels, chunk_tensor, chunk_start = _chunks(tuple(t[0].numel() for t in group), device)
        _adamw_multi_kernel[(len(chunk_tensor),)](
            addresses, numels, chunk_tensor, chunk_start, n_tensors,
            *scalars,
            P_DTYPE=TL_DTYPES[dtype], CHUNK_SIZE=CHUNK, BLOCK_SIZE=BLOCK,
            LERP_SMALL=(1 - beta1) < 0.5,
            ROUND_BF16=INTERPRETED and dtype == torch.bfloat16,
            num_warps=NUM_WARPS,
        )
