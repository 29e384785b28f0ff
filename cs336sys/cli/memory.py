"""`cs336sys memory`: peak memory of the LM's forward pass or training step, measured and
accounted; `cs336sys memory residuals`: what one block saves for backward, by operation."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    check_db,
    choices,
    fail,
    progress,
    recording,
    table,
)
from cs336sys.cli.options import (
    DFF,
    Attention,
    BatchSize,
    Checkpoint,
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
MIB = 2**20

memory_app = typer.Typer(name="memory", add_completion=False, pretty_exceptions_enable=False)


@memory_app.callback(invoke_without_command=True)
def memory(
    ctx: typer.Context,
    size: Size = None,
    context_length: ContextLength = None,
    batch_size: BatchSize = None,
    mode: Annotated[
        ListOpt,
        typer.Option(
            help="forward (no grad) and/or train (forward, backward, AdamW step). [default: train]"
        ),
    ] = None,
    precision: Precision = None,
    checkpoint: Checkpoint = None,
    attention: Attention = None,
    optimizer: Optimizer = None,
    snapshot: Annotated[
        Path | None,
        typer.Option(
            help="Directory for each point's memory timeline PNG (and, on CUDA, the "
            "pickle pytorch.org/memory_viz loads); created if missing."
        ),
    ] = None,
    warmup: Annotated[int, typer.Option(help="Untracked warm-up steps.")] = 1,
    steps: Annotated[
        int, typer.Option(help="Timed steps (untracked), before the measured one.")
    ] = 3,
    device: Device = "auto",
    seed: Seed = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    resume: Resume = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Peak memory of a forward pass or training step, next to its analytic breakdown; one row per point.

    Per point: the bytes after model init, the peak of the step and of each phase, the bytes just before and after the optimizer step, and the bytes saved for backward (parameters excluded); beside them parameters, gradients and AdamW state (4P, 4P, 8P bytes), the counted activations (fp32, naive attention) and the residual-stream tensor B·T·d·bytes. On CUDA the allocator's figures; elsewhere the live tensor bytes counted by a tracker (not RSS). A sweep over --checkpoint marks the setting with the lowest peak in each group. View: memory_runs.

    Example:

        cs336sys memory --size small --checkpoint none,every:1,sqrt

    Subcommand `cs336sys memory residuals` measures one block's saved bytes, by operation.
    """  # noqa: E501
    if ctx.invoked_subcommand is not None:
        _refuse_options_before_subcommand(ctx)
        return
    from cs336sys.cli.model import model_specs
    from cs336sys.experiments.memory import MODES

    modes = choices(mode, MODES, "--mode", default=["train"])
    dev, model_points = model_specs(
        size=size, context_length=context_length, batch_size=batch_size, mode=modes,
        precision=precision, attention=attention, optimizer=optimizer, compile=False,
        checkpoint=checkpoint, warmup=warmup, steps=steps, device=device, seed=seed,
        d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
        vocab_size=vocab_size,
    )  # fmt: skip
    snapshot_dir = _check_snapshot(snapshot)
    check_db(db)
    # -- measure ----------------------------------------------------------------------------
    from cs336sys.bench.result import guarded
    from cs336sys.experiments.memory import EXPERIMENT, MemorySpec, run
    from cs336sys.store.db import now

    specs = [MemorySpec(p, snapshot=snapshot_dir) for p in model_points]
    results = []
    with recording(db, "memory", dev) as rec:
        specs = rec.pending(EXPERIMENT, specs, resume)
        groups: dict[tuple, list] = {}
        sizes = _group_sizes(specs)
        for spec in progress(specs, "memory", show=_label):
            started = now()
            result = guarded(run, spec)
            run_id = rec.add(EXPERIMENT, spec.settings(), result, started)
            results.append((spec, result))
            group = groups.setdefault(_group(spec), [])
            group.append((run_id, result))
            if len(group) == sizes[_group(spec)]:
                _mark_lowest(rec.store, group)
        typer.echo(_summary(results))
        if rec.errors:
            raise typer.Exit(1)


