"""Parallelism accounting from first principles: the ring collectives, and when data, fully
sharded, tensor and fully sharded + tensor parallelism become communication-bound.

Pure arithmetic on plain numbers: no torch, no other cs336sys module (`cs336sys plan`
answers in well under a second). experiments/plan.py applies it to a whole model.

Notation (CS336 2026, "analysis of parallelism strategies"; Austin et al. 2025, "How to
Scale Your Model", part 5, "Training"):

  B  global batch in tokens (one forward and backward, no gradient accumulation)
  D  d_model;  F  d_ff (the course's D_FF)
  N  degree: devices the strategy spreads over
  C  dense bf16 FLOP/s of one device
  W  per-device egress bandwidth in bytes/s: what one device sends per second on its
     links while it also receives as much (NVLink's per-direction figure; nccl-tests'
     bus bandwidth, busbw, measures it)
  e  bytes per element on the wire: 2 (bf16 weights, gradients and activations)

The ring collectives (Patarasuk and Yuan 2009; nccl-tests doc/PERFORMANCE.md), S the size
in bytes of the whole buffer (gathered output of all-gather, input of reduce-scatter,
either side of all-reduce):

  all-gather, reduce-scatter   (N-1)/N * S / W     each device sends N-1 shards of S/N
  all-reduce                   2(N-1)/N * S / W    = reduce-scatter, then all-gather
  alternate ring all-reduce    (N-1) * S / W       each device passes whole inputs around

The single-FFN derivation, with m weight matrices: the 2026 handout's SwiGLU FFN has m = 3
(x1 = x W1, x2 = x W2, y = (f(x1) * x2) W3; W1, W2 D x F, W3 F x D), the 2025 handout's
two-matrix FFN m = 2 (x W1 then W2). A matmul of B x D by D x F costs 2BDF FLOPs, so forward
costs 2mBDF and backward twice that, 4mBDF (the gradients of the inputs and of the weights).
Parameters mDF, in bf16 2mDF bytes.

  DP    (N replicas, B/N tokens each): backward all-reduces the gradients, S = 2mDF.
        compute-bound iff 4mBDF/(NC) >= 2(N-1)/N * 2mDF/W  <=>  B/N >= (N-1)/N * C/W
                                                           <=>  N <= 1 + B*W/C
  FSDP  (weights, gradients and optimizer state sharded N ways, B/N tokens each): forward
        all-gathers the weights; backward all-gathers them again and reduce-scatters the
        gradients (S = 2mDF each). Per phase: forward 2mBDF/(NC) against (N-1)/N * 2mDF/W,
        backward 4mBDF/(NC) against 2(N-1)/N * 2mDF/W: the same bound as DP in both phases.
  TP    (Megatron: W1 (and W2) split by columns, the last matrix by rows, every device sees
        all B tokens): one all-reduce of the B x D output, S = 2BD bytes, in forward, and one
        of the input's gradient dx in backward (every other product is local).
        forward compute-bound iff 2mBDF/(NC) >= 2(N-1)/N * 2BD/W <=> N <= 1 + m*F*W/(2C);
        backward, twice the compute for the same traffic: N <= 1 + m*F*W/C. B cancels.
  FSDP+TP (N = X*Y: FSDP over X, TP over Y), forward: each device computes 2mBDF/N; FSDP
        gathers its TP shard of the weights over X, (X-1)/X * 2mDF/(Y W); TP all-reduces B/X
        tokens' outputs over Y, 2(Y-1)/Y * 2BD/(X W).
        Overlapped (the two axes' collectives run at once; the step waits on the longer):
          compute-bound iff X <= 1 + B*W/C and Y <= 1 + m*F*W/(2C),
          so N <= (1 + B*W/C)(1 + m*F*W/(2C)).
        Not overlapped (the axes share the links; the times add), dividing by the compute:
          compute-bound iff (X-1)/B + (Y-1) * 2/(m F) <= W/C.
        The best split minimises that sum: best_split_n_max with a = 1/B, k = 2/(mF), and
        then N <= (m B F / 8)(W/C + 1/B + 2/(mF))^2 ~ m B F W^2 / (8 C^2).

Communication "hides" behind compute when, in each phase, it takes no longer than the
phase's compute: the best case, with every collective overlapped (DDP's bucketed
all-reduce, FSDP's prefetched all-gathers, an asynchronous or collective-matmul TP). A step
is communication-bound when it does not hide: in some phase the step waits on the wire.
"""

