"""Time attention implementations forward, backward and end to end; one row per point.

One implementation at one shape is one point, an AttentionSpec. `run(spec)` makes random Q,
K, V (and an upstream gradient), checks the implementation once against a float64 reference
(O, and dQ, dK, dV when backward runs; a point that fails is stored as `wrong`, timed but
never a winner), measures the memory in use before backward, then times the requested
passes. The user's own kernels (`yours-torch`, `yours-triton`, one-off
`yours=pkg.module:Fn`) run the same way. FLOPs follow the FlashAttention-2 paper's
convention (Dao 2023, §4.1): 4·B·H·Tq·Tk·d for the forward, halved when causal, and 2.5×
that for the backward.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from cs336sys import yours
from cs336sys.attention import opt_in, registry
from cs336sys.attention.diagnosis import backward_cannot_run, cannot_run, status_of
from cs336sys.attention.point_check import checked
from cs336sys.attention.saved_lse import forward_logsumexps
from cs336sys.experiments import attention_command, attention_rounds, attention_section, preflight
from cs336sys.experiments.attention_rounds import timed_metrics
from cs336sys.experiments.attention_section import TABLE
from cs336sys.experiments.attention_timing import time_passes, warm_blas_and_probe
from cs336sys.measure.compile_backend import compile_backend
from cs336sys.measure.dtypes import PRECISIONS, torch_dtype
from cs336sys.measure.memory import saved_tensor_bytes
from cs336sys.models.flops import attention_forward_flops
from cs336sys.sweep import points
from cs336sys.sweep.declaration import Experiment, launch, metric_table, settings_keys, timing
from cs336sys.sweep.points import NOT_A_SETTING, SpecError, one_value_options, settings_of
from cs336sys.sweep.result import Result
from cs336sys.sweep.rounds import ROUNDS_DONE, checked_first
from cs336sys.yours.implementations import named_impls, sources, uses_triton

DTYPES = tuple(PRECISIONS)
PASSES = ("forward", "backward", "both")
TIMERS = ("loop", "do-bench")
SDPA_BACKENDS = ("auto", "flash", "efficient", "math", "cudnn")
# Implementations whose kernels support only these head dims (the contract).
FLASH_IMPLS = ("flash-torch", "triton")
FLASH_D_RANGE = (16, 128)
TRITON_IMPLS = ("triton", "yours-triton")  # they need CUDA or Triton's interpreter

_BACKEND_NAMES = {
    "FLASH_ATTENTION": "flash",
    "EFFICIENT_ATTENTION": "efficient",
    "MATH": "math",
    "CUDNN_ATTENTION": "cudnn",
    "OVERRIDEABLE": "overrideable",
}


@dataclass(frozen=True)
class AttentionSpec:
    impl: str
    seq: int
    d_head: int
    heads: int | None  # None: 3-D inputs (batch, seq, d)
    batch: int
    precision: str
    causal: bool
    passes: str  # forward | backward | both; the setting is called `pass`
    timer: str  # loop | do-bench
    sdpa_backend: str | None  # only for impl == "sdpa"
    warmup: int
    iters: int
    device: str
    seed: int = 0
    # impl == "triton": its opt-in kernel paths ("default", "tma", "atomic-dq", ...), from
    # the environment (attention/opt_in.py); what actually ran is the triton_kernels metric.
    triton_opt_in: str | None = None
    # each pass samples at least `iters` calls adding up to at least this many seconds
    min_time: float = 0.0
    # the timed calls in this many interleaved rounds (experiments/attention_rounds.py)
    rounds: int = 1
    # whether this run checks against float64: every point's first round
    check_round: bool = field(default=True, metadata=NOT_A_SETTING)
    # the implementation wrapped in torch.compile (--compile), whoever wrote it
    compile: bool = False

    def settings(self) -> dict[str, Any]:
        return {_RENAMED.get(k, k): v for k, v in settings_of(self).items()}

    @property
    def shape(self) -> tuple[int, ...]:
        if self.heads is None:
            return (self.batch, self.seq, self.d_head)
        return (self.batch, self.heads, self.seq, self.d_head)


_RENAMED = {"passes": "pass"}  # `pass` is a Python keyword

# Presets fill in what the user did not give; an explicit option always wins.
PRESETS: dict[str, dict[str, Any]] = {
    # CS336 assignment 2, "pytorch_attention": where naive attention's memory goes. No mask,
    # as the handout has it (a causal one adds a T x T mask and a masked copy of the scores);
    # "Time 100 forward passes": 100 calls in one round, no more for a time budget.
    "pytorch-attention": dict(
        batch=[8], heads=None, d_head=[16, 32, 64, 128], seq=[256, 1024, 4096, 8192, 16384],
        iters=100, passes="both", causal=False, impl=["naive"], rounds=1, min_time=0.0,
    ),
    # CS336 assignment 2, "flash_benchmarking": Triton FlashAttention-2 against naive, timed
    # with triton.testing.do_bench as the handout asks.
    "flash-benchmarking": dict(
        batch=[1], heads=None, causal=True, seq=[2**i for i in range(7, 17)],
        d_head=[16, 32, 64, 128], precision=["bf16", "fp32"], impl=["naive", "triton"],
        passes="both", timer_cuda="do-bench",
    ),
    # The CS336 leaderboard shape: causal, 16 heads of 64, 16k tokens, bf16, fwd+bwd.
    "leaderboard": dict(
        batch=[1], heads=16, d_head=[64], seq=[16384], precision=["bf16"], causal=True,
        passes="both", impl=["triton", "sdpa", "naive"], timer_cuda="do-bench",
    ),
}

DEFAULTS: dict[str, Any] = dict(
    seq=[256, 1024, 4096, 8192, 16384], d_head=[16, 32, 64, 128], batch=[8], heads=None,
    precision=["fp32"], causal=True, passes="both", warmup=10, iters=100, timer="loop",
)
DEFAULT_IMPLS = {"cuda": ["naive", "compiled", "sdpa", "flash-torch", "triton"],
                 "cpu": ["naive", "sdpa", "flash-torch"]}
# On a CPU the GPU sweep would take hours (naive attention at 16k tokens materialises an
# 8 GiB score matrix per batch of 8): shorter sequences, fewer calls, a point in seconds.
CPU_DEFAULTS: dict[str, Any] = dict(
    seq=[128, 256, 512, 1024], d_head=[32, 64], batch=[4], warmup=3, iters=10,
)


@one_value_options
def specs(
    *,
    impl: Iterable[str] | None = None,
    seq: Iterable[Any] | None = None,
    d_head: Iterable[Any] | None = None,
    batch: Iterable[Any] | None = None,
    heads: int | None = None,
    precision: Iterable[str] | None = None,
    causal: bool | None = None,
    passes: str | None = None,
    warmup: int | None = None,
    iters: int | None = None,
    timer: str | None = None,
    min_time: float | None = None,
    rounds: int | None = None,
    sdpa_backend: str = "auto",
    triton_opt_in: Iterable[str] | None = None,
    compile: bool = False,
    preset: str | None = None,
    device: str = "auto",
    seed: int = 0,
) -> list[AttentionSpec]:
    """The points of an attention sweep; an option left None takes the preset's value, then
    the default. SpecError names the first bad option.

    Shared by the commands that run attention points (`attention`, `profile attention`).
    """
    if preset is not None and preset not in PRESETS:
        raise points.unknown("--preset", preset, PRESETS)
    chosen = PRESETS.get(preset, {})

    dev = points.device_choice(device)
    on_cuda = dev.startswith("cuda")
    defaults = DEFAULTS if on_cuda else {**DEFAULTS, **CPU_DEFAULTS}

    def pick(name: str, given: Any) -> Any:
        return given if given is not None else chosen.get(name, defaults.get(name))

    impls = (points.listed(impl, "--attention") or chosen.get("impl")
             or DEFAULT_IMPLS["cuda" if on_cuda else "cpu"])
    if compile and "compiled" in impls:
        if points.listed(impl, "--attention"):
            raise SpecError("--compile: `compiled` is naive attention under torch.compile "
                            "already; list naive to compile it")
        impls = [i for i in impls if i != "compiled"]  # a default list: naive stands for it
    impls = named_impls(impls, "attention", "--attention", registry.names())
    seqs = sorted(points.positive_ints(seq, "--seq") or pick("seq", None))
    d_heads = points.positive_ints(d_head, "--d-head") or pick("d_head", None)
    batches = points.positive_ints(batch, "--batch") or pick("batch", None)
    n_heads = pick("heads", heads)
    points.positive_sizes(heads=n_heads)
    precisions = points.choices(precision, DTYPES, "--precision") or pick("precision", None)
    is_causal = pick("causal", causal)
    which = pick("passes", passes)
    if which not in PASSES:
        raise points.unknown("--pass", which, PASSES)
    n_warmup, n_iters = pick("warmup", warmup), pick("iters", iters)
    points.counts(n_warmup, n_iters, "--iters")
    least_s = points.min_time(pick("min_time", min_time), on_cuda)
    n_rounds = points.rounds(pick("rounds", rounds), on_cuda, n_iters)
    points.check_seed(seed)
    how = timer if timer is not None else chosen.get("timer_cuda" if on_cuda else "timer",
                                                     DEFAULTS["timer"])
    if how not in TIMERS:
        raise points.unknown("--timer", how, TIMERS)
    if how == "do-bench" and not on_cuda:
        raise SpecError("--timer do-bench needs CUDA (triton.testing.do_bench times with CUDA events)")
    if sdpa_backend not in SDPA_BACKENDS:
        raise points.unknown("--sdpa-backend", sdpa_backend, SDPA_BACKENDS)
    for given, only in ((sdpa_backend != "auto", "sdpa"), (triton_opt_in is not None, "triton")):
        if given and only not in impls:  # it would be ignored
            raise SpecError(f"--{'sdpa-backend' if only == 'sdpa' else 'triton-opt-in'} is a "
                            f"setting of {only}, which --attention {','.join(impls)} leaves out")
    if any(i in FLASH_IMPLS for i in impls):
        lo, hi = FLASH_D_RANGE
        for d in d_heads:
            if not lo <= d <= hi:
                raise SpecError(f"--d-head {d}: flash-torch and triton support head dims {lo} to {hi}")
    for name in TRITON_IMPLS:
        if name in impls and not _unimplemented(name):  # that one is a skipped row first
            points.check_triton(on_cuda, f"--attention {name}")
    # triton's opt-in kernel paths: a list sweeps them (a point each); default: the environment's
    opt_ins = points.choices(triton_opt_in, opt_in.CHOICES, "--triton-opt-in",
                             [opt_in.requested()], rule=opt_in.GRAMMAR)
    return [
        AttentionSpec(
            impl=p["impl"], seq=p["seq"], d_head=p["d_head"], heads=n_heads, batch=p["batch"],
            precision=p["precision"], causal=is_causal, passes=which, timer=how,
            sdpa_backend=sdpa_backend if p["impl"] == "sdpa" else None, warmup=n_warmup,
            iters=n_iters, device=dev, seed=seed, triton_opt_in=p["opt_in"], min_time=least_s,
            rounds=n_rounds, compile=compile,
        )
        for p in points.expand({"impl": impls, "precision": precisions, "d_head": d_heads,
                                "batch": batches, "seq": seqs})
        for p in ({**p, "opt_in": o} for o in (opt_ins if p["impl"] == "triton" else [None]))
    ]


def _unimplemented(name: str) -> bool:
    """The user's attention `name` is an adapters getter that still raises
    NotImplementedError (read from the file): its points are `skipped`, whatever the device."""
    adapters, entry = yours.active(), yours.entries("attention").get(name)
    if adapters is None or entry is None or yours.target("attention", name) is not None:
        return False
    return adapters.unfinished(entry)


def flops_forward(spec: AttentionSpec) -> float:
    """QKᵀ and PV of the point (models/flops.attention_forward_flops); causal computes half."""
    return attention_forward_flops(spec.batch, spec.heads or 1, spec.seq, spec.d_head,
                                   spec.causal)


def _impl_context(spec: AttentionSpec):
    """triton: its opt-in kernel paths for this point; sdpa: the backend asked for."""
    if spec.impl == "triton" and spec.triton_opt_in is not None:
        from cs336sys.attention.flash_triton import opted_in

        return opted_in(spec.triton_opt_in)
    if spec.impl != "sdpa" or spec.sdpa_backend in (None, "auto"):
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {
        "flash": SDPBackend.FLASH_ATTENTION,
        "efficient": SDPBackend.EFFICIENT_ATTENTION,
        "math": SDPBackend.MATH,
        # cuDNN's fused attention (torch >= 2.4), the fastest SDPA backend on Hopper
        "cudnn": SDPBackend.CUDNN_ATTENTION,
    }[spec.sdpa_backend]
    return sdpa_kernel(backend)


def sdpa_backend_used(q, k, v, is_causal: bool) -> str | None:
    """The backend SDPA's dispatcher picks for these inputs under the active sdpa_kernel."""
    import torch
    from torch.nn.attention import SDPBackend

    try:
        choice = SDPBackend(torch._fused_sdp_choice(q, k, v, None, 0.0, is_causal))
    except (AttributeError, RuntimeError, TypeError):  # private API: degrade, never fail
        return None
    return _BACKEND_NAMES.get(choice.name, choice.name.lower())


