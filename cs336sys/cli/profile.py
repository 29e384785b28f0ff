"""`cs336sys profile model|attention`: torch.profiler over the measured steps, per phase.

The options are those of `cs336sys model` and `cs336sys attention`, declared once with them
(experiments/model_command.py, attention_command.py; `with_options`) and validated and
expanded by the same functions (`model.specs`, `attention.specs`), plus --top, --trace and --nvtx; --nsys is every measuring command's
(cli/nsys.py). Each point is one `runs` row (view `profile_runs`) and its op/kernel summary is
rows of `kernel_stats` linked to it.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

import typer

from cs336sys.cli.common import fail, run_experiment, table
from cs336sys.cli.declared import with_options
from cs336sys.cli.nsys import on_cuda
from cs336sys.cli.options import option
from cs336sys.experiments import attention_command, model_command
from cs336sys.measure.nsys import nvtx_asked
from cs336sys.report.kernel_names import readable_all

profile_app = typer.Typer(name="profile", no_args_is_help=True)


@profile_app.callback()
def _profile() -> None:
    """Profile the measured steps of a model or attention point, phase by phase.

    Example:

        cs336sys profile model --size small --seq 256 --top 15
    """


def _profiling(
    top: option("Ops/kernels kept per phase; the rest is one (other) row.", int) = 10,
    trace: option("Write a Chrome trace (chrome://tracing, ui.perfetto.dev); several points get "
                  "-1, -2, ... before the suffix.", Path | None) = None,
    exec_: option("Accepted for scripts of 0.2, where --nsys only printed its command: --nsys "
                  "now runs it (--nsys --dry-run prints).", bool, "--exec", hidden=True) = False,
    nvtx: option("Mark phases and the measured steps with NVTX ranges in place of "
                 "torch.profiler (what --nsys runs: nsys and torch.profiler cannot share "
                 "CUPTI).", bool, "--nvtx") = False,
    force: option("Run the points estimated not to fit in the device's free memory too (without "
                  "it they are stored as skipped, with the estimate), and write a --trace over "
                  "a file cs336sys did not write (without it the command refuses).", bool,
                  "--force") = False,
) -> None:
    """The options of both subcommands beyond those of the command they profile."""


def _model_steps(
    warmup: option("Warm-up steps, run before the profiler. [default: 5 on CUDA, 2 on CPU]",
                   int | None) = None,
    iters: option("Profiled (measured) steps. [default: 10 on CUDA, 5 on CPU]", int | None) = None,
) -> None:
    """What `profile model` counts as warm-up and measured."""


def _attention_calls(
    warmup: option("Warm-up calls, before the profiler. [default: 10 on CUDA, 3 on CPU]",
                   int | None) = None,
    iters: option("Profiled (measured) calls. [default: 100 on CUDA, 10 on CPU]",
                  int | None) = None,
) -> None:
    """What `profile attention` counts as warm-up and measured."""


@with_options(model_command.COMMAND, _model_steps, _profiling, drop=("rounds",))
def profile_model(ctx: typer.Context, **options: Any) -> None:
    """Profile model steps: ops (CPU) or kernels (CUDA) per phase, stored in kernel_stats.

    Same options as `cs336sys model`. Warm-up steps run outside the profiler; each measured step's forward, backward and optimizer phases are summarised separately, then together: name, calls, total and mean time, share of the phase (CUDA: kernel time; CPU: op self time). With naive attention the forward's QKᵀ matmul, its scale and mask, the softmax and PV are also set against their FLOPs.

    Example:

        cs336sys profile model --size small --seq 256 --mode train --top 15
    """
    from cs336sys.experiments import model as model_exp

    # the profiler records --iters steps in one round
    _profile_points(ctx, "model", functools.partial(model_exp.specs, rounds=1), options)


@with_options(attention_command.COMMAND, _attention_calls, _profiling,
              drop=("timer", "skip_after_oom", "rounds", "min_time"))
def profile_attention(ctx: typer.Context, **options: Any) -> None:
    """Profile attention calls: ops/kernels per phase, and naive attention's parts vs FLOPs.

    Same options as `cs336sys attention` (but no --timer, --rounds or --min-time: the profiler times --iters calls, in one round). For naive attention the forward's QKᵀ (2·B·H·T²·d FLOPs), its scale and mask (no FLOPs counted), softmax (5·B·H·T²) and PV (2·B·H·T²·d) get their time and achieved GFLOP/s.

    Example:

        cs336sys profile attention --attention naive,sdpa --seq 1024 --d-head 64 --iters 20
    """
    from cs336sys.experiments import attention as attention_exp

    # what the profiler runs: --iters calls in one round (CUDA's default of 3 rounds refused
    # --iters 2, and a given --rounds or --min-time was stored, never used)
    specs = functools.partial(attention_exp.specs, rounds=1, min_time=0.0)
    _profile_points(ctx, "attention", specs, options)


profile_app.command("model")(profile_model)
profile_app.command("attention")(profile_attention)

_PROFILING = ("top", "trace", "exec_", "nvtx")  # the options of _profiling


def _profile_points(ctx, target, point_specs, options):
    """Validate the profiling options, then profile and store each point (with --nsys,
    cli/common.run_experiment records each under Nsight Systems instead)."""
    from cs336sys.experiments import profile as exp

    top, trace, exec_, nvtx = (options.pop(k) for k in _PROFILING)
    nsys = options["nsys"]
    if exec_ and not nsys:
        fail("--exec runs the Nsight Systems command: pass --nsys too")
    if nsys and nvtx:
        fail("--nsys already runs the command with --nvtx: pass one of them")
    if trace is not None and (nsys or nvtx):
        fail("--trace writes torch.profiler's trace, which --nsys/--nvtx do not run")
    nvtx = nvtx or nvtx_asked()  # under --nsys's nsys: NVTX ranges, not torch.profiler
    if trace is not None:
        _check_writable(trace, options["db"])

    def specs(**point_options):
        from cs336sys.cli.outputs import refuse_to_replace

        points = exp.specs(target, point_specs(**point_options), top=top, nvtx=nvtx, trace=trace)
        if nvtx and not nvtx_asked() and not any(on_cuda(str(p.point.device)) for p in points):
            typer.echo("--nvtx without CUDA: its ranges are CUDA's, so nothing is profiled; "
                       "each row keeps its phases' wall times alone", err=True)
        points = _past_earlier_traces(points, trace)
        refuse_to_replace([Path(p.trace) for p in points if p.trace], "trace", "--trace",
                          options["force"], options["db"])
        return points

    run_experiment(exp.EXPERIMENT, specs, {**options, "ctx": ctx}, command=f"profile {target}",
                   describe=_point_name,
                   emulation=False, after=lambda points: typer.echo(_details(points)))


def _past_earlier_traces(points: list, trace: Path | None) -> list:
    """The points, each trace a name no trace cs336sys wrote has yet: `stem.json` taken, the
    next of `stem-2.json`, `stem-3.json`, ... (`stem-N.json` taken by several points, the
    next numbers), as memory's --snapshot does: a second profile into one --trace wrote
    over the first's files, whose stored rows then named the other run's trace. A file
    cs336sys did not write is left where it is, for refuse_to_replace to refuse."""
    import dataclasses
    import itertools

    from cs336sys.cli.outputs import foreign

    def ours_there(path: Path) -> bool:
        return path.is_file() and path.stat().st_size > 0 and foreign(path, "trace") is None

    if trace is None or not any(ours_there(Path(p.trace)) for p in points):
        return points
    t = Path(trace)
    whole = [t] if len(points) == 1 else []
    names = itertools.chain(whole, (t.with_name(f"{t.stem}-{n}{t.suffix}")
                                    for n in itertools.count(2 if whole else 1)))
    free = (p for p in names if not p.exists())
    return [dataclasses.replace(p, trace=str(next(free))) for p in points]


def _check_writable(path: Path, db: Path) -> None:
    """Refuse a --trace that cannot be written, or that is this command's store (--db)."""
    from cs336sys.cli.outputs import refuse_the_store
    from cs336sys.measure.paths import why_unwritable

    parent = path.parent if str(path.parent) else Path(".")
    if not path.name.strip():  # a name of spaces (a pasted non-breaking one): blank
        fail("--trace: empty value; give a file name")
    if path.is_dir():
        fail(f"--trace: {path} is a directory")
    refuse_the_store([path], "--trace", db)
    # made if missing, as --snapshot's folder is; tried, not asked: os.access says yes to
    # root even on /proc or a read-only mount
    problem = why_unwritable(parent)
    if problem is not None:
        fail(f"--trace {path}: {problem}")
    if path.exists() and not os.access(path, os.W_OK):
        fail(f"--trace: {path} is not writable")


