"""`cs336sys comm`: what a collective costs at each size and world size (nccl-tests style)."""

from __future__ import annotations

from typing import Any

from cs336sys.cli.common import run_experiment
from cs336sys.cli.options import list_option, nsys_options, option, options_of, store_options
from cs336sys.measure.units import format_size


def _comm_only(
    op: list_option("all-reduce, all-gather, reduce-scatter, broadcast. [default: "
                    "all-reduce]") = None,
    bytes: list_option("Buffer size(s): B, KB, MB, GB (10^3..) or KiB, MiB, GiB (2^10..); or "
                       "a range START:END:xFACTOR as nccl-tests' -b -e -f, e.g. 8B:1GB:x2. "
                       "[default: 1MB,10MB,100MB,1GB on CUDA, 1MB,10MB,100MB on CPU]",
                       "--bytes") = None,
    placement: list_option("out-of-place and/or in-place, as nccl-tests times all-gather and "
                           "reduce-scatter (all-reduce and broadcast are in place only). "
                           "[default: both]") = None,
    world_size: list_option("Ranks per group. [default: 2,4,6 capped at the GPUs (NCCL) or cores "
                            "(Gloo)]") = None,
    backend: list_option("gloo and/or nccl (gloo,nccl: Gloo on CPU tensors and NCCL on the GPUs, "
                         "in one run). [default: nccl on CUDA, else gloo]") = None,
    precision: list_option("fp32, bf16 and/or fp16. [default: fp32]") = None,
    warmup: option("Untimed iterations per point. [default: 5 on CUDA, 2 on "
                   "CPU]", int | None) = None,
    iters: option("Timed iterations per point. [default: 20 on CUDA, 10 on "
                  "CPU]", int | None) = None,
    device: option("auto, cpu or cuda (picks the default backend).", str) = "auto",
) -> None:
    """The options of `comm` beyond the store's (it runs no user code: no --adapters)."""


@options_of(_comm_only, nsys_options, store_options, drop=("adapters",))
def comm(**options: Any) -> None:
    """Time collectives across ranks; store time, algbw and busbw (nccl-tests' formulas).

    Each point spawns its ranks locally (Gloo on CPU, NCCL with one GPU per rank), or joins the group when started by torchrun; only rank 0 writes. The result of every op is checked once (`wrong` counts bad elements).

    Examples:

        cs336sys comm --op all-reduce,all-gather --bytes 1MB,100MB --world-size 2

        cs336sys comm --op reduce-scatter --placement in-place --bytes 8B:64MB:x4

        cs336sys comm --bytes 8B:64MB:x4 --world-size 2

        torchrun --nnodes 2 --nproc-per-node 8 -m cs336sys comm --bytes 1GB
    """
    from cs336sys.experiments import comm as exp

    run_experiment(exp.EXPERIMENT, exp.specs, options, describe=point_name, ranks=True,
                   emulation=False, after=_averages)


def _averages(points) -> None:
    """nccl-tests' closing line, per op, backend, world size and precision."""
    import typer

    from cs336sys.experiments.comm import average_lines
    from cs336sys.report.tables import row_of

    for line in average_lines([row_of(p.spec, p.result) for p in points]):
        typer.echo(line)


def point_name(spec) -> str:
    """A point in a few words, for the progress bar."""
    from cs336sys.experiments.comm import placement_words

    where = placement_words(spec.op, spec.placement)
    return f"{spec.op}{where} {format_size(spec.bytes)} n={spec.world_size}"
