"""`cs336sys ddp`: a data-parallel training step with each DDP variant, against torch DDP."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, check_db, choices, fail, positive_ints, table
from cs336sys.cli.options import DFF, DModel, NumHeads, NumLayers, Resume, VocabSize

ListOpt = list[str] | None
DEFAULT_BUCKETS = [1.0, 10.0, 100.0, 1000.0]
# A laptop finishes a tiny-model step in about a second; a GPU gets the GPT-2 XL shape.
DEFAULTS = {
    "cpu": dict(size="tiny", context_length=128, global_batch=4),
    "cuda": dict(size="xl", context_length=512, global_batch=8),
}


def ddp(
    impl: Annotated[
        ListOpt,
        typer.Option(
            help="naive, flat, overlap, bucketed, torch (replicas), fsdp and/or torch-fsdp "
            "(sharded). [default: the five replica impls]"
        ),
    ] = None,
    shard_optimizer: Annotated[
        bool,
        typer.Option(
            "--shard-optimizer",
            help="Also run each replica impl with its AdamW state sharded by "
            "cs336sys.parallel.ShardedOptimizer.",
        ),
    ] = False,
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
        str | None, typer.Option(help="Model size preset. [default: tiny on CPU, xl on GPU]")
    ] = None,
    context_length: Annotated[
        int | None, typer.Option(help="Sequence length. [default: 128 on CPU, 512 on GPU]")
    ] = None,
    global_batch: Annotated[
        int | None,
        typer.Option(
            help="Sequences per step over all ranks, split evenly. [default: 4 CPU, 8 GPU]"
        ),
    ] = None,
    world_size: Annotated[ListOpt, typer.Option(help="Ranks. [default: 2]")] = None,
    backend: Annotated[
        str | None, typer.Option(help="gloo or nccl. [default: nccl on CUDA, else gloo]")
    ] = None,
    precision: Annotated[ListOpt, typer.Option(help="fp32 and/or bf16 (autocast).")] = None,
    warmup: Annotated[int, typer.Option(help="Untimed steps per point.")] = 3,
    steps: Annotated[int, typer.Option(help="Timed steps per point.")] = 10,
    device: Annotated[
        str, typer.Option(help="auto, cpu or cuda (picks the default backend).")
    ] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for weights and data.")] = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    resume: Resume = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time data-parallel training steps; store step time and the exposed gradient communication.

    Each variant wraps the same Transformer LM: naive (an all-reduce per gradient), flat (one all-reduce of all gradients), overlap (async per-gradient all-reduce from backward hooks), bucketed (async all-reduce per bucket, swept over --bucket-mb) and torch (DistributedDataParallel) keep full replicas; fsdp (cs336sys.parallel.FSDP) and torch-fsdp (FSDP2) shard weights, gradients and optimizer state. comm_ms is the time a step waits on gradient communication; comm_fraction its share of the step. Each point also stores this rank's memory after init and around the optimizer step (parameters, gradients, optimizer state, beside the analytic expectation) and the bytes of each kind of collective in one step.

    Examples:

        cs336sys ddp --impl bucketed,torch --bucket-mb 1,10,100 --world-size 2

        cs336sys ddp --impl torch,fsdp,torch-fsdp --shard-optimizer --zero

        torchrun --nproc-per-node 8 -m cs336sys ddp --size xl --global-batch 32
    """  # noqa: E501
    from cs336sys.bench.sweep import split_list
    from cs336sys.cli.distributed import rank0_recording, resolve_backend, run_groups, world_sizes
    from cs336sys.experiments import ddp as exp
    from cs336sys.models.config import PRESETS, from_preset

    impls = choices(impl, exp.IMPLS, "--impl", default=exp.REPLICA_IMPLS)
    shardings = ["none"] + ["own"] * shard_optimizer + ["zero"] * zero
    buckets = []
    for b in split_list(bucket_mb) or DEFAULT_BUCKETS:
        try:
            buckets.append(float(b))
        except ValueError:
            fail(f"--bucket-mb: {b!r} is not a number")
        if buckets[-1] <= 0:
            fail(f"--bucket-mb must be positive, got {b}")
    precisions = choices(precision, exp.PRECISIONS, "--precision", default=["fp32"])
    if steps <= 0:
        fail(f"--steps must be positive, got {steps}")
    if warmup < 0:
        fail(f"--warmup must be zero or more, got {warmup}")
    be, dev = resolve_backend(backend, device)
    wss = world_sizes(world_size, be, [2])
    defaults = DEFAULTS[dev]
    size = size or defaults["size"]
    if size not in PRESETS:
        fail(f"--size: unknown size {size!r}; choose from {', '.join(PRESETS)}")
    ctx_len = positive_ints([str(context_length)], "--context-length")[0] if context_length is not None else defaults["context_length"]  # fmt: skip
    batch = global_batch if global_batch is not None else defaults["global_batch"]
    if batch <= 0:
        fail(f"--global-batch must be positive, got {batch}")
    for n in wss:
        if batch % n:
            fail(f"--global-batch {batch} does not split evenly over {n} ranks")
    overrides = dict(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                     vocab_size=vocab_size)  # fmt: skip
    for name, value in overrides.items():
        if value is not None and value <= 0:
            fail(f"--{name.replace('_', '-')} must be positive, got {value}")
    try:
        cfg = from_preset(size, context_length=ctx_len, **overrides)
    except ValueError as exc:
        fail(exc)
    check_db(db)

    groups: dict[int, list] = {}
    for n in wss:
        for prec in precisions:
            for name in impls:
                for b, sharding in _points(name, buckets, shardings, exp.TORCH_BUCKET_MB):
                    groups.setdefault(n, []).append(exp.DDPSpec.of(
                        cfg, size, impl=name, bucket_mb=b, optimizer_sharding=sharding,
                        world_size=n, backend=be, device=dev, global_batch=batch,
                        precision=prec, warmup=warmup, steps=steps, seed=seed,
                    ))  # fmt: skip

    with rank0_recording(db, "ddp", "cuda:0" if dev == "cuda" else "cpu", resume) as rec:
        groups = {n: rec.pending(exp.EXPERIMENT, s, resume) for n, s in groups.items()}
        groups = {n: s for n, s in groups.items() if s}
        results = run_groups(rec, exp.EXPERIMENT, groups, exp.worker, be)
        from cs336sys.cli.distributed import torchrun_rank

        if torchrun_rank() in (None, 0):
            typer.echo(_summary(results))
        if rec.errors:
            raise typer.Exit(1)


