"""Harness overhead of `cs336sys comm` (docs/experiments/comm.md): its busbw against a minimal timing loop.

The minimal loop is what one would write by hand: one barrier, then `iters` back-to-back
all-reduces between two device syncs, time / iters. `cs336sys comm` adds a barrier and a
sync around every iteration and gathers per-rank times. Both run here on the same ranks
and sizes, alternating, `--rounds` times; the medians are compared.

    python benchmarks/comm_overhead.py [--bytes 1MB,10MB,100MB] [--world-size 2] [--rounds 7]

Exits 1 unless comm's busbw is within 5% of the minimal loop's at every size.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

from cs336sys.experiments import comm as exp
from cs336sys.measure.units import format_size, parse_size
from cs336sys.parallel.launcher import default_backend, launch


def _minimal(ctx, size_bytes: int, warmup: int, iters: int) -> float:
    import torch
    import torch.distributed as dist

    from cs336sys.measure.device import synchronize

    x = torch.zeros(size_bytes // 4, device=ctx.device)
    for _ in range(warmup):
        dist.all_reduce(x)
    dist.barrier()
    synchronize(ctx.device)
    t0 = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(x)
    synchronize(ctx.device)
    return (time.perf_counter() - t0) / iters


def comm_point(size: int, world_size: int, backend: str, warmup: int, iters: int):
    """comm's own all-reduce point of `size` bytes, as `cs336sys comm` builds it."""
    return exp.CommSpec(op="all-reduce", placement="in-place", bytes=size,
                        world_size=world_size, backend=backend, precision="fp32",
                        warmup=warmup, iters=iters, device="cuda" if backend == "nccl" else "cpu")


def _both(ctx, sizes: list[int], warmup: int, iters: int, rounds: int, backend: str):
    """On every rank: alternate the minimal loop and comm's own point, `rounds` times."""
    from cs336sys.sweep.ranks import gather

    out = []
    for size in sizes:
        spec = comm_point(size, ctx.world_size, backend, warmup, iters)
        for _ in range(rounds):
            t = max(gather(_minimal(ctx, size, warmup, iters)))  # the slowest rank's loop
            r = exp.run(ctx, spec)
            out.append((size, t, r.metrics["time_ms_mean"] / 1e3))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bytes", default="1MB,10MB,100MB")
    parser.add_argument("--world-size", type=int, default=2)
    parser.add_argument("--backend", default=None)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--iters", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    import torch

    backend = args.backend or default_backend("cuda" if torch.cuda.is_available() else "cpu")
    n = args.world_size
    sizes = [exp.buffer_bytes(parse_size(s), "fp32", n) for s in args.bytes.split(",")]
    rows = launch(_both, n, backend, args=(sizes, args.warmup, args.iters, args.rounds, backend))[0]

    factor = exp.busbw_factor("all-reduce", n)
    ok = True
    print(f"all-reduce, {n} ranks, {backend}, fp32, median of {args.rounds} rounds")
    print(f"{'size':>8} {'minimal busbw':>14} {'comm busbw':>11} {'comm/minimal':>13}")
    for size in sizes:
        t_min = statistics.median(t for s, t, _ in rows if s == size)
        t_comm = statistics.median(t for s, _, t in rows if s == size)
        bw_min, bw_comm = size / t_min / 1e9 * factor, size / t_comm / 1e9 * factor
        ratio = bw_comm / bw_min
        ok &= ratio >= 0.95
        print(f"{format_size(size):>8} {bw_min:>11.3f} GB/s {bw_comm:>8.3f} GB/s {ratio:>12.1%}")
    print("PASS" if ok else "FAIL: comm's busbw is more than 5% below the minimal loop's")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
