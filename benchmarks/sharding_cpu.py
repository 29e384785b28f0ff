"""Sharding on CPU (docs/experiments/ddp.md): per-rank memory and step time of DDP, DDP with the sharded
optimizer, DDP with ZeroRedundancyOptimizer, FSDP and FSDP2, beside the analytic figures.

Two Gloo ranks train the tiny Transformer LM with AdamW. DDP here is torch's
DistributedDataParallel, alone and with each optimizer-state sharding; fsdp is
cs336sys.parallel.FSDP, torch-fsdp is FSDP2 (fully_shard per block, then the root). Memory is
rank 0's, measured by the live-tensor tracker in one step after warm-up (parameters and
gradients just before the optimizer step, optimizer state just after it); step time is the
median over rounds of each variant's mean.

    python benchmarks/sharding_cpu.py [--rounds 2] [--iters 4] [--out reports/sharding-cpu]

Exits 1 unless the sharded optimizer holds at most 60% of DDP's optimizer state per rank
(a saving of at least 40%) at world size 2.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from _sweep import collect

from cs336sys.experiments import ddp as exp
from cs336sys.models.config import from_preset

VARIANTS = [  # (impl, bucket MiB, optimizer sharding, label)
    ("torch", exp.TORCH_BUCKET_MB, "none", "DDP"),
    ("torch", exp.TORCH_BUCKET_MB, "ours", "DDP + ShardedOptimizer"),
    ("torch", exp.TORCH_BUCKET_MB, "zero", "DDP + ZeroRedundancyOptimizer"),
    ("fsdp", None, None, "FSDP (cs336sys)"),
    ("torch-fsdp", None, None, "FSDP2 (fully_shard)"),
]
MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", default="tiny")
    parser.add_argument("--seq", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default="reports/sharding-cpu")
    args = parser.parse_args()

    cfg = from_preset(args.size, context_length=args.seq)
    specs = [
        exp.DDPSpec.of(
            cfg, args.size, impl=impl, bucket_mb=b, shard_optimizer=sharding, world_size=2,
            backend="gloo", device="cpu", batch=args.batch, precision="fp32",
            warmup=args.warmup, iters=args.iters, seed=0,
        )
        for _ in range(args.rounds)
        for impl, b, sharding, _ in VARIANTS
    ]
    got = collect(exp.EXPERIMENT, specs, key=lambda s: (s.impl, s.shard_optimizer))

    def med(key, name):
        return statistics.median(m[name] for m in got[key])

    def mib(x):
        return f"{x / MIB:.1f}"

    base = med(("torch", "none"), "step_ms_mean")
    lines = [
        f"# Sharding: per-rank memory and step time, {args.size} model, 2 Gloo ranks, CPU",
        "",
        f"context {args.seq}, global batch {args.batch}, fp32, AdamW, "
        f"{args.iters} timed steps after {args.warmup} warm-up, median of {args.rounds} rounds. "
        "Memory: rank 0, measured (analytic expectation), MiB. "
        "Measured with `python benchmarks/sharding_cpu.py`.",
        "",
        "| variant | params | grads | optimizer state | live before step | peak | step ms | vs DDP | comm MiB/step |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for impl, _, sharding, label in VARIANTS:
        key = (impl, sharding)
        m = got[key][0]  # memory does not vary between rounds; times do
        cells = [
            f"{mib(m[f'mem_{w}_{k}_bytes'])} ({mib(m[f'expected_{k}_bytes'])})"
            for w, k in (("before_opt", "params"), ("before_opt", "grads"), ("after_opt", "opt_state"))
        ]
        step = med(key, "step_ms_mean")
        lines.append(
            f"| {label} | {' | '.join(cells)} | {mib(m['mem_before_opt_bytes'])} | "
            f"{mib(m['mem_peak_bytes'])} | {step:.0f} | {step / base:.2f}x | "
            f"{mib(m['comm_bytes'])} |"
        )
    state = {k: got[k][0]["mem_after_opt_opt_state_bytes"] for k in got}
    saving = 1 - state[("torch", "ours")] / state[("torch", "none")]
    ok = saving >= 0.40
    lines += [
        "",
        f"ShardedOptimizer optimizer state per rank: {mib(state[('torch', 'ours')])} MiB against "
        f"DDP's {mib(state[('torch', 'none')])} MiB, a saving of {saving:.0%}: "
        + ("PASS (at least 40%)" if ok else "FAIL (less than 40%)"),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