@memory_app.command()
def residuals(
    size: Annotated[
        ListOpt, typer.Option(help="Size preset(s) of the block. [default: small]")
    ] = None,
    context_length: ContextLength = None,
    batch_size: Annotated[ListOpt, typer.Option(help="Batch size(s). [default: 1]")] = None,
    precision: Precision = None,
    impl: Annotated[
        ListOpt,
        typer.Option(help="eager and/or compiled (torch.compile). [default: eager,compiled]"),
    ] = None,
    attention: Attention = None,
    device: Device = "auto",
    seed: Seed = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_heads: NumHeads = None,
    resume: Resume = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Bytes one TransformerBlock saves for backward, eager and compiled, and the top 5 operations by saved bytes.

    Saved-tensor hooks count each saved storage once, parameters excluded; the bytes are attributed to autograd node names by walking the graph (a storage saved by several nodes is split among them), so the shares add up to 1. A compiled block is one CompiledFunctionBackward node. The analytic count is given for the eager fp32 block with naive attention. View: memory_residuals_runs.

    Example:

        cs336sys memory residuals --size xl --context-length 2048
    """  # noqa: E501
    from cs336sys.cli.model import model_specs
    from cs336sys.experiments.memory_residuals import IMPLS

    impls = choices(impl, IMPLS, "--impl", default=list(IMPLS))
    # The model options' validation and expansion, for one block: layers play no part.
    dev, points = model_specs(
        size=size, context_length=context_length, batch_size=batch_size or ["1"],
        mode=["forward"], precision=precision, attention=attention, optimizer=None,
        compile=False, checkpoint=None, warmup=0, steps=1, device=device, seed=seed,
        d_model=d_model, d_ff=d_ff, num_layers=None, num_heads=num_heads, vocab_size=None,
    )  # fmt: skip
    check_db(db)
    from cs336sys.bench.result import guarded
    from cs336sys.experiments.memory_residuals import EXPERIMENT, ResidualsSpec, run
    from cs336sys.store.db import now

    specs = [
        ResidualsSpec(
            size=p.size,
            d_model=p.d_model,
            d_ff=p.d_ff,
            num_heads=p.num_heads,
            context_length=p.context_length,
            batch_size=p.batch_size,
            precision=p.precision,
            impl=i,
            attention=p.attention,
            device=p.device,
            seed=p.seed,
        )  # fmt: skip
        for p in points
        for i in impls
    ]
    results = []
    with recording(db, "memory residuals", dev) as rec:
        specs = rec.pending(EXPERIMENT, specs, resume)
        for spec in progress(specs, "memory residuals", show=lambda s: f"{s.size} T={s.context_length} {s.impl}"):  # fmt: skip
            started = now()
            result = guarded(run, spec)
            rec.add(EXPERIMENT, spec.settings(), result, started)
            results.append((spec, result))
        typer.echo(_residuals_summary(results))
        if rec.errors:
            raise typer.Exit(1)


# -- validation -------------------------------------------------------------------------------


def _refuse_options_before_subcommand(ctx: typer.Context) -> None:
    """`memory --size xl residuals` would silently drop --size: say where it belongs."""
    # By name: typer may bring its own copy of click, whose ParameterSource is another enum.
    given = [n for n in ctx.params if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]  # fmt: skip
    if given:
        flag = "--" + given[0].replace("_", "-")
        fail(f"{flag} belongs after the subcommand: cs336sys memory {ctx.invoked_subcommand} {flag} ...")  # fmt: skip


def _check_snapshot(path: Path | None) -> str | None:
    """Refuse a --snapshot directory that cannot be created or written, before any work."""
    if path is None:
        return None
    if path.exists() and not path.is_dir():
        fail(f"--snapshot {path}: exists and is not a directory")
    existing = path
    while not existing.exists():  # the nearest ancestor that exists must be a writable dir
        existing = existing.parent
    if not existing.is_dir():
        fail(f"--snapshot {path}: {existing} is not a directory")
    # Try it: os.access says yes to root even on /proc or a read-only mount.
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        fail(f"--snapshot {path}: cannot write in {existing} ({exc.strerror or exc})")
    return str(path)


# -- lowest peak per group --------------------------------------------------------------------


def _group(spec) -> tuple:
    """Points that differ only in --checkpoint form a group."""
    return tuple(sorted((k, str(v)) for k, v in spec.settings().items() if k != "checkpoint"))


def _group_sizes(specs) -> dict[tuple, int]:
    sizes: dict[tuple, int] = {}
    for spec in specs:
        sizes[_group(spec)] = sizes.get(_group(spec), 0) + 1
    return sizes


def _mark_lowest(store, group: list) -> None:
    """Once a group has run, flag the ok rows with the lowest peak (`lowest_peak` true, the
    others false; null where fewer than two points ran ok). Rows are written as each point
    finishes, so this updates them."""
    ok = [(run_id, r) for run_id, r in group if r.status == "ok"]
    if len(ok) < 2:  # nothing to compare with: lowest_peak stays null
        return
    lowest = min(r.metrics["peak_bytes"] for _, r in ok)
    for run_id, result in ok:
        flag = result.metrics["peak_bytes"] == lowest  # ties are all marked
        result.metrics["lowest_peak"] = flag
        metrics = json.loads(store.db["runs"].get(run_id)["metrics"])
        metrics["lowest_peak"] = flag
        store.db["runs"].update(run_id, {"metrics": json.dumps(metrics)})


# -- output -------------------------------------------------------------------------------------


def _label(spec) -> str:
    m = spec.model
    return f"{m.size} T={m.context_length} {m.mode} {m.precision} {m.checkpoint}"


def _mib(value) -> str:
    if value is None:
        return ""
    return f"{value / MIB:,.1f}" if value >= MIB else f"{value / MIB:.3f}"


def _summary(results) -> str:
    rows = []
    for spec, r in results:
        m, x = spec.model, r.metrics
        step = x.get("step_ms_mean")
        rows.append([
            m.size, m.context_length, m.batch_size, m.mode, m.precision, m.checkpoint, r.status,
            _mib(x.get("init_bytes")), _mib(x.get("peak_bytes")), _mib(x.get("peak_reserved_bytes")),
            _mib(x.get("before_opt_bytes")), _mib(x.get("after_opt_bytes")),
            _mib(x.get("saved_bytes")), _mib(x.get("act_bytes_analytic")),
            _mib(x.get("residual_bytes")), "" if step is None else f"{step:.1f}",
            "<- lowest" if x.get("lowest_peak") else "",
        ])  # fmt: skip
    headers = ["size", "ctx", "batch", "mode", "precision", "checkpoint", "status", "init MiB",
               "peak MiB", "reserved MiB", "pre-opt MiB", "post-opt MiB", "saved MiB",
               "analytic act MiB", "residual MiB", "step ms", "peak"]  # fmt: skip
    return table(rows, headers, numparse=False)


def _residuals_summary(results) -> str:
    rows = []
    for s, r in results:
        x = r.metrics
        top = ", ".join(
            f"{x[f'top{i}_op']} {x[f'top{i}_share']:.0%}"
            for i in range(1, 6)
            if x.get(f"top{i}_op") is not None
        )
        rows.append([
            s.size, s.context_length, s.batch_size, s.precision, s.impl, r.status,
            _mib(x.get("saved_bytes")), _mib(x.get("analytic_bytes")), _mib(x.get("residual_bytes")),
            "" if x.get("saved_per_residual") is None else f"{x['saved_per_residual']:.1f}", top,
        ])  # fmt: skip
    headers = ["size", "ctx", "batch", "precision", "impl", "status", "saved MiB",
               "analytic MiB", "residual MiB", "saved / residual", "top operations (share)"]  # fmt: skip
    return table(rows, headers, numparse=False)
