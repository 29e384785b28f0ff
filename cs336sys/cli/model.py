"""`cs336sys model`: end-to-end timing of the Transformer LM over a sweep of settings."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    Bar,
    DbOption,
    announce_user_code,
    check_db,
    emulated,
    recording,
    show,
    user_code,
    user_errors,
)
from cs336sys.cli.options import (
    DFF,
    Adapters,
    Attention,
    Batch,
    Checkpoint,
    Compile,
    Device,
    DModel,
    Iters,
    Label,
    NumHeads,
    NumLayers,
    Optimizer,
    Precision,
    Resume,
    Seed,
    Seq,
    Size,
    UserModel,
    VocabSize,
    Warmup,
)

ListOpt = list[str] | None


def model(
    size: Size = None,
    seq: Seq = None,
    batch: Batch = None,
    mode: Annotated[
        ListOpt, typer.Option(help="forward, forward-backward and/or train. [default: train]")
    ] = None,
    precision: Precision = None,
    attention: Attention = None,
    optimizer: Optimizer = None,
    compile: Compile = False,
    checkpoint: Checkpoint = None,
    warmup: Warmup = None,
    iters: Iters = None,
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
    model: UserModel = None,
    resume: Resume = False,
    label: Label = None,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time forward, backward and optimizer steps of the Transformer LM; one row per point.

    Every list option takes comma lists or repetition, and the sweep is their cartesian product. Weights and data are random. Out-of-memory points are stored with status `oom` and the sweep goes on; other failures are stored as `error` (exit code 1 at the end).

    Example:

        cs336sys model --size small,medium --precision fp32,bf16 --seq 256

        cs336sys model --model cs336_basics --size tiny,small

        cs336sys model --attention flash-torch,yours-torch
    """  # noqa: E501
    from cs336sys.experiments import model as exp
    from cs336sys.sweep.runner import run_sweep

    user_code(adapters)
    with user_errors():
        specs = exp.specs(
            size=size, seq=seq, batch=batch, mode=mode, precision=precision,
            attention=attention, optimizer=optimizer, compile=compile, checkpoint=checkpoint,
            warmup=warmup, iters=iters, device=device, seed=seed, d_model=d_model, d_ff=d_ff,
            num_layers=num_layers, num_heads=num_heads, vocab_size=vocab_size, nvtx=nvtx,
            model=model,
        )
    check_db(db)
    announce_user_code(adapters is not None)
    emulated(specs[0].device, [s.precision for s in specs])
    with recording(db, "model", specs[0].device, label=label) as rec:
        points = run_sweep(exp.EXPERIMENT, specs, rec, resume=resume, progress=Bar("model", point_name))
        show(exp.EXPERIMENT, points)


def point_name(spec) -> str:
    """A point in a few words, for the progress bar."""
    return f"{spec.model or spec.size} T={spec.seq} {spec.mode} {spec.precision}"
