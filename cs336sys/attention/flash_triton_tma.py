"""FlashAttention-2 kernels that move tiles through tensor descriptors (TMA), for Hopper.

    forward   _attn_fwd_tma_kernel       as _attn_fwd_kernel
    backward  _attn_bwd_dq_tma_kernel    as _attn_bwd_dq_kernel (D and dQ; runs first)
              _attn_bwd_dkdv_tma_kernel  as _attn_bwd_dkdv_kernel

Issue 15 lists tensor descriptors among the levers for beating cuDNN on an H100. These kernels
run the very loops of the pointer kernels in `flash_triton_kernels.py` (online softmax in
base 2, causal tile skipping with masks only on the diagonal and tail tiles, an atomic-free
backward with separate dK/dV and dQ kernels), passing them descriptors and TMA=True, and
take the same arguments, so the launch plans of `flash_triton.py` and the tile candidates
and autotuning of `flash_triton_tuning.py` apply to them unchanged. What differs is how tiles of Q, K, V, O, dO, dQ,
dK and dV travel between global and shared memory:

- Each program builds 2-D descriptors over its own (batch, head) slice of each tensor: shape
  (T, HEAD_DIM), strides (stride_t, 1), block (tile, BLOCK_D). On sm_90 a descriptor load is
  one asynchronous TMA copy into shared memory issued by a single thread, instead of a
  vector load per thread with per-element addresses and masks in registers.
- Out of bounds, TMA fills rows past T and columns past HEAD_DIM (BLOCK_D is the next power
  of two) with zeros on loads and drops them on stores, which replaces every load and store
  mask. Scores still need the tail and causal mask: a zero key scores 0, not -inf.
- TMA needs a 16-byte aligned base and row stride and a unit stride along HEAD_DIM. The host
  checks this per launch plan (`tma_layout_ok`); other layouts run the pointer kernels.
- Descriptors made inside a kernel are written to a global-memory scratch that Triton's
  launcher requests from the allocator given to `triton.set_allocator` (`ensure_allocator`).
- L and D, (B*H, T) float32 rows, are still read and written through pointers: they are
  1-D and O(T), as in Triton's fused-attention tutorial. So is O in the dQ kernel, read once
  per program for D (the same `_attn_bwd_delta` as the pointer kernel).

Opt-in (`CS336SYS_TRITON_TMA=1`, on GPUs of compute capability >= 9) until these kernels have
been measured on an H100: they were written and checked on a CPU-only machine, through
Triton's interpreter (3.9 and 3.6) and offline sm_90 compiles.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from cs336sys.attention.flash_triton_kernels import (
    _attn_bwd_delta,
    _attn_bwd_dkdv_loop,
    _attn_bwd_dq_loop,
    _attn_fwd_loop,
)
from cs336sys.attention.flash_triton_tiles import LOG2E, _cast, _slice_ptrs, _tile_program

# --------------------------------------------------------------------------------------------
# Host side: when the descriptors are allowed, and their scratch memory


def tma_layout_ok(*tensors: torch.Tensor) -> bool:
    """Whether every (B, [H,] T, D) kernel view can back a TMA descriptor per (batch, head).

    The slice base (data_ptr plus batch and head offsets) and the row stride must be 16-byte
    aligned and D unit-stride. A dimension of size one adds no offset, so its stride is free.
    """
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(-2) * size) % 16:
            return False
        offsets = zip(t.shape[:-2], t.stride()[:-2], strict=True)  # batch (and head) strides
        if any((s * size) % 16 for n, s in offsets if n > 1):
            return False
    return True


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for in-kernel descriptors (triton.set_allocator's contract), on the
    current CUDA device, where the launchers of flash_triton.py launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


try:  # where Triton 3.6 to 3.9 keep the allocator, to tell whether one was set
    from triton.runtime._allocation import _NULL_ALLOCATOR, _allocator
except ImportError:  # pragma: no cover (another release: always set ours)
    _allocator = _NULL_ALLOCATOR = None


def ensure_allocator() -> None:
    """Give Triton an allocator for descriptor scratch unless the caller already set one.

    Triton 3.6 to 3.9 keep the allocator in a ContextVar, which is per thread: one set in the
    forward's thread is not seen by autograd's backward thread on CUDA. So the launchers call
    this before every descriptor launch (a ContextVar read; a set only the first time in a
    thread). Triton's fused-attention and persistent-matmul tutorials call set_allocator
    once, in their main thread, with a function like _scratch.
    """
    if _allocator is None or _allocator.get() is _NULL_ALLOCATOR:
        triton.set_allocator(_scratch)


# --------------------------------------------------------------------------------------------
# Kernels. Argument lists are exactly those of the pointer kernels (`# fmt: skip` groups:
# tensors, strides, sizes and scales, constexprs), and so are the loops, in
# flash_triton_kernels.py with the math; here only the tiles' sources and stores differ.


@triton.jit
def _slice_desc(
    base, b, h, stride_b, stride_h, stride_t, n_rows,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """Descriptor of the (n_rows, HEAD_DIM) slice of batch b, head h, in (ROWS, BLOCK_D) tiles;
    loads pad with zeros past n_rows and HEAD_DIM, stores drop what lies there."""
    return tl.make_tensor_descriptor(
        base + b * stride_b + h * stride_h,
        shape=[n_rows, HEAD_DIM],
        strides=[stride_t, 1],
        block_shape=[ROWS, BLOCK_D],
    )


@triton.jit
def _attn_fwd_tma_kernel(
    Q, K, V, Out, L,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
    N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, head, batch): writes O_i (Q_TILE, HEAD_DIM) and L_i."""
    start_m, h, b, bh = _tile_program(Q_TILE)
    offs_m = start_m + tl.arange(0, Q_TILE)
    offs_n = tl.arange(0, K_TILE)

    q_desc = _slice_desc(Q, b, h, stride_qb, stride_qh, stride_qt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D)
    k_desc = _slice_desc(K, b, h, stride_kb, stride_kh, stride_kt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    v_desc = _slice_desc(V, b, h, stride_vb, stride_vh, stride_vt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    q = q_desc.load([start_m, 0])  # stays on chip for the whole key loop

    o, L_i = _attn_fwd_loop(
        q, k_desc, v_desc, stride_kt, stride_vt, start_m, offs_m, offs_n,
        N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
        PRECISION, UPCAST_DOT, ROUND_BF16, True,
    )  # fmt: skip

    o_desc = _slice_desc(Out, b, h, stride_ob, stride_oh, stride_ot, N_Q, HEAD_DIM, Q_TILE, BLOCK_D)
    o_desc.store([start_m, 0], _cast(o, Out.dtype.element_ty, ROUND_BF16))  # tail rows dropped
    tl.store(L + bh * N_Q + offs_m, L_i, mask=offs_m < N_Q)


@triton.jit
def _attn_bwd_dkdv_tma_kernel(
    Q, K, V, dO, L, D, dK, dV, dQ,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
    stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
    stride_dqb, stride_dqh, stride_dqt,
    N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    ATOMIC_DQ: tl.constexpr,
):  # fmt: skip
    """One program per (key tile, head, batch): writes dK_j and dV_j (K_TILE, HEAD_DIM); with
    ATOMIC_DQ adds its share of dQ into the float32 dQ through pointer atomics (_add_tile)."""
    start_n, h, b, bh = _tile_program(K_TILE)
    offs_n = start_n + tl.arange(0, K_TILE)
    offs_m = tl.arange(0, Q_TILE)

    k_desc = _slice_desc(K, b, h, stride_kb, stride_kh, stride_kt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    v_desc = _slice_desc(V, b, h, stride_vb, stride_vh, stride_vt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    q_desc = _slice_desc(Q, b, h, stride_qb, stride_qh, stride_qt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D)
    do_desc = _slice_desc(
        dO, b, h, stride_dob, stride_doh, stride_dot, N_Q, HEAD_DIM, Q_TILE, BLOCK_D
    )
    k = k_desc.load([start_n, 0])
    v = v_desc.load([start_n, 0])

    dQ_ptrs = _slice_ptrs(dQ, b, h, stride_dqb, stride_dqh, stride_dqt, offs_m, BLOCK_D)

    dk, dv = _attn_bwd_dkdv_loop(
        k, v, q_desc, do_desc, L + bh * N_Q, D + bh * N_Q, dQ_ptrs, stride_qt, stride_dot,
        stride_dqt, start_n, offs_m, offs_n, N_Q, N_K, sm_scale, qk_scale,
        HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL, PRECISION, UPCAST_DOT, ROUND_BF16, True,
        ATOMIC_DQ,
    )  # fmt: skip

    dk_desc = _slice_desc(
        dK, b, h, stride_dkb, stride_dkh, stride_dkt, N_K, HEAD_DIM, K_TILE, BLOCK_D
    )
    dv_desc = _slice_desc(
        dV, b, h, stride_dvb, stride_dvh, stride_dvt, N_K, HEAD_DIM, K_TILE, BLOCK_D
    )
    dk_desc.store([start_n, 0], _cast(dk, dK.dtype.element_ty, ROUND_BF16))
    dv_desc.store([start_n, 0], _cast(dv, dV.dtype.element_ty, ROUND_BF16))


@triton.jit
def _attn_bwd_dq_tma_kernel(
    Q, K, V, Out, dO, L, D, dQ,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
    stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
    N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
):  # fmt: skip
    """One program per (query tile, head, batch): writes D_i and dQ_i (Q_TILE, HEAD_DIM)."""
    start_m, h, b, bh = _tile_program(Q_TILE)
    offs_m = start_m + tl.arange(0, Q_TILE)
    offs_n = tl.arange(0, K_TILE)

    q_desc = _slice_desc(Q, b, h, stride_qb, stride_qh, stride_qt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D)
    do_desc = _slice_desc(
        dO, b, h, stride_dob, stride_doh, stride_dot, N_Q, HEAD_DIM, Q_TILE, BLOCK_D
    )
    k_desc = _slice_desc(K, b, h, stride_kb, stride_kh, stride_kt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    v_desc = _slice_desc(V, b, h, stride_vb, stride_vh, stride_vt, N_K, HEAD_DIM, K_TILE, BLOCK_D)
    q = q_desc.load([start_m, 0])
    do = do_desc.load([start_m, 0])
    L2_i = tl.load(L + bh * N_Q + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E
    D_i = _attn_bwd_delta(
        Out, D, do, b, h, bh, stride_ob, stride_oh, stride_ot, offs_m, N_Q, HEAD_DIM, BLOCK_D
    )

    dq = _attn_bwd_dq_loop(
        q, do, L2_i, D_i, k_desc, v_desc, stride_kt, stride_vt, start_m,
        offs_m, offs_n, N_Q, N_K, sm_scale, qk_scale,
        HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL, PRECISION, UPCAST_DOT, ROUND_BF16, True,
    )  # fmt: skip

    dq_desc = _slice_desc(
        dQ, b, h, stride_dqb, stride_dqh, stride_dqt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D
    )
    dq_desc.store([start_m, 0], _cast(dq, dQ.dtype.element_ty, ROUND_BF16))
