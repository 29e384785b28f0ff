"""`cs336sys model`: end-to-end timing of the Transformer LM over a sweep of settings."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    check_db,
    check_triton,
    choices,
    fail,
    positive_ints,
    progress,
    recording,
    table,
)
from cs336sys.cli.options import (
    DFF,
    Attention,
    BatchSize,
    Checkpoint,
    Compile,
    ContextLength,
    Device,
    DModel,
    NumHeads,
    NumLayers,
    Optimizer,
    Precision,
    Resume,
    Seed,
    Size,
    VocabSize,
)

ListOpt = list[str] | None
# On CPU the default context is short enough for a laptop to finish a step in seconds.
DEFAULT_CONTEXT = {"cuda": 512, "cpu": 128}


def model(
    size: Size = None,
    context_length: ContextLength = None,
    batch_size: BatchSize = None,
    mode: Annotated[
        ListOpt, typer.Option(help="forward, forward-backward and/or train. [default: train]")
    ] = None,
    precision: Precision = None,
    attention: Attention = None,
    optimizer: Optimizer = None,
    compile: Compile = False,
    checkpoint: Checkpoint = None,
    warmup: Annotated[int, typer.Option(help="Untimed warm-up steps.")] = 5,
    steps: Annotated[int, typer.Option(help="Timed steps.")] = 10,
    device: Device = "auto",
    seed: Seed = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    nvtx: Annotated[
        bool, typer.Option("--nvtx", help="Emit NVTX ranges (for nsys); no-op without CUDA.")
    ] = False,
    resume: Resume = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time forward, backward and optimizer steps of the Transformer LM; one row per point.

    Every list option takes comma lists or repetition, and the sweep is their cartesian product. Weights and data are random. Out-of-memory points are stored with status `oom` and the sweep goes on; other failures are stored as `error` (exit code 1 at the end).

    Example:

        cs336sys model --size small,medium --precision fp32,bf16
    """  # noqa: E501
    dev, specs = model_specs(
        size=size, context_length=context_length, batch_size=batch_size, mode=mode,
        precision=precision, attention=attention, optimizer=optimizer, compile=compile,
        checkpoint=checkpoint, warmup=warmup, steps=steps, device=device, seed=seed,
        d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
        vocab_size=vocab_size, nvtx=nvtx,
    )  # fmt: skip
    check_db(db)
    # -- measure ----------------------------------------------------------------------------
    from cs336sys.bench.result import guarded
    from cs336sys.experiments.model import EXPERIMENT, run
    from cs336sys.store.db import now

    results = []
    with recording(db, "model", dev) as rec:
        specs = rec.pending(EXPERIMENT, specs, resume)
        for spec in progress(specs, "model", show=_label):
            started = now()
            result = guarded(run, spec)
            rec.add(EXPERIMENT, spec.settings(), result, started)
            results.append((spec, result))
        typer.echo(_summary(results))
        if rec.errors:
            raise typer.Exit(1)


