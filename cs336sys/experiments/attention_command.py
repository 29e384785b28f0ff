"""The command line of `cs336sys attention`: its options, help, examples and how a point is
named on the progress bar, declared as a `Command` (sweep/declaration.py) that the kind's
`EXPERIMENT` carries and the CLI builds (cli/declared.py). `profile attention` takes these
options too, so this module stays light (it imports the sweep's declarations alone): the
command line imports it as it starts."""

from __future__ import annotations

from typing import Any

from cs336sys.sweep.declaration import Command
from cs336sys.sweep.options import list_option, option


def options(
    impl: list_option("Attention implementation(s): naive, compiled, sdpa, flash-torch, triton; "
                      "yours: yours-torch, yours-triton (your adapters file) or "
                      "yours=package.module:Function. [default: all but triton and compiled on "
                      "CPU]", "--attention", "--impl") = None,
    seq: list_option("Sequence length(s). [default: 256,1024,4096,8192,16384 on CUDA, "
                     "128,256,512,1024 "
                     "on CPU]") = None,
    d_head: list_option("Head dimension(s). [default: 16,32,64,128 on CUDA, 32,64 on CPU]") = None,
    batch: list_option("Batch size(s). [default: 8 on CUDA, 4 on CPU]") = None,
    heads: option("Heads, for (batch, heads, seq, d) inputs; omit for (batch, seq, d).",
                  int | None) = None,
    precision: list_option("fp32, bf16 and/or fp16. [default: fp32]") = None,
    causal: option("Causal mask. [default: causal]", bool | None, "--causal/--no-causal") = None,
    passes: option("forward, backward or both (adds end-to-end). [default: both]",
                   str | None, "--pass") = None,
    warmup: option("Untimed calls before each timed pass (loop timer). [default: 10 on CUDA, 3 on "
                   "CPU]", int | None) = None,
    iters: option("Timed calls per pass, at least (do_bench too). [default: 100 on CUDA, 10 on "
                  "CPU]", int | None) = None,
    timer: option("loop (sync around each call) or do-bench (triton.testing.do_bench, CUDA). "
                  "[default: loop]", str | None) = None,
    min_time: option("Seconds each pass keeps sampling, after at least --iters calls (do_bench "
                     "too). [default: 1 on CUDA, 0 on CPU]", float | None) = None,
    rounds: option("Interleaved rounds: every point's share of its timed calls, then the next "
                   "round, so that drift falls on every implementation alike. "
                   "[default: 3 on CUDA, 1 on CPU]", int | None) = None,
    sdpa_backend: option("For sdpa: auto, flash, efficient, math or cudnn.", str) = "auto",
    triton_opt_in: list_option("For triton: its kernel paths, a point each: default (Hopper, "
                               "16-bit: tiles through TMA descriptors; else pointers), pointer, "
                               "tma, atomic-dq (dQ added with atomics in the dK/dV kernel), "
                               "pointer+atomic-dq, tma+atomic-dq, reduce-dq (each dQ tile "
                               "added by one TMA reduction; TMA build only), heavy-first "
                               "(causal tiles launched longest first), lazy-rescale (the "
                               "forward's running max moved only past a threshold), "
                               "warp-specialize (the forward's and dK/dV kernel's loops split "
                               "into warp groups; TMA build only), and their combinations "
                               "(pointer+heavy-first+atomic-dq). [default: what "
                               "CS336SYS_TRITON_TMA, _HEAVY_FIRST, _LAZY_RESCALE, "
                               "_WARP_SPECIALIZE, _ATOMIC_DQ and _REDUCE_DQ say, else "
                               "default]") = None,
    compile: option("Wrap every implementation in the list in torch.compile, yours included; "
                    "stored as the setting compile. (`compiled` is naive attention compiled "
                    "already: with --compile, list naive.)", bool,
                    "--compile/--no-compile") = False,
    preset: option("pytorch-attention, flash-benchmarking or leaderboard.", str | None) = None,
    skip_after_oom: option("After an OOM, store longer sequences of the same impl, d and dtype as "
                           "skipped.", bool, "--skip-after-oom/--no-skip-after-oom") = True,
    device: option("auto, cpu, cuda or cuda:N.", str) = "auto",
    seed: option("Seed for the random inputs.", int) = 0,
) -> None:
    """The options of `attention` beyond the store's and --force (--attention, also --impl,
    is `specs`'s `impl`)."""


def point_name(spec: Any) -> str:
    """A point in a few words, for the progress bar."""
    compiled = " compiled" if spec.compile else ""
    return f"{spec.impl}{compiled} seq={spec.seq} d={spec.d_head} {spec.precision}"


COMMAND = Command(
    options=options,
    help=(
        "Each point is checked once against a float64 reference (max_err; a point outside the "
        "tolerance is stored as wrong), and records the memory in use before backward (CUDA: "
        "allocated bytes; CPU: bytes saved for backward), peak memory (CUDA), FLOPs and TFLOP/s. Without "
        "CUDA, --attention triton needs TRITON_INTERPRET=1 (rows are marked interpreted). --impl "
        "is another name for --attention here."
    ),
    examples=(
        "cs336sys attention --seq 16384 --attention triton,sdpa --precision bf16",
        "cs336sys attention --preset leaderboard --impl triton --triton-opt-in default,pointer,atomic-dq",
        "cs336sys attention --impl yours-torch,flash-torch --seq 128,256",
        "cs336sys attention --impl naive,yours-torch --compile",
    ),
    groups=("estimate", "nsys"),
    describe=point_name,
    run_options=("skip_after_oom",),
)
