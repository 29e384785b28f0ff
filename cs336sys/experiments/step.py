"""Time one full training step as the CS336 2026 leaderboard does (zero_grad, forward,
cross-entropy's mean over the batch, backward, AdamW; do_bench on CUDA), once per switch set,
so that each optimisation's gain shows alone and together.

The leaderboard's step, `optimizer.zero_grad(); loss = cross_entropy(model(x), y).sum();
loss.backward(); optimizer.step()` (cs336_basics' cross_entropy is the mean over the tokens,
a scalar, which `.sum()` leaves as it is), runs on the 8B config (d_model 4096, d_ff 11008, 34 layers, 32 heads, vocab 151936, context 32768,
batch 2, bf16, causal), timed with `triton.testing.do_bench`. Here the whole step is one
function with no sync inside (unlike `cs336sys model`, which times each phase): do_bench on
CUDA, the loop timer (a sync before and after each call) on a CPU. `--num-layers`, `--seq`,
`--batch` and `--vocab-size` scale the config down to one GPU.

The switches, each alone or together (`fused-adamw+fused-ce`, `all`, or `ablation` for none,
each alone and all):

    fused-adamw  our fused AdamW instead of the reference loop (models/adamw.py): the Triton
                 kernel on CUDA, the multi-tensor (foreach) one on a CPU, `--adamw` picks;
    fused-ce     the LM head and cross-entropy fused (models/fused_ce.py): the (B·T, V) logits
                 are never materialised;
    flash        our Triton FlashAttention-2 (causal) as the model's attention instead of the
                 baseline `--attention` (SDPA by default);
    compile      torch.compile of each block's forward, from an empty cache: the compile time and the
                 point's wall time are stored, next to the leaderboard's 10-minute rule.

Activation checkpointing is an axis of its own (`--checkpoint none,groups:14,14,6`): it buys
memory, not time, and finding the largest model that fits is what it is for.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cs336sys.attention import registry
from cs336sys.experiments import ddp_setup, preflight, step_command, step_section
from cs336sys.experiments.checks import CHECK_METRICS, before_timing, judged, user_code
from cs336sys.experiments.model import (
    check_blocks,
    check_model,
    preset_config,
    preset_sizes,
)
from cs336sys.experiments.step_ablation import merge, split
from cs336sys.experiments.step_build import (
    COURSE_REP_MS,
    COURSE_WARMUP_MS,
    LIMIT_S,
    build,
    course_ms,
    empty_compile_cache,
    once_per_process,
    tensor_peak_bytes,
    within_limit,
)
from cs336sys.experiments.step_ranks import ranks_wrapper, run_on_ranks
from cs336sys.experiments.training_step import (
    interpreted,
    optimizer_option,
    throughput,
    throughput_metrics,
)
from cs336sys.measure.device import synchronize
from cs336sys.measure.dtypes import matmul_precision
from cs336sys.measure.progress import phase
from cs336sys.measure.stats import flatten
from cs336sys.measure.timing import time_do_bench, time_loop
from cs336sys.models.config import ModelShape
from cs336sys.sweep import points
from cs336sys.sweep.declaration import (
    Experiment,
    Metric,
    metric_table,
    settings_keys,
    timing,
)
from cs336sys.sweep.points import (
    SpecError,
    check_seed,
    check_triton,
    checkpoint_list,
    choices,
    counts,
    device_choice,
    expand,
    listed,
    one_value_options,
    positive_ints,
    positive_sizes,
    unknown,
)
from cs336sys.sweep.result import Result
from cs336sys.sweep.rounds import ROUNDS_DONE
from cs336sys.yours.implementations import named_impl

SWITCHES = ("fused-adamw", "fused-ce", "flash", "compile")
ADAMW_IMPLS = ("triton", "foreach", "torch-fused")  # what fused-adamw runs
CE_IMPLS = ("torch", "triton")  # what fused-ce runs
OPT_CALLS = 3  # optimizer steps timed alone after the timed steps
PARAM_DTYPES = ("fp32", "bf16")

# A GPU gets the 8B scaled to one H100 (8 layers at context 8192, batch 2); a CPU
# a point that finishes in seconds, in fp32 (bf16 is emulated on CPUs without AVX512-BF16).
# fused-ce runs the Triton kernel on CUDA: 668 ms against the chunked torch one's 813 at
# 65,536 rows x 151,936 vocab on an H200 (benchmarks/fused_ce.py, reports/nvidia-h200).
DEFAULTS = {
    "cuda": dict(size="8b", num_layers=8, seq=8192, batch=2, warmup=2, iters=10,
                 adamw="triton", ce="triton", attention="sdpa", switches="ablation",
                 precision="bf16"),
    "cpu": dict(size="tiny", num_layers=None, seq=128, batch=2, warmup=1,
                iters=3, adamw="foreach", ce="torch", attention="sdpa",
                switches="none,fused-adamw,fused-ce", precision="fp32"),
}
PRESETS = step_command.PRESETS  # what --preset means, declared with the option
DEFAULT_DDP = "fsdp"  # on several ranks: the 8B fits only sharded


@dataclass(frozen=True)
class StepSpec(ModelShape):
    batch: int
    precision: str  # autocast dtype: bf16 (the leaderboard's) or fp32
    param_dtype: str  # fp32 master weights under autocast, or bf16 weights (fp32 optimizer state)
    switches: str  # "none" or the switches on, "+"-joined in SWITCHES order
    optimizer: str  # what ran, resolved from the switches
    loss: str  # materialised | fused-torch | fused-triton
    attention: str
    compile: bool
    checkpoint: str = "none"
    timer: str = "loop"  # do_bench (CUDA) | loop
    warm_cache: bool = False  # compile: with the inductor and Triton caches as they are
    warmup: int = 1
    iters: int = 3
    device: str = "cpu"
    seed: int = 0
    model: str | None = None  # None: cs336sys's TransformerLM; else the user's (--model)
    blocks: str | None = None  # where the user's model keeps its blocks (--blocks)
    min_time: float = 0.0  # the timed steps add up to at least this many seconds
    # the timed steps in this many interleaved rounds (sweep/runner.in_rounds): each round
    # builds the point again and takes its share of iters and min_time
    rounds: int = 1
    # ranks of the step (experiments/step_ranks.py), each training its slice of the batch,
    # and the wrapper that shares the step between them (a `ddp --impl` name)
    world_size: int = 1
    ddp: str | None = None
    # also time the step as the leaderboard's test does (not a setting: it adds a metric)
    course_timing: bool = False

    def settings(self) -> dict[str, object]:
        """Every field but course_timing, which adds a metric and changes no point."""
        out = super().settings()
        out.pop("course_timing")
        return out

    @property
    def backend(self) -> str:
        """The process group's backend, for points on several ranks."""
        return "nccl" if self.device.startswith("cuda") else "gloo"


