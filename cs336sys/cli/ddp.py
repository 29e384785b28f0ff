"""`cs336sys ddp`: a data-parallel training step with each DDP variant, against torch DDP."""

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
    fail,
    oversubscribed,
    recording,
    show,
    user_code,
    user_errors,
)
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
    from cs336sys.experiments import ddp as exp
    from cs336sys.sweep.ranks import torchrun_rank
    from cs336sys.sweep.runner import run_sweep

    rank = torchrun_rank()
    if rank is not None and resume:
        # Ranks must run identical point lists; only rank 0 can read its store.
        fail("--resume is not supported under torchrun")
    user_code(adapters)
    with user_errors():
        specs = exp.specs(
            impl=impl, shard_optimizer=shard_optimizer, zero=zero, bucket_mb=bucket_mb, size=size,
            seq=seq, batch=batch, world_size=world_size,
            backend=backend, precision=precision, warmup=warmup, iters=iters, device=device,
            seed=seed, d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
            vocab_size=vocab_size, model=model,
        )
    check_db(db)
    if not rank:
        announce_user_code(adapters is not None)
        oversubscribed(specs)
        emulated(specs[0].device, [s.precision for s in specs])
    device_name = "cuda:0" if specs[0].device == "cuda" else "cpu"
    with recording(db, "ddp", device_name, rank, label=label) as rec:
        points = run_sweep(exp.EXPERIMENT, specs, rec, resume=resume,
                           progress=Bar("ddp", exp.label_of, on=not rank))
        if not rank:
            show(exp.EXPERIMENT, points)
