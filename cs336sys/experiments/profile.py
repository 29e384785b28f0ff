"""Profiling: where the measured steps of a model or attention point spend their time.

One ProfileSpec wraps one point of `cs336sys model` (a ModelSpec) or `cs336sys attention`
(an AttentionSpec). `run(spec)` builds the point the way those experiments do (a model point
is the training step of experiments/training_step.py), runs the warm-up steps *outside* the profiler,
then the measured steps inside `torch.profiler`, each phase (forward, backward, optimizer)
in a range of its own that ends with a device sync.
profile_events.py attributes every op (CPU: self CPU time) or kernel (CUDA: device time) to
its phase and ranks them; the rows go to the `kernel_stats` table, linked to the run.

For naive attention the QKᵀ, softmax and PV parts of the forward pass are set against their
FLOPs. Convention (per call, B batch, H heads, T queries = keys, d head dim):

    QKᵀ:     2·B·H·T²·d   the full (T, T) matrix, as the naive code computes it even when
                          causal; its range also holds the 1/√d scaling and the causal mask
    softmax: 5·B·H·T²     per score: max, subtract, exp, sum, divide (element-wise work)
    PV:      2·B·H·T²·d

In a model step the parts are summed over the layers. The user's model (`--model`) gets the
same split where a module of its classes has the course's `scaled_dot_product_attention`: each
call runs in a range of its own, and its ops are split at the softmax (the matmuls before it
are QKᵀ, its other ops the scale and mask, the matmuls after it PV). With `nvtx=True` torch.profiler is
not used (Nsight Systems cannot share CUPTI with it): the phases become NVTX ranges and the
measured steps sit inside one range, MEASURED_RANGE, which `nsys --capture-range=nvtx`
captures, so warm-up never enters the report.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cs336sys import yours
from cs336sys.attention import registry
from cs336sys.attention.diagnosis import NOT_JUDGED, status_of, untested
from cs336sys.attention.point_check import checked as attention_checked
from cs336sys.attention.saved_lse import forward_logsumexps
from cs336sys.experiments.attention import _RENAMED as _ATTENTION_RENAMED
from cs336sys.experiments.attention import AttentionSpec, _impl_context, interpreted
from cs336sys.experiments.checks import CHECK_METRICS, before_timing, judged, user_code
from cs336sys.experiments.model import ModelSpec
from cs336sys.experiments.model_command import ATTENTION_FUNCTION
from cs336sys.experiments.profile_events import (
    USER_ATTENTION,
    USER_SOFTMAX,
    matmul_shares,
    ranges,
    summarize,
)
from cs336sys.experiments.profile_section import label, section
from cs336sys.experiments.training_step import make_model, make_step, timed_phase
from cs336sys.measure.check import Verdict
from cs336sys.measure.dtypes import torch_dtype
from cs336sys.measure.landing import staged
from cs336sys.measure.progress import step_done
from cs336sys.measure.stats import flatten
from cs336sys.sweep.declaration import (
    AroundPoint,
    Column,
    Experiment,
    Metric,
    Table,
    column_table,
    metric_table,
    settings_keys,
    timing,
)
from cs336sys.sweep.points import SpecError, one_value_options
from cs336sys.sweep.result import Result, Unfinished, first_line, is_oom
from cs336sys.yours.implementations import sources

TARGETS = ("model", "attention")
SHORT = {"forward": "fwd", "backward": "bwd", "optimizer": "opt", "step": "step"}
# Settings of the profiled point that say nothing about the profile: the model's own NVTX
# switch (`profiler` says what ran), the attention benchmark's timer (unused here) and the
# rounds of either (the profiler records its steps in one round).
_NOT_SETTINGS = ("nvtx", "timer", "rounds")


@dataclass(frozen=True)
class ProfileSpec(AroundPoint):
    target: str  # model | attention
    point: ModelSpec | AttentionSpec
    top: int  # names kept per phase in kernel_stats; the rest become one (other) row
    nvtx: bool = False  # NVTX ranges for nsys instead of torch.profiler
    trace: str | None = None  # Chrome trace file to write (an output, not a setting)

    def settings(self) -> dict[str, Any]:
        base = {k: v for k, v in self.point.settings().items() if k not in _NOT_SETTINGS}
        return {
            "target": self.target,
            "profiler": "nvtx" if self.nvtx else "torch",
            "top": self.top,
            **base,
        }

    @property
    def steps(self) -> tuple[int, int]:
        """(warm-up, measured) steps of the point."""
        return self.point.warmup, self.point.iters


@one_value_options
def specs(target: str, points: Iterable[ModelSpec | AttentionSpec], *, top: int = 10,
          nvtx: bool = False, trace: str | None = None) -> list[ProfileSpec]:
    """Profile each of `points` (from model.specs or attention.specs). With several points,
    the trace `stem.json` becomes `stem-1.json`, `stem-2.json`, ..."""
    from pathlib import Path

    if target not in TARGETS:
        raise SpecError(f"target must be one of {TARGETS}, not {target!r}")
    if top <= 0:
        raise SpecError(f"--top must be positive, got {top}")
    points = list(points)
    takes = ModelSpec if target == "model" else AttentionSpec
    for p in points:  # a model point profiled as attention ran neither as asked
        if not isinstance(p, takes):
            raise SpecError(f"profile {target!r} takes points of {target}.specs(), "
                            f"not {type(p).__name__}")

    def trace_path(index: int) -> str | None:
        if trace is None:
            return None
        if len(points) == 1:
            return str(trace)
        t = Path(trace)
        return str(t.with_name(f"{t.stem}-{index}{t.suffix}"))

    return [ProfileSpec(target, p, top, nvtx=nvtx, trace=trace_path(i))
            for i, p in enumerate(points, start=1)]


@dataclass
class _Steps:
    """A built point: `one_step(phase)` runs one step, returns {phase}_ms times."""

    one_step: Callable[[Callable], dict[str, float]]
    context: contextlib.AbstractContextManager = field(default_factory=contextlib.nullcontext)
    part_flops: dict[str, float] = field(default_factory=dict)  # per step, naive attention
    losses: list = field(default_factory=list)  # model steps: each step's loss
    code: dict = field(default_factory=dict)  # model steps: the user's code (checks.user_code)
    checked: Verdict | None = None  # model steps: the user's model or kernel and AdamW


def run(spec: ProfileSpec) -> Result:
    from cs336sys.measure.nvtx import measured, nvtx_enabled, nvtx_range, profiler_ranges

    on_cuda = spec.point.device.startswith("cuda")
    n_warmup, n_steps = spec.steps
    built = _model(spec.point) if spec.target == "model" else _attention(spec.point)
    warm: dict[str, list[float]] = {}
    timed: dict[str, list[float]] = {}

    done = [0]

    def collect(target: dict[str, list[float]]) -> None:
        for name, ms in built.one_step(nvtx_range).items():
            target.setdefault(name, []).append(ms)
        done[0] += 1
        step_done(done[0], n_warmup + n_steps)

    prof = None
    try:
        with built.context, nvtx_enabled(spec.nvtx):
            for _ in range(n_warmup):
                collect(warm)
            if spec.nvtx:
                with measured():
                    for _ in range(n_steps):
                        collect(timed)
            else:
                from torch.profiler import ProfilerActivity, profile

                activities = [ProfilerActivity.CPU]
                if on_cuda:
                    activities.append(ProfilerActivity.CUDA)
                with profiler_ranges(True), profile(activities=activities) as prof:
                    for _ in range(n_steps):
                        collect(timed)
    except RuntimeError as exc:
        skipped = _unsupported_sdpa(spec, exc)
        if skipped is None:
            raise
        return Result("skipped", error=skipped)

    metrics: dict[str, Any] = {
        "time_basis": "cuda" if on_cuda else "cpu",
        "profiled_steps": n_steps,
    }
    if isinstance(spec.point, AttentionSpec):  # Triton's CPU interpreter: not the kernel's time
        metrics["interpreted"] = interpreted(spec.point.impl)
    for name in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
        if name in timed:
            metrics.update(flatten(name, timed[name]))
    kernels: list[dict[str, Any]] = []
    if prof is not None:
        events = prof.events()
        kernels, totals, parts = summarize(events, on_cuda, spec.top)
        for name, ms in totals.items():
            metrics[f"{SHORT[name]}_profiled_ms_mean"] = ms / n_steps
        for name, share in matmul_shares(events, on_cuda).items():
            metrics[f"{SHORT[name]}_matmul_share"] = share
        if getattr(spec.point, "model", None):  # the calls of yours the split looked into
            metrics["attention_calls"] = len(ranges(events).get(USER_ATTENTION, ())) / n_steps
        for key, ms in parts.items():
            per_step = ms / n_steps
            flops = built.part_flops.get(key)
            metrics[f"{key}_ms_mean"] = per_step
            if key != "mask":  # the scaling and masking: element-wise, no FLOPs counted
                metrics[f"{key}_flops"] = flops
                metrics[f"{key}_gflops"] = (
                    flops / (per_step / 1e3) / 1e9 if flops and per_step else None
                )
        if spec.trace:
            with staged() as stage:  # a Ctrl-C while it is written leaves no half trace
                prof.export_chrome_trace(str(stage.path(spec.trace)))
            # absolute: a relative path read from the store names no file from elsewhere
            metrics["trace_path"] = os.path.abspath(spec.trace)
    if built.losses:
        losses = [float(v) for v in built.losses]
        metrics.update(loss_first=losses[0], loss_last=losses[-1])
    samples: dict[str, Any] = dict(timed)
    samples["warmup"] = warm
    if built.checked is not None:
        metrics["code"] = built.code
    return judged(built.checked, metrics, built.losses, samples=samples,
                  tables={"kernel_stats": kernels})


def attention_part_flops(batch: int, heads: int, seq: int, d_head: int) -> dict[str, float]:
    """FLOPs of one naive-attention call, by part (convention in the module docstring)."""
    scores = batch * heads * seq * seq
    return {"qk": 2.0 * scores * d_head, "softmax": 5.0 * scores, "pv": 2.0 * scores * d_head}


def _model(spec: ModelSpec) -> _Steps:
    """The training step as every model experiment takes it (experiments/training_step.py)."""
    config = spec.config()
    checked = before_timing(config, spec.optimizer, spec.device, spec.seed, spec.batch)
    step = make_step(make_model(config, spec.device, spec.seed), vocab_size=config.vocab_size,
                     batch=spec.batch, seq=spec.seq, mode=spec.mode,
                     precision=spec.precision, optimizer=spec.optimizer, compile=spec.compile,
                     device=spec.device, seed=spec.seed)
    losses: list = []

    def one_step(phase: Callable) -> dict[str, float]:
        times = step(phase)
        losses.append(step.last_loss)
        return times

    parts: dict[str, float] = {}
    context: contextlib.AbstractContextManager = contextlib.nullcontext()
    if config.model is not None and not spec.compile:
        context = user_attention_marked(step.model)
    if (spec.attention == "naive" or config.model is not None) and not spec.compile:
        per_call = attention_part_flops(spec.batch, config.num_heads, spec.seq,
                                        config.d_head)
        parts = {k: v * config.num_layers for k, v in per_call.items()}
    return _Steps(one_step, context=context, part_flops=parts, losses=losses, checked=checked,
                  code=None if checked is None else user_code(config, step.model, step.optimizer))


@contextlib.contextmanager
def user_attention_marked(model: Any) -> Iterator[None]:
    """Inside, each call of the attention function of the user's model (ATTENTION_FUNCTION
    in the module of its class or of a submodule's class: a subclass in a module of its own,
    an attention class in another file) runs in the range USER_ATTENTION, and each call of
    the `softmax` it calls by that name in USER_SOFTMAX, which profile_events splits into
    QKᵀ, softmax and PV; all are put back after. Without that function, no split."""
    import functools

    from cs336sys.measure.nvtx import nvtx_range

    def marked(fn: Any, name: str) -> Any:
        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            with nvtx_range(name):
                return fn(*args, **kwargs)

        return call

    modules = {type(m).__module__: sys.modules.get(type(m).__module__) for m in model.modules()}
    put_back: list[tuple[Any, str, Any]] = []  # (namespace, name, original)
    softmaxes: dict[int, dict] = {}  # the names each function looks up when it runs
    for module in modules.values():
        original = getattr(module, ATTENTION_FUNCTION, None)
        if callable(original):
            put_back.append((vars(module), ATTENTION_FUNCTION, original))
            softmaxes.setdefault(id(names := getattr(original, "__globals__", {})), names)
    for names in softmaxes.values():
        if callable(names.get("softmax")):
            put_back.append((names, "softmax", names["softmax"]))
    for namespace, name, original in put_back:
        namespace[name] = marked(original, USER_SOFTMAX if name == "softmax" else USER_ATTENTION)
    try:
        yield
    finally:
        for namespace, name, original in reversed(put_back):
            namespace[name] = original


def _attention(spec: AttentionSpec) -> _Steps:
    """An attention call (and its backward) as experiments/attention.py times it."""
    import torch

    backward = spec.passes != "forward"
    gen = torch.Generator(device=spec.device).manual_seed(spec.seed)
    q, k, v, dout = (
        torch.randn(spec.shape, generator=gen, device=spec.device, dtype=torch_dtype(spec.precision))
        for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(backward)
    fn = registry.get(spec.impl)

    def one_step(phase: Callable) -> dict[str, float]:
        times: dict[str, float] = {}
        q.grad = k.grad = v.grad = None
        with timed_phase(spec.device, "fwd", times, phase):
            out = fn(q, k, v, is_causal=spec.causal)  # (..., T, d)
        if backward:
            with timed_phase(spec.device, "bwd", times, phase):
                out.backward(dout)
        # the phases' wall times (timed_phase also records each one's host time, *_host_ms,
        # which summed in made the step twice its phases)
        times["step_ms"] = sum(times.get(f"{p}_ms", 0.0) for p in ("fwd", "bwd"))
        return times

    parts = attention_part_flops(spec.batch, spec.heads or 1, spec.seq, spec.d_head)
    checked = None
    if yours.is_yours(spec.impl):
        with _impl_context(spec):
            checked = _attention_checked(spec, fn, q, k, v, dout if backward else None)
    return _Steps(one_step, context=_impl_context(spec), part_flops=parts, checked=checked,
                  code=sources(fn) if checked is not None else {})


def _attention_checked(spec: AttentionSpec, fn: Any, q: Any, k: Any, v: Any,
                       dout: Any | None) -> Verdict:
    """The user's kernel checked as `attention` checks it (attention/point_check.py), on one
    pass before the profiled ones: a kernel without the 1/√d scale was profiled and stored
    ok. Where `attention` does not judge a failure (a size the handout never tests, bf16 in
    Triton's interpreter), the point is skipped as there (Unfinished), raising or wrong."""
    try:
        out = fn(q, k, v, is_causal=spec.causal)
        lse = forward_logsumexps(spec, out, fn, q, k, v)
        if dout is not None:
            out.backward(dout)
    except Exception as exc:
        if untested(spec) and not is_oom(exc):
            raise Unfinished(NOT_JUDGED.format(untested(spec)) + f"; {spec.impl} raised "
                             f"{type(exc).__name__}: {first_line(exc)}") from exc
        raise
    metrics: dict[str, Any] = {}
    verdict = attention_checked(spec, out.detach(), q, k, v, dout, metrics, lse, fn)
    q.grad = k.grad = v.grad = None
    status, why = status_of(spec, interpreted(spec.impl), verdict)
    if status == "skipped":
        raise Unfinished(why or "not judged")
    return Verdict(status == "ok", metrics, why)


def _unsupported_sdpa(spec: ProfileSpec, exc: RuntimeError) -> str | None:
    """The reason to store a point as skipped, where an SDPA backend cannot take the inputs."""
    message = first_line(exc)
    point = spec.point
    if isinstance(point, AttentionSpec) and point.impl == "sdpa":
        if "No available kernel" in message or "No viable backend" in message:
            return f"sdpa backend {point.sdpa_backend!r} cannot run these inputs: {message}"
    return None


# -- the declaration ------------------------------------------------------------------------


_SETTINGS = tuple(dict.fromkeys((
    "target", "profiler", "top",
    *settings_keys(ModelSpec, drop=_NOT_SETTINGS),
    *settings_keys(AttentionSpec, drop=_NOT_SETTINGS, rename=_ATTENTION_RENAMED),
)))

TABLE = Table(
    "Profiled points: wall time per phase, and the summed op or kernel time in it",
    (
        Column("point", cell=label, setting=True, covers=(
            "target", "size", "seq", "mode", "precision", "impl", "d_head")),
        # what the point's label leaves out and its figures (FLOPs, times) depend on: named
        # above the table where every row shares it, a column where they differ
        Column("batch", "batch", setting=True),
        Column("heads", "heads", setting=True, optional=True),
        Column("causal", "causal", "yes_no", setting=True, optional=True),
        Column("ckpt", "checkpoint", setting=True, optional=True),
        Column("basis", "time_basis"),
        *column_table("""
            fwd ms        fwd_ms                mean_std
            bwd ms        bwd_ms                mean_std
            opt ms        opt_ms                mean_std
            fwd prof. ms  fwd_profiled_ms_mean  num
            bwd prof. ms  bwd_profiled_ms_mean  num
            opt prof. ms  opt_profiled_ms_mean  num
            fwd matmul    fwd_matmul_share      pct       optional
            bwd matmul    bwd_matmul_share      pct       optional
            step matmul   step_matmul_share     pct       optional
        """),
    ),
    note="basis cuda: kernel time on the GPU; cpu: op self time. Phase times are taken under "
    "the profiler: compare speed with the model and attention experiments, not with these.",
)

_RENAMED_PROFILE = {
    **{f"{p}_ms": f"{p}_ms_mean" for p in ("fwd", "bwd", "opt", "step")},
    **{f"{p}_profiled_ms": f"{p}_profiled_ms_mean" for p in ("fwd", "bwd", "opt")},
    **{f"{p}_ms": f"{p}_ms_mean" for p in ("qk", "softmax", "pv")},
}

EXPERIMENT = Experiment(
    kind="profile",
    title="Profile: top kernels or ops",
    spec=ProfileSpec,
    run=run,
    settings=_SETTINGS,
    metrics=(
        Metric("time_basis", "", "cuda: kernel time on the GPU; cpu: op self time"),
        Metric("profiled_steps", "", "steps under the profiler"),
        *timing("fwd_ms", "forward phase under the profiler, wall"),
        *timing("bwd_ms", "backward phase under the profiler, wall"),
        *timing("opt_ms", "optimizer phase under the profiler, wall"),
        *timing("step_ms", "whole step under the profiler, wall"),
        *(Metric(f"{p}_profiled_ms_mean", "ms", f"summed op/kernel time of the {p} phase, "
                 "mean per step") for p in ("fwd", "bwd", "opt")),
        *(Metric(f"{p}_matmul_share", "", f"share of the {p} phase's op/kernel time in matrix "
                 "multiplications (profile_events.MATMUL)") for p in ("fwd", "bwd", "opt")),
        Metric("step_matmul_share", "", "share of the whole step's op/kernel time, every phase, "
               "in matrix multiplications"),
        Metric("interpreted", "", "attention: a Triton kernel run by Triton's CPU interpreter "
               "(TRITON_INTERPRET=1), whose times are the emulator's, not the kernel's"),
        Metric("attention_calls", "", "your model (--model): calls of its attention function "
               "per profiled step, whose ops the attention's parts split at their softmax"),
        *(m for part in ("qk", "softmax", "pv") for m in (
            Metric(f"{part}_ms_mean", "ms", f"naive attention's {part}, per step (QKᵀ, PV: "
                   "their matrix multiplications)"),
            Metric(f"{part}_flops", "FLOP", f"naive attention's {part} FLOPs per step"),
            Metric(f"{part}_gflops", "GFLOP/s", f"naive attention's {part}, achieved"),
        )),
        Metric("mask_ms_mean", "ms", "naive attention's scaling and masking of the scores "
               "(the ops before the softmax other than QKᵀ's matmul), per step"),
        *metric_table("""
            trace_path  -  the Chrome trace written with --trace, its absolute path
            loss_first  -  model: loss of the first step
            loss_last   -  model: loss of the last profiled step
        """),
        *CHECK_METRICS,
    ),
    tables=(TABLE,),
    compare="step_ms",
    renamed=_RENAMED_PROFILE,
    section=section,
)