# The switches that change cs336sys's model (its attention, its LM head): not the user's.
MODEL_SWITCHES = ("flash", "fused-ce")


def parse_switches(values: Iterable[str] | None, default: str) -> list[tuple[str, ...]]:
    """`--switches none,fused-ce,fused-adamw+fused-ce,all` -> the switch sets, in order.
    `ablation` is none, each switch alone, and all of them."""
    out: list[tuple[str, ...]] = []
    for item in listed(values, "--switches", default.split(",")):
        if item == "ablation":
            sets = [(), *((s,) for s in SWITCHES), SWITCHES]
        elif item == "all":
            sets = [SWITCHES]
        elif item == "none":
            sets = [()]
        else:
            names = [n.strip() for n in item.split("+")]
            for n in names:
                if n in ("none", "all", "ablation"):  # a set, not a switch to join
                    raise SpecError(f"--switches: {n} stands alone, not joined with + "
                                    f"({item}); list it beside the others: --switches "
                                    f"{','.join(names)}")
                if n not in SWITCHES:
                    raise unknown("--switches", n, [*SWITCHES, "none", "all", "ablation"],
                                  "switch")
            sets = [tuple(s for s in SWITCHES if s in names)]
        out += [s for s in sets if s not in out]
    return out


def asked_as(values: Iterable[str] | None, default: str, switch: str) -> str:
    """How the command line asked for `switch`: `--switches flash`, or `--switches ablation
    (it holds flash)` where only a preset named it, for a refusal to quote."""
    items = listed(values, "--switches", default.split(","))
    if any(switch in [n.strip() for n in item.split("+")] for item in items):
        return f"--switches {switch}"
    preset = next((i for i in items if i in ("ablation", "all")), None)
    return f"--switches {preset} (it holds {switch})" if preset else f"--switches {switch}"


