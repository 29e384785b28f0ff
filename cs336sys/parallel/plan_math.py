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

The single-FFN derivation: x (B x D) -> W1 (D x F) -> W2 (F x D); a matmul of B x D by
D x F costs 2BDF FLOPs, so forward costs 4BDF and backward twice that, 8BDF (the gradients
of the input and of the weights). Parameters 2DF, in bf16 4DF bytes.

  DP    (N replicas, B/N tokens each): backward all-reduces the gradients, S = 4DF.
        compute-bound iff 8BDF/(NC) >= 2(N-1)/N * 4DF/W  <=>  B/N >= (N-1)/N * C/W
                                                           <=>  N <= 1 + B*W/C
  FSDP  (weights, gradients and optimizer state sharded N ways, B/N tokens each): forward
        all-gathers the weights; backward all-gathers them again and reduce-scatters the
        gradients (S = 4DF each). Per phase: forward 4BDF/(NC) against (N-1)/N * 4DF/W,
        backward 8BDF/(NC) against 2(N-1)/N * 4DF/W: the same bound as DP, N <= 1 + B*W/C.
  TP    (Megatron: W1 split by columns, W2 by rows, every device sees all B tokens): one
        all-reduce of the activations, S = 2BD bytes, in forward (after W2) and one in
        backward (the gradient of x).
        compute-bound iff 4BDF/(NC) >= 2(N-1)/N * 2BD/W  <=>  F/N >= (N-1)/N * C/W
                                                          <=>  N <= 1 + F*W/C
        (backward has twice the compute for the same traffic: forward binds). B cancels.
  FSDP+TP (N = X*Y: FSDP over X, TP over Y): each device computes 4BDF/N in forward;
        FSDP gathers its TP shard of the weights over X, (X-1)/X * 4DF/(Y W); TP
        all-reduces B/X tokens' activations over Y, 2(Y-1)/Y * 2BD/(X W). Multiplying by
        N C W / (4D):
          compute-bound iff (X-1)/B + (Y-1)/F <= W/C
        The best split minimises (X-1)/B + (N/X-1)/F: X = sqrt(N B / F), Y = sqrt(N F / B),
        and then compute-bound iff N <= (B F / 4) * (W/C + 1/B + 1/F)^2 ~ B F W^2 / (4 C^2).

Communication "hides" behind compute when, in each phase, it takes no longer than the
phase's compute: the best case, with every collective overlapped (DDP's bucketed
all-reduce, FSDP's prefetched all-gathers, an asynchronous or collective-matmul TP). A step
is communication-bound when it does not hide: in some phase the step waits on the wire.
"""

from __future__ import annotations

import math

# -- the ring collectives ---------------------------------------------------------------------


def all_gather_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring all-gather of a `size_bytes` output over `n` devices at `w` bytes/s
    egress each: (n-1)/n * S / W. Each device forwards n-1 shards of S/n around the ring."""
    return (n - 1) / n * size_bytes / w


def reduce_scatter_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring reduce-scatter of a `size_bytes` input: (n-1)/n * S / W (the
    all-gather's traffic run backwards, adding as it goes)."""
    return (n - 1) / n * size_bytes / w


def all_reduce_s(size_bytes: float, n: int, w: float) -> float:
    """Seconds of a ring all-reduce of `size_bytes`: 2(n-1)/n * S / W (Patarasuk and Yuan
    2009, bandwidth-optimal: no algorithm sends less per device)."""
    return 2 * (n - 1) / n * size_bytes / w


def all_reduce_two_step_s(size_bytes: float, n: int, w: float) -> float:
    """The alternate all-reduce: a reduce-scatter (each device ends with the sum of one
    shard), then an all-gather of the summed shards. The same 2(n-1)/n * S / W as the ring,
    and what FSDP's reduce-scatter + all-gather pair costs over a step: ZeRO-3 moves the
    gradients no more than DDP, it moves them at different times."""
    return reduce_scatter_s(size_bytes, n, w) + all_gather_s(size_bytes, n, w)


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


def ffn_compute_s(b: float, d: float, f: float, n: int, c: float) -> tuple[float, float]:
    """(forward, backward) seconds of one FFN layer per device, the work split n ways:
    4BDF/(NC) and 8BDF/(NC)."""
    return 4 * b * d * f / (n * c), 8 * b * d * f / (n * c)


def ffn_comm_s(strategy: str, b: float, d: float, f: float, n: int, w: float,
               x: int = 1, y: int = 1) -> tuple[float, float]:
    """(forward, backward) communication seconds of one FFN layer per device (module
    docstring); `x`, `y` the FSDP and TP degrees of fsdp-tp (x * y == n)."""
    weights = E * 2 * d * f  # bytes of W1 and W2
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
        return gather + tp, 2 * gather + tp
    raise ValueError(f"unknown strategy {strategy!r}")


def ffn_n_max(strategy: str, b: float, f: float, c: float, w: float) -> float:
    """The largest degree N at which one FFN layer is still compute-bound, as a real number
    (the module docstring's closed forms): DP, FSDP 1 + BW/C; TP 1 + FW/C; FSDP+TP with
    the best split (B F / 4)(W/C + 1/B + 1/F)^2, or a pure split where that is better."""
    if strategy in ("dp", "fsdp"):
        return 1 + b * w / c
    if strategy == "tp":
        return 1 + f * w / c
    if strategy == "fsdp-tp":
        # per phase: (X-1)*a + (Y-1)*k <= K with a = 1/B, k = 1/F, K = W/C
        return best_split_n_max(1 / b, 1 / f, w / c)
    raise ValueError(f"unknown strategy {strategy!r}")


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
    "fsdp": "compute-bound iff B/N >= (N-1)/N * C/W, i.e. N <= 1 + B*W/C",
    "tp": "compute-bound iff F/N >= (N-1)/N * C/W, i.e. N <= 1 + F*W/C",
    "fsdp-tp": "compute-bound iff (X-1)/B + (Y-1)/F <= W/C; best split X = sqrt(NB/F): "
    "N <= (BF/4)(W/C + 1/B + 1/F)^2",
}
