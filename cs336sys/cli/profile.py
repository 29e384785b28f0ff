"""`cs336sys profile model|attention`: torch.profiler over the measured steps, per phase.

The options are those of `cs336sys model` and `cs336sys attention`, validated and expanded
by the same functions (`model.specs`, `attention.specs`), plus --top, --trace, --nsys/--exec
and --nvtx. Each point is one `runs` row (view `profile_runs`) and its op/kernel summary is
rows of `kernel_stats` linked to it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from cs336sys.cli.attention import (
    AttentionBatch,
    AttentionImpl,
    AttentionPrecision,
    AttentionSeq,
    DHead,
    Heads,
)
from cs336sys.cli.common import (
    DEFAULT_DB,
    Bar,
    DbOption,
    announce_user_code,
    check_db,
    fail,
    recording,
    show,
    table,
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
)

ListOpt = list[str] | None

profile_app = typer.Typer(name="profile", no_args_is_help=True)


@profile_app.callback()
def _profile() -> None:
    """Profile the measured steps of a model or attention point, phase by phase.

    Example:

        cs336sys profile model --size small --seq 256 --top 15
    """


# -- options shared by both subcommands --------------------------------------------------
Top = Annotated[int, typer.Option(help="Ops/kernels kept per phase; the rest is one (other) row.")]
Trace = Annotated[
    Path | None,
    typer.Option(
        help="Write a Chrome trace (chrome://tracing, ui.perfetto.dev); several points get "
        "-1, -2, ... before the suffix.",
    ),
]
Nsys = Annotated[
    bool,
    typer.Option(
        "--nsys",
        help="Print the Nsight Systems command that captures only the measured steps (NVTX "
        "range 'measured_steps'), instead of profiling here. Needs nsys and CUDA.",
    ),
]
Exec = Annotated[bool, typer.Option("--exec", help="With --nsys: also run that command.")]
Nvtx = Annotated[
    bool,
    typer.Option(
        "--nvtx",
        help="Mark phases and the measured steps with NVTX ranges in place of torch.profiler "
        "(what the --nsys command runs; nsys and torch.profiler cannot share CUPTI).",
    ),
]


def profile_model(
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
    warmup: Annotated[
        int | None,
        typer.Option(help="Warm-up steps, run before the profiler. [default: 5 on CUDA, 2 on CPU]"),
    ] = None,
    iters: Annotated[
        int | None, typer.Option(help="Profiled (measured) steps. [default: 10 on CUDA, 5 on CPU]")
    ] = None,
    device: Device = "auto",
    seed: Seed = 0,
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
    model: UserModel = None,
    top: Top = 10,
    trace: Trace = None,
    nsys: Nsys = False,
    exec_: Exec = False,
    nvtx: Nvtx = False,
    resume: Resume = False,
    label: Label = None,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Profile model steps: ops (CPU) or kernels (CUDA) per phase, stored in kernel_stats.

    Same options as `cs336sys model`. Warm-up steps run outside the profiler; each measured step's forward, backward and optimizer phases are summarised separately: name, calls, total and mean time, share of the phase (CUDA: kernel time; CPU: op self time). With naive attention the forward's QKᵀ, softmax and PV are also set against their FLOPs.

    Example:

        cs336sys profile model --size small --seq 256 --mode train --top 15
    """  # noqa: E501
    from cs336sys.experiments import model as model_exp

    user_code(adapters)
    with user_errors():
        points = model_exp.specs(
            size=size, seq=seq, batch=batch, mode=mode,
            precision=precision, attention=attention, optimizer=optimizer, compile=compile,
            checkpoint=checkpoint, warmup=warmup, iters=iters, device=device, seed=seed,
            d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
            vocab_size=vocab_size, model=model,
        )
    args = _args(
        ("--size", size), ("--seq", seq), ("--batch", batch),
        ("--mode", mode), ("--precision", precision), ("--attention", attention),
        ("--optimizer", optimizer), ("--compile", compile), ("--checkpoint", checkpoint),
        ("--warmup", warmup), ("--iters", iters), ("--device", device), ("--seed", seed),
        ("--d-model", d_model), ("--d-ff", d_ff), ("--num-layers", num_layers),
        ("--num-heads", num_heads), ("--vocab-size", vocab_size), ("--label", label),
        ("--model", model), ("--adapters", adapters),
    )
    _profile_points("model", points, args, top, trace, nsys, exec_, nvtx, resume, db, label)