@one_value_options
def specs(
    *,
    size: Iterable[str] | None = None,
    seq: Iterable[Any] | None = None,
    batch: Iterable[Any] | None = None,
    precision: Iterable[str] | None = None,
    param_dtype: Iterable[str] | None = None,
    switches: Iterable[str] | None = None,
    checkpoint: Iterable[str] | None = None,
    attention: str | None = None,
    optimizer: str | None = None,
    adamw: str | None = None,
    ce: str | None = None,
    warm_cache: bool = False,
    warmup: int | None = None,
    iters: int | None = None,
    min_time: float | None = None,
    rounds: int | None = None,
    device: str = "auto",
    seed: int = 0,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_layers: Iterable[Any] | int | None = None,
    num_heads: int | None = None,
    vocab_size: int | None = None,
    model: str | None = None,
    blocks: str | None = None,
    world_size: Iterable[Any] | None = None,
    ddp: str | None = None,
    preset: str | None = None,
    course_timing: bool = False,
) -> list[StepSpec]:
    """The points of a step sweep (the product of the list options), validated; SpecError
    names the first bad option. What is not given takes the device's default (DEFAULTS).
    The user's model (`model`) takes the switches that do not change its code: fused-adamw
    and compile (per block, found as --checkpoint finds them; whole when they are not)."""
    dev = device_choice(device)
    on_cuda = dev.startswith("cuda")
    defaults = DEFAULTS["cuda" if on_cuda else "cpu"]
    if preset is not None and preset not in PRESETS:
        raise unknown("--preset", preset, PRESETS)
    chosen = PRESETS.get(preset, {})
    size, seq, batch = (given if given is not None else chosen.get(name)
                        for name, given in (("size", size), ("seq", seq), ("batch", batch)))
    precision = precision if precision is not None else chosen.get("precision")
    worlds = step_command.world_sizes(world_size, preset, dev)
    ranked = any(w > 1 for w in worlds)
    warmup = defaults["warmup"] if warmup is None else warmup
    iters = defaults["iters"] if iters is None else iters
    counts(warmup, iters)
    step_command.one_process_timing(ranked, rounds, min_time)
    least_s = points.min_time(min_time, on_cuda)
    rounds = points.rounds(rounds, on_cuda, iters)
    check_seed(seed)
    sizes = preset_sizes(size, defaults["size"])
    if num_layers is None and size is None:
        num_layers = defaults["num_layers"]  # the default 8B is scaled down to fit
    if isinstance(num_layers, int):
        num_layers = [num_layers]
    # A list of layer counts finds the largest model that fits: smallest first, and after an
    # out-of-memory the larger ones with the same other settings are skipped (oom_axis).
    layers = sorted(positive_ints(num_layers, "--num-layers")) if num_layers else [None]
    overrides = positive_sizes(d_model=d_model, d_ff=d_ff, num_heads=num_heads,
                                vocab_size=vocab_size)
    precisions = choices(
        precision, ("bf16", "fp32"), "--precision", default=[defaults["precision"]]
    )
    param_dtypes = choices(param_dtype, PARAM_DTYPES, "--param-dtype", default=["fp32"])
    sets = parse_switches(switches, defaults["switches"])
    wrapper_asked = (ddp if ddp is not None else chosen.get("ddp", DEFAULT_DDP)).strip()
    given = {"--adamw": ("fused-adamw", adamw), "--ce": ("fused-ce", ce),
             "--warm-cache": ("compile", warm_cache or None)}
    adamw = defaults["adamw"] if adamw is None else adamw.strip()  # '' is not the default
    if adamw not in ADAMW_IMPLS:
        raise unknown("--adamw", adamw, ADAMW_IMPLS)
    ce = defaults["ce"] if ce is None else ce.strip()
    if ce not in CE_IMPLS:
        raise unknown("--ce", ce, CE_IMPLS)
    for option, (switch, value) in given.items():  # a setting of a switch not run: ignored
        if value is not None and not any(switch in switch_set for switch_set in sets):
            raise SpecError(f"{option} sets what the {switch} switch runs, which --switches "
                            f"{','.join('+'.join(x) or 'none' for x in sets)} leaves out")

    if model is not None and switches is None:  # the default's sets, less what changes ours
        sets = list(dict.fromkeys(tuple(s for s in switch_set if s not in MODEL_SWITCHES)
                                  for switch_set in sets))
    on = {s for switch_set in sets for s in switch_set}
    if model is not None:
        check_model(model, attention)
        for switch in MODEL_SWITCHES:
            if switch in on:
                raise SpecError(f"{asked_as(switches, defaults['switches'], switch)} changes "
                                "cs336sys's model (its attention, its LM head); --model "
                                f"{model} takes fused-adamw and compile")
    elif blocks is not None:
        raise SpecError("--blocks names where your model keeps its blocks: give it with --model")
    else:
        attention = named_impl(defaults["attention"] if attention is None else attention,
                               "attention", "--attention", registry.names())
    baseline = optimizer_option(optimizer)
    if "flash" in on:
        check_triton(on_cuda, asked_as(switches, defaults["switches"], "flash"))
    elif attention == "triton":
        check_triton(on_cuda, "--attention triton")
    if "fused-adamw" in on and adamw == "triton":
        check_triton(on_cuda, asked_as(switches, defaults["switches"], "fused-adamw")
                     + " with --adamw triton")
    if "fused-ce" in on and ce == "triton":
        check_triton(on_cuda, asked_as(switches, defaults["switches"], "fused-ce")
                     + " with --ce triton")
    if "fused-adamw" in on and adamw == "torch-fused" and not on_cuda:
        raise SpecError("--adamw torch-fused: torch's fused AdamW is benchmarked on CUDA only")
    seqs = positive_ints(seq, "--seq", default=[defaults["seq"]])
    batches = positive_ints(batch, "--batch", default=[defaults["batch"]])
    wrapper = None
    if ranked:
        wrapper = ranks_wrapper(wrapper_asked, worlds, batches)
    elif ddp is not None:
        raise SpecError("--ddp shares the step between ranks: give --world-size 2 or more")
    if wrapper == "fsdp" and "bf16" in param_dtypes:  # its rows said bf16 weights
        raise SpecError("--param-dtype bf16 under cs336sys's FSDP (--ddp fsdp, the default on "
                        "ranks): it keeps fp32 master shards, so the weights would be fp32; "
                        "--precision bf16 computes in bf16, --ddp torch-fsdp keeps bf16 weights")
    if course_timing and not on_cuda:
        raise SpecError("--course-timing is triton.testing.do_bench's, which times with CUDA "
                        "events: it needs CUDA")
    if course_timing and ranked:
        given = "" if world_size is not None else f" (--preset {preset} runs {max(worlds)} ranks)"
        raise SpecError(f"--course-timing runs on one GPU{given}: do_bench decides its count on "
                        "each rank alone, and ranks must run the same steps; add --world-size 1")
    out = []
    for p in expand({"size": sizes, "num_layers": layers, "seq": seqs, "batch": batches,
                     "precision": precisions, "param_dtype": param_dtypes,
                     "checkpoint": checkpoint_list(checkpoint), "switches": sets,
                     "world_size": worlds}):
        cfg = preset_config(p["size"], context_length=p["seq"], model=model, blocks=blocks,
                            checkpoint=p["checkpoint"], num_layers=p["num_layers"], **overrides)
        check_blocks(cfg)
        on = p["switches"]
        out.append(StepSpec(
            **ModelShape.of(p["size"], cfg), batch=p["batch"],
            precision=p["precision"], param_dtype=p["param_dtype"],
            switches="+".join(on) or "none",
            optimizer=f"adamw-{adamw}" if "fused-adamw" in on else baseline,
            loss=f"fused-{ce}" if "fused-ce" in on else "materialised",
            attention="triton" if "flash" in on else attention,
            compile="compile" in on, checkpoint=p["checkpoint"],
            timer="do_bench" if on_cuda else "loop", warm_cache=warm_cache and "compile" in on,
            warmup=warmup, iters=iters, device=dev, seed=seed, model=model, blocks=blocks,
            min_time=least_s,
            rounds=rounds, world_size=p["world_size"], course_timing=course_timing,
            ddp=wrapper if p["world_size"] > 1 else None,
        ))
        if p["world_size"] > 1:  # every rank the same steps: fixed counts, the loop timer
            out[-1] = dataclasses.replace(out[-1], timer="loop", min_time=0.0, rounds=1)
    return list(dict.fromkeys(out))


