"""Memory scaling of attention (docs/experiments/attention.md): bytes saved for backward by naive and flash-torch.

FlashAttention keeps Q, K, V, O and the logsumexp L for backward, O(T·d); naive attention
keeps the (T, T) probability matrix, O(T²). This measures both with saved-tensor hooks
(device-independent: the bytes are what autograd holds, on any machine), fits the growth
exponent, and writes a markdown table and a log-log plot.

    python benchmarks/attention_memory.py [--seq 1024,2048,4096,8192,16384] [--out DIR]

Exits 1 unless flash-torch grows linearly (exponent 1 ± 0.1) and naive quadratically
(exponent > 1.8 between the two longest sequences).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

import torch

from cs336sys.attention import registry
from cs336sys.measure.memory import saved_tensor_bytes

IMPLS = ("naive", "flash-torch")


def measure(impl: str, seq: int, d: int, batch: int) -> int:
    q, k, v = (torch.randn(batch, seq, d, requires_grad=True) for _ in range(3))
    fn = registry.get(impl)
    out, saved = saved_tensor_bytes(lambda: fn(q, k, v, is_causal=True))
    del out
    return saved


def slope(xs: list[int], ys: list[int]) -> float:
    """Growth exponent between the last two points: log(y2/y1) / log(x2/x1)."""
    return math.log(ys[-1] / ys[-2]) / math.log(xs[-1] / xs[-2])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seq", default="1024,2048,4096,8192,16384")
    parser.add_argument("--d-head", type=int, default=64)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--out", default="reports/attention-memory")
    args = parser.parse_args()
    seqs = [int(s) for s in args.seq.split(",")]

    saved = {impl: [measure(impl, s, args.d_head, args.batch) for s in seqs] for impl in IMPLS}
    lines = [
        f"# Bytes saved for backward: naive vs flash-torch (batch {args.batch}, d {args.d_head}, "
        "fp32, causal)",
        "",
        "Measured with `python benchmarks/attention_memory.py` (saved-tensor hooks; each "
        "storage counted once).",
        "",
        "| seq | naive MiB | flash-torch MiB | naive / flash |",
        "| ---: | ---: | ---: | ---: |",
    ]
    for i, s in enumerate(seqs):
        n, f = saved["naive"][i], saved["flash-torch"][i]
        lines.append(f"| {s} | {n / 2**20:.2f} | {f / 2**20:.2f} | {n / f:.1f} |")
    growth = {impl: slope(seqs, saved[impl]) for impl in IMPLS}
    lines += [
        "",
        f"Growth exponent between seq {seqs[-2]} and {seqs[-1]}: naive {growth['naive']:.2f}, "
        f"flash-torch {growth['flash-torch']:.2f} (1 = linear, 2 = quadratic).",
        f"Ratio at seq {seqs[-1]}: naive saves "
        f"{saved['naive'][-1] / saved['flash-torch'][-1]:.1f}x the bytes of flash-torch.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "README.md").write_text(text + "\n![bytes saved for backward](saved_bytes.png)\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for impl in IMPLS:
        ax.plot(seqs, [b / 2**20 for b in saved[impl]], marker="o", label=impl)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel("bytes saved for backward (MiB)")
    ax.set_title(f"Attention memory, batch {args.batch}, d {args.d_head}, fp32, causal")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "saved_bytes.png", dpi=120)

    ok = abs(growth["flash-torch"] - 1) <= 0.1 and growth["naive"] > 1.8
    print("PASS" if ok else "FAIL", f"(written to {out}/)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