from __future__ import annotations

import math

# The strategies, in the order tables and plots show them.
STRATEGIES = ("dp", "fsdp", "tp", "fsdp-tp")

# -- the ring collectives ---------------------------------------------------------------------

# What a device sends of one collective of S bytes over n devices, in units of (n-1)/n S:
# the ring's (a broadcast's chain: every device but the last forwards S, (n-1)/n S on average)
RING_SENDS = {"all_reduce": 2, "broadcast": 1, "all_gather": 1, "reduce_scatter": 1}


def sent_bytes(kind: str, size_bytes: float, n: int) -> float:
    """Bytes one device sends (the devices' mean) in a ring `kind` collective of S bytes."""
    return RING_SENDS[kind] * (n - 1) / n * size_bytes


def all_gather_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring all-gather of a `size_bytes` output over `n` devices at `w` bytes/s
    egress each: (n-1)/n * S / W. Each device forwards n-1 shards of S/n around the ring."""
    return sent_bytes("all_gather", size_bytes, n) / w


def reduce_scatter_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring reduce-scatter of a `size_bytes` input: (n-1)/n * S / W (the
    all-gather's traffic run backwards, adding as it goes)."""
    return sent_bytes("reduce_scatter", size_bytes, n) / w


def all_reduce_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring all-reduce of `size_bytes`: 2(n-1)/n * S / W (Patarasuk and Yuan
    2009, bandwidth-optimal: no algorithm sends less per device)."""
    return sent_bytes("all_reduce", size_bytes, n) / w


def all_reduce_two_step_s(size_bytes: float, n: int, w: float) -> float:
    """The ring all-reduce written as its two steps, as the CS336 2026 handout builds it: a
    ring reduce-scatter (each device ends with the sum of one shard), then a ring all-gather
    of the summed shards: 2(n-1)/n * S / W. It is also what FSDP's reduce-scatter +
    all-gather pair costs over a step: ZeRO-3 moves the gradients no more than DDP, it moves
    them at different times."""
    return reduce_scatter_s(size_bytes, n, w) + all_gather_s(size_bytes, n, w)


def all_reduce_alternate_ring_s(size_bytes: float, n: int, w: float) -> float:
    """The CS336 2026 handout's alternate ring all-reduce (`alternate_ring_all_reduce`):
    every device passes whole inputs x(i) around the ring, adding each one it receives, for
    n-1 steps. Each step sends S bytes, not S/n: (n-1) * S / W, n/2 times the ring's."""
    return (n - 1) * size_bytes / w


def all_reduce_naive_s(size_bytes: float, n: int, w: float) -> float:
    """All-reduce through one device: the n-1 others send it their whole buffer, it sums
    and sends the result back to each. Its link carries (n-1) * S each way: 2(n-1) * S / W,
    n times the ring's time for large n (the root's link is the bottleneck)."""
    return 2 * (n - 1) * size_bytes / w


def all_reduce_tree_s(size_bytes: float, n: int, w: float) -> float:
    """All-reduce as a binary-tree reduce then broadcast of the whole buffer, unpipelined:
    2 * ceil(log2 n) * S / W. Fewer steps than the ring (latency log n instead of n) but
    more bytes per device for large S; NCCL pipelines trees to close the gap."""
    return 2 * math.ceil(math.log2(n)) * size_bytes / w if n > 1 else 0.0


# -- the single-FFN derivation ------------------------------------------------------------------

E = 2  # bytes per bf16 element
MATRICES = 3  # the 2026 handout's SwiGLU FFN: W1, W2 (D x F) and W3 (F x D); 2 for 2025's


