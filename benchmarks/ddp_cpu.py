"""DDP variants against torch DDP on CPU (docs/experiments/ddp.md): step time relative to torch, and the
share of the step spent waiting on gradient communication.

Two Gloo ranks train the tiny Transformer LM. All variants run in one process group, in
turn, for `--rounds` rounds (so slow drifts of a shared machine hit them all alike); each
variant's figure is the median over rounds of its mean step time.

    python benchmarks/ddp_cpu.py [--rounds 3] [--iters 8] [--bucket-mb 1,10,25,100] [--out DIR]

Exits 1 unless bucketed at torch's own bucket cap (25 MiB) is within 10% of torch DDP.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _sweep import collect

from cs336sys.experiments import ddp as exp
from cs336sys.models.config import from_preset


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--bucket-mb", default="1,10,25,100")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", default="reports/ddp-cpu")
    args = parser.parse_args()

    cfg = from_preset(args.size, context_length=args.seq)
    variants = [(i, None) for i in ("naive", "flat", "overlap")]
    variants += [("bucketed", float(b)) for b in args.bucket_mb.split(",")]
    variants += [("torch", exp.TORCH_BUCKET_MB)]
    specs = [
        exp.DDPSpec.of(
            cfg, args.size, impl=impl, bucket_mb=b, shard_optimizer="none", world_size=2,
            backend="gloo", device="cpu", batch=args.batch, precision="fp32",
            warmup=args.warmup, iters=args.iters, seed=0,
        )
        for _ in range(args.rounds)
        for impl, b in variants
    ]
    got = collect(exp.EXPERIMENT, specs, key=lambda s: (s.impl, s.bucket_mb))

    def med(key, name):
        return statistics.median(m[name] for m in got[key])

    torch_key = ("torch", exp.TORCH_BUCKET_MB)
    base = med(torch_key, "step_ms_mean")
    lines = [
        f"# DDP variants vs torch DDP: {args.size} model, 2 Gloo ranks, CPU",
        "",
        f"context {args.seq}, global batch {args.batch}, fp32, "
        f"{args.iters} timed steps after {args.warmup} warm-up, median of {args.rounds} rounds. "
        "Measured with `python benchmarks/ddp_cpu.py`.",
        "",
        "| impl | step ms | vs torch | comm ms | comm % of step | all-reduces/step |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for key in got:
        step = med(key, "step_ms_mean")
        name = key[0] + (f" {key[1]:g} MiB" if key[1] else "")
        lines.append(
            f"| {name} | {step:.0f} | {step / base:.2f}x | {med(key, 'comm_ms_mean'):.0f} | "
            f"{med(key, 'comm_fraction'):.1%} | {med(key, 'allreduce_calls'):g} |"
        )
    ratio = med(("bucketed", exp.TORCH_BUCKET_MB), "step_ms_mean") / base
    ok = ratio <= 1.10
    verdict = f"bucketed at 25 MiB / torch DDP = {ratio:.2f}x: " + (
        "PASS (within 10%)" if ok else "FAIL (more than 10% slower)"
    )
    lines += ["", verdict]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ddp.md").write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
