"""Host cost of one attention call: microseconds per call, ours against SDPA and
against a bare Triton launch of an empty kernel, the floor; and the floors of our forward
without a kernel: its two allocations alone, and inside an autograd.Function that saves what
ours saves (their difference is autograd's own cost per call).

    python benchmarks/attention_host_overhead.py [--calls 100] [--repeats 7] [--json FILE]

Shape: batch 1, 16 heads, d 64, seq 1024, bf16, causal. Each figure is the time for `--calls`
calls issued without a device sync, divided by the calls (median of `--repeats` rounds, after
a warm-up call that compiles and autotunes). On CUDA that is the host's own work per call as
long as the GPU keeps up (the "synced" column adds one sync at the end: when it is close to the
unsynced figure, the calls are host-bound). Target on CUDA: our forward at most 40 us per call
(it was about 190 us on an H100 host at commit c4f7c7e).

Without CUDA there is no such figure. With TRITON_INTERPRET=1 the Triton rows are measured on
CPU, marked as such and not the target: ours with the kernel launches stubbed out (only the
Python around them: the plan lookup, checks, allocations, autograd), the empty kernel run by
the interpreter. Without the interpreter only SDPA is measured. SDPA on CPU computes for real,
so its CPU figures are compute time, not host cost.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import triton
import triton.language as tl

TARGET_US = 40.0
BATCH, HEADS, SEQ, D_HEAD = 1, 16, 1024, 64


@triton.jit
def _empty_kernel(X, N: tl.constexpr):
    pass


def per_call_us(fn: Callable[[], object], calls: int, repeats: int, sync: Callable[[], None]):
    """(unsynced, synced) microseconds per call: medians over `repeats` rounds of `calls`."""
    fn()  # compile, autotune, allocate: not what is measured
    sync()
    unsynced, synced = [], []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        t1 = time.perf_counter()
        sync()
        t2 = time.perf_counter()
        unsynced.append((t1 - t0) / calls * 1e6)
        synced.append((t2 - t0) / calls * 1e6)
    return statistics.median(unsynced), statistics.median(synced)


def stub_kernel_launches(flash_triton) -> None:
    """CPU only: make every kernel launch of flash_triton a no-op (the interpreter would take
    minutes per call at this shape), so that what is timed is the Python around the launch."""

    class Stub:
        def __init__(self, kernel):
            self.arg_names = kernel.arg_names

        def __getitem__(self, grid):
            return lambda *args, **kwargs: None

    for name, kernel in list(flash_triton._KERNELS.items()):
        flash_triton._KERNELS[name] = Stub(kernel)
    flash_triton._PLANS.clear()  # plans hold the kernels they launch


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=100, help="calls per round, no sync between")
    parser.add_argument("--repeats", type=int, default=7, help="rounds; the median is reported")
    parser.add_argument("--json", type=Path, help="also write the figures to this file")
    args = parser.parse_args()

    import torch
    import torch.nn.functional as F

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    triton_ok = (cuda and not interpreted) or (not cuda and interpreted)

    def inputs(grad: bool):
        q, k, v, do = (torch.randn(BATCH, HEADS, SEQ, D_HEAD, device=device, dtype=torch.bfloat16)
                       for _ in range(4))
        return [t.requires_grad_(grad) for t in (q, k, v)] + [do]

    def fwd(attn, grad):
        q, k, v, _ = inputs(grad)
        return lambda: attn(q, k, v, is_causal=True)

    def fwd_bwd(attn):
        q, k, v, do = inputs(True)

        def step():
            q.grad = k.grad = v.grad = None
            attn(q, k, v, is_causal=True).backward(do)

        return step

    rows: list[tuple[str, float | None, float | None, str]] = []  # (what, us, synced us, note)

    def measure(
        what: str, fn, note: str = "", calls: int | None = None, repeats: int | None = None
    ):
        u, s = per_call_us(fn, calls or args.calls, repeats or args.repeats, sync)
        rows.append((what, u, s if cuda else None, note))
        print(f"  {what}: {u:.1f} us", file=sys.stderr, flush=True)

    if triton_ok:
        from cs336sys.attention import flash_triton

        x = torch.empty(1, device=device)
        handle = _empty_kernel[(1,)](x, N=1)
        note = "" if cuda else "CPU, interpreted: not the target"
        measure("empty Triton kernel, Triton's launcher (floor)",
                lambda: _empty_kernel[(1,)](x, N=1), note)
        if cuda:
            launch = handle[(1, 1, 1)]
            measure("empty Triton kernel, compiled handle", lambda: launch(x, 1))
        ours = flash_triton.flash_attention_triton
        if not cuda:
            stub_kernel_launches(flash_triton)
            note = "CPU, kernels stubbed: the Python around the launch only; not the target"
        measure("ours forward, no grad", fwd(ours, False), note)
        measure("ours forward (inputs need grad)", fwd(ours, True), note)
        measure("ours forward+backward", fwd_bwd(ours), note)
        if cuda:
            # The other launch path too (plans are keyed on it), so one run shows both side
            # by side: the compiled handle is the default, CS336SYS_TRITON_DIRECT_LAUNCH=0
            # goes through Triton's JIT launcher.
            default = flash_triton.DIRECT_LAUNCH
            other = "Triton's launcher" if default else "direct launch"
            flash_triton.DIRECT_LAUNCH = not default
            measure(f"ours forward, no grad, {other}", fwd(ours, False))
            measure(f"ours forward (inputs need grad), {other}", fwd(ours, True))
            measure(f"ours forward+backward, {other}", fwd_bwd(ours))
            flash_triton.DIRECT_LAUNCH = default
    else:
        why = "TRITON_INTERPRET=1 set with CUDA" if cuda else "needs a GPU or TRITON_INTERPRET=1"
        rows.append(("ours and the empty Triton kernel", None, None, f"not run: Triton {why}"))

    # The floors of our forward with and without grad: its two allocations (O and L) alone,
    # then inside an autograd.Function that saves what ours saves. Neither launches anything,
    # so on any device they are host cost, and their difference is autograd's own per call.
    from cs336sys.attention.flash_triton_launch import forward_outputs

    def allocate(q, k, v, is_causal):  # what our forward allocates, and nothing else
        return forward_outputs(q)

    class AllocateOnly(torch.autograd.Function):
        """Our Function's bookkeeping (save Q, K, V, O, L; a flag) around no kernel."""

        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            o, lse = forward_outputs(q)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal = is_causal
            return o

        @staticmethod
        def backward(ctx, do):
            return None, None, None, None

    measure("floor: allocate O and L", fwd(allocate, False))
    measure("floor: allocate O and L in an autograd.Function",
            fwd(lambda q, k, v, is_causal: AllocateOnly.apply(q, k, v, is_causal), True))

    sdpa = F.scaled_dot_product_attention
    # SDPA computes on CPU (tens of ms per call here): fewer calls, and not a host cost.
    cpu_calls = {} if cuda else {"calls": min(args.calls, 5), "repeats": min(args.repeats, 3)}
    note = "" if cuda else "CPU compute time, not host cost"
    measure("SDPA forward (inputs need grad)", fwd(sdpa, True), note, **cpu_calls)
    measure("SDPA forward+backward", fwd_bwd(sdpa), note, **cpu_calls)

    name = torch.cuda.get_device_name(0) if cuda else "CPU"
    print(f"# Attention host cost per call on {name}")
    print()
    print(f"batch {BATCH}, {HEADS} heads, d {D_HEAD}, seq {SEQ}, bf16, causal; {args.calls} calls "
          f"without a sync per round, median of {args.repeats} rounds")
    print()
    print("| call | us per call | synced us per call | note |")
    print("| --- | ---: | ---: | --- |")
    for what, us, synced, note in rows:
        fmt = lambda x: "" if x is None else f"{x:.1f}"  # noqa: E731
        print(f"| {what} | {fmt(us)} | {fmt(synced)} | {note} |")
    ours_fwd = next((us for what, us, _, _ in rows if what.startswith("ours forward (")), None)
    met = None
    print()
    if cuda and ours_fwd is not None:
        met = ours_fwd <= TARGET_US
        print(f"Target: ours forward at most {TARGET_US:g} us per call: "
              f"{ours_fwd:.1f} us, {'met' if met else 'NOT met'}")
    else:
        print(f"Target (ours forward at most {TARGET_US:g} us per call) is a CUDA figure: not "
              "measured on this machine.")
    if args.json:
        args.json.write_text(json.dumps({
            "device": name, "interpreted": interpreted and not cuda, "target_us": TARGET_US,
            "ours_forward_us": ours_fwd if cuda else None, "met": met,
            "rows": [{"call": w, "us": u, "synced_us": s, "note": n} for w, u, s, n in rows],
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