def _points(impl: str, buckets: list[float], shardings: list[str], torch_default: float) -> list:
    """(bucket cap, optimizer sharding) pairs to sweep for `impl`: bucket caps for bucketed
    (torch DDP's own cap recorded for torch), each sharding for the replica impls; the FSDPs
    have neither (they shard the optimizer state anyway)."""
    if impl in ("fsdp", "torch-fsdp"):
        return [(None, None)]
    caps = buckets if impl == "bucketed" else [torch_default] if impl == "torch" else [None]
    return [(b, sh) for b in caps for sh in shardings]


def _ms(m: dict, phase: str) -> str:
    mean = m.get(f"{phase}_ms_mean")
    return "" if mean is None else f"{mean:.1f} ± {m.get(f'{phase}_ms_std') or 0:.1f}"


def _summary(results) -> str:
    # Step time relative to torch DDP at the same world size and precision, where it ran.
    def key(spec):
        return (spec.world_size, spec.precision)

    base = {key(s): r.metrics["step_ms_mean"] for s, r in results
            if s.impl == "torch" and s.optimizer_sharding == "none" and r.status == "ok"}  # fmt: skip
    rows = []
    for spec, r in results:
        m = r.metrics
        ref = base.get(key(spec))
        rows.append([
            _label(spec), spec.world_size, spec.precision, r.status, _ms(m, "step"),
            _ms(m, "comm"),
            "" if m.get("comm_fraction") is None else f"{m['comm_fraction']:.1%}",
            _mib(m.get("comm_bytes")), _mib(m.get("mem_before_opt_params_bytes")),
            _mib(m.get("mem_before_opt_grads_bytes")), _mib(m.get("mem_after_opt_opt_state_bytes")),
            _mib(m.get("mem_peak_bytes")),
            f"{m['step_ms_mean'] / ref:.2f}x" if ref and m.get("step_ms_mean") else "",
        ])  # fmt: skip
    headers = ["impl", "ranks", "precision", "status", "step ms", "comm ms", "comm %",
               "comm MiB/step", "params MiB", "grads MiB", "opt state MiB", "peak MiB",
               "vs torch"]  # fmt: skip
    return table(rows, headers, numparse=False)


def _label(spec) -> str:
    out = spec.impl + (f" {spec.bucket_mb:g}MiB" if spec.bucket_mb else "")
    return out + {"own": " +sharded opt", "zero": " +ZeRO"}.get(spec.optimizer_sharding or "", "")


def _mib(x) -> str:
    return "" if x is None else f"{x / 2**20:.1f}"
