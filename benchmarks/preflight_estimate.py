"""The pre-flight estimates (docs/methodology.md#memory) against what a CPU measures.

For a few shapes of the tiny LM, the memory estimate of `experiments/preflight.py` over the
peak the memory experiment measures (live tensor bytes); then what Triton's CPU interpreter
takes a pair of tiles, forward and backward, on cs336sys's kernel at a few shapes, the
figures `preflight.INTERPRETED_PAIR_S` stand for:

    python benchmarks/preflight_estimate.py [--no-triton]

Exits 1 when an estimate falls below the measured peak (a point it lets through must fit).
"""

from __future__ import annotations

import argparse
import os
import sys

SHAPES = (  # size, seq, batch, mode, checkpoint
    ("tiny", 64, 2, "train", "none"),
    ("tiny", 128, 4, "train", "none"),
    ("small", 64, 1, "train", "none"),
    ("tiny", 128, 4, "forward", "none"),
    ("tiny", 128, 4, "train", "every:1"),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--no-triton", action="store_true", help="skip the interpreter's rate")
    args = parser.parse_args()
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any kernel module is imported

    from cs336sys.experiments import memory, preflight

    low = False
    print("| size | seq | batch | mode | checkpoint | measured peak MiB | estimate MiB | ratio |")
    print("|---|---|---|---|---|---|---|---|")
    for size, seq, batch, mode, ckpt in SHAPES:
        (spec,) = memory.specs(size=[size], seq=[seq], batch=[batch], mode=[mode],
                               checkpoint=[ckpt], device="cpu", warmup=0, iters=1)
        peak = memory.run(spec).metrics["peak_bytes"]
        est = preflight.model_estimate(spec.model).bytes
        low |= est < peak
        print(f"| {size} | {seq} | {batch} | {mode} | {ckpt} | {peak / 2**20:,.1f} | "
              f"{est / 2**20:,.1f} | {est / peak:.2f}x |")
    if not args.no_triton:
        _interpreted(preflight)
    return 1 if low else 0


def _interpreted(preflight) -> None:
    import time

    import torch

    from cs336sys.attention import FlashAttention2Triton

    print("\n| batch | seq | d | forward ms a pair | backward ms a pair |\n|---|---|---|---|---|")
    for batch, seq, d in ((1, 256, 32), (4, 128, 64), (1, 256, 128)):
        q, k, v = (torch.randn(batch, seq, d, requires_grad=True) for _ in range(3))
        FlashAttention2Triton.apply(q, k, v, False)  # the interpreter's first call
        t0 = time.perf_counter()
        out = FlashAttention2Triton.apply(q, k, v, False)
        t1 = time.perf_counter()
        out.sum().backward()
        t2 = time.perf_counter()
        pairs = batch * preflight._tile_pairs(seq, causal=False)
        print(f"| {batch} | {seq} | {d} | {(t1 - t0) / pairs * 1e3:.1f} | "
              f"{(t2 - t1) / pairs * 1e3:.1f} |")
    print("\npreflight.INTERPRETED_PAIR_S: "
          + ", ".join(f"{k} {v * 1e3:g} ms" for k, v in preflight.INTERPRETED_PAIR_S.items()))


if __name__ == "__main__":
    sys.exit(main())
