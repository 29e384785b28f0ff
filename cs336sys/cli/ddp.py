"""`cs336sys ddp`: a data-parallel training step with each DDP variant, against torch DDP."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, measure
from cs336sys.cli.options import (
    DFF,
    Adapters,
    DModel,
    Label,
    NumHeads,
    NumLayers,
    Resume,
    UserModel,
    VocabSize,
)

ListOpt = list[str] | None


def ddp(
    impl: Annotated[
        ListOpt,
        typer.Option(
            help="naive, flat, overlap, bucketed, torch (replicas), fsdp and/or torch-fsdp "
            "(sharded); yours: yours, yours-individual, yours-bucketed, yours-fsdp (your "
            "adapters file) or NAME=package.module:Class (an FSDP when NAME has fsdp in it). "
            "[default: the five replica impls]"
        ),
    ] = None,
    shard_optimizer: Annotated[
        ListOpt,
        typer.Option(
            "--shard-optimizer",
            help="Also run each replica impl with its AdamW state sharded: ours "
            "(cs336sys.parallel.ShardedOptimizer; what the bare flag means), yours (your "
            "adapters' get_sharded_optimizer) or yours=package.module:Class.",
        ),
    ] = None,
    zero: Annotated[
        bool,
        typer.Option(
            "--zero",
            help="Also run each replica impl with torch's ZeroRedundancyOptimizer.",
        ),
    ] = False,
    bucket_mb: Annotated[
        ListOpt, typer.Option(help="Bucket caps in MiB, for bucketed. [default: 1,10,100,1000]")
    ] = None,
    size: Annotated[
        ListOpt, typer.Option(help="Model size preset(s). [default: xl on CUDA, tiny on CPU]")
    ] = None,
    seq: Annotated[
        ListOpt, typer.Option(help="Sequence length(s). [default: 512 on CUDA, 128 on CPU]")
    ] = None,
    batch: Annotated[
        ListOpt,
        typer.Option(
            help="Sequences per step over all ranks (the global batch), split evenly. "
            "[default: 8 on CUDA, 4 on CPU]"
        ),
    ] = None,
    world_size: Annotated[ListOpt, typer.Option(help="Ranks. [default: 2]")] = None,
    backend: Annotated[
        str | None, typer.Option(help="gloo or nccl. [default: nccl on CUDA, else gloo]")
    ] = None,
    precision: Annotated[
        ListOpt, typer.Option(help="fp32, bf16 and/or fp16 (autocast). [default: fp32]")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Untimed steps per point. [default: 3 on CUDA, 2 on CPU]")
    ] = None,
    iters: Annotated[
        int | None, typer.Option(help="Timed steps per point. [default: 10 on CUDA, 5 on CPU]")
    ] = None,
    device: Annotated[
        str, typer.Option(help="auto, cpu or cuda (picks the default backend).")
    ] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for weights and data.")] = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    model: UserModel = None,
    resume: Resume = False,
    label: Label = None,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time data-parallel training steps; store step time and the exposed gradient communication.

    Each variant wraps the same Transformer LM: naive (an all-reduce per gradient), flat (one all-reduce of all gradients), overlap (async per-gradient all-reduce from backward hooks), bucketed (async all-reduce per bucket, swept over --bucket-mb) and torch (DistributedDataParallel) keep full replicas; fsdp (cs336sys.parallel.FSDP) and torch-fsdp (FSDP2) shard weights, gradients and optimizer state. comm_ms is the time a step waits on gradient communication (fsdp: the time any of its collectives is in flight); comm_fraction its share of the step. Each point also stores this rank's memory after init and around the optimizer step (parameters, gradients, optimizer state, beside the analytic expectation) and the bytes of each kind of collective in one step.

    Examples:

        cs336sys ddp --impl bucketed,torch --bucket-mb 1,10,100 --world-size 2

        cs336sys ddp --impl torch,fsdp,torch-fsdp --shard-optimizer --zero

        cs336sys ddp --impl flat --size tiny,small --seq 128,256 --batch 4,8

        cs336sys ddp --impl yours,bucketed --shard-optimizer yours --world-size 2

        torchrun --nproc-per-node 8 -m cs336sys ddp --size xl --batch 32
    """  # noqa: E501
    options = dict(locals())
    from cs336sys.experiments import ddp as exp

    measure(exp.EXPERIMENT, exp.specs, options, describe=exp.label_of, ranks=True)