def run(spec: AttentionSpec) -> Result:
    import torch


    device = spec.device
    on_cuda = device.startswith("cuda")

    dtype = torch_dtype(spec.precision)
    backward = spec.passes != "forward"

    # Bytes are counted from what the process held before this point's inputs, as memory's
    # are: cuBLAS's workspace (32 MiB on an H100), allocated by a point's first matmul and
    # kept, made every later point of a sweep read 32 MiB more than the first. It is
    # allocated here, before the base is read.
    probe = warm_blas_and_probe(device, dtype) if on_cuda else None
    gen = torch.Generator(device=device).manual_seed(spec.seed)
    q, k, v, dout = (
        torch.randn(spec.shape, generator=gen, device=device, dtype=dtype) for _ in range(4)
    )
    for t in (q, k, v):
        t.requires_grad_(backward)
    impl_fn = registry.get(spec.impl)
    # compiled here, on the checked pass below, which is also the first warm-up
    fn = torch.compile(impl_fn, backend=compile_backend()) if spec.compile else impl_fn

    def forward():
        return fn(q, k, v, is_causal=spec.causal)

    def fresh_forward():
        q.grad = k.grad = v.grad = None
        return forward()

    metrics: dict[str, Any] = {"interpreted": interpreted(spec.impl), "peak_bytes": None}
    with _impl_context(spec):
        if spec.impl == "sdpa":
            metrics["sdpa_backend_used"] = sdpa_backend_used(q, k, v, spec.causal)
        # One checked pass first: correctness, saved bytes, memory before backward. It also
        # serves as the first warm-up (compilation, autotuning happen here).
        try:
            out, saved = saved_tensor_bytes(forward)
        except Exception as exc:
            why = cannot_run(spec, exc, lambda: fn(q, k, v, is_causal=False),
                             lambda: impl_fn(q, k, v, is_causal=spec.causal),
                             metrics["interpreted"])
            if why is None:
                raise
            return Result("skipped", error=why)
        # L before the backward frees what the forward saved (the course's test reads it so)
        lse = forward_logsumexps(spec, out, impl_fn, q, k, v)
        if backward:
            metrics["saved_bytes"] = saved
            metrics["mem_before_bwd_bytes"] = probe.current() if probe else saved
            try:
                out.backward(dout)
            except Exception as exc:  # a backward refusing is_causal, or not written yet
                why = backward_cannot_run(spec, exc, impl_fn, q, k, v, dout)
                if why is not None:
                    return Result("skipped", error=why)
                raise
        if spec.impl == "triton":  # what the checked pass ran (the opt-ins may fall back)
            from cs336sys.attention.flash_triton import kernels_ran

            metrics["triton_kernels"] = kernels_ran(backward)
        # The float64 reference only after memory was read, so its tensors never count.
        out = out.detach()
        verdict = checked(spec, out, q, k, v, dout if backward else None, metrics, lse, impl_fn)
        del out, lse
        q.grad = k.grad = v.grad = None

        samples, host = time_passes(spec, forward, fresh_forward, dout, (q, k, v))
        if probe:
            # The peak of one more pass, not of the timed ones: do_bench flushes the L2 with
            # a 256 MB buffer of its own between its calls, which is not attention's memory.
            probe.reset_peak()
            if backward:
                fresh_forward().backward(dout)
            else:
                forward()
            torch.cuda.synchronize(device)
            metrics["peak_bytes"] = probe.peak()

    # the work done: a kernel that ignored is_causal computed every score
    fwd = flops_forward(replace(spec, causal=metrics.get("computed_causal", spec.causal)))
    metrics.update(timed_metrics(samples, host, fwd, device))
    if yours.is_yours(spec.impl):
        metrics["code"] = sources(impl_fn)
    status, why = status_of(spec, metrics["interpreted"], verdict)
    return Result(status, metrics=metrics, error=why,
                  samples={**samples, **{k: v for k, v in host.items() if v}})


