"""`@triton.jit` helpers on tiles, shared by the FlashAttention-2 kernels.

Both kernel variants build on them: the pointer kernels of `flash_triton_kernels.py`, whose
docstring sets the conventions (base-2 scores, additive masks, UPCAST_DOT and ROUND_BF16),
and the descriptor (TMA) kernels of `flash_triton_tma.py`. _load_tile is what lets the two
share their loops: it loads a tile through either a pointer block or a tensor descriptor.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336sys.bench.triton_support import round_bf16

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln(2) = 1 / log2(e)
MASKED_SCORE: tl.constexpr = tl.constexpr(-1.0e6)  # added to masked scores (base-2 units)


@triton.jit
def _tile_program(TILE: tl.constexpr):
    """This program's tile start, head h, batch b and row bh of L and D; grid (tiles, H, B)."""
    start = tl.program_id(0) * TILE
    h = tl.program_id(1).to(tl.int64)  # int64: B*H*T*D may exceed 2^31 elements
    b = tl.program_id(2).to(tl.int64)
    return start, h, b, b * tl.num_programs(1) + h


@triton.jit
def _dot(a, b, acc, PRECISION: tl.constexpr, UPCAST_DOT: tl.constexpr):
    """acc + a @ b with a float32 accumulator (UPCAST_DOT: flash_triton_kernels.py)."""
    if UPCAST_DOT:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc, input_precision=PRECISION)


@triton.jit
def _cast(x, dtype, ROUND_BF16: tl.constexpr):
    """x.to(dtype), rounding float32 to the nearest bfloat16 also in the interpreter
    (ROUND_BF16, set only when interpreted: bench/triton_support.round_bf16)."""
    return round_bf16(x, ROUND_BF16).to(dtype)


@triton.jit
def _slice_ptrs(base, b, h, stride_b, stride_h, stride_t, rows, BLOCK_D: tl.constexpr):
    """Pointers to rows `rows` (a 1-D range) of batch b, head h, as a (rows, BLOCK_D) block:
    the pointer counterpart of flash_triton_tma._slice_desc, masked by _load_rows."""
    slice_base = base + b * stride_b + h * stride_h
    return slice_base + rows[:, None] * stride_t + tl.arange(0, BLOCK_D)[None, :]


@triton.jit
def _load_rows(
    ptrs, rows, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr
):
    """Load a (rows, BLOCK_D) tile; zeros past the sequence end and the true head dim.

    The constexpr branches keep a tile that is known to be in bounds free of any mask, so its
    loads vectorise fully (flash-attention's EVEN_M / EVEN_HEADDIM trick).
    """
    offs_d = tl.arange(0, BLOCK_D)
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs, mask=rows[:, None] < n_rows, other=0.0)
        else:
            x = tl.load(
                ptrs, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM), other=0.0
            )
    else:
        if HEAD_DIM == BLOCK_D:
            x = tl.load(ptrs)
        else:
            x = tl.load(ptrs, mask=offs_d[None, :] < HEAD_DIM, other=0.0)
    return x


@triton.jit
def _load_tile(
    src, start, offs, stride_t, n_rows,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, TMA: tl.constexpr,
):  # fmt: skip
    """Rows start + offs (offs = arange(0, tile)) of a (n_rows, HEAD_DIM) slice, zero padded.

    TMA: src is the slice's tensor descriptor, which pads out of bounds itself (offs,
    stride_t and n_rows are unused). Otherwise src points at the slice's rows offs
    (_slice_ptrs) and _load_rows masks. Since Triton compiles a jit function once per
    constexpr value, a loop that loads through this helper serves both kernel variants with
    no runtime branch.
    """
    if TMA:
        x = src.load([start, 0])
    else:
        rows = start + offs
        x = _load_rows(src + start * stride_t, rows, n_rows, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return x


@triton.jit
def _add_tile(
    dst, start, offs, stride_t, n_rows, x,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr,
):  # fmt: skip
    """Atomically add the float32 tile x to rows start + offs of a float32 (n_rows, HEAD_DIM)
    slice; dst points at the slice's rows offs (_slice_ptrs), as _load_tile's src.

    Relaxed: the additions only need to be atomic, not ordered (the default, acq_rel, would
    fence every one). Pointer atomics in both kernel variants: Triton's interpreter runs them,
    not a descriptor's atomic_add (a TMA reduction), so this path is tested on CPU too.
    """
    ptrs = dst + start * stride_t
    rows = start + offs
    if CHECK_ROWS:
        if HEAD_DIM == BLOCK_D:
            tl.atomic_add(ptrs, x, mask=rows[:, None] < n_rows, sem="relaxed")
        else:
            offs_d = tl.arange(0, BLOCK_D)
            mask = (rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM)
            tl.atomic_add(ptrs, x, mask=mask, sem="relaxed")
    else:
        if HEAD_DIM == BLOCK_D:
            tl.atomic_add(ptrs, x, sem="relaxed")
        else:
            offs_d = tl.arange(0, BLOCK_D)
            tl.atomic_add(ptrs, x, mask=(offs_d[None, :] < HEAD_DIM), sem="relaxed")


@triton.jit
def _store_rows(ptrs, x, rows, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a (rows, BLOCK_D) tile, dropping rows past the sequence end and the head-dim pad."""
    if HEAD_DIM == BLOCK_D:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _score_mask(i, j, N_Q, N_K, IS_CAUSAL: tl.constexpr):
    """0 where query i may see key j, else MASKED_SCORE.

    i and j are query and key indices already broadcastable to the score tile's shape, so
    the same helper builds S's mask ((Q, 1), (1, K)) and S^T's ((1, Q), (K, 1)).
    """
    keep = (i < N_Q) & (j < N_K)
    if IS_CAUSAL:
        keep = keep & (j <= i)
    return tl.where(keep, 0.0, MASKED_SCORE)


@triton.jit
def _query_tile_key_ranges(
    start_m, N_K, Q_TILE: tl.constexpr, K_TILE: tl.constexpr, IS_CAUSAL: tl.constexpr
):
    """Key ranges for a query tile: [0, full_end) needs no mask, [full_end, hi) does.

    Full tiles lie inside the sequence and, when causal, end at or before the tile's first
    query (start_n + K_TILE - 1 <= start_m). Causal key tiles from start_m + Q_TILE on are
    invisible to every query of the tile and are skipped.
    """
    full_end = N_K // K_TILE * K_TILE
    hi = N_K
    if IS_CAUSAL:
        full_end = tl.minimum(full_end, (start_m + 1) // K_TILE * K_TILE)
        hi = tl.minimum(hi, start_m + Q_TILE)
    return full_end, hi
