"""`cs336sys comm`: what a collective costs at each size and world size (nccl-tests style)."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    Bar,
    DbOption,
    check_db,
    fail,
    oversubscribed,
    recording,
    show,
    user_errors,
)
from cs336sys.cli.options import Label, Resume

ListOpt = list[str] | None


def comm(
    op: Annotated[
        ListOpt,
        typer.Option(
            help="all-reduce, all-gather, reduce-scatter, broadcast. [default: all-reduce]"
        ),
    ] = None,
    bytes_: Annotated[
        ListOpt,
        typer.Option(
            "--bytes",
            help="Buffer size(s): B, KB, MB, GB (10^3..) or KiB, MiB, GiB (2^10..). "
            "[default: 1MB,10MB,100MB,1GB on CUDA, 1MB,10MB,100MB on CPU]",
        ),
    ] = None,
    world_size: Annotated[
        ListOpt,
        typer.Option(
            help="Ranks per group. [default: 2,4,6 capped at the GPUs (NCCL) or cores (Gloo)]"
        ),
    ] = None,
    backend: Annotated[
        str | None, typer.Option(help="gloo or nccl. [default: nccl on CUDA, else gloo]")
    ] = None,
    precision: Annotated[
        ListOpt, typer.Option(help="fp32, bf16 and/or fp16. [default: fp32]")
    ] = None,
    warmup: Annotated[
        int | None, typer.Option(help="Untimed iterations per point. [default: 5 on CUDA, 2 on CPU]")
    ] = None,
    iters: Annotated[
        int | None, typer.Option(help="Timed iterations per point. [default: 20 on CUDA, 10 on CPU]")
    ] = None,
    device: Annotated[
        str, typer.Option(help="auto, cpu or cuda (picks the default backend).")
    ] = "auto",
    resume: Resume = False,
    label: Label = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time collectives across ranks; store time, algbw and busbw (nccl-tests' formulas).

    Each point spawns its ranks locally (Gloo on CPU, NCCL with one GPU per rank), or joins the group when started by torchrun; only rank 0 writes. The result of every op is checked once (`wrong` counts bad elements).

    Examples:

        cs336sys comm --op all-reduce,all-gather --bytes 1MB,100MB --world-size 2

        torchrun --nnodes 2 --nproc-per-node 8 -m cs336sys comm --bytes 1GB
    """  # noqa: E501
    from cs336sys.experiments import comm as exp
    from cs336sys.sweep.ranks import torchrun_rank
    from cs336sys.sweep.runner import run_sweep

    rank = torchrun_rank()
    if rank is not None and resume:
        # Ranks must run identical point lists; only rank 0 can read its store.
        fail("--resume is not supported under torchrun")
    with user_errors():
        specs = exp.specs(op=op, size=bytes_, world_size=world_size, backend=backend,
                          precision=precision, warmup=warmup, iters=iters, device=device)
    check_db(db)
    if not rank:
        oversubscribed(specs)
    device_name = "cuda:0" if specs[0].device == "cuda" else "cpu"
    with recording(db, "comm", device_name, rank, label=label) as rec:
        points = run_sweep(exp.EXPERIMENT, specs, rec, resume=resume,
                           progress=Bar("comm", point_name, on=not rank))
        if not rank:
            show(exp.EXPERIMENT, points)


def point_name(spec) -> str:
    """A point in a few words, for the progress bar."""
    from cs336sys.measure.units import format_size

    return f"{spec.op} {format_size(spec.size_bytes)} n={spec.world_size}"