def interpreted(impl: str) -> bool:
    """Whether the point's kernel ran in Triton's CPU interpreter: ours, or the user's
    Triton code (yours-triton, or a one-off target that is Triton) under TRITON_INTERPRET."""
    if yours.is_yours(impl):
        return os.environ.get("TRITON_INTERPRET") == "1" and uses_triton(impl)
    if impl != "triton":  # (flash_triton imports triton, which not every host has)
        return False
    from cs336sys.attention import flash_triton

    return bool(flash_triton.INTERPRETED)


# -- the declaration ------------------------------------------------------------------------

EXPERIMENT = Experiment(
    kind="attention",
    title="Attention: implementations by sequence length",
    spec=AttentionSpec, specs=specs, run=run,
    settings=settings_keys(AttentionSpec, rename=_RENAMED),
    metrics=(
        *timing("fwd_ms", "forward call"),
        *timing("bwd_ms", "backward call"),
        *timing("e2e_ms", "forward and backward, end to end"),
        *metric_table("""
            mem_before_bwd_bytes  bytes    memory in use before backward (CUDA: allocated since
                                             the point began; CPU: saved for backward)
            saved_bytes           bytes    bytes saved for backward (saved-tensor hooks)
            peak_bytes            bytes    CUDA: peak allocated over one more pass after the
                                             timed ones, since the point began
            flops_fwd             FLOP     forward FLOPs, 4·B·H·T²·d, halved when causal
            flops_bwd             FLOP     backward FLOPs, 2.5 × forward
            flops_e2e             FLOP     forward + backward FLOPs
            tflops_fwd            TFLOP/s  forward FLOPs / median forward time
            tflops_bwd            TFLOP/s  backward FLOPs / median backward time
            tflops_e2e            TFLOP/s  end-to-end FLOPs / median end-to-end time
            max_err               -        max |O - O_ref| against a float64 reference
            max_err_grad          -        max error of dQ, dK, dV against the reference
            check                 -        pass, or fail (the point is `wrong`): every element of O
                                             (and dQ, dK, dV) within check_atol + check_rtol·|ref|
            check_rtol            -        the check's relative tolerance
            check_atol            -        the check's absolute tolerance
            check_detail          -        what a kernel that fails computes instead (non-causal,
                                             no scale, ...), or why it passes against another
                                             reference
            not_compared          -        why this ok point's times are not set beside others:
                                             a PyTorch FlashAttention of yours that ignores
                                             is_causal did non-causal work
            computed_causal       -        whether the kernel applied the causal mask (stored when
                                             it did not, at a causal point)
            code                  -        the user's code measured: its files and their sha256
                                             (JSON)
            host_us               us       host time per call of the main pass (end to end, else
                                             forward), until the call returned, before the sync
            interpreted           -        Triton ran in its CPU interpreter
            sdpa_backend_used     -        the SDPA backend torch's dispatcher chose
            triton_kernels        -        triton: the kernels that ran (pointer or tma, +atomic-dq
                                             for the atomic-dQ backward)
        """),
        ROUNDS_DONE,
        *launch(("fwd", "bwd", "e2e")),
        *preflight.METRICS,
    ),
    estimate=preflight.attention_estimate,
    split=checked_first,
    merge=attention_rounds.merge,
    tables=(TABLE,),
    compare="e2e_ms",
    oom_axis="seq",
    renamed={"fwd_ms": "fwd_ms_mean", "bwd_ms": "bwd_ms_mean", "e2e_ms": "e2e_ms_mean",
             "dtype": "precision"},
    section=attention_section.section,
    draws=True,
    apart=attention_section.APART,
    command=attention_command.COMMAND,
)