def model_specs(
    *,
    size: ListOpt,
    context_length: ListOpt,
    batch_size: ListOpt,
    mode: ListOpt,
    precision: ListOpt,
    attention: ListOpt,
    optimizer: ListOpt,
    compile: bool,
    checkpoint: ListOpt,
    warmup: int,
    steps: int,
    device: str,
    seed: int,
    d_model: int | None,
    d_ff: int | None,
    num_layers: int | None,
    num_heads: int | None,
    vocab_size: int | None,
    nvtx: bool = False,
) -> tuple[str, list]:
    """Validate the model options (exit 2 on bad input) and expand them into ModelSpecs.

    Shared by every command that runs the model (`model`, `memory`, `profile model`).
    """  # fmt: skip
    from cs336sys.bench.sweep import expand
    from cs336sys.experiments.model import MODES, OPTIMIZERS, PRECISIONS

    # -- validate everything before anything is written --------------------------------
    sizes = _sizes(size)
    modes = choices(mode, MODES, "--mode", default=["train"])
    precisions = choices(precision, PRECISIONS, "--precision", default=["fp32"])
    optimizers = choices(optimizer, OPTIMIZERS, "--optimizer", default=["adamw"])
    batch_sizes = positive_ints(batch_size, "--batch-size", default=[4])
    if steps <= 0:
        fail(f"--steps must be positive, got {steps}")
    if warmup < 0:
        fail(f"--warmup must be zero or more, got {warmup}")
    from cs336sys.attention.registry import names as attention_names
    from cs336sys.bench.sweep import split_list

    attentions = split_list(attention) or ["naive"]
    for a in attentions:
        if a not in attention_names():
            fail(f"--attention: unknown value {a!r}; choose from {', '.join(attention_names())}")
    overrides = dict(
        d_model=d_model,
        d_ff=d_ff,
        num_layers=num_layers,
        num_heads=num_heads,
        vocab_size=vocab_size,
    )
    for name, value in overrides.items():
        if value is not None and value <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {value}")

    from cs336sys.bench.device import resolve_device

    try:
        dev = resolve_device(device)
    except ValueError as exc:
        fail(exc)
    if "triton" in attentions:
        check_triton(dev.startswith("cuda"), "--attention triton")
    contexts = positive_ints(
        context_length,
        "--context-length",
        default=[DEFAULT_CONTEXT["cuda" if dev.startswith("cuda") else "cpu"]],
    )

    from cs336sys.experiments.model import ModelSpec
    from cs336sys.models.config import from_preset

    checkpoints = split_list(checkpoint) or ["none"]
    specs = []
    for point in expand(
        {
            "size": sizes,
            "context_length": contexts,
            "batch_size": batch_sizes,
            "mode": modes,
            "precision": precisions,
            "attention": attentions,
            "optimizer": optimizers,
            "checkpoint": checkpoints,
        }
    ):
        try:
            cfg = from_preset(
                point["size"],
                context_length=point["context_length"],
                attention=point["attention"],
                checkpoint=point["checkpoint"],
                **overrides,
            )
        except ValueError as exc:
            fail(f"--checkpoint: {exc}" if "checkpoint" in str(exc) else exc)
        specs.append(
            ModelSpec(
                size=point["size"],
                d_model=cfg.d_model,
                d_ff=cfg.d_ff,
                num_layers=cfg.num_layers,
                num_heads=cfg.num_heads,
                vocab_size=cfg.vocab_size,
                context_length=point["context_length"],
                batch_size=point["batch_size"],
                mode=point["mode"],
                precision=point["precision"],
                compile=compile,
                attention=point["attention"],
                optimizer=point["optimizer"] if point["mode"] == "train" else "none",
                warmup=warmup,
                steps=steps,
                device=dev,
                seed=seed,
                nvtx=nvtx,
                # Forward-only passes save nothing for backward: checkpointing changes nothing.
                checkpoint=point["checkpoint"] if point["mode"] != "forward" else "none",
            )
        )
    # the optimizer and checkpoint axes collapse for the modes they do not apply to
    specs = list(dict.fromkeys(specs))

    return dev, specs


def _sizes(values: ListOpt) -> list[str]:
    from cs336sys.bench.sweep import split_list
    from cs336sys.models.config import PRESETS

    sizes = split_list(values) or ["small"]
    for s in sizes:
        if s not in PRESETS:
            fail(f"--size: unknown size {s!r}; choose from {', '.join(PRESETS)}")
    return sizes


def _label(spec) -> str:
    return f"{spec.size} T={spec.context_length} {spec.mode} {spec.precision}"


def _ms(metrics: dict, phase: str) -> str:
    mean = metrics.get(f"{phase}_ms_mean")
    if mean is None:
        return ""
    return f"{mean:.2f} ± {metrics.get(f'{phase}_ms_std') or 0:.2f}"


def _summary(results) -> str:
    rows = []
    for spec, r in results:
        m = r.metrics
        rows.append(
            [
                spec.size,
                spec.context_length,
                spec.batch_size,
                spec.mode,
                spec.precision,
                spec.attention + ("+compile" if spec.compile else ""),
                spec.checkpoint,
                r.status,
                _ms(m, "fwd"),
                _ms(m, "bwd"),
                _ms(m, "opt"),
                _ms(m, "step"),
                f"{m['tokens_per_s']:.0f}" if m.get("tokens_per_s") else "",
                f"{m['tflops']:.3g}" if m.get("tflops") else "",
                f"{m['mfu']:.1%}" if m.get("mfu") else "",
            ]
        )
    headers = [
        "size",
        "ctx",
        "batch",
        "mode",
        "precision",
        "attention",
        "checkpoint",
        "status",
        "fwd ms",
        "bwd ms",
        "opt ms",
        "step ms",
        "tokens/s",
        "TFLOP/s",
        "MFU",
    ]
    return table(rows, headers, numparse=False)
