"""Triton kernels of the FlashAttention-2 backward (Dao 2023, Algorithm 2).

    _attn_bwd_dq_kernel       D = rowsum(O * dO) and dQ: one program per query tile, loop over
                              key tiles; runs first
    _attn_bwd_dkdv_kernel     dK, dV: one program per key tile, loop over query tiles, reading
                              the D the dQ kernel wrote
    _attn_bwd_preprocess      D alone, for the atomic-dQ backward (dK/dV kernel with
                              ATOMIC_DQ), which has no dQ kernel to write it

The conventions (layouts, the TMA constexpr, base-2 scores, masking, atomic dQ) are the
forward's, in the docstring of flash_triton_kernels.py. With WARP_SPECIALIZE the dK/dV
kernel's loop is split into warp groups as the forward's is; the dQ kernel's is not: built for
sm_90 its split failed under Triton 3.9 whatever the loads of L and D (a masked pointer load
feeding the loop, or a TMA copy of the row, whose block the pass halves for one tensor and not
the other), and under 3.6 with the pointer loads.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336sys.attention.flash_triton_tiles import (
    LOG2E,
    _add_tile,
    _cast,
    _dot,
    _load_owned,
    _load_rows,
    _load_tile,
    _query_tile_key_ranges,
    _score_mask,
    _slice,
    _slice_ptrs,
    _store_owned,
    _tile_program,
)

# --------------------------------------------------------------------------------------------
# Backward (Dao 2023, Algorithm 2, split into a dQ pass and a dK/dV pass so that no two
# programs write the same rows: no atomics, at the cost of computing S and P twice; the
# opt-in ATOMIC_DQ folds the dQ pass into the dK/dV one instead).


@triton.jit
def _attn_bwd_delta(
    Out, D, do, b, h, bh, stride_ob, stride_oh, stride_ot, offs_m, N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr,
):
    """D_i = rowsum(dO_i * O_i) in float32 (Algorithm 2, line 4), for the query rows offs_m:
    stored in D, a (B*H, N_Q) row, for the dK/dV kernel that runs next, and returned.

    D_i equals rowsum(P_i * dP_i), the term that the softmax Jacobian subtracts in
    dS = P * (dP - D); computing it from O avoids a reduction over the (T_q, T_k) matrix.
    The dQ kernel computes it from the dO_i it holds anyway, which saves the launch and the
    pass over dO of a kernel of its own (the tutorial's _attn_bwd_preprocess).
    """
    o_ptrs = _slice_ptrs(Out, b, h, stride_ob, stride_oh, stride_ot, offs_m, BLOCK_D)
    o = _load_rows(o_ptrs, offs_m, N_Q, HEAD_DIM, BLOCK_D, True)
    D_i = tl.sum(o.to(tl.float32) * do.to(tl.float32), 1)  # zero on rows past N_Q
    tl.store(D + bh * N_Q + offs_m, D_i, mask=offs_m < N_Q)
    return D_i


@triton.jit
def _attn_bwd_dq_inner(
    dq, q, do, L2_i, D_i,
    K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
    lo, hi, N_Q, N_K, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr,
):
    """Accumulate dQ_i over the key tiles [lo, hi) (Algorithm 2, lines 9-13 and 15)."""
    for start_n in range(lo, hi, K_TILE):
        start_n = tl.multiple_of(start_n, K_TILE)
        k = _load_tile(K_src, start_n, offs_n, stride_kt, N_K, HEAD_DIM, BLOCK_D, MASKED, TMA)
        v = _load_tile(V_src, start_n, offs_n, stride_vt, N_K, HEAD_DIM, BLOCK_D, MASKED, TMA)
        s = _dot(q, tl.trans(k), tl.zeros([Q_TILE, K_TILE], tl.float32), PRECISION, UPCAST_DOT)
        s = s * qk_scale
        if MASKED:
            s += _score_mask(offs_m[:, None], (start_n + offs_n)[None, :], N_Q, N_K, IS_CAUSAL)
        p = tl.exp2(s - L2_i[:, None])
        dp = _dot(do, tl.trans(v), tl.zeros([Q_TILE, K_TILE], tl.float32), PRECISION, UPCAST_DOT)
        ds = p * (dp - D_i[:, None])
        # dQ_i += dS K_j (line 15), scaled once after the loop.
        dq = _dot(_cast(ds, k.dtype, ROUND_BF16), k, dq, PRECISION, UPCAST_DOT)
    return dq


@triton.jit
def _attn_bwd_dq_kernel(
    Q, K, V, Out, dO, L, D, dQ,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_ob, stride_oh, stride_ot,
    stride_dob, stride_doh, stride_dot, stride_dqb, stride_dqh, stride_dqt,
    N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, HEAVY_FIRST: tl.constexpr,
):
    """One program per (query tile, head, batch): writes D_i and dQ_i (Q_TILE, HEAD_DIM).

    Walks the same key tiles as the forward, in the same two stages, with Q_i, dO_i, L_i
    and D_i kept on chip, its tiles in the forward's order (HEAVY_FIRST). Layouts as in
    _attn_fwd_kernel: dO and dQ shaped like Q; D like L.
    """
    start_m, h, b, bh = _tile_program(Q_TILE, HEAVY_FIRST)
    offs_m = start_m + tl.arange(0, Q_TILE)  # this tile's queries, (Q_TILE,)
    offs_n = tl.arange(0, K_TILE)  # key rows from a key tile's start, (K_TILE,)

    q = _load_owned(Q, b, h, stride_qb, stride_qh, stride_qt, start_m, N_Q, HEAD_DIM, Q_TILE,
                    BLOCK_D, TMA)
    do = _load_owned(dO, b, h, stride_dob, stride_doh, stride_dot, start_m, N_Q, HEAD_DIM,
                     Q_TILE, BLOCK_D, TMA)
    L2_i = tl.load(L + bh * N_Q + offs_m, mask=offs_m < N_Q, other=0.0) * LOG2E  # base 2
    D_i = _attn_bwd_delta(
        Out, D, do, b, h, bh, stride_ob, stride_oh, stride_ot, offs_m, N_Q, HEAD_DIM, BLOCK_D
    )
    # K and V stream through, from their (N_K, HEAD_DIM) slices of this (batch, head).
    K_src = _slice(K, b, h, stride_kb, stride_kh, stride_kt, N_K, HEAD_DIM, K_TILE, BLOCK_D, TMA)
    V_src = _slice(V, b, h, stride_vb, stride_vh, stride_vt, N_K, HEAD_DIM, K_TILE, BLOCK_D, TMA)

    dq = tl.zeros([Q_TILE, BLOCK_D], dtype=tl.float32)
    full_end, hi = _query_tile_key_ranges(start_m, N_K, Q_TILE, K_TILE, IS_CAUSAL)
    dq = _attn_bwd_dq_inner(
        dq, q, do, L2_i, D_i, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
        0, full_end,  # fully visible key tiles: no mask
        N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
        False, PRECISION, UPCAST_DOT, ROUND_BF16, TMA,
    )
    dq = _attn_bwd_dq_inner(
        dq, q, do, L2_i, D_i, K_src, V_src, stride_kt, stride_vt, offs_m, offs_n,
        full_end, hi,  # diagonal and tail key tiles: masked
        N_Q, N_K, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
        True, PRECISION, UPCAST_DOT, ROUND_BF16, TMA,
    )

    # dS = dL/dS' of the scaled scores S' = S / sqrt(d): dQ = scale * dS K (line 15).
    _store_owned(dQ, b, h, stride_dqb, stride_dqh, stride_dqt, start_m, N_Q, dq * sm_scale,
                 HEAD_DIM, Q_TILE, BLOCK_D, ROUND_BF16, TMA)


@triton.jit
def _load_stat_row(S_row, start, N, ROWS: tl.constexpr, MASKED: tl.constexpr,
                   BY_TMA: tl.constexpr):
    """ROWS float32 entries of a row of L or D (S_row: its start) from `start`, zero past N
    where MASKED. BY_TMA: one TMA copy (N % 4 == 0, for 16-byte strides), which pads instead."""
    if BY_TMA:
        desc = tl.make_tensor_descriptor(S_row, shape=[1, N], strides=[N, 1],
                                         block_shape=[1, ROWS])
        return tl.reshape(desc.load([0, start]), [ROWS])
    offs = start + tl.arange(0, ROWS)
    if MASKED:
        return tl.load(S_row + offs, mask=offs < N, other=0.0)
    return tl.load(S_row + offs)


@triton.jit
def _attn_bwd_dkdv_inner(
    dk, dv, k, v,
    Q_src, dO_src, L_ptrs, D_ptrs, dQ_dst, stride_qt, stride_dot, stride_dqt, offs_m, offs_n,
    lo, hi, N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """Accumulate dK_j, dV_j over the query tiles [lo, hi), one _attn_bwd_dkdv_step per
    tile; WARP_SPECIALIZE as in the forward's _attn_fwd_inner (never with ATOMIC_DQ, whose
    loop Triton 3.6's pass could not split), L and D then fetched by TMA like the tiles, so
    that the loading group has them and the computing ones issue no load."""
    if WARP_SPECIALIZE:
        for start_m in tl.range(lo, hi, Q_TILE, warp_specialize=True):
            dk, dv = _attn_bwd_dkdv_step(
                dk, dv, k, v, Q_src, dO_src, L_ptrs, D_ptrs, dQ_dst, stride_qt, stride_dot,
                stride_dqt, offs_m, offs_n, start_m, N_Q, N_K, sm_scale, qk_scale, HEAD_DIM,
                BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL, MASKED, PRECISION, UPCAST_DOT, ROUND_BF16,
                TMA, ATOMIC_DQ, DQ_TMA, True)
    else:
        for start_m in range(lo, hi, Q_TILE):
            dk, dv = _attn_bwd_dkdv_step(
                dk, dv, k, v, Q_src, dO_src, L_ptrs, D_ptrs, dQ_dst, stride_qt, stride_dot,
                stride_dqt, offs_m, offs_n, start_m, N_Q, N_K, sm_scale, qk_scale, HEAD_DIM,
                BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL, MASKED, PRECISION, UPCAST_DOT, ROUND_BF16,
                TMA, ATOMIC_DQ, DQ_TMA, False)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_step(
    dk, dv, k, v,
    Q_src, dO_src, L_ptrs, D_ptrs, dQ_dst, stride_qt, stride_dot, stride_dqt, offs_m, offs_n,
    start_m, N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr, MASKED: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr, STATS_TMA: tl.constexpr,
):
    """dK_j, dV_j after query tile start_m (Algorithm 2, lines 7-14), and with ATOMIC_DQ
    add dS_ij K_j into the float32 dQ rows of the tile (line 15), a TMA reduction with DQ_TMA.

    Works on transposed tiles (S^T = K_j Q_i^T, as the Triton tutorial does) so that P^T and
    dS^T are the left operands of the dV and dK products without a register transpose.
    """
    start_m = tl.multiple_of(start_m, Q_TILE)
    offs_qm = start_m + offs_m
    q = _load_tile(Q_src, start_m, offs_m, stride_qt, N_Q, HEAD_DIM, BLOCK_D, MASKED, TMA)
    do = _load_tile(dO_src, start_m, offs_m, stride_dot, N_Q, HEAD_DIM, BLOCK_D, MASKED, TMA)
    L2_i = _load_stat_row(L_ptrs, start_m, N_Q, Q_TILE, MASKED, STATS_TMA) * LOG2E
    D_i = _load_stat_row(D_ptrs, start_m, N_Q, Q_TILE, MASKED, STATS_TMA)
    # P^T = exp(S^T - L) recomputed from the saved logsumexp (line 9), in base 2.
    sT = _dot(k, tl.trans(q), tl.zeros([K_TILE, Q_TILE], tl.float32), PRECISION, UPCAST_DOT)
    sT = sT * qk_scale
    if MASKED:
        sT += _score_mask(offs_qm[None, :], offs_n[:, None], N_Q, N_K, IS_CAUSAL)
    pT = tl.exp2(sT - L2_i[None, :])
    # dV_j += P^T dO_i (line 10)
    dv = _dot(_cast(pT, do.dtype, ROUND_BF16), do, dv, PRECISION, UPCAST_DOT)
    # dP^T = V_j dO_i^T (line 11); dS^T = P^T * (dP^T - D_i) (line 13)
    dpT = _dot(v, tl.trans(do), tl.zeros([K_TILE, Q_TILE], tl.float32), PRECISION, UPCAST_DOT)
    dsT = pT * (dpT - D_i[None, :])
    # dK_j += dS^T Q_i (line 14); the softmax scale is applied once, after the loop.
    dsT = _cast(dsT, q.dtype, ROUND_BF16)
    dk = _dot(dsT, q, dk, PRECISION, UPCAST_DOT)
    if ATOMIC_DQ:
        # dQ_i += dS K_j (line 15), scaled here: the buffer holds the finished sum.
        dq = _dot(tl.trans(dsT), k, tl.zeros([Q_TILE, BLOCK_D], tl.float32), PRECISION,
                  UPCAST_DOT)
        _add_tile(dQ_dst, start_m, offs_m, stride_dqt, N_Q, dq * sm_scale,
                  HEAD_DIM, BLOCK_D, MASKED, DQ_TMA)
    return dk, dv


@triton.jit
def _attn_bwd_dkdv_kernel(
    Q, K, V, dO, L, D, dK, dV, dQ,
    stride_qb, stride_qh, stride_qt, stride_kb, stride_kh, stride_kt,
    stride_vb, stride_vh, stride_vt, stride_dob, stride_doh, stride_dot,
    stride_dkb, stride_dkh, stride_dkt, stride_dvb, stride_dvh, stride_dvt,
    stride_dqb, stride_dqh, stride_dqt,
    N_Q, N_K, sm_scale, qk_scale,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr, K_TILE: tl.constexpr,
    IS_CAUSAL: tl.constexpr,
    PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr, ATOMIC_DQ: tl.constexpr, DQ_TMA: tl.constexpr,
    WARP_SPECIALIZE: tl.constexpr,
):
    """One program per (key tile, head, batch): writes dK_j and dV_j (K_TILE, HEAD_DIM);
    with ATOMIC_DQ also adds its share of dQ into dQ, float32, zeroed (unused otherwise):
    per element with pointer atomics, or with DQ_TMA (on a TMA build) a tile at a time.

    K_j and V_j stay on chip while the program walks the query tiles (Algorithm 2, lines
    6-14, the outer loop over j); Q, dO, L and D are re-read per query tile. Layouts as in
    _attn_fwd_kernel: dO and dQ shaped like Q, dK and dV like K; D like L.

    The query tiles come in three ranges. Causal: query tiles before `lo` end before key
    start_n and see none of these keys (skipped); tiles from `lo` to `diag_end` straddle the
    diagonal (masked); from `diag_end` on, the tile's first query start_m >= start_n +
    K_TILE - 1 sees every key of the tile. Then a masked tail tile if N_Q is not a multiple
    of Q_TILE. Padded keys of a tail key tile (k = v = 0) produce rows of dK, dV that are not
    stored and never mix with real keys' rows, so the unmasked range needs no key mask.
    WARP_SPECIALIZE (TMA build, no ATOMIC_DQ): the three ranges as one masked loop, split
    into warp groups as the forward's.
    """
    # Key tile j sees the query tiles from j on: the heaviest come first already.
    start_n, h, b, bh = _tile_program(K_TILE, False)
    offs_n = start_n + tl.arange(0, K_TILE)  # this tile's keys, (K_TILE,)
    offs_m = tl.arange(0, Q_TILE)  # query rows from a query tile's start, (Q_TILE,)

    k = _load_owned(K, b, h, stride_kb, stride_kh, stride_kt, start_n, N_K, HEAD_DIM, K_TILE,
                    BLOCK_D, TMA)
    v = _load_owned(V, b, h, stride_vb, stride_vh, stride_vt, start_n, N_K, HEAD_DIM, K_TILE,
                    BLOCK_D, TMA)
    # Q and dO stream through, from their (N_Q, HEAD_DIM) slices of this (batch, head).
    Q_src = _slice(Q, b, h, stride_qb, stride_qh, stride_qt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D, TMA)
    dO_src = _slice(dO, b, h, stride_dob, stride_doh, stride_dot, N_Q, HEAD_DIM, Q_TILE, BLOCK_D,
                    TMA)
    # The float32 dQ of ATOMIC_DQ takes atomic additions: TMA reductions with DQ_TMA, else
    # pointer atomics, whatever TMA says for the other tiles.
    dQ_dst = _slice(dQ, b, h, stride_dqb, stride_dqh, stride_dqt, N_Q, HEAD_DIM, Q_TILE, BLOCK_D,
                    DQ_TMA)
    L_row = L + bh * N_Q
    D_row = D + bh * N_Q

    dk = tl.zeros([K_TILE, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([K_TILE, BLOCK_D], dtype=tl.float32)
    q_end = (N_Q + Q_TILE - 1) // Q_TILE * Q_TILE
    full_end = N_Q // Q_TILE * Q_TILE
    lo = 0
    diag_end = 0
    if IS_CAUSAL:
        lo = start_n // Q_TILE * Q_TILE
        diag_end = (start_n + K_TILE - 1 + Q_TILE - 1) // Q_TILE * Q_TILE
    if WARP_SPECIALIZE:
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, Q_src, dO_src, L_row, D_row, dQ_dst, stride_qt, stride_dot,
            stride_dqt, offs_m, offs_n,
            lo, q_end,  # every query tile this key tile meets, masked
            N_Q, N_K, sm_scale, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
            True, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, ATOMIC_DQ, DQ_TMA, True,
        )
    else:
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, Q_src, dO_src, L_row, D_row, dQ_dst, stride_qt, stride_dot, stride_dqt,
            offs_m, offs_n,
            lo, tl.minimum(diag_end, q_end),  # diagonal query tiles: masked
            N_Q, N_K, sm_scale, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
            True, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, ATOMIC_DQ, DQ_TMA, False,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, Q_src, dO_src, L_row, D_row, dQ_dst, stride_qt, stride_dot, stride_dqt,
            offs_m, offs_n,
            diag_end, full_end,  # query tiles that see every key of this tile: no mask
            N_Q, N_K, sm_scale, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
            False, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, ATOMIC_DQ, DQ_TMA, False,
        )
        dk, dv = _attn_bwd_dkdv_inner(
            dk, dv, k, v, Q_src, dO_src, L_row, D_row, dQ_dst, stride_qt, stride_dot, stride_dqt,
            offs_m, offs_n,
            tl.maximum(full_end, diag_end), q_end,  # the tail query tile: masked
            N_Q, N_K, sm_scale, qk_scale, HEAD_DIM, BLOCK_D, Q_TILE, K_TILE, IS_CAUSAL,
            True, PRECISION, UPCAST_DOT, ROUND_BF16, TMA, ATOMIC_DQ, DQ_TMA, False,
        )

    # dK = scale * dS^T Q (line 14), as dQ.
    _store_owned(dK, b, h, stride_dkb, stride_dkh, stride_dkt, start_n, N_K, dk * sm_scale,
                 HEAD_DIM, K_TILE, BLOCK_D, ROUND_BF16, TMA)
    _store_owned(dV, b, h, stride_dvb, stride_dvh, stride_dvt, start_n, N_K, dv, HEAD_DIM,
                 K_TILE, BLOCK_D, ROUND_BF16, TMA)


@triton.jit
def _attn_bwd_preprocess(
    Out, dO, D,
    stride_ob, stride_oh, stride_ot, stride_dob, stride_doh, stride_dot,
    N_Q,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, Q_TILE: tl.constexpr,
):
    """D alone, one program per (query tile, head, batch): for the atomic-dQ backward, whose
    dK/dV kernel needs D before it starts and which has no dQ kernel to compute it."""
    start_m, h, b, bh = _tile_program(Q_TILE, False)
    offs_m = start_m + tl.arange(0, Q_TILE)
    do = _load_owned(dO, b, h, stride_dob, stride_doh, stride_dot, start_m, N_Q, HEAD_DIM,
                     Q_TILE, BLOCK_D, False)
    _attn_bwd_delta(Out, D, do, b, h, bh, stride_ob, stride_oh, stride_ot, offs_m, N_Q,
                    HEAD_DIM, BLOCK_D)
