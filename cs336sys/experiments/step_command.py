"""The command line of `cs336sys step`: its options, help, examples and how a point is named
on the progress bar, declared as a `Command` (sweep/declaration.py) that the kind's
`EXPERIMENT` carries and the CLI builds (cli/declared.py)."""

from __future__ import annotations

from typing import Any

from cs336sys.sweep import ranks
from cs336sys.sweep.declaration import Command
from cs336sys.sweep.options import list_option, option
from cs336sys.sweep.points import SpecError, positive_ints
from cs336sys.sweep.ranks import timeout_s


def options(
    size: list_option("Size preset(s) of the handout's table (small, medium, large, xl, 10B; "
                      "--handout 2025 for its xl), 2.7B, tiny or 8b (the 2026 leaderboard's). "
                      "[default: 8b on CUDA, tiny on CPU]") = None,
    seq: list_option("Context length(s). [default: 8192 on CUDA, 128 on CPU]") = None,
    batch: list_option("Batch size(s). [default: 2]") = None,
    switches: list_option("Switch sets: none, fused-adamw, fused-ce, flash, compile, sets joined "
                          "with + "
                          "(fused-adamw+fused-ce), all, or ablation (none, each alone, all). "
                          "[default: "
                          "ablation on CUDA, none,fused-adamw,fused-ce on CPU]") = None,
    precision: list_option("Autocast dtype: bf16 and/or fp32. [default: bf16 on CUDA, fp32 on "
                           "CPU]") = None,
    param_dtype: list_option("Weights: fp32 (master weights under autocast) and/or bf16 (16-bit "
                             "weights; cs336sys's AdamW keeps fp32 state, torch-adamw its "
                             "weights' bf16). [default: fp32]") = None,
    attention: option("The baseline attention that flash replaces (yours-torch, yours-triton: your "
                      "adapters'). [default: sdpa]", str | None) = None,
    optimizer: option("The baseline optimizer that fused-adamw replaces: adamw (ours, the "
                      "reference loop), torch-adamw, or your own: yours-adamw (your adapters' "
                      "get_adamw_cls) or NAME=package.module:Class, checked against torch's AdamW "
                      "first. [default: adamw]", str | None) = None,
    adamw: option("What fused-adamw runs: triton, foreach or torch-fused (torch's, CUDA). "
                  "[default: triton on CUDA, foreach on CPU]", str | None) = None,
    ce: option("What fused-ce runs: torch (chunked) or triton. "
               "[default: triton on CUDA, torch on CPU]", str | None) = None,
    warm_cache: option("Compile with the inductor and Triton caches already there, instead of from "
                       "empty ones as the leaderboard's 10-minute rule counts.",
                       bool, "--warm-cache") = False,
    warmup: option("Steps after the first one, untimed. [default: 2 on CUDA, 1 on "
                   "CPU]", int | None) = None,
    iters: option("Timed steps, at least (do_bench's too on CUDA). [default: 10, 3 on CPU]",
                  int | None) = None,
    min_time: option("Seconds the timed steps add up to, at least. [default: 1 on CUDA, 0 on "
                     "CPU]", float | None) = None,
    rounds: option("Interleaved rounds: every point's share of its timed steps, then the next "
                   "round, each point built again, so that drift falls on all alike. "
                   "[default: 3 on CUDA, 1 on CPU]", int | None) = None,
    num_layers: list_option("Override the preset's num_layers; a list (8,12,16) finds the largest "
                            "that "
                            "fits: after an out-of-memory the larger counts are skipped. [default: "
                            "8 "
                            "for the default 8b on CUDA]") = None,
    world_size: list_option("Ranks that share the step, each training its slice of the global "
                            "--batch (the leaderboard's: 2 GPUs). [default: 1]") = None,
    ddp: option("With --world-size above 1, what shares the step: a `ddp --impl` name (naive, "
                "flat, overlap, bucketed, torch, fsdp, torch-fsdp) or yours (yours, "
                "yours-fsdp, NAME=package.module:Class). [default: fsdp]", str | None) = None,
    course_timing: option("Also time each step as the leaderboard's test does "
                          "(triton.testing.do_bench, rep 30 s, warm-up 10 s: 40 s a point), "
                          "stored as course_ms beside ours. CUDA, one rank.", bool,
                          "--course-timing") = False,
    preset: option("leaderboard: the leaderboard's run unscaled, 8b at context 32768, batch 2, "
                   "bf16, on 2 ranks with fsdp; an option given explicitly wins.",
                   str | None) = None,
    skip_after_oom: option("After an out-of-memory, store the larger --num-layers of the same "
                           "other settings as skipped.", bool,
                           "--skip-after-oom/--no-skip-after-oom") = True,
) -> None:
    """The options of `step` beyond the model's (cli/options.py, model_options)."""