def ffn_compute_s(b: float, d: float, f: float, n: int, c: float,
                  m: int = MATRICES) -> tuple[float, float]:
    """(forward, backward) seconds of one FFN layer of `m` matrices per device, the work
    split n ways: 2mBDF/(NC) and 4mBDF/(NC)."""
    return 2 * m * b * d * f / (n * c), 4 * m * b * d * f / (n * c)


def ffn_comm_s(strategy: str, b: float, d: float, f: float, n: int, w: float,
               x: int = 1, y: int = 1, m: int = MATRICES,
               overlap: bool = False) -> tuple[float, float]:
    """(forward, backward) communication seconds of one FFN layer per device (module
    docstring); `x`, `y` the FSDP and TP degrees of fsdp-tp (x * y == n), whose two axes'
    collectives take the longer of the two with `overlap`, their sum without."""
    weights = E * m * d * f  # bytes of the m matrices
    if strategy == "dp":
        return 0.0, all_reduce_s(weights, n, w)
    if strategy == "fsdp":
        return all_gather_s(weights, n, w), all_gather_s(weights, n, w) + reduce_scatter_s(
            weights, n, w
        )
    if strategy == "tp":
        return all_reduce_s(E * b * d, n, w), all_reduce_s(E * b * d, n, w)
    if strategy == "fsdp-tp":
        gather = all_gather_s(weights / y, x, w)
        tp = all_reduce_s(E * b / x * d, y, w)
        both = max if overlap else (lambda u, v: u + v)
        return both(gather, tp), both(gather + reduce_scatter_s(weights / y, x, w), tp)
    raise ValueError(f"unknown strategy {strategy!r}")


def ffn_n_max(strategy: str, b: float, f: float, c: float, w: float, m: int = MATRICES,
              overlap: bool = False, mesh: tuple[float, float] = (1, 1)) -> float:
    """The largest degree N at which one FFN layer of `m` matrices is still compute-bound in
    forward and in backward, as a real number (the module docstring's closed forms): DP,
    FSDP 1 + BW/C; TP 1 + mFW/(2C) (forward binds); FSDP+TP in forward, with `overlap`
    (1 + M_X BW/C)(1 + M_Y mFW/(2C)), each axis's collectives over its `mesh` axes (M_X,
    M_Y) at W each, without it the best split of (X-1)/B + (Y-1) 2/(mF) <= W/C."""
    if strategy in ("dp", "fsdp"):
        return 1 + b * w / c
    if strategy == "tp":
        return 1 + m * f * w / (2 * c)
    if strategy == "fsdp-tp":
        if overlap:
            mx, my = mesh
            return (1 + mx * b * w / c) * (1 + my * m * f * w / (2 * c))
        return best_split_n_max(1 / b, 2 / (m * f), w / c)
    raise ValueError(f"unknown strategy {strategy!r}")


def ffn_n_max_backward(strategy: str, b: float, f: float, c: float, w: float,
                       m: int = MATRICES) -> float:
    """The same bound for the backward alone: DP, FSDP 1 + BW/C, TP 1 + mFW/C (twice the
    compute for the forward's traffic)."""
    if strategy == "tp":
        return 1 + m * f * w / c
    return ffn_n_max(strategy, b, f, c, w, m)


def mesh_batch_per_device(f: float, y: float, c: float, w: float, mx: float,
                          my: float, m: int = 2) -> tuple[float, bool]:
    """FSDP over X devices and TP over Y in the notation of "How to Scale Your Model"
    (Austin et al. 2025, part 5, "Combining FSDP and Tensor Parallelism"), as the CS336 2025
    handout's `communication_accounting` (c) asks: the forward of one FFN layer of `m`
    matrices (2 there), the FSDP collectives over M_X mesh axes and the TP ones over M_Y,
    each axis at W_ici, overlapped with each other and with compute, the (X-1)/X of the ring
    left out:

        T_FSDP = 2mDF / (Y W M_X),  T_TP = 4BD / (X W M_Y),  T_math = 2mBDF / (N C).

    T_FSDP < T_math iff B/N > alpha / (Y M_X), alpha = C/W: the per-device batch (tokens)
    returned. T_TP < T_math iff mF/(2Y) > alpha / M_Y (F/Y > alpha / M_Y for m = 2),
    whatever B: whether TP can hide at all."""
    alpha = c / w
    return alpha / (y * mx), m * f / (2 * y) > alpha / my