def profile_attention(
    attention: AttentionImpl = None,
    seq: AttentionSeq = None,
    d_head: DHead = None,
    batch: AttentionBatch = None,
    heads: Heads = None,
    precision: AttentionPrecision = None,
    causal: Annotated[
        bool | None, typer.Option("--causal/--no-causal", help="Causal mask. [default: causal]")
    ] = None,
    passes: Annotated[
        str | None, typer.Option("--pass", help="forward, backward or both. [default: both]")
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help="Warm-up calls, before the profiler. [default: 10 on CUDA, 3 on CPU]"),
    ] = None,
    iters: Annotated[
        int | None,
        typer.Option(help="Profiled (measured) calls. [default: 100 on CUDA, 10 on CPU]"),
    ] = None,
    sdpa_backend: Annotated[
        str, typer.Option(help="For sdpa: auto, flash, efficient, math or cudnn.")
    ] = "auto",
    preset: Annotated[
        str | None, typer.Option(help="pytorch-attention, flash-benchmarking or leaderboard.")
    ] = None,
    device: Device = "auto",
    seed: Annotated[int, typer.Option(help="Seed for the random inputs.")] = 0,
    top: Top = 10,
    trace: Trace = None,
    nsys: Nsys = False,
    exec_: Exec = False,
    nvtx: Nvtx = False,
    resume: Resume = False,
    label: Label = None,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Profile attention calls: ops/kernels per phase, and naive attention's parts vs FLOPs.

    Same options as `cs336sys attention` (but no --timer: the profiler times). For naive attention the forward's QKᵀ (2·B·H·T²·d FLOPs, with scale and mask), softmax (5·B·H·T²) and PV (2·B·H·T²·d) get their time and achieved GFLOP/s.

    Example:

        cs336sys profile attention --attention naive,sdpa --seq 1024 --d-head 64 --iters 20
    """  # noqa: E501
    from cs336sys.experiments import attention as attention_exp

    user_code(adapters)
    with user_errors():
        points = attention_exp.specs(
            impl=attention, seq=seq, d_head=d_head, batch=batch, heads=heads, precision=precision,
            causal=causal, passes=passes, warmup=warmup, iters=iters, timer="loop",
            sdpa_backend=sdpa_backend, preset=preset, device=device, seed=seed,
        )
    args = _args(
        ("--attention", attention), ("--seq", seq), ("--d-head", d_head), ("--batch", batch),
        ("--heads", heads), ("--precision", precision), ("--pass", passes), ("--warmup", warmup),
        ("--iters", iters), ("--sdpa-backend", sdpa_backend), ("--preset", preset),
        ("--device", device), ("--seed", seed), ("--label", label), ("--adapters", adapters),
    ) + ([] if causal is None else ["--causal" if causal else "--no-causal"])
    _profile_points("attention", points, args, top, trace, nsys, exec_, nvtx, resume, db, label)


profile_app.command("model")(profile_model)
profile_app.command("attention")(profile_attention)


def _profile_points(target, points, args, top, trace, nsys, exec_, nvtx, resume, db, label):
    """Validate the profiling options, then print/run nsys or profile and store each point."""
    from cs336sys.experiments import profile as exp
    from cs336sys.sweep.runner import run_sweep

    with user_errors():
        specs = exp.specs(target, points, top=top, nvtx=nvtx, trace=trace)
    if exec_ and not nsys:
        fail("--exec runs the Nsight Systems command: pass --nsys too")
    if nsys and nvtx:
        fail("--nsys already runs the command with --nvtx: pass one of them")
    if trace is not None and (nsys or nvtx):
        fail("--trace writes torch.profiler's trace, which --nsys/--nvtx do not run")
    if trace is not None:
        _check_writable(trace)
    check_db(db)
    announce_user_code()
    dev = points[0].device
    if nsys:
        _nsys(target, dev, [*args, "--top", str(top), "--db", str(db)], exec_)
    with recording(db, f"profile {target}", dev, label=label) as rec:
        points = run_sweep(exp.EXPERIMENT, specs, rec, resume=resume,
                           progress=Bar(f"profile {target}", _label))
        show(exp.EXPERIMENT, points)
        typer.echo(_details(points))


def _args(*pairs: tuple[str, Any]) -> list[str]:
    """Options as a command line: lists joined by commas, flags for True, None left out."""
    out: list[str] = []
    for flag, value in pairs:
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        else:
            out += [flag, ",".join(value) if isinstance(value, list) else str(value)]
    return out


def _check_writable(path: Path) -> None:
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        fail(f"--trace: {path} is a directory")
    if not parent.is_dir():
        fail(f"--trace: directory {parent} does not exist")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        fail(f"--trace: {path} is not writable")


def nsys_command(nsys: str, target: str, args: list[str], output: str) -> list[str]:
    """The nsys command line that records only the measured steps of `cs336sys profile`.

    The child runs with --nvtx: no torch.profiler (one CUPTI client at a time), NVTX ranges
    for the phases, and the range 'measured_steps' around the measured steps only, which
    --capture-range=nvtx starts and --capture-range-end=stop ends the capture on. Ranges
    pushed by name are unregistered NVTX strings, which nsys matches only when
    NSYS_NVTX_PROFILER_REGISTER_ONLY=0 (Nsight Systems user guide, "NVTX capture range").
    """
    from cs336sys.experiments.profile import MEASURED_RANGE

    return [
        nsys, "profile", "--trace=cuda,nvtx,osrt", "--capture-range=nvtx",
        f"--nvtx-capture={MEASURED_RANGE}", "--capture-range-end=stop",
        "--env-var=NSYS_NVTX_PROFILER_REGISTER_ONLY=0", "--force-overwrite=true",
        f"--output={output}", sys.executable, "-m", "cs336sys", "profile", target, *args, "--nvtx",
    ]


def _nsys(target: str, dev: str, args: list[str], run_it: bool) -> None:
    path = shutil.which("nsys")
    if path is None:
        fail("--nsys: Nsight Systems (nsys) is not installed or not on PATH")
    if not _nvtx_on(dev):
        fail(f"--nsys needs a CUDA device: NVTX ranges are emitted only on CUDA (device {dev})")
    cmd = nsys_command(path, target, args, f"cs336sys-profile-{target}")
    typer.echo(shlex.join(cmd))
    if not run_it:
        raise typer.Exit(0)
    import subprocess

    raise typer.Exit(subprocess.run(cmd, check=False).returncode)


def _nvtx_on(dev: str) -> bool:
    """Whether NVTX ranges are emitted for `dev` (measure/nvtx.py: only with CUDA)."""
    return dev.startswith("cuda")


def _label(spec) -> str:
    p = spec.point
    if spec.target == "model":
        return f"{p.size} T={p.seq} {p.mode} {p.precision}"
    return f"{p.impl} seq={p.seq} d={p.d_head} {p.precision}"


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "" if value is None else format(value, fmt)


def _details(points) -> str:
    """Naive attention's parts against their FLOPs, then each point's top ops per phase."""
    parts, blocks = [], []
    for p in points:
        m = p.result.metrics
        fwd = m.get("fwd_profiled_ms_mean")
        for key, name in (("qk", "QKᵀ (+scale, mask)"), ("softmax", "softmax"), ("pv", "PV")):
            if m.get(f"{key}_ms_mean") is not None:
                share = m[f"{key}_ms_mean"] / fwd if fwd else None
                parts.append([_label(p.spec), name, _f(m[f"{key}_ms_mean"]),
                              _f(m.get(f"{key}_flops"), ".4g"), _f(m.get(f"{key}_gflops"), ".4g"),
                              _f(share, ".1%")])
        kernels = p.result.tables.get("kernel_stats", [])
        for phase in ("forward", "backward", "optimizer"):
            ops = [k for k in kernels if k["phase"] == phase]
            if not ops:
                continue
            what = "kernel time" if ops[0]["time_basis"] == "cuda" else "CPU self time"
            head = f"{_label(p.spec)} | {phase} | {what} over {m.get('profiled_steps')} steps"
            body = table(
                [[k["rank"], _short(k["name"]), k["calls"], _f(k["total_ms"]),
                  _f(k["mean_ms"], ".4f"), _f(k["share"], ".1%")] for k in ops],
                ["#", "name", "calls", "total ms", "mean ms", "share"], numparse=False,
            )
            blocks.append(f"{head}\n{body}")
    out = []
    if parts:
        out.append("naive attention, forward, per step:\n" + table(
            parts, ["point", "part", "ms", "FLOPs", "GFLOP/s", "of fwd"], numparse=False))
    return "\n\n".join(out + blocks)


def _short(name: str, width: int = 72) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"
