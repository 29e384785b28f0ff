"""`cs336sys model`: end-to-end timing of the Transformer LM over a sweep of settings."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, measure
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
    options = dict(locals())
    from cs336sys.experiments import model as exp

    measure(exp.EXPERIMENT, exp.specs, options, describe=point_name)


def point_name(spec) -> str:
    """A point in a few words, for the progress bar."""
    return f"{spec.model or spec.size} T={spec.seq} {spec.mode} {spec.precision}"