# -- the step ---------------------------------------------------------------------------------


def run(spec: StepSpec) -> Result:
    import torch

    from cs336sys.measure.nvtx import measured

    on_cuda = spec.device.startswith("cuda")
    losses: list[Any] = []
    config = dataclasses.replace(spec.config(), attention=spec.attention)
    checked = before_timing(config, spec.optimizer, spec.device, spec.seed, spec.batch)
    # from here on: the leaderboard's run has no check of the user's code (nor do the ranks')
    once_per_process(spec.compile, spec.device)  # (the process's one-time work: before the clock)

    t_start = time.perf_counter()
    with empty_compile_cache(spec.compile and not spec.warm_cache):
        model, optimizer, train_step = build(spec)
        if on_cuda:
            torch.cuda.reset_peak_memory_stats(spec.device)

        def step() -> None:
            losses.append(train_step())

        # The first call pays torch.compile, autotuning and the allocator's first requests.
        synchronize(spec.device)
        t0 = time.perf_counter()
        step()
        synchronize(spec.device)
        first_s = time.perf_counter() - t0
        to_first_s = time.perf_counter() - t_start
        with phase("warm-up"):
            warm = time_loop(step, 0, spec.warmup, spec.device) if spec.warmup else []
        with measured(), phase("timed"):  # what --nsys records: the timed steps
            if spec.timer == "do_bench":
                estimate = sorted(warm)[len(warm) // 2] if warm else first_s * 1e3
                samples = time_do_bench(step, calls=spec.iters, call_ms=estimate,
                                        min_count=spec.iters, min_seconds=spec.min_time)
            else:
                samples = time_loop(step, 0, spec.iters, spec.device,
                                    min_seconds=spec.min_time)
        wall_s = time.perf_counter() - t_start
        run_losses = list(losses)  # the steps below, do_bench's among them, are not the run's
        # the optimizer phase alone (the last step left its gradients): a switch cannot save
        # more than the phase it acts on (the table flags fused-adamw saving more)
        with phase("optimizer alone"):
            opt = time_loop(optimizer.step, 0, OPT_CALLS, spec.device)
        course = course_ms(step) if spec.course_timing else None
    peak_cpu = None if on_cuda or spec.compile else tensor_peak_bytes(model, optimizer, train_step)

    metrics: dict[str, Any] = {**flatten("step_ms", samples), **flatten("opt_ms", opt)}
    step_s = metrics["step_ms_median"] / 1e3
    metrics.update(throughput(model, spec.config(), spec.batch, spec.seq, "train",
                              metrics["step_ms_median"], spec.device,
                              matmul_precision(spec.precision, spec.param_dtype)))
    metrics.update(
        peak_allocated_mb=torch.cuda.max_memory_allocated(spec.device) / 2**20 if on_cuda else None,
        peak_reserved_mb=torch.cuda.max_memory_reserved(spec.device) / 2**20 if on_cuda else None,
        peak_tensor_mb=peak_cpu / 2**20 if peak_cpu is not None else None,
        first_step_s=first_s,
        compile_s=max(first_s - step_s, 0.0) if spec.compile else None,
        wall_s=wall_s,
        **within_limit(to_first_s, step_s),  # what the leaderboard's 10 minutes bound
        loss_first=float(run_losses[0]),
        loss_last=float(run_losses[-1]),
        course_ms=course,
        code=user_code(config, model, optimizer) if checked is not None else None,
        interpreted=interpreted(spec),
    )
    return judged(checked, metrics, run_losses,
                  samples={"step_ms": samples, "opt_ms": opt, "warmup": {"step_ms": warm},
                           "loss": [float(v) for v in run_losses]})


# -- the declaration ------------------------------------------------------------------------


TABLE = step_section.TABLE  # (the name tests and the catalog's readers know)

EXPERIMENT = Experiment(
    kind="step",
    title="Training step: what each optimisation buys",
    spec=StepSpec, specs=specs, run=run,
    settings=settings_keys(StepSpec, drop=("course_timing",)),
    metrics=(
        *timing(
            "step_ms", "one leaderboard step: zero_grad, forward, mean loss, backward, AdamW"
        ),
        *timing("opt_ms", "the optimizer step alone, after the timed steps"),
        *throughput_metrics("median"),
        *metric_table("""
            peak_allocated_mb  MiB  CUDA: peak bytes held by tensors over the point
            peak_reserved_mb   MiB  CUDA: peak bytes held by the caching allocator
            peak_tensor_mb     MiB  CPU: peak bytes of live tensors over one step
            first_step_s       s    the first step: compile, autotuning and first allocations
            compile_s          s    compile: the first step's time beyond a median step
            wall_s             s    the point's wall time, model build to the last timed step
            leaderboard_s      s    the leaderboard's timing run: model build, the first step, do_bench's calls
            loss_first         -    loss of the first step (the mean over the batch's tokens)
            loss_last          -    loss of the last timed step
        """),
        Metric("within_limit", "", f"leaderboard_s within the leaderboard's {LIMIT_S} s"),
        Metric("course_ms", "ms", "the step timed as the leaderboard's test does: do_bench's "
               f"mean over {COURSE_REP_MS} ms after {COURSE_WARMUP_MS} ms of warm-up "
               "(--course-timing)"),
        ROUNDS_DONE,
        Metric("interpreted", "", "a Triton kernel ran in Triton's CPU interpreter "
               "(TRITON_INTERPRET=1): the time is the emulator's"),
        *ddp_setup.SHARE_METRICS,  # on ranks
        *CHECK_METRICS,
        *preflight.METRICS,
    ),
    estimate=preflight.model_estimate,
    tables=(TABLE,),
    compare="step_ms",
    oom_axis="num_layers",
    split=split,
    merge=merge,
    run_on_ranks=run_on_ranks,
    section=step_section.section,
    apart=step_section.APART,
    draws=True,
    command=step_command.COMMAND,
)
