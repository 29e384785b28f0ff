"""`@triton.jit` helpers on tiles, shared by the FlashAttention-2 kernels.

The kernels of `flash_triton_kernels.py` (whose docstring sets the conventions: base-2
scores, additive masks, UPCAST_DOT and ROUND_BF16) and `flash_triton_backward.py` move every
tile of Q, K, V, O, dO, dQ, dK and dV through four helpers here, so that one kernel body
serves both ways of moving it:

    _load_owned   the tile a program owns, read once: rows [start, start + ROWS) of the
                  (n_rows, HEAD_DIM) slice of one (batch, head), zero padded
    _store_owned  an output's rows of the owned tile, dropping the padding
    _slice        a slice whose tiles stream through the program's loop: pointers to its
                  first rows, or a descriptor
    _load_tile    a streamed tile, rows [start, start + tile) of a _slice, zero padded

Their TMA constexpr picks the way. False: pointer arithmetic and masked `tl.load` /
`tl.store` (no block pointers, which Triton 3.9 removed). True: tensor descriptors
(`tl.make_tensor_descriptor`; Triton's "Tensor descriptors" docs and its fused-attention
tutorial): on sm_90 each tile load is one asynchronous TMA copy into shared memory, issued by a
single thread, instead of a vector load per thread with per-element addresses and masks in
registers; out of bounds, TMA fills rows past n_rows and columns past HEAD_DIM with zeros on
loads and drops them on stores, which replaces every load and store mask (scores still need
the tail and causal masks: a zero-padded key scores 0, not -inf). Triton compiles a
jit function once per constexpr value, so the pointer build never contains a descriptor
operation, nor the TMA build a mask on a tile.
"""

from __future__ import annotations

import triton
import triton.language as tl

from cs336sys.measure.triton_support import round_bf16

LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)  # log2(e)
LN2: tl.constexpr = tl.constexpr(0.6931471805599453)  # ln(2) = 1 / log2(e)
MASKED_SCORE: tl.constexpr = tl.constexpr(-1.0e6)  # added to masked scores (base-2 units)
# LAZY_RESCALE's threshold: a stale running max leaves P~ below 2^8 = 256, far inside float32
# and bf16's range (FlashAttention-4 uses the same 8)
RESCALE_LOG2: tl.constexpr = tl.constexpr(8.0)