def _point_name(spec) -> str:
    """The profiled point in a few words, as its own command names it (progress, nsys)."""
    command = model_command if spec.target == "model" else attention_command
    return command.point_name(spec.point)


def _labels(points) -> dict[int, str]:
    """Each point's label by id(), as the report's section gives it (its settings and
    what it measured: `(Triton interpreted)`), told apart where two read the same."""
    from cs336sys.experiments.profile_section import labelled

    rows = [{**p.result.metrics, **p.spec.settings(), "_settings": p.spec.settings()}
            for p in points]
    return {id(p): name for p, name in zip(points, labelled(rows), strict=True)}


def _f(value: float | None, fmt: str = ".3f") -> str:
    return "" if value is None else format(value, fmt)


def _details(points) -> str:
    """Attention's parts against their FLOPs, then each point's top ops per phase."""
    parts, blocks = [], []
    every = {k["name"] for p in points for k in p.result.tables.get("kernel_stats", [])}
    labels = _labels(points)
    for p in points:
        m = p.result.metrics
        fwd = m.get("fwd_profiled_ms_mean")
        for key, name in (("qk", "QKᵀ"), ("mask", "scale, mask"), ("softmax", "softmax"),
                          ("pv", "PV")):
            if m.get(f"{key}_ms_mean") is not None:
                share = m[f"{key}_ms_mean"] / fwd if fwd else None
                parts.append([labels[id(p)], name, _f(m[f"{key}_ms_mean"]),
                              _f(m.get(f"{key}_flops"), ".4g"), _f(m.get(f"{key}_gflops"), ".4g"),
                              _f(share, ".1%")])
        kernels = p.result.tables.get("kernel_stats", [])
        for phase in ("forward", "backward", "optimizer", "step"):
            ops = [k for k in kernels if k["phase"] == phase]
            if not ops:
                continue
            what = "kernel time" if ops[0]["time_basis"] == "cuda" else "CPU self time"
            steps = m.get("profiled_steps") or 1
            where = "every phase" if phase == "step" else phase
            head = (f"{labels[id(p)]} | {where} | {what} per step, the mean of {steps} "
                    f"profiled step{'s' * (steps != 1)}")
            body = table(
                [[k["rank"], name, _f(k["calls"] / steps, ".4g"),
                  _f(k["total_ms"] / steps), _f(k["mean_ms"], ".4f"), _f(k["share"], ".1%")]
                 for k, name in zip(ops, readable_all([k["name"] for k in ops], 72, every),
                                    strict=True)],
                ["#", "name", "calls/step", "ms/step", "ms/call", "share"], numparse=False,
            )
            blocks.append(f"{head}\n{body}")
    out = []
    if parts:
        out.append("attention (naive, or your model's), forward, per step:\n" + table(
            parts, ["point", "part", "ms", "FLOPs", "GFLOP/s", "of fwd"], numparse=False))
    unsplit = [p for p in points if getattr(p.spec.point, "model", None)
               and p.result.status == "ok" and not p.spec.point.compile
               and p.result.metrics.get("qk_ms_mean") is None]
    # nsys_profile (e)'s split, missing: said, not left blank
    unseen = [p for p in unsplit if not p.result.metrics.get("attention_calls")]
    if unseen:
        out.append(f"no call of {model_command.ATTENTION_FUNCTION} was seen in the modules of "
                   f"your model's classes at {len(unseen)} point(s): the attention's parts "
                   "(QKᵀ, softmax, PV) are left out there")
    if len(unseen) < len(unsplit):
        out.append(f"your {model_command.ATTENTION_FUNCTION} ran, but no softmax op ran inside "
                   f"it at {len(unsplit) - len(unseen)} point(s) (a fused kernel, such as "
                   "torch's scaled_dot_product_attention, computes the scores, softmax and PV "
                   "in one): there is nothing to split into QKᵀ, softmax and PV")
    written = [p.result.metrics["trace_path"] for p in points
               if p.result.metrics.get("trace_path")]
    if written:  # a name taken by an earlier trace was passed over: say which were written
        blocks.append("trace" + "s" * (len(written) > 1) + " written: " + ", ".join(written))
    return "\n\n".join(out + blocks)
