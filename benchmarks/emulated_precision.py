"""How much slower a 16-bit step is on this CPU than fp32: the figure behind the warning that
`cs336sys model --precision bf16` prints where the CPU only emulates the dtype.

    python benchmarks/emulated_precision.py [--size tiny] [--seq 128] [--iters 5]

Runs the training step of `cs336sys model` (tiny model, batch 4) in fp32, bf16 and fp16 side
by side in one process, and prints each precision's median step time, its ratio to fp32's,
and whether this CPU computes the dtype natively (AVX512-BF16/AMX for bf16, AVX512-FP16/AMX-FP16
for fp16). Nothing is stored.
"""

from __future__ import annotations

import argparse
import statistics

from cs336sys.cli.common import EMULATED_SLOWDOWN
from cs336sys.experiments import model, run_sweep
from cs336sys.experiments.precision import native_support


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=5)
    args = parser.parse_args()
    specs = model.specs(size=[args.size], context_length=[args.seq], device="cpu",
                        precision=["fp32", "bf16", "fp16"], warmup=args.warmup,
                        steps=args.iters)
    medians = {}
    for point in run_sweep(model.EXPERIMENT, specs):
        medians[point.spec.precision] = statistics.median(point.result.samples["step_ms"])
    print(f"{args.size}, T={args.seq}, batch 4, train; median of {args.iters} steps")
    for precision, ms in medians.items():
        native = "" if precision == "fp32" else "  native: {} ({})".format(*native_support("cpu", precision))
        print(f"{precision}: {ms:9.1f} ms  {ms / medians['fp32']:5.2f}x fp32{native}")
    print(f"the warning quotes about {EMULATED_SLOWDOWN}x (cs336sys/cli/common.py)")


if __name__ == "__main__":
    main()