def best_split_n_max(a: float, k: float, budget: float) -> float:
    """The largest N = X*Y (X, Y >= 1 real) with (X-1)*a + (Y-1)*k <= budget for some split.

    At fixed N, (X-1)a + (N/X-1)k is least at X = sqrt(N k / a), where it equals
    2 sqrt(N a k) - a - k; that is <= budget iff N <= (budget + a + k)^2 / (4 a k). The
    interior optimum needs X >= 1 and Y >= 1; otherwise the best is a pure split: Y = 1
    gives N <= 1 + budget/a, X = 1 gives N <= 1 + budget/k."""
    pure = max(1 + budget / a, 1 + budget / k)
    interior = (budget + a + k) ** 2 / (4 * a * k)
    x = math.sqrt(interior * k / a)
    if x >= 1 and interior / x >= 1:
        return max(interior, pure)
    return pure


INEQUALITY = {
    "dp": "compute-bound iff B/N >= (N-1)/N * C/W, i.e. N <= 1 + B*W/C",
    "fsdp": "compute-bound iff B/N >= (N-1)/N * C/W, i.e. N <= 1 + B*W/C (forward and backward)",
    "tp": "compute-bound iff m*F/N >= 2(N-1)/N * C/W, i.e. N <= 1 + m*F*W/(2C) (forward; "
    "backward N <= 1 + m*F*W/C)",
    "fsdp-tp": "overlapped axes: X <= 1 + M_X*B*W/C and Y <= 1 + M_Y*m*F*W/(2C) (M_X, M_Y the "
    "mesh axes, 1 without --mesh-axes), N <= their product; "
    "sharing the links: (X-1)/B + (Y-1)*2/(m*F) <= W/C, best N <= (mBF/8)(W/C + 1/B + 2/(mF))^2",
}


def closed_forms(strategy: str, m: int = MATRICES) -> tuple[str, str, str, str]:
    """One FFN layer of `m` matrices per device, in the handout's letters (module docstring):
    (forward FLOPs, backward FLOPs, forward communication time, backward communication time).
    The m matrices are 2mDF bytes in bf16; the FLOPs of N devices' equal shares."""
    fwd, bwd, size = f"{2 * m}BDF/N", f"{4 * m}BDF/N", f"{2 * m}DF"
    if strategy == "dp":  # the gradients all-reduced once, in backward
        return fwd, bwd, "0", f"2(N-1)/N * {size}/W"
    if strategy == "fsdp":  # the weights gathered in each phase, the gradients reduce-scattered
        return fwd, bwd, f"(N-1)/N * {size}/W", f"2(N-1)/N * {size}/W"
    if strategy == "tp":  # y in forward, dx in backward: B x D, 2BD bytes
        return fwd, bwd, "2(N-1)/N * 2BD/W", "2(N-1)/N * 2BD/W"
    if strategy == "fsdp-tp":  # N = XY, the two axes overlapped
        tp = "2(Y-1)/Y * 2BD/(X W)"
        return (fwd, bwd, f"max((X-1)/X * {size}/(Y W), {tp})",
                f"max(2(X-1)/X * {size}/(Y W), {tp})")
    raise ValueError(f"unknown strategy {strategy!r}")


# tp_calcs (a): TP's backward, W1 and W2 split by columns and W3 by rows (device i's shards).
TP_BACKWARD = ("dz(i) = dy W3(i)^T; dx2(i) = dz(i) * f(x1(i)); dx1(i) = dz(i) * f'(x1(i)) * "
               "x2(i); dW3(i) = z(i)^T dy; dW2(i) = x^T dx2(i); dW1(i) = x^T dx1(i); dx = "
               "all-reduce({dx1(i) W1(i)^T + dx2(i) W2(i)^T})")
