"""The pre-flight estimates (docs/methodology.md#memory) against what a CPU measures.

For a few shapes of the tiny LM, the memory estimate of `experiments/preflight.py` over the
peak the memory experiment measures (live tensor bytes); then the rate of Triton's CPU
interpreter on one attention point, the figure `preflight.INTERPRETED_FLOPS` stands for:

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

    from cs336sys.experiments import attention, memory, preflight

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
        (spec,) = attention.specs(impl=["triton"], seq=[256], d_head=[32], batch=[1], heads=1,
                                  warmup=0, iters=1, device="cpu")
        e2e = attention.run(spec).metrics
        rate = e2e["flops_e2e"] / (e2e["e2e_ms_median"] / 1e3)
        print(f"\nTriton interpreted, seq 256 d 32, forward+backward: {e2e['flops_e2e']:.3g} "
              f"FLOPs in {e2e['e2e_ms_median'] / 1e3:.2f} s = {rate / 1e6:.2f} MFLOP/s "
              f"(preflight.INTERPRETED_FLOPS: {preflight.INTERPRETED_FLOPS / 1e6:g} MFLOP/s)")
    return 1 if low else 0


if __name__ == "__main__":
    sys.exit(main())