HELP = (
    "The default on CUDA is the leaderboard's 8B scaled to one GPU (8 of its 34 layers, context "
    "8192, batch 2); --num-layers, --seq, --batch and --vocab-size scale it. A list of "
    "--num-layers (with --checkpoint none, sqrt or groups:A,B,...) finds the largest model that "
    "fits: out-of-memory points are stored as `oom`, larger layer counts are then skipped, and "
    "the sweep goes on."
)

EXAMPLES = (
    "cs336sys step --size 8b --num-layers 8 --seq 8192 --batch 2 --switches ablation",
    "cs336sys step --preset leaderboard --switches none,fused-adamw+flash",
    "cs336sys step --world-size 2 --ddp yours-fsdp --size tiny",
)


def point_name(spec: Any) -> str:
    """A point in a few words, for the progress bar."""
    ranks = f" {spec.world_size}x{spec.ddp}" if spec.world_size > 1 else ""
    return f"{spec.model or spec.size} L={spec.num_layers} T={spec.seq} {spec.switches}{ranks}"


# --preset leaderboard: the leaderboard's run as it is timed, on two GPUs and unscaled (8B,
# 34 layers, batch 2, context 32768, bf16, causal); an option given explicitly wins.
PRESETS = {"leaderboard": dict(size=["8b"], seq=[32768], batch=[2], precision=["bf16"],
                               world_size=[2], ddp="fsdp")}


def world_sizes(world_size: Any, preset: str | None, device: str | None = None) -> list[int]:
    """--world-size's values, else the preset's, else one rank (SpecError for a bad value).
    With `device` (resolved), several ranks are checked as ddp checks them before any
    starts: a CS336SYS_DIST_TIMEOUT that is a number of seconds, and on a CPU no more local
    Gloo ranks than this host runs (NCCL's, one a GPU, the launcher counts)."""
    worlds = (positive_ints(world_size, "--world-size")
              or PRESETS.get(preset or "", {}).get("world_size", [1]))
    if device is not None and any(w > 1 for w in worlds):
        try:
            timeout_s()
        except ValueError as exc:
            raise SpecError(str(exc)) from None
        if not device.startswith("cuda"):
            ranks.world_sizes([w for w in worlds if w > 1], "gloo", [])
    return worlds


def starts_ranks(options: dict[str, Any]) -> bool:
    """Whether the points will start ranks, read from the options as given, before they are
    built: a world size above 1."""
    try:
        return max(world_sizes(options.get("world_size"), options.get("preset"))) > 1
    except SpecError:  # the points' check refuses it in its own words
        return False


COMMAND = Command(
    options=options,
    help=HELP,
    examples=EXAMPLES,
    groups=("model", "estimate", "nsys"),
    describe=point_name,
    ranks=True,
    starts_ranks=starts_ranks,
    run_options=("skip_after_oom",),
)


def one_process_timing(ranked: bool, rounds: Any, min_time: Any) -> None:
    """--rounds and --min-time interleave and extend the points one process times; a point on
    ranks runs fixed counts in its own ranks (every rank the same steps), so they were
    dropped there without a word: refused beside --world-size above 1."""
    given = [o for o, v in (("--rounds", rounds), ("--min-time", min_time)) if v is not None]
    if ranked and given:
        raise SpecError(f"{' and '.join(given)} {'time' if len(given) > 1 else 'times'} the "
                        "points of one process; --world-size above 1 runs each point on its "
                        "own ranks, every rank the same fixed steps (--iters): leave "
                        f"{'them' if len(given) > 1 else 'it'} out")
