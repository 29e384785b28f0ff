"""Time collectives across ranks; store time, algbw and busbw (nccl-tests' formulas).

One CommSpec is one point: one collective at one size and world size. Methodology follows
nccl-tests (github.com/NVIDIA/nccl-tests, doc/PERFORMANCE.md):
- S is the buffer size in bytes: the tensor for all-reduce and broadcast, the gathered output
  for all-gather, the input that is scattered for reduce-scatter (so every op moves S);
- algbw = S / t;  busbw = algbw * factor, with factor 2(n-1)/n for all-reduce, (n-1)/n for
  all-gather and reduce-scatter and 1 for broadcast: the bandwidth each link must sustain,
  comparable to the hardware's peak whatever n is.
As in nccl-tests, all-gather and reduce-scatter are timed out of place (separate input and
output buffers) and in place (all-gather's input is this rank's slice of the output,
reduce-scatter's output this rank's slice of the input): `--placement`. torch.distributed's
all-reduce and broadcast have one buffer, so they are in place only.
Each timed iteration starts after a barrier and ends with a device sync. Per rank the mean
over iterations is taken; the stored time is the mean over ranks, with min and max over
ranks beside it. The result of the op is checked once per point against the exact expected
values and the number of wrong elements is stored.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from typing import Any

from cs336sys.measure.device import synchronize
from cs336sys.measure.dtypes import PRECISIONS, itemsize, torch_dtype
from cs336sys.measure.progress import step_done
from cs336sys.measure.stats import flatten
from cs336sys.measure.units import format_size, parse_sizes
from cs336sys.report.plots import Plot
from cs336sys.report.sections import add_plot, series, varying
from cs336sys.sweep.declaration import (
    Column,
    Command,
    Experiment,
    Table,
    metric_table,
    setting_columns,
    timing,
)
from cs336sys.sweep.options import list_option, option
from cs336sys.sweep.points import SpecError, choices, counts, expand, listed, one_value_options
from cs336sys.sweep.ranks import backend_and_device, gather, over_ranks, world_sizes
from cs336sys.sweep.result import Result

OPS = ("all-reduce", "all-gather", "reduce-scatter", "broadcast")
PLACEMENTS = ("out-of-place", "in-place")
IN_PLACE_ONLY = ("all-reduce", "broadcast")  # one buffer in torch.distributed
DEFAULT_WORLD_SIZES = [2, 4, 6]
# nccl-tests' range on GPUs; on a CPU, Gloo moves 1 GB in seconds, so a point of 25 of them
# would take minutes: up to 100 MB and fewer iterations there.
DEFAULTS = {
    "cuda": dict(size=["1MB", "10MB", "100MB", "1GB"], warmup=5, iters=20),
    "cpu": dict(size=["1MB", "10MB", "100MB"], warmup=2, iters=10),
}


def busbw_factor(op: str, n: int) -> float:
    return {
        "all-reduce": 2 * (n - 1) / n,
        "all-gather": (n - 1) / n,
        "reduce-scatter": (n - 1) / n,
        "broadcast": 1.0,
    }[op]


def placement_words(op: str, placement: str | None) -> str:
    """' in-place' or ' out-of-place' after an op that has both, '' after one that is in
    place only. Rows stored before `placement` existed have none: they were out of place."""
    return "" if op in IN_PLACE_ONLY else f" {placement or 'out-of-place'}"


def buffer_bytes(requested: int, dtype: str, world_size: int) -> int:
    """The size actually moved: whole elements, a multiple of the world size (for the
    ops that split the buffer into equal shards), at least one element per rank."""
    elt = itemsize(dtype)
    numel = max(world_size, requested // elt // world_size * world_size)
    return numel * elt


@dataclass(frozen=True)
class CommSpec:
    op: str
    placement: str  # out-of-place | in-place (PLACEMENTS)
    bytes: int  # S as defined above, already rounded by buffer_bytes
    world_size: int
    backend: str
    precision: str
    warmup: int
    iters: int
    device: str  # "cpu" or "cuda": each rank uses its own cuda:<local_rank>

    def settings(self) -> dict[str, Any]:
        return asdict(self)


@one_value_options
def specs(
    *,
    op: Iterable[str] | None = None,
    bytes: Iterable[str] | None = None,
    placement: Iterable[str] | None = None,
    world_size: Iterable[Any] | None = None,
    backend: Iterable[str] | str | None = None,
    precision: Iterable[str] | None = None,
    warmup: int | None = None,
    iters: int | None = None,
    device: str = "auto",
) -> list[CommSpec]:
    """The points of a collectives sweep, backend then world size slowest. SpecError names a
    bad option. `bytes` is the buffer size (the CLI's --bytes); what is not given takes
    the device's default (DEFAULTS). `placement` defaults to both where the op has both.
    `backend` is one or several (gloo,nccl: Gloo on CPU tensors and NCCL on the GPUs in one
    run, as the 2025 handout asks)."""
    ops = choices(op, OPS, "--op", default=["all-reduce"])
    placements = choices(placement, PLACEMENTS, "--placement", default=list(PLACEMENTS))
    if "in-place" not in placements and (only := [o for o in ops if o in IN_PLACE_ONLY]):
        raise SpecError(f"--placement out-of-place: {' and '.join(only)} in torch.distributed "
                        "work in place only; add in-place, or ask for all-gather or "
                        "reduce-scatter")
    backends = [backend] if isinstance(backend, str) else listed(backend, "--backend", [None])
    out = []
    for given_backend in dict.fromkeys(backends):
        be, dev = backend_and_device(given_backend, device)
        defaults = DEFAULTS[dev]
        given = listed(bytes, "--bytes", defaults["size"])
        try:
            sizes = list(dict.fromkeys(n for s in given for n in parse_sizes(s)))
        except ValueError as exc:
            raise SpecError(f"--bytes: {exc}") from None
        precisions = choices(precision, tuple(PRECISIONS), "--precision", default=["fp32"])
        n_warmup = defaults["warmup"] if warmup is None else warmup
        n_iters = defaults["iters"] if iters is None else iters
        counts(n_warmup, n_iters, "--iters")
        worlds = world_sizes(world_size, be, DEFAULT_WORLD_SIZES)
        out += [
            CommSpec(op=p["op"], placement=p["placement"],
                     bytes=buffer_bytes(p["size"], p["precision"], p["world_size"]),
                     world_size=p["world_size"], backend=be, precision=p["precision"],
                     warmup=n_warmup, iters=n_iters, device=dev)
            for p in expand({"world_size": worlds, "op": ops, "placement": placements,
                             "precision": precisions, "size": sizes})
            if p["placement"] == "in-place" or p["op"] not in IN_PLACE_ONLY
        ]
    # Requested sizes that round to one buffer (1B and 2B; 8B and 16B at 3 ranks) are one
    # point, measured once, as nccl-tests does: each would otherwise weigh in the average.
    return list(dict.fromkeys(out))


# Checked and filled in chunks so a 1 GB buffer needs no 8-byte-per-element temporaries.
_CHUNK = 1 << 24


# Ranks whose buffers hold the pattern; the others hold zeros. A sum over every rank is then
# at most 2·64 + 63 = 191, an integer bf16 holds exactly (it has 8 significant bits: 256),
# however many ranks there are (at 86 ranks of the pattern, 258 rounded, and a right
# all-reduce read wrong).
PATTERN_RANKS = 64


def _pattern(rank: int, index):
    """Small exact integers, rank-dependent, so sums over ranks are exact even in bf16."""
    return ((index % 3) + (rank % 3)) * (rank < PATTERN_RANKS)  # rank: an int or a tensor


def _fill(buf, rank: int) -> None:
    import torch

    for start in range(0, buf.numel(), _CHUNK):
        end = min(start + _CHUNK, buf.numel())
        buf[start:end] = _pattern(rank, torch.arange(start, end, device=buf.device))


def _count_wrong(out, expected_at) -> int:
    """Elements of `out` that differ from `expected_at(global indices)` (float64)."""
    import torch

    wrong = 0
    for start in range(0, out.numel(), _CHUNK):
        end = min(start + _CHUNK, out.numel())
        index = torch.arange(start, end, device=out.device)
        wrong += int((out[start:end].double() != expected_at(index).double()).sum())
    return wrong


def _make_op(op: str, numel: int, n: int, rank: int, dtype, device, in_place: bool = False):
    """(input, run, output, expected_at) for this rank; `run()` does the collective once. In
    place, all-gather's input is this rank's shard of the output and reduce-scatter's output
    this rank's shard of the input (nccl-tests' in-place buffers)."""
    import torch
    import torch.distributed as dist

    from cs336sys.parallel.collectives import all_gather_flat as all_gather
    from cs336sys.parallel.collectives import reduce_scatter_flat as reduce_scatter

    shard = numel // n
    holding = min(n, PATTERN_RANKS)  # the ranks whose buffers hold the pattern
    rank_sum = sum(r % 3 for r in range(holding))  # sum over ranks of the rank term of _pattern

    def summed(index):  # the pattern summed over all ranks
        return holding * (index % 3) + rank_sum

    if op in ("all-reduce", "broadcast"):
        buf = torch.empty(numel, dtype=dtype, device=device)
        _fill(buf, rank)
        if op == "all-reduce":
            return buf, (lambda: dist.all_reduce(buf)), buf, summed
        return buf, (lambda: dist.broadcast(buf, src=0)), buf, (lambda i: _pattern(0, i))
    if op == "all-gather":
        out = torch.empty(numel, dtype=dtype, device=device)
        inp = (out[rank * shard:(rank + 1) * shard] if in_place
               else torch.empty(shard, dtype=dtype, device=device))
        _fill(inp, rank)
        # out[j] came from rank j // shard, element j % shard
        return inp, (lambda: all_gather(out, inp)), out, (lambda j: _pattern(j // shard, j % shard))
    if op == "reduce-scatter":
        inp = torch.empty(numel, dtype=dtype, device=device)
        _fill(inp, rank)
        out = (inp[rank * shard:(rank + 1) * shard] if in_place
               else torch.empty(shard, dtype=dtype, device=device))
        # this rank owns global elements rank*shard ... (rank+1)*shard - 1
        return inp, (lambda: reduce_scatter(out, inp)), out, (lambda k: summed(rank * shard + k))
    raise ValueError(f"unknown op {op!r}")


def run(ctx: Any, spec: CommSpec) -> Result:
    import torch.distributed as dist

    from cs336sys.measure.nvtx import measured, nvtx_range

    dtype = torch_dtype(spec.precision)
    n, rank, device = ctx.world_size, ctx.rank, ctx.device
    numel = spec.bytes // itemsize(spec.precision)
    source, op, output, expected_at = _make_op(spec.op, numel, n, rank, dtype, device,
                                               in_place=spec.placement == "in-place")

    # Correctness, once: the first call on the patterned input against the exact values.
    op()
    synchronize(device)
    wrong = _count_wrong(output, expected_at)
    # Time on zeros: repeated in-place reductions of the pattern would grow to inf.
    source.zero_()

    times: list[float] = []

    def timed(i: int) -> float:
        dist.barrier()
        synchronize(device)
        t0 = time.perf_counter()
        with nvtx_range(f"{spec.op} {spec.bytes} B"):
            op()
            synchronize(device)
        step_done(i + 1, spec.warmup + spec.iters)
        return (time.perf_counter() - t0) * 1e3

    for i in range(spec.warmup):
        timed(i)
    with measured():  # what --nsys records: the timed collectives
        times = [timed(i) for i in range(spec.warmup, spec.warmup + spec.iters)]

    per_rank = gather({"times": times, "wrong": wrong})
    # each iteration's time averaged over the ranks: the statistics every experiment stores
    # of a timed quantity (its mean is each rank's mean, averaged over ranks, as nccl-tests
    # reports); how far the ranks' own means spread, apart (time_ms_rank_*)
    per_iter = [statistics.fmean(r["times"][i] for r in per_rank) for i in range(spec.iters)]
    metrics: dict[str, Any] = flatten("time_ms", per_iter)
    metrics.update(over_ranks("time_ms_rank", [statistics.fmean(r["times"]) for r in per_rank]))
    t_s = metrics["time_ms_mean"] / 1e3
    algbw = spec.bytes / t_s / 1e9
    metrics.update(
        algbw_gbps=algbw,
        busbw_gbps=algbw * busbw_factor(spec.op, n),
        wrong=sum(r["wrong"] for r in per_rank),
        numel=numel,
    )
    samples = {f"rank{r}": p["times"] for r, p in enumerate(per_rank)}
    bad = [r for r, p in enumerate(per_rank) if p["wrong"]]
    if not bad:
        return Result("ok", metrics=metrics, samples=samples)
    return Result("wrong", metrics=metrics, samples=samples,
                  error=f"wrong: {metrics['wrong']} elements of the {spec.op} output differ "
                  f"from the exact values, on rank{'s' if len(bad) > 1 else ''} "
                  f"{', '.join(map(str, bad))}")


# -- the report section ----------------------------------------------------------------------


def section(sec: Any, pts: list) -> None:
    """Bus bandwidth against message size (nccl-tests' busbw)."""
    lines = series(pts, "bytes", "busbw_gbps",
                   first=("op", "placement", "backend", "world_size"))
    add_plot(sec, "Bus bandwidth against message size", "comm-busbw",
             Plot.lines(lines, "message size (bytes)", "bus bandwidth (GB/s)", "Bus bandwidth",
                        logx=True), note="; ".join(average_lines(pts)))


# -- the declaration ------------------------------------------------------------------------

def average_busbw(rows: list) -> list[tuple[str, float, int]]:
    """nccl-tests' closing line per group of ok rows of one op, backend, world size and
    precision, and of any other setting that varies between the rows (`warmup=2`, as the
    plot's lines are kept apart; one size of two sweeps was counted twice): (the group, the
    mean of its bus bandwidths over the sizes, how many sizes)."""
    ok = [r for r in rows if r.get("status") == "ok" and r.get("busbw_gbps") is not None]
    others = varying(ok, shown=("op", "placement", "backend", "world_size", "precision",
                                "bytes"))
    groups: dict[str, list[float]] = {}
    for r in ok:
        where = placement_words(r["op"], r.get("placement"))
        key = " ".join([f"{r['op']}{where} {r['backend']} {r['world_size']} ranks "
                        f"{r['precision']}", *(f"{k}={r['_settings'].get(k)}" for k in others)])
        groups.setdefault(key, []).append(r["busbw_gbps"])
    return [(k, sum(v) / len(v), len(v)) for k, v in groups.items()]


def average_lines(rows: list) -> list[str]:
    """The closing lines: `Avg bus bandwidth: 12.3 GB/s (all-reduce gloo 2 ranks fp32, 9 sizes)`."""
    return [f"Avg bus bandwidth: {avg:.3g} GB/s ({key}, {n} size{'s' if n != 1 else ''})"
            for key, avg, n in average_busbw(rows)]


TABLE = Table(
    "Collectives (nccl-tests formulas for bus bandwidth)",
    (
        *setting_columns("op placement backend ranks=world_size precision"),
        Column("size", "bytes", "size", setting=True),
        # mean ± std over iterations, a noisy or drifting one flagged as every timing is
        Column("time ms", "time_ms", "mean_std"),
        # the slowest rank's mean; rows stored before it kept it as time_ms_max
        Column("slowest rank ms", cell=lambda r: r.get("time_ms_rank_max") or r.get("time_ms_max"),
               fmt="num"),
        Column("algbw GB/s", "algbw_gbps", "num"),
        Column("busbw GB/s", "busbw_gbps", "num"),
        Column("wrong", "wrong"),
    ),
    note="time: each iteration's time averaged over the ranks, mean ± std over iterations "
    "(the mean is each rank's mean averaged over ranks, as nccl-tests reports it); slowest "
    "rank: that rank's mean. busbw = algbw × 2(ranks-1)/ranks for all-reduce, (ranks-1)/ranks for "
    "all-gather and reduce-scatter, 1 for broadcast.",
)


def _options(
    op: list_option("all-reduce, all-gather, reduce-scatter, broadcast. [default: "
                    "all-reduce]") = None,
    bytes: list_option("Buffer size(s): B, KB, MB, GB (10^3..) or KiB, MiB, GiB (2^10..); or "
                       "a range START:END:xFACTOR as nccl-tests' -b -e -f, e.g. 8B:1GiB:x2 (nccl-tests' -b 8 -e 1G -f 2: its G is 2^30). "
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
    """comm's own options (it runs no user code: no --adapters)."""


def point_name(spec: CommSpec) -> str:
    """A point in a few words, for the progress bar."""
    where = placement_words(spec.op, spec.placement)
    return f"{spec.op}{where} {format_size(spec.bytes)} n={spec.world_size}"


COMMAND = Command(
    options=_options,
    help="Each point spawns its ranks locally (Gloo on CPU, NCCL with one GPU per rank), or "
    "joins the group when started by torchrun; only rank 0 writes. The result of every op is "
    "checked once (`wrong` counts bad elements).",
    examples=(
        "cs336sys comm --op all-reduce,all-gather --bytes 1MB,100MB --world-size 2",
        "cs336sys comm --op reduce-scatter --placement in-place --bytes 8B:32MiB:x4",
        "cs336sys comm --bytes 8B:32MiB:x4 --world-size 2",
        "torchrun --nnodes 2 --nproc-per-node 8 -m cs336sys comm --bytes 1GB",
    ),
    groups=("nsys",),
    drop=("adapters",),
    describe=point_name,
    closing=average_lines,  # nccl-tests' closing line, per op, backend, world size, precision
    ranks=True,
    emulation=False,
)

EXPERIMENT = Experiment(
    kind="comm",
    title="Collectives: bus bandwidth",
    spec=CommSpec, specs=specs, run=run,
    metrics=(
        *timing("time_ms", "one collective, each iteration's time averaged over the ranks"),
        *metric_table("""
            time_ms_rank_mean  ms    each rank's mean over iterations, averaged over ranks
            time_ms_rank_min   ms    the fastest rank's mean (older rows: in time_ms_min)
            time_ms_rank_max   ms    the slowest rank's mean (older rows: in time_ms_max)
            algbw_gbps      GB/s  S / time
            busbw_gbps      GB/s  algbw × the op's bus factor (nccl-tests)
            wrong           -     elements that differ from the exact expected values
            numel           -     elements in the buffer
        """),
    ),
    tables=(TABLE,),
    compare="time_ms",
    distributed=True,
    rank_preload=("torch",),  # its ranks only communicate: no dynamo (parallel/fork_server.py)
    section=section,
    draws=True,
    command=COMMAND,
)
