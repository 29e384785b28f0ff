"""Activation checkpointing on CPU (docs/experiments/memory.md): peak memory against step time for the tiny LM.

Runs the memory experiment (`cs336sys.experiments.memory.run`, the code behind
`cs336sys memory`) for the `tiny` preset with checkpointing none, every:1 and sqrt, and
writes a markdown table, with each point's memory timeline, to reports/memory-cpu/:

    python benchmarks/memory_cpu.py [--seq 256] [--batch 4] [--out DIR]

Peaks are live tensor bytes (the tracker in cs336sys/measure/live_tensors.py), not RSS. Step
times come from untracked steps, so they carry no measuring overhead; on a shared CPU other
processes inflate some steps, so the table gives the minimum (the least disturbed step, the
figure compared) and the median. Exits 1 unless every:1 saves at least 2x fewer bytes for
backward than none and has a lower peak.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from _sweep import collect

from cs336sys.experiments import memory
from cs336sys.models.config import checkpoint_group, from_preset

CHECKPOINTS = ("none", "every:1", "sqrt")
MIB = 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("reports/memory-cpu"))
    args = parser.parse_args()

    specs = memory.specs(
        size=["tiny"], seq=[args.seq], batch=[args.batch],
        mode=["train"], checkpoint=list(CHECKPOINTS), warmup=args.warmup, iters=args.iters,
        device="cpu", snapshot=args.out,
    )
    got = collect(memory.EXPERIMENT, specs, key=lambda s: s.model.checkpoint)
    results = {ck: got[ck][0] for ck in CHECKPOINTS}
    base = results["none"]
    lowest = min(CHECKPOINTS, key=lambda ck: results[ck]["peak_bytes"])
    layers = from_preset("tiny").num_layers
    lines = [
        f"# Activation checkpointing on CPU: tiny LM, batch {args.batch}, context "
        f"{args.seq}, fp32, AdamW",
        "",
        "Measured with `python benchmarks/memory_cpu.py` (the `cs336sys memory` experiment). "
        "Peak = live tensor bytes over one training step (tracker, not RSS); saved = bytes "
        "autograd keeps for backward, parameters excluded; analytic = the same counted from "
        f"the shapes. Step time: min and median of {args.iters} untracked steps after "
        f"{args.warmup} warm-up steps (min compared: the CPU is shared, and other processes "
        "inflate some steps).",
        "",
        "| checkpoint | K | peak MiB | peak vs none | saved MiB | analytic MiB | "
        "step ms min / median | time vs none |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for ck in CHECKPOINTS:
        m = results[ck]
        k = checkpoint_group(ck, layers)
        mark = " (lowest peak)" if ck == lowest else ""
        lines.append(
            f"| {ck}{mark} | {k or '-'} | {m['peak_bytes'] / MIB:.1f} | "
            f"{m['peak_bytes'] / base['peak_bytes']:.2f}x | {m['saved_bytes'] / MIB:.1f} | "
            f"{m['act_bytes_analytic'] / MIB:.1f} | {m['step_ms_min']:.0f} / "
            f"{m['step_ms_median']:.0f} | {m['step_ms_min'] / base['step_ms_min']:.2f}x |"
        )
    p = base
    lines += [
        "",
        f"Fixed part of the peak (same for all): parameters {p['param_bytes'] / MIB:.1f} MiB, "
        f"gradients {p['grad_bytes'] / MIB:.1f} MiB, AdamW state {p['optim_bytes'] / MIB:.1f}"
        f" MiB; the residual-stream tensor B·T·d is {p['residual_bytes'] / MIB:.2f} MiB. "
        "Phase peaks (MiB) forward / backward / optimizer: "
        + "; ".join(
            f"{ck} {results[ck]['fwd_peak_bytes'] / MIB:.0f} / "
            f"{results[ck]['bwd_peak_bytes'] / MIB:.0f} / "
            f"{results[ck]['opt_peak_bytes'] / MIB:.0f}"
            for ck in CHECKPOINTS
        )
        + ".",
        "",
    ]
    lines += [f"![{ck}]({Path(results[ck]['snapshot_png']).name})" for ck in CHECKPOINTS]
    text = "\n".join(lines) + "\n"
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "README.md").write_text(text)

    every1 = results["every:1"]
    ok = base["saved_bytes"] >= 2 * every1["saved_bytes"] and (
        every1["peak_bytes"] < base["peak_bytes"]
    )
    print("PASS" if ok else "FAIL", f"(written to {args.out}/)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
