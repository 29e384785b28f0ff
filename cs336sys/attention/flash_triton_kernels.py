"""Triton kernels of FlashAttention-2: the forward here, and the conventions of them all.

    forward   _attn_fwd_kernel          Dao 2023, Algorithm 1: O and the logsumexp L
    backward  _attn_bwd_dq_kernel       D = rowsum(O * dO) and dQ: one program per query
    (in flash_triton_backward.py)       tile, loop over key tiles; runs first
              _attn_bwd_dkdv_kernel     dK, dV: one program per key tile, loop over query
                                        tiles, reading the D the dQ kernel wrote
    opt-in    _attn_bwd_preprocess      D alone, then _attn_bwd_dkdv_kernel with ATOMIC_DQ:
              (atomic dQ)               it also adds each dS^T-tile's share of dQ into a
                                        float32 buffer with atomics (see below)

The host side (input checks, launch plans, the autograd.Function) is in `flash_triton.py`,
tile sizes and autotuning in `flash_triton_tuning.py`, the tile helpers in
`flash_triton_tiles.py`; this file and `flash_triton_backward.py` hold only `@triton.jit` code,
written after Triton's fused-attention tutorial and the flash-attention repository's Triton
kernel.

Conventions shared by every kernel:
- Tensors arrive as (B, H, T, HEAD_DIM) with any batch, head and sequence strides (passed
  per tensor, so the model's (B, H, T, D) views of a (B, T, H, D) projection need no copy)
  and a unit stride along HEAD_DIM. The launch grid is (sequence tiles, H, B): a program
  owns one tile of one (batch, head) pair. L and D are ours, contiguous (B*H, T) float32.
- One body per kernel, two ways to move its tiles, chosen by the constexpr TMA. Every tile
  of Q, K, V, O, dO, dQ, dK and dV goes through the helpers of flash_triton_tiles.py (owned
  tiles through _load_owned and _store_owned, streamed ones through _slice and _load_tile):
  with TMA False, pointer arithmetic with masks (no block pointers, which Triton
  3.9 removed), the head dimension padded to BLOCK_D, the next power of two, and masked when
  HEAD_DIM != BLOCK_D, sequence tails masked on load and store; with TMA True (opt-in, for
  Hopper), tensor descriptors, whose TMA copies pad and drop out-of-bounds rows and columns
  themselves. Triton compiles each constexpr value separately, so the pointer build never
  contains a descriptor operation, nor the TMA build a mask on a tile. The O(T) rows L and D
  and O in the D computation always use pointers, as in Triton's tutorial; the atomic dQ
  too, unless DQ_TMA (opt-in REDUCE_DQ) adds each of its tiles by one TMA reduction.
- Scores live in base 2: qk_scale = log2(e) / sqrt(d) is folded into S, so the softmax uses
  exp2, which is one MUFU instruction on NVIDIA GPUs (exp is exp2 plus a multiply). L is
  stored as a natural-log logsumexp, and the backward multiplies it by log2(e) again.
- Causal masking is top-left aligned (query i sees keys j <= i, also when T_q != T_k), as
  torch SDPA. Tiles that are entirely masked are never visited. Each key loop is split into
  an unmasked stage over tiles that are fully visible and inside the sequence, and a masked
  stage for the tiles on the diagonal or at the sequence tail, so the hot loop carries no
  mask arithmetic. Masked scores get -1e6 ADDED (not -inf), as the Triton tutorial does: an
  entirely masked row of a tile then gives exp2(-1e6 - m) = 0 instead of NaN from inf - inf.
- Every output is written with a plain store, never accumulated, so the autotuner may
  re-run a kernel on the same buffers. The one exception is the opt-in atomic dQ, whose
  float32 buffer the autotuner zeroes before each trial (reset_to_zero).
- Atomic dQ (opt-in, CS336SYS_TRITON_ATOMIC_DQ=1): the default backward is atomic-free and
  deterministic, but its dQ kernel recomputes S and dP, so it runs 7 tile products where
  Algorithm 2 runs 5. At the leaderboard shape that is 1.92 of the 2.47 causal TFLOP of
  forward+backward; with dQ added in the dK/dV kernel as FlashAttention-2 and -3 do (dQ_i +=
  dS_ij K_j, atomically, into float32), it is 1.37. On an H200 per-element atomics cost more
  than the two products they save; TMA reductions of whole tiles (DQ_TMA), as FA3 adds its
  dQ, are yet to be timed.
- PRECISION is tl.dot's input_precision ("ieee" for float32 inputs so that fp32 means fp32,
  not TF32). UPCAST_DOT and ROUND_BF16 work around two bfloat16 bugs of the Triton 3.9
  interpreter, and the launcher sets them only when interpreted: its tl.dot returns garbage
  for bf16 operands, so they are upcast to float32 (exact for products of bf16 values), and
  its float32 -> bf16 casts truncate, so values are rounded first (see _cast).
- Argument lists are laid out by hand in groups: tensors, pointers and
  strides, ranges and sizes, then constexprs.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336sys.attention.flash_triton_tiles import (
    LN2,
    RESCALE_LOG2,
    _cast,
    _dot,
    _load_owned,
    _load_tile,
    _query_tile_key_ranges,
    _score_mask,
    _slice,
    _store_owned,
    _tile_program,
)
from cs336sys.measure.triton_support import interpreted

# --------------------------------------------------------------------------------------------
# Forward (Dao 2023, Algorithm 1)


@triton.jit
def _attn_fwd_inner(
    acc, l_i, m_i, q,
    K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
    lo, hi, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, LAZY_RESCALE: tl.constexpr, WARP_SPECIALIZE: tl.constexpr,
):
    """Online softmax over the key tiles [lo, hi) (Algorithm 1, lines 6-11), one
    _attn_fwd_step per tile. WARP_SPECIALIZE: the loop is Triton's to split into warp groups
    (a producer issuing the TMA loads, consumers computing), as FlashAttention-3 does by hand;
    the default's plain `range` runs on a Triton whose `tl.range` has no `warp_specialize`."""
    if WARP_SPECIALIZE:
        for start_n in tl.range(lo, hi, K_TILE, warp_specialize=True):
            acc, l_i, m_i = _attn_fwd_step(
                acc, l_i, m_i, q, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
                start_n, N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
                MASKED, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, LAZY_RESCALE)
    else:
        for start_n in range(lo, hi, K_TILE):
            acc, l_i, m_i = _attn_fwd_step(
                acc, l_i, m_i, q, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
                start_n, N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
                MASKED, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, LAZY_RESCALE)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_step(
    acc, l_i, m_i, q,
    K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
    start_n, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, LAZY_RESCALE: tl.constexpr,
):
    """One key tile of the online softmax: O_i, l_i and m_i after key tile start_n.

    LAZY_RESCALE: the running max m_i is moved, and O_i and l_i rescaled, only when some row's
    max has grown by more than RESCALE_LOG2 (base-2 units) since it was last moved; until then
    P~ = exp2(S - m_i) is computed against the stale max, so its entries stay below
    2^RESCALE_LOG2, and L = m_i + log2(l_i) is the same sum. FlashAttention-4's conditional
    rescaling: the tile-wide test is one scalar branch, and most tiles after the first few
    skip the (Q_TILE, BLOCK_D) multiply of O_i, which waits for the previous PV product.
    """
    start_n = tl.multiple_of(start_n, K_TILE)
    k = _load_tile(K_src, start_n, offs_n, stride_kt, N_K, HEAD_DIM, BLOCK_D, MASKED, TMA)
    # S_i^(j) = Q_i K_j^T, already scaled into base 2 (line 8)
    s = _dot(q, tl.trans(k), tl.zeros([Q_TILE, K_TILE], tl.float32), PRECISION, UPCAST_DOT)
    s = s * qk_scale
    # Key indices are formed here, not hoisted above the loads: the TMA build needs them
    # only for the mask, and hoisting them cost its sm_90 compiles up to 20 registers.
    if MASKED:
        s += _score_mask(offs_m[:, None], (start_n + offs_n)[None, :], N_Q, N_K, IS_CAUSAL)
    # m_i^(j) = max(m_i^(j-1), rowmax(S)); P~ = exp(S - m_i^(j)); the previous l_i and
    # O_i are rescaled by exp(m_i^(j-1) - m_i^(j)) (lines 9-10). Every row has a finite
    # max after the first tile: the first tile holds key 0, which every query sees.
    m_ij = tl.maximum(m_i, tl.max(s, 1))
    if LAZY_RESCALE:
        if tl.max(m_ij - m_i, 0) > RESCALE_LOG2:  # the first tile always (m_i = -inf)
            alpha = tl.exp2(m_i - m_ij)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_ij
        p = tl.exp2(s - m_i[:, None])
        l_i = l_i + tl.sum(p, 1)
    else:
        p = tl.exp2(s - m_ij[:, None])
        alpha = tl.exp2(m_i - m_ij)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        m_i = m_ij
    v = _load_tile(V_src, start_n, offs_n, stride_vt, N_K, HEAD_DIM, BLOCK_D, MASKED, TMA)
    # O_i = diag(alpha) O_i + P~ V_j, with P~ cast to V's dtype so the product runs on
    # the low-precision tensor cores; l_i keeps the float32 P~.
    acc = _dot(_cast(p, v.dtype, ROUND_BF16), v, acc, PRECISION, UPCAST_DOT)
    return acc, l_i, m_i


