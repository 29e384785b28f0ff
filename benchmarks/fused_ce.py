"""Fused LM head + cross-entropy: time and peak memory against the materialised baseline.

One forward + backward of the LM head's loss, three ways:
  baseline  the training step's: logits = h @ W^T under autocast, F.cross_entropy(logits.float())
  torch     linear_cross_entropy(..., impl="torch"): chunks of rows, forward and backward together
  triton    linear_cross_entropy(..., impl="triton"): the same, softmax/CE in one Triton kernel

    python benchmarks/fused_ce.py                       # CUDA: rows 65536 (batch 2 x 32768),
                                                        #   vocab 151936, d 4096; CPU: 4096, 32000, 512
    python benchmarks/fused_ce.py --rows 8192 --vocab 151936 --d-model 4096 --impls baseline,torch
    python benchmarks/fused_ce.py --impls baseline,triton --chunk-rows 512,2048,8192 \
        --grad-w-sum add,addmm                          # the sweep: every fused variant, one run

Every fused variant (impl x --chunk-rows x --grad-w-sum: how grad_W is summed over the chunks,
cs336sys/models/fused_ce.py) runs beside the baseline in the same invocation, in --rounds
interleaved rounds (each variant's share of its timed calls, then the next round), so that
drift falls on all alike; the ratios are of medians over all rounds.

Peak = the most bytes held at once above the inputs (h, W, targets) during the loss, its
backward and the .grad of h and W: torch.cuda.max_memory_allocated on CUDA, the live-tensor
tracker (cs336sys/measure/live_tensors.py) on CPU. Time: median of --iters synced calls after
--warmup. A point that runs out of memory is reported as OOM, not a crash. On CPU the Triton
kernel runs only in the interpreter (TRITON_INTERPRET=1, set here when triton is asked for),
which is slow: it is left out of the CPU default.

The baseline's logits are also counted from the shapes: rows x V in the autocast dtype, their
float32 copy, and the float32 log-softmax F.cross_entropy keeps for backward.

Stopped by SIGTERM (make gpu-owed's budget), it prints the table of the rounds done, so a
step cut short on a lent GPU keeps its figures.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import sys

import torch


def format_size(n: float) -> str:
    """Bytes in GB or MB (decimal), 3 significant digits or more."""
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.1f} MB"


def parse_args() -> argparse.Namespace:
    cuda = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if cuda else "cpu")
    parser.add_argument(
        "--rows", type=int, default=None, help="batch x context (CUDA 65536, CPU 4096)"
    )
    parser.add_argument(
        "--vocab", type=int, default=None, help="vocab size (CUDA 151936, CPU 32000)"
    )
    parser.add_argument(
        "--d-model", type=int, default=None, help="hidden size (CUDA 4096, CPU 512)"
    )
    parser.add_argument("--precision", choices=["bf16", "fp32"], default="bf16")
    parser.add_argument("--chunk-rows", default=None,
                        help="rows per chunk, a list to sweep (default: the function's)")
    parser.add_argument("--grad-w-sum", default="add",
                        help="add and/or addmm (CUDA): how grad_W is summed over the chunks")
    parser.add_argument("--rounds", type=int, default=None,
                        help="interleaved rounds (CUDA 3, CPU 1)")
    parser.add_argument("--impls", default=None, help="baseline,torch,triton (CPU: no triton)")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--iters", type=int, default=None, help="timed calls (CUDA 5, CPU 2)")
    args = parser.parse_args()
    on_cuda = args.device.startswith("cuda")
    args.rows = args.rows or (65536 if on_cuda else 4096)
    args.vocab = args.vocab or (151936 if on_cuda else 32000)
    args.d_model = args.d_model or (4096 if on_cuda else 512)
    args.iters = args.iters or (5 if on_cuda else 2)
    args.rounds = args.rounds or (3 if on_cuda else 1)
    args.chunk_rows = [int(r) for r in args.chunk_rows.split(",")] if args.chunk_rows else [None]
    args.grad_w_sum = args.grad_w_sum.split(",")
    for how in args.grad_w_sum:
        if how not in ("add", "addmm"):
            parser.error(f"unknown --grad-w-sum {how!r}: choose from add, addmm")
    args.impls = (args.impls or ("baseline,torch,triton" if on_cuda else "baseline,torch")).split(
        ","
    )
    for impl in args.impls:
        if impl not in ("baseline", "torch", "triton"):
            parser.error(f"unknown impl {impl!r}: choose from baseline, torch, triton")
    if "triton" in args.impls and not on_cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before the kernel module is imported
    return args


def make_inputs(args):
    g = torch.Generator(device=args.device).manual_seed(0)
    h = torch.randn(args.rows, args.d_model, device=args.device, generator=g).requires_grad_()
    w = torch.randn(args.vocab, args.d_model, device=args.device, generator=g)
    w = (w * args.d_model**-0.5).requires_grad_()
    t = torch.randint(args.vocab, (args.rows,), device=args.device, generator=g)
    return h, w, t


def loss_fn(impl: str, chunk_rows: int | None, grad_w_sum: str):
    import torch.nn.functional as F

    from cs336sys.models.fused_ce import linear_cross_entropy

    if impl == "baseline":  # as cs336sys/experiments/training_step.py computes it
        return lambda h, w, t: F.cross_entropy(F.linear(h, w).float(), t)
    return lambda h, w, t: linear_cross_entropy(h, w, t, chunk_rows=chunk_rows, impl=impl,
                                                grad_w_sum=grad_w_sum)


def step(fn, h, w, t, amp) -> None:
    """Forward + backward, then drop the gradients (so each call starts alike)."""
    with torch.autocast(h.device.type, dtype=amp or torch.bfloat16, enabled=amp is not None):
        loss = fn(h, w, t)
    loss.backward()
    h.grad = w.grad = None


def peak_bytes(fn, h, w, t, amp, device: str) -> int:
    if device.startswith("cuda"):
        from cs336sys.measure.memory import CudaProbe

        probe = CudaProbe(device)
        probe.reset_peak()
        step(fn, h, w, t, amp)
        return probe.peak()
    from cs336sys.measure.live_tensors import LiveTensorTracker

    with LiveTensorTracker() as tracker:  # counts only what is made inside: the inputs are not
        step(fn, h, w, t, amp)
    return tracker.peak


def variants(args) -> list[tuple[str, int | None, str]]:
    """(impl, chunk rows, grad_W sum): the baseline once, every fused combination."""
    out = []
    for impl in args.impls:
        if impl == "baseline":
            out.append(("baseline", None, "add"))
        else:
            out += [(impl, rows, how) for rows in args.chunk_rows for how in args.grad_w_sum]
    return out


def measure(variants_: list, args, inputs, amp) -> dict:
    """Each variant's peak (once) and its timed calls, in interleaved rounds; a variant that
    runs out of memory or fails is left out of the later rounds with what it said."""
    from cs336sys.measure.timing import time_loop

    results = {v: {"status": "ok", "times": []} for v in variants_}
    try:
        _rounds(results, variants_, args, inputs, amp, time_loop)
    except Stopped:  # what the finished calls measured is kept and printed
        print(f"(stopped by SIGTERM: medians of the rounds done, at most {args.rounds})")
    for r in results.values():
        if r["status"] == "ok" and not r["times"]:
            r["status"] = "not measured (stopped)"
        elif r["status"] == "ok":
            r["ms"] = statistics.median(r["times"])
    return results


class Stopped(Exception):
    """SIGTERM, raised between two calls: the rounds end and the table is printed."""


def _stop(signum: int, frame: object) -> None:
    raise Stopped


def _rounds(results: dict, variants_: list, args, inputs, amp, time_loop) -> None:
    for round_ in range(args.rounds):
        for v in variants_:
            r = results[v]
            if r["status"] != "ok":
                continue
            fn = loss_fn(*v)
            try:
                if round_ == 0:
                    r["peak"] = peak_bytes(fn, *inputs, amp, args.device)
                r["times"] += time_loop(lambda fn=fn: step(fn, *inputs, amp),
                                        args.warmup, args.iters, args.device)
            except torch.OutOfMemoryError:
                r["status"] = "OOM"
            except (RuntimeError, ValueError, TypeError) as exc:  # e.g. addmm's out_dtype missing
                r["status"] = f"error: {str(exc).splitlines()[0][:80]}"
            if r["status"] != "ok":
                inputs[0].grad = inputs[1].grad = None
                if args.device.startswith("cuda"):
                    torch.cuda.empty_cache()


def main() -> int:
    args = parse_args()
    from cs336sys.models.fused_ce import default_chunk_rows

    amp = torch.bfloat16 if args.precision == "bf16" else None
    n, v, c = args.rows, args.vocab, args.d_model
    chunk = max(r or default_chunk_rows(n, v, c) for r in args.chunk_rows)
    low = 2 if amp is not None else 4
    logits_low, logits_fp32 = n * v * low, n * v * 4
    sweep = ", ".join(str(r or default_chunk_rows(n, v, c)) for r in args.chunk_rows)
    print(f"# Fused LM head + cross-entropy: rows {n}, vocab {v}, d_model {c}, {args.precision}, "
          f"{args.device}, chunk_rows {sweep}")
    print()
    print("Materialised by the baseline, from the shapes:")
    print(f"- logits ({n} x {v}) in {'bf16' if amp else 'fp32'}: {format_size(logits_low)}")
    if amp is not None:
        print(f"- their fp32 copy (.float()): {format_size(logits_fp32)}")
    print(f"- fp32 log-softmax kept for backward: {format_size(logits_fp32)}, and in backward the "
          f"fp32 gradient of the logits: {format_size(logits_fp32)}")
    print(f"- the fused version's largest chunk: {chunk} x {v} fp32 = {format_size(chunk * v * 4)}")
    print()

    inputs = make_inputs(args)
    signal.signal(signal.SIGTERM, _stop)
    results = measure(variants(args), args, inputs, amp)
    base = results.get(("baseline", None, "add"))
    base = base if base and base["status"] == "ok" else None
    # the samples each median is of: --iters x --rounds, fewer where SIGTERM stopped the rounds
    taken = sorted({len(r["times"]) for r in results.values() if r["status"] == "ok"})
    samples = "-".join(map(str, dict.fromkeys([taken[0], taken[-1]]))) if taken else "0"
    print(f"| impl | chunk rows | grad_W sum | peak (above inputs) | peak vs baseline | "
          f"ms (median of {samples}) | time vs baseline |")
    print("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for (impl, rows, how), r in results.items():
        rows_cell = "" if impl == "baseline" else str(rows or default_chunk_rows(n, v, c))
        how_cell = "" if impl == "baseline" else how
        if r["status"] != "ok":
            print(f"| {impl} | {rows_cell} | {how_cell} | {r['status']} | | | |")
            continue
        vs_mem = f"{r['peak'] / base['peak']:.3f}x" if base else ""
        vs_time = f"{r['ms'] / base['ms']:.2f}x" if base else ""
        print(f"| {impl} | {rows_cell} | {how_cell} | {format_size(r['peak'])} | {vs_mem} | "
              f"{r['ms']:.1f} | {vs_time} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