@triton.jit
def _tile_program(TILE: tl.constexpr, HEAVY_FIRST: tl.constexpr):
    """This program's tile start, head h, batch b and row bh of L and D; grid (tiles, H, B).

    HEAVY_FIRST: the tiles in reverse order. The GPU starts programs in launch order, and
    under a causal mask a query tile's work grows with its index: launched last, the longest
    programs of the last heads leave the GPU's final wave to a few of them. Reversed, the
    longest start first and the shortest fill the end (longest-processing-time first, as
    FlashAttention-3's causal tile scheduler orders them)."""
    pid = tl.program_id(0)
    if HEAVY_FIRST:
        pid = tl.num_programs(0) - 1 - pid
    start = pid * TILE
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
    (ROUND_BF16, set only when interpreted: measure/triton_support.round_bf16)."""
    return round_bf16(x, ROUND_BF16).to(dtype)


@triton.jit
def _slice_ptrs(base, b, h, stride_b, stride_h, stride_t, rows, BLOCK_D: tl.constexpr):
    """Pointers to rows `rows` (a 1-D range) of batch b, head h, as a (rows, BLOCK_D) block,
    masked by _load_rows. The int64 b and h keep batch and head offsets from overflowing."""
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
def _store_rows(ptrs, x, rows, n_rows, HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr):
    """Store a (rows, BLOCK_D) tile, dropping rows past the sequence end and the head-dim pad."""
    if HEAD_DIM == BLOCK_D:
        tl.store(ptrs, x, mask=rows[:, None] < n_rows)
    else:
        offs_d = tl.arange(0, BLOCK_D)
        tl.store(ptrs, x, mask=(rows[:, None] < n_rows) & (offs_d[None, :] < HEAD_DIM))


@triton.jit
def _slice(
    base, b, h, stride_b, stride_h, stride_t, n_rows,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TMA: tl.constexpr,
):
    """The (n_rows, HEAD_DIM) slice of batch b, head h, for tiles of (ROWS, BLOCK_D).

    TMA: a tensor descriptor with shape (n_rows, HEAD_DIM), strides (stride_t, 1) and block
    (ROWS, BLOCK_D). It needs a 16-byte aligned base and row stride, which the host checks
    (flash_triton_tma.tma_layout_ok), and Triton writes it to a global scratch buffer from
    the allocator given to `triton.set_allocator` (flash_triton_tma.ensure_allocator).
    Otherwise: pointers to the slice's first ROWS rows, a (ROWS, BLOCK_D) block, which
    _load_tile moves to the tile's rows.
    """
    if TMA:
        src = tl.make_tensor_descriptor(
            base + b * stride_b + h * stride_h,
            shape=[n_rows, HEAD_DIM],
            strides=[stride_t, 1],
            block_shape=[ROWS, BLOCK_D],
        )
    else:
        src = _slice_ptrs(base, b, h, stride_b, stride_h, stride_t, tl.arange(0, ROWS), BLOCK_D)
    return src


@triton.jit
def _load_tile(
    src, start, offs, stride_t, n_rows,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, TMA: tl.constexpr,
):
    """Rows start + offs (offs = arange(0, tile)) of a _slice src, as a (tile, BLOCK_D) tile
    with zeros past n_rows and HEAD_DIM.

    TMA: the descriptor pads out of bounds itself (offs, stride_t, n_rows and CHECK_ROWS are
    unused). Otherwise the pointers are moved start rows on and _load_rows masks; CHECK_ROWS
    False promises rows inside the slice, for loads without a row mask.
    """
    if TMA:
        x = src.load([start, 0])
    else:
        rows = start + offs
        x = _load_rows(src + start * stride_t, rows, n_rows, HEAD_DIM, BLOCK_D, CHECK_ROWS)
    return x


@triton.jit
def _load_owned(
    base, b, h, stride_b, stride_h, stride_t, start, n_rows,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TMA: tl.constexpr,
):
    """Rows [start, start + ROWS) of the (n_rows, HEAD_DIM) slice of batch b, head h, as a
    (ROWS, BLOCK_D) tile with zeros past n_rows and HEAD_DIM: the tile a program owns, read
    once. _slice and _load_tile in one, but with the pointers formed at the tile's rows:
    moving the slice's first rows there instead cost sm_90 builds up to 14 registers."""
    if TMA:
        x = _slice(base, b, h, stride_b, stride_h, stride_t, n_rows, HEAD_DIM, ROWS, BLOCK_D,
                   True).load([start, 0])
    else:
        rows = start + tl.arange(0, ROWS)
        ptrs = _slice_ptrs(base, b, h, stride_b, stride_h, stride_t, rows, BLOCK_D)
        x = _load_rows(ptrs, rows, n_rows, HEAD_DIM, BLOCK_D, True)
    return x


@triton.jit
def _store_owned(
    base, b, h, stride_b, stride_h, stride_t, start, n_rows, x,
    HEAD_DIM: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr, ROUND_BF16: tl.constexpr,
    TMA: tl.constexpr,
):
    """Store the float32 (ROWS, BLOCK_D) tile x, cast to base's dtype (_cast), to rows
    [start, start + ROWS) of the slice, as _load_owned reads them, dropping rows past n_rows
    and columns past HEAD_DIM. The cast comes after the slice is formed: casting first cost
    the TMA forward's sm_90 build 10 registers under Triton 3.6."""
    if TMA:
        desc = _slice(base, b, h, stride_b, stride_h, stride_t, n_rows, HEAD_DIM, ROWS, BLOCK_D,
                      True)
        desc.store([start, 0], _cast(x, base.dtype.element_ty, ROUND_BF16))
    else:
        rows = start + tl.arange(0, ROWS)
        ptrs = _slice_ptrs(base, b, h, stride_b, stride_h, stride_t, rows, BLOCK_D)
        _store_rows(ptrs, _cast(x, base.dtype.element_ty, ROUND_BF16), rows, n_rows, HEAD_DIM,
                    BLOCK_D)


@triton.jit
def _add_tile(
    dst, start, offs, stride_t, n_rows, x,
    HEAD_DIM: tl.constexpr, BLOCK_D: tl.constexpr, CHECK_ROWS: tl.constexpr, TMA: tl.constexpr,
):
    """Atomically add the float32 tile x to rows start + offs of a float32 (n_rows, HEAD_DIM)
    _slice dst.

    TMA: one reduction of the whole tile through the descriptor (`atomic_add`, PTX
    cp.reduce.async.bulk.tensor), issued by one thread from shared memory, as FlashAttention-3
    adds its dQ; rows and columns out of bounds are dropped. Otherwise per-element pointer
    atomics, relaxed: the additions only need to be atomic, not ordered (the default,
    acq_rel, would fence every one).
    """
    if TMA:
        dst.atomic_add([start, 0], x)
    else:
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