@triton.jit
def _attn_fwd_kernel(
    Q, K, V, Out, L,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
    N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, HEAVY_FIRST: tl.constexpr, LAZY_RESCALE: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """One program per (query tile, head, batch): writes O_i (Q_TILE, HEAD_DIM) and L_i
    (Algorithm 1, lines 4-13), the key loop split into unmasked tiles, then masked ones.

    Q and Out are (B, H, N_Q, HEAD_DIM), K and V (B, H, N_K, HEAD_DIM), each with its own
    (batch, head, sequence) strides and unit stride along HEAD_DIM; L is (B*H, N_Q) float32.
    HEAVY_FIRST (causal only): the query tiles in reverse launch order (_tile_program);
    LAZY_RESCALE: see _attn_fwd_step. WARP_SPECIALIZE (TMA build): one loop over every key
    tile, each masked, warp-specialised. Triton 3.6 and 3.9 split only a kernel's sole loop
    on Hopper, and none with a branch inside: sm_90 builds of the two-stage loop failed in
    its warp-specialisation pass, a loop with `if` was left as it was (`python
    benchmarks/sm90_compile.py --only forward`). The mask costs a compare and a select per
    score on tiles that need none; what the split wins is for a GPU to measure.
    """
    start_m, h, b, bh = _tile_program(Q_TILE, HEAVY_FIRST)
    offs_m = start_m + tl.arange(0, Q_TILE)  # this tile's queries, (Q_TILE,)
    offs_n = tl.arange(0, K_TILE)  # key rows from a key tile's start, (K_TILE,)

    # K and V stream through the key loop, a tile per step, from their (N_K, HEAD_DIM) slices
    # of this (batch, head); Q_i stays on chip for the whole loop (line 4: load Q_i once).
    K_src = _slice(K, b, h, stride_kb, stride_kh, stride_kt, N_K, HEAD_DIM, K_TILE, BLOCK_D, TMA)
    V_src = _slice(V, b, h, stride_vb, stride_vh, stride_vt, N_K, HEAD_DIM, K_TILE, BLOCK_D, TMA)
    q = _load_owned(Q, b, h, stride_qb, stride_qh, stride_qt, start_m, N_Q, HEAD_DIM, Q_TILE,
                    BLOCK_D, TMA)

    # On-chip statistics and accumulator, float32 whatever the input dtype (line 5).
    m_i = tl.full([Q_TILE], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([Q_TILE], dtype=tl.float32)
    acc = tl.zeros([Q_TILE, BLOCK_D], dtype=tl.float32)
    full_end, hi = _query_tile_key_ranges(start_m, N_K, Q_TILE, K_TILE, IS_CAUSAL)
    if WARP_SPECIALIZE:
        full_end = 0  # every key tile in the masked loop
    else:
        acc, l_i, m_i = _attn_fwd_inner(
            acc, l_i, m_i, q, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
            0, full_end,  # fully visible key tiles: no mask
            N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
            False, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, LAZY_RESCALE, False,
        )
    acc, l_i, m_i = _attn_fwd_inner(
        acc, l_i, m_i, q, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
        full_end, hi,  # diagonal and tail key tiles: masked
        N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
        True, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, LAZY_RESCALE, WARP_SPECIALIZE,
    )

    # Epilogue (lines 12-13): O_i = diag(l_i)^-1 O_i, once per row (FlashAttention-2 defers
    # this division to the end), and L_i = m_i + log(l_i), converted back to natural log.
    o = acc / l_i[:, None]
    L_i = (m_i + tl.log2(l_i)) * LN2
    _store_owned(Out, b, h, stride_ob, stride_oh, stride_ot, start_m, N_Q, o, HEAD_DIM, Q_TILE,
                 BLOCK_D, ROUND_BF16, TMA)
    tl.store(L + bh * N_Q + offs_m, L_i, mask=offs_m < N_Q)


# The kernels were defined by the interpreter exactly when triton.jit saw TRITON_INTERPRET=1
# at import time; asking the kernel object avoids re-implementing that environment parsing.
INTERPRETED: bool = interpreted(_attn_fwd_kernel)
