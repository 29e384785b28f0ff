"""Time forward, backward and optimizer steps of the Transformer LM; one row per point.

End-to-end timing of the training step. One ModelSpec is one point of a sweep; `specs(...)` validates a sweep's options and expands
them (what `cs336sys model` and every command that runs the model call), and `run(spec)`
builds the model with random weights, runs `warmup` untimed steps and `iters` timed ones of
the training step (experiments/training_step.py), and returns a Result. Each phase ends with a
device sync, so the host timer measures the device's work (docs/methodology.md,
"Timing"); raw samples of warm-up and timed steps are kept.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cs336sys.attention import registry
from cs336sys.experiments import model_command, model_section, preflight
from cs336sys.experiments.checks import CHECK_METRICS, before_timing, judged, user_code
from cs336sys.experiments.training_step import (
    MODES,
    OPTIMIZERS,
    interpreted,
    make_model,
    make_step,
    merged_rounds,
    run_steps,
    throughput,
    throughput_metrics,
)
from cs336sys.measure.device import MFU_NOTE
from cs336sys.measure.dtypes import PRECISIONS
from cs336sys.measure.stats import flatten
from cs336sys.measure.timing import launch_metrics
from cs336sys.models.config import (
    ModelConfig,
    ModelShape,
    checkpoint_groups,
    from_preset,
    preset_name,
)
from cs336sys.sweep import points
from cs336sys.sweep import rounds as in_rounds
from cs336sys.sweep.declaration import (
    HOST_BOUND,
    MODEL_COLUMN,
    Column,
    Experiment,
    Table,
    column_table,
    launch,
    metric_table,
    setting_columns,
    settings_keys,
    timing,
)
from cs336sys.sweep.points import (
    NOT_A_SETTING,
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
    shape_error,
    warmups,
)
from cs336sys.sweep.result import Result
from cs336sys.yours.implementations import (
    UserCodeError,
    build_model,
    model_class,
    named_impls,
)

# Defaults by device: a GPU gets the course's `small` at 512 tokens; on a CPU a point (warm-up
# and timed steps) finishes in seconds (`small` took a minute a point on 2 cores).
DEFAULTS = {
    "cuda": dict(size="small", seq=512, warmup=5, iters=10),
    "cpu": dict(size="tiny", seq=128, warmup=2, iters=5),
}


@dataclass(frozen=True)
class ModelSpec(ModelShape):
    batch: int
    mode: str
    precision: str
    compile: bool
    attention: str | None  # None: the user's model, with its own attention
    optimizer: str
    checkpoint: str = "none"
    warmup: int = 5
    iters: int = 10
    device: str = "cpu"
    seed: int = 0
    nvtx: bool = False
    model: str | None = None  # None: cs336sys's TransformerLM; else the user's (--model)
    blocks: str | None = None  # where the user's model keeps its blocks (--blocks)
    # the timed steps in this many interleaved rounds (sweep/runner.in_rounds): each round
    # builds the model again, warms it up and times its share of `iters`
    rounds: int = 1
    # whether this run checks the user's code: every point's first round
    check_round: bool = dataclasses.field(default=True, metadata=NOT_A_SETTING)


@one_value_options
def specs(
    *,
    size: Iterable[str] | None = None,
    seq: Iterable[Any] | None = None,
    batch: Iterable[Any] | None = None,
    mode: Iterable[str] | None = None,
    precision: Iterable[str] | None = None,
    attention: Iterable[str] | None = None,
    optimizer: Iterable[str] | None = None,
    compile: bool = False,
    checkpoint: Iterable[str] | None = None,
    warmup: Iterable[Any] | int | None = None,
    iters: int | None = None,
    device: str = "auto",
    seed: int = 0,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    vocab_size: int | None = None,
    nvtx: bool = False,
    model: str | None = None,
    blocks: str | None = None,
    rounds: int | None = None,
) -> list[ModelSpec]:
    """The points of a model sweep: the cartesian product of the list options (each a list,
    comma lists allowed), validated. SpecError names the first bad option. What is not
    given takes the device's default (DEFAULTS). `warmup` is one count or a list of them
    (the warm-up study: a point per count). `rounds`: the timed steps in interleaved rounds
    (1 unless given; `memory` and `profile model` share these points and always take 1).

    Shared by every command that runs the model (`model`, `memory`, `profile model`).
    """
    dev = device_choice(device)
    defaults = DEFAULTS["cuda" if dev.startswith("cuda") else "cpu"]
    warmup_counts = warmups(warmup, defaults["warmup"])
    iters = defaults["iters"] if iters is None else iters
    sizes = preset_sizes(size, defaults["size"])
    modes = choices(mode, MODES, "--mode", default=["train"])
    precisions = choices(precision, PRECISIONS, "--precision", default=["fp32"])
    optimizers = named_impls(listed(optimizer, "--optimizer", ["adamw"]), "adamw", "--optimizer",
                             list(OPTIMIZERS))
    if optimizer is not None and "train" not in modes:  # it would be ignored
        raise SpecError(f"--optimizer is the training step's, which --mode {','.join(modes)} "
                        f"leaves out")
    if modes == ["forward"] and any(c != "none" for c in checkpoint_list(checkpoint)):
        # a forward without grad saves nothing for backward: every point stored `none`
        raise SpecError("--checkpoint trades what a forward saves for backward, which --mode "
                        "forward leaves out")
    batches = positive_ints(batch, "--batch", default=[4])
    for warmup in warmup_counts:
        counts(warmup, iters)
    # one round unless asked, on CUDA too: the handout's method, each point's warm-up and
    # timed steps in a row (its mean ± std over 10 steps after 5)
    rounds = points.rounds(1 if rounds is None else rounds, dev.startswith("cuda"), iters)
    if rounds > 1 and 0 in warmup_counts:
        # each round builds the model again: R cold first steps among the timed ones, where
        # the warm-up study reads one
        raise SpecError(f"--rounds {rounds} builds the model again each round, so with "
                        "--warmup 0 every round's first timed step is a cold one: measure the "
                        "warm-up study in one round")
    check_seed(seed)

    if model is not None:
        check_model(model, attention)
        attentions: list[str | None] = [None]
    elif blocks is not None:
        raise SpecError("--blocks names where your model keeps its blocks: give it with --model")
    else:
        attentions = named_impls(listed(attention, "--attention", ["naive"]), "attention",
                                 "--attention", registry.names())
    overrides = positive_sizes(d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                                num_heads=num_heads, vocab_size=vocab_size)
    if "triton" in attentions:
        check_triton(dev.startswith("cuda"), "--attention triton")
    if "adamw-triton" in optimizers and "train" in modes:
        check_triton(dev.startswith("cuda"), "--optimizer adamw-triton")
    seqs = positive_ints(seq, "--seq", default=[defaults["seq"]])
    out = []
    for p in expand({"size": sizes, "seq": seqs, "batch": batches,
                     "mode": modes, "precision": precisions, "attention": attentions,
                     "optimizer": optimizers, "checkpoint": checkpoint_list(checkpoint),
                     "warmup": warmup_counts}):
        cfg = preset_config(p["size"], context_length=p["seq"], model=model, blocks=blocks,
                            attention=p["attention"], checkpoint=p["checkpoint"], **overrides)
        check_blocks(cfg)
        out.append(ModelSpec(
            **ModelShape.of(p["size"], cfg), batch=p["batch"], mode=p["mode"], precision=p["precision"], compile=compile,
            attention=p["attention"],
            optimizer=p["optimizer"] if p["mode"] == "train" else "none",
            # Forward-only passes save nothing for backward: checkpointing changes nothing.
            checkpoint=p["checkpoint"] if p["mode"] != "forward" else "none",
            warmup=p["warmup"], iters=iters, device=dev, seed=seed, nvtx=nvtx, model=model,
            blocks=blocks, rounds=rounds,
        ))
    # the optimizer and checkpoint axes collapse for the modes they do not apply to
    return list(dict.fromkeys(out))


def check_model(model: str, attention: Any = None) -> None:
    """Refuse, before anything runs, a --model that does not import, and an --attention
    beside it (the user's model brings its own attention)."""
    if attention is not None:
        raise SpecError(f"--attention chooses the kernel of cs336sys's model; --model {model} "
                        "brings its own attention")
    try:
        model_class(model)
    except UserCodeError as exc:
        raise SpecError(str(exc)) from None


def check_blocks(config: ModelConfig) -> None:
    """Refuse, before anything runs, a user's model whose blocks --checkpoint cannot find,
    --blocks does not name, or a policy cannot group (models/checkpointing.py). The model is
    built and probed on the meta device (no memory, no time); one that cannot be built or run
    there is left to its run, which stores what goes wrong."""
    if config.model is None or (config.blocks is None and config.checkpoint == "none"):
        return
    import torch

    from cs336sys.models.checkpointing import NotChained, blocks_of, check_chained

    try:
        with torch.device("meta"):
            users = build_model(config)
    except Exception:  # the user's code: its run says what is wrong, as a stored error
        return
    try:
        blocks = blocks_of(users, config.num_layers, config.blocks)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    groups = checkpoint_groups(config.checkpoint, config.num_layers)
    if groups:  # (--blocks alone wraps nothing)
        try:
            check_chained(users, blocks, grouped=max(groups) > 1)
        except NotChained as exc:
            raise SpecError(str(exc)) from None
        except Exception:  # not runnable on the meta device: the run checks it again
            return


def preset_sizes(values: Iterable[Any] | None, default: str) -> list[str]:
    """The --size list, each a preset in any case, spelled as PRESETS does (SpecError naming
    the presets if not)."""
    return [preset_name(s) for s in listed(values, "--size", [default])]


def preset_config(size: str, **fields: Any) -> ModelConfig:
    """from_preset(size, **fields), its ValueError a SpecError (named --checkpoint where the
    checkpoint spec is what is wrong)."""
    try:
        return from_preset(size, **fields)
    except ValueError as exc:
        if "checkpoint" in str(exc):
            raise SpecError(f"--checkpoint: {exc}") from None
        raise shape_error(exc) from None


def run(spec: ModelSpec) -> Result:
    import torch

    from cs336sys.measure.nvtx import nvtx_enabled

    config = spec.config()
    checked = before_timing(config, spec.optimizer, spec.device, spec.seed, spec.batch,
                            first_round=spec.check_round)
    model = make_model(config, spec.device, spec.seed)
    step = make_step(model, vocab_size=config.vocab_size, batch=spec.batch, seq=spec.seq,
                     mode=spec.mode, precision=spec.precision, optimizer=spec.optimizer,
                     compile=spec.compile, device=spec.device, seed=spec.seed)
    on_cuda = spec.device.startswith("cuda")
    if on_cuda:
        torch.cuda.reset_peak_memory_stats(spec.device)
    with nvtx_enabled(spec.nvtx):
        warm, timed, losses = run_steps(step, spec.warmup, spec.iters)

    metrics: dict[str, Any] = {}
    for phase in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
        metrics.update(flatten(phase, timed.get(phase, [])))
    metrics.update(throughput(model, config, spec.batch, spec.seq, spec.mode,
                              metrics["step_ms_mean"], spec.device, spec.precision))
    metrics.update(
        logits_dtype=step.logits_dtype,
        # CUDA only: peak bytes held by tensors (allocated) and by the caching allocator
        # (reserved) over warm-up and timed steps. CPU memory is the memory experiment's job.
        peak_allocated_mb=torch.cuda.max_memory_allocated(spec.device) / 2**20 if on_cuda else None,
        peak_reserved_mb=torch.cuda.max_memory_reserved(spec.device) / 2**20 if on_cuda else None,
        loss_first=losses[0],
        loss_last=losses[-1],
        interpreted=interpreted(spec),
    )
    metrics.update(launch_metrics(timed, ("fwd", "bwd", "opt"), spec.device))
    if checked is not None:
        metrics["code"] = user_code(config, model, step.optimizer)
    return judged(checked, metrics, losses,
                  samples={**timed, "loss": losses, "warmup": warm})


def merge(spec: ModelSpec, results: list[Result]) -> Result:
    """One point from its rounds (training_step.merged_rounds): the rates from the merged
    mean, as the table's; the first round's warm-up samples and check, a failed check where
    a later round's losses were not finite; the host-bound flags of every round's steps."""
    point = merged_rounds(results, ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"), "mean",
                          ("peak_allocated_mb", "peak_reserved_mb"))
    point.metrics.update(launch_metrics(point.samples, ("fwd", "bwd", "opt"), spec.device))
    if point.status == "wrong":
        point.metrics["check"] = "fail"
    return point


# -- the declaration ------------------------------------------------------------------------

CHECK_NOTE = ("check, for the user's code: their model (--model) has a finite loss and, where "
              "its state_dict loads into cs336sys's TransformerLM, the same loss with the same "
              "weights; their attention kernel in our model gives naive attention's loss "
              "(check_detail says which). A point that fails is wrong.")

TABLE = Table(
    "Time per phase (mean ± std over timed steps)",
    (
        *setting_columns("size seq batch mode precision warmup"),
        Column("compile", "compile", "yes_no", setting=True),
        Column("ckpt", "checkpoint", setting=True),
        MODEL_COLUMN,
        Column("attention", "attention", setting=True),
        Column("optimizer", "optimizer", setting=True),
        *column_table("""
            fwd ms    fwd_ms        mean_std
            bwd ms    bwd_ms        mean_std
            opt ms    opt_ms        mean_std
            step ms   step_ms       mean_std
            tokens/s  tokens_per_s  num
            TFLOP/s   tflops        num
            MFU       mfu           pct
        """),
        HOST_BOUND,
        Column("check", "check", optional=True, note=CHECK_NOTE),
    ),
    note=MFU_NOTE,
)

EXPERIMENT = Experiment(
    kind="model",
    title="Model: end-to-end training step",
    spec=ModelSpec, specs=specs, run=run,
    metrics=(
        *timing("fwd_ms", "forward pass with the loss"),
        *timing("bwd_ms", "backward pass"),
        *timing("opt_ms", "optimizer step and zero_grad"),
        *timing("step_ms", "whole step"),
        *throughput_metrics("mean"),
        *metric_table("""
            logits_dtype       -    dtype of the logits under autocast
            peak_allocated_mb  MiB  CUDA: peak bytes held by tensors
            peak_reserved_mb   MiB  CUDA: peak bytes held by the caching allocator
            loss_first         -    loss of the first (warm-up) step
            loss_last          -    loss of the last timed step
            interpreted        -    a Triton kernel ran in Triton's CPU interpreter
                                      (TRITON_INTERPRET=1): the emulator's time
        """),
        *CHECK_METRICS,
        in_rounds.ROUNDS_DONE,
        *launch(("fwd", "bwd", "opt")),
        *preflight.METRICS,
    ),
    estimate=preflight.model_estimate,
    tables=(TABLE,),
    compare="step_ms",
    settings=settings_keys(ModelSpec),
    split=in_rounds.checked_first, merge=merge,  # each round builds and warms up its model
    section=model_section.section,
    apart=model_section.APART,
    draws=True,
    command=model_command.COMMAND,
)
