"""`cs336sys comm`: what a collective costs at each size and world size (nccl-tests style)."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, check_db, choices, fail, table

ListOpt = list[str] | None
DEFAULT_SIZES = ["1MB", "10MB", "100MB", "1GB"]
DEFAULT_WORLD_SIZES = [2, 4, 6]


def comm(
    op: Annotated[
        ListOpt,
        typer.Option(
            help="all-reduce, all-gather, reduce-scatter, broadcast. [default: all-reduce]"
        ),
    ] = None,
    size: Annotated[
        ListOpt,
        typer.Option(
            help="Buffer size(s): B, KB, MB, GB (10^3..) or KiB, MiB, GiB (2^10..). [default: 1MB,10MB,100MB,1GB]"
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
    dtype: Annotated[ListOpt, typer.Option(help="fp32, bf16 and/or fp16. [default: fp32]")] = None,
    warmup: Annotated[int, typer.Option(help="Untimed iterations per point.")] = 5,
    iters: Annotated[int, typer.Option(help="Timed iterations per point.")] = 20,
    device: Annotated[
        str, typer.Option(help="auto, cpu or cuda (picks the default backend).")
    ] = "auto",
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip points stored ok for this commit.")
    ] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time collectives across ranks; store time, algbw and busbw (nccl-tests' formulas).

    Each point spawns its ranks locally (Gloo on CPU, NCCL with one GPU per rank), or joins the group when started by torchrun; only rank 0 writes. The result of every op is checked once (`wrong` counts bad elements).

    Examples:

        cs336sys comm --op all-reduce,all-gather --size 1MB,100MB --world-size 2

        torchrun --nnodes 2 --nproc-per-node 8 -m cs336sys comm --size 1GB
    """  # noqa: E501
    from cs336sys.bench.sweep import expand, split_list
    from cs336sys.bench.units import parse_size
    from cs336sys.cli.distributed import rank0_recording, resolve_backend, run_groups, world_sizes
    from cs336sys.experiments import comm as exp

    ops = choices(op, exp.OPS, "--op", default=["all-reduce"])
    try:
        sizes = [parse_size(s) for s in split_list(size) or DEFAULT_SIZES]
    except ValueError as exc:
        fail(f"--size: {exc}")
    dtypes = choices(dtype, tuple(exp.DTYPE_BYTES), "--dtype", default=["fp32"])
    if iters <= 0:
        fail(f"--iters must be positive, got {iters}")
    if warmup < 0:
        fail(f"--warmup must be zero or more, got {warmup}")
    be, dev = resolve_backend(backend, device)
    sizes_ws = world_sizes(world_size, be, DEFAULT_WORLD_SIZES)
    check_db(db)

    groups: dict[int, list] = {}
    for p in expand({"world_size": sizes_ws, "op": ops, "dtype": dtypes, "size": sizes}):
        n = p["world_size"]
        spec = exp.CommSpec(
            op=p["op"], size_bytes=exp.buffer_bytes(p["size"], p["dtype"], n), world_size=n,
            backend=be, dtype=p["dtype"], warmup=warmup, iters=iters, device=dev,
        )  # fmt: skip
        groups.setdefault(n, []).append(spec)

    with rank0_recording(db, "comm", "cuda:0" if dev == "cuda" else "cpu", resume) as rec:
        groups = {n: rec.pending(exp.EXPERIMENT, s, resume) for n, s in groups.items()}
        groups = {n: s for n, s in groups.items() if s}
        results = run_groups(rec, exp.EXPERIMENT, groups, exp.worker, be)
        from cs336sys.cli.distributed import torchrun_rank

        if torchrun_rank() in (None, 0):
            typer.echo(_summary(results))
        if rec.errors:
            raise typer.Exit(1)


def _summary(results) -> str:
    from cs336sys.bench.units import format_size

    rows = []
    for spec, r in results:
        m = r.metrics
        rows.append([
            spec.op, spec.backend, spec.world_size, spec.dtype, format_size(spec.size_bytes),
            r.status,
            "" if m.get("time_ms_mean") is None else f"{m['time_ms_mean']:.3f}",
            "" if m.get("time_ms_max") is None else f"{m['time_ms_max']:.3f}",
            "" if m.get("algbw_gbps") is None else f"{m['algbw_gbps']:.3g}",
            "" if m.get("busbw_gbps") is None else f"{m['busbw_gbps']:.3g}",
            m.get("wrong", ""),
        ])  # fmt: skip
    headers = ["op", "backend", "ranks", "dtype", "size", "status", "time ms", "max ms",
               "algbw GB/s", "busbw GB/s", "wrong"]  # fmt: skip
    return table(rows, headers, numparse=False)
