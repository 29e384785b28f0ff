"""The training step of the Transformer LM, once, for every experiment that runs the model.

`cs336sys model` times it, `profile model` profiles it, `memory` measures its bytes and `ddp`
runs it on every rank behind a data-parallel wrapper: all four take the step built here, so
they measure the same thing. A step is

    forward    logits = model(x) under autocast (bf16/fp16), then the loss
    backward   loss.backward(), the loss scaled first for fp16 (Micikevicius et al. 2018)
    comm       finish_gradient_synchronization(), for the DDP wrappers only
    optimizer  optimizer.step() (through the gradient scaler for fp16), then zero_grad

with `mode` forward (inference, under no_grad), forward-backward (no optimizer) or train.
Each phase ends with a device sync inside its range, so its time is the device's and its
kernels fall inside it (docs/methodology.md, "Timing").

The loss convention (docs/experiments/model.md): the logits are cast to float32 before the
cross-entropy, mean over the B·T tokens, as the CS336 reference training loop does; under
autocast the cross-entropy of 16-bit logits would otherwise be computed on a 16-bit
log-softmax. In fp32 the cast is a no-op and costs nothing.

Weights come from `torch.manual_seed(seed)` and the tokens from a generator of their own
(seed + 1, on the CPU, then moved), so the same seed gives the same model and data on any
device and in every experiment.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from cs336sys import yours
from cs336sys.measure.compile_backend import compile_backend
from cs336sys.measure.device import device_name, peak_tflops, synchronize, tf32_matmuls
from cs336sys.measure.dtypes import autocast_dtype
from cs336sys.measure.progress import step_done
from cs336sys.measure.stats import flatten
from cs336sys.models.config import checkpoint_groups
from cs336sys.models.flops import attention_matmul_flops, step_flops
from cs336sys.sweep import rounds
from cs336sys.sweep.declaration import Metric
from cs336sys.yours.implementations import (
    build_model,
    call_adapter,
    load_target,
    named_impl,
    uses_triton,
)

MODES = ("forward", "forward-backward", "train")
# ours: the reference, multi-tensor, one Triton kernel (models/adamw_fused.py); torch's:
# its default (foreach on CUDA, a loop on CPU) and fused=True, the production baseline.
OPTIMIZERS = ("adamw", "adamw-foreach", "adamw-triton", "torch-adamw", "torch-adamw-fused")
LR, WEIGHT_DECAY = 1e-4, 0.01
# betas and eps as torch.optim.AdamW's defaults; given too, as assignment 1's test_adamw builds
# the user's class (lr, weight_decay, betas, eps), so a class with no defaults of its own works
BETAS, EPS = (0.9, 0.999), 1e-8
PHASES = {"fwd": "forward", "bwd": "backward", "comm": "comm", "opt": "optimizer"}


def cross_entropy(logits: Any, targets: Any, vocab: int | None = None) -> Any:
    """The loss of every step: float32 logits (B, T, V) against targets (B, T), mean. A
    model that returns something else (a tuple of logits and a loss, as Hugging Face's do),
    or, where `vocab` is given (the check before timing), logits of another vocabulary, is
    told what is needed, not met with a tensor method missing or `Target 3302 is out of
    bounds` (on CUDA a device-side assert that ends the process's later points too)."""
    import torch
    import torch.nn.functional as F

    if not isinstance(logits, torch.Tensor):
        what = (f"a {type(logits).__name__} of {len(logits)}"
                if isinstance(logits, (tuple, list, dict)) else f"a {type(logits).__name__}")
        raise TypeError(f"the model's forward returned {what}, not the logits: cs336sys needs "
                        f"forward(x) to return the logits (batch, seq, vocab) alone")
    if logits.dim() != 3 or tuple(logits.shape[:2]) != tuple(targets.shape):
        raise ValueError(f"the model's forward returned a tensor of shape {tuple(logits.shape)}; "
                         f"cs336sys needs the logits (batch, seq, vocab) for tokens "
                         f"{tuple(targets.shape)}")
    if vocab is not None and logits.shape[-1] != vocab:
        raise ValueError(f"the model's forward returned logits of shape {tuple(logits.shape)}; "
                         f"cs336sys needs (batch, seq, vocab) with the vocabulary of "
                         f"{vocab:,} tokens it was built with (--vocab-size)")
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


def make_model(config: Any, device: str, seed: int) -> Any:
    """TransformerLM(config), or the user's model when `config.model` names one, with the
    weights of `seed`, initialised on `device` (a 10B model would take minutes on the host)."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        if config.model is not None:
            from cs336sys.models.checkpointing import checkpoint_blocks

            model = build_model(config)
            groups = checkpoint_groups(config.checkpoint, config.num_layers)
            if groups is None:
                return model
            return checkpoint_blocks(model, config.num_layers, groups, config.blocks)
        from cs336sys.models.transformer import TransformerLM

        return TransformerLM(config)


def adamw_kwargs(cls: Any) -> dict[str, Any]:
    """What an AdamW class is built with: lr 1e-4, weight decay 0.01, and betas and eps where
    its constructor takes them by those names (a student's that names them beta1 and beta2,
    with defaults, is built without)."""
    import inspect

    kwargs = {"lr": LR, "weight_decay": WEIGHT_DECAY}
    try:
        params = inspect.signature(cls).parameters
    except (TypeError, ValueError):
        return kwargs
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    extra = {"betas": BETAS, "eps": EPS}
    return kwargs | {k: v for k, v in extra.items() if takes_any or k in params}


def make_optimizer(name: str, params: Any) -> Any:
    """One of OPTIMIZERS over `params` (adamw_kwargs): ours (cs336sys.models AdamW and its
    fused versions), torch.optim.AdamW, default or fused=True, or the user's (`--optimizer
    yours=package.module:AdamW`, or `yours-adamw`: the class assignment 1's adapters getter
    `get_adamw_cls()` returns)."""
    if name == "torch-adamw-fused":
        import torch

        return torch.optim.AdamW(params, **adamw_kwargs(torch.optim.AdamW), fused=True)
    if name not in OPTIMIZERS and not yours.is_yours(name):
        raise ValueError(f"optimizer must be one of {OPTIMIZERS}, not {name!r}")
    cls = optimizer_class(name)
    return cls(params, **adamw_kwargs(cls))


# What an optimizer class is named by (optimizer_class), beside the user's: `step` and `ddp`
# take one with --optimizer.
OPTIMIZER_CLASSES = ("adamw", "torch-adamw")


def optimizer_option(value: str | None) -> str:
    """An --optimizer of one class (`step`'s baseline, `ddp`'s on every rank): adamw when not
    given; SpecError for a name that is neither one of OPTIMIZER_CLASSES nor the user's that
    can be found."""
    given = "adamw" if value is None else value.strip()
    return named_impl(given, "adamw", "--optimizer", list(OPTIMIZER_CLASSES))


def optimizer_class(name: str) -> Any:
    """The class of `name`, for make_optimizer and for what builds its own optimizers from one
    (the sharded ones): ours and its fused versions, torch's (its default for the device) or
    the user's."""
    if yours.is_yours(name):
        where = yours.target("adamw", name)
        return load_target(where) if where else call_adapter(yours.entries("adamw")[name], 0)
    if name == "torch-adamw":
        import torch

        return torch.optim.AdamW
    from cs336sys.models.adamw import AdamW
    from cs336sys.models.adamw_fused import AdamWForeach, AdamWTriton

    ours = {"adamw": AdamW, "adamw-foreach": AdamWForeach, "adamw-triton": AdamWTriton}
    if name in ours:
        return ours[name]
    raise ValueError(f"optimizer class must be one of {tuple(ours)}, torch-adamw or yours, "
                     f"not {name!r}")


def interpreted(spec: Any) -> bool:
    """Whether a Triton kernel of the point ran in Triton's CPU interpreter
    (TRITON_INTERPRET=1): the fused AdamW, the fused cross-entropy (step's), our
    FlashAttention or the user's Triton attention (model's and step's). Its time is the
    emulator's, not the kernel's (fused-ce read 0.10x, flash 0.0068x of `none`, "slower")."""
    import os

    attention = getattr(spec, "attention", None)
    return os.environ.get("TRITON_INTERPRET") == "1" and (
        spec.optimizer == "adamw-triton" or getattr(spec, "loss", None) == "fused-triton"
        or attention == "triton" or (attention is not None and uses_triton(attention)))


def make_batch(seed: int, batch: int, seq: int, vocab_size: int) -> tuple:
    """Random tokens x and next-token targets y, (B, T) each, on the CPU: the same for a
    seed whatever the device (DDP ranks slice one global batch drawn this way)."""
    import torch

    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randint(0, vocab_size, (batch, seq), generator=g)  # (B, T)
    y = torch.randint(0, vocab_size, (batch, seq), generator=g)  # (B, T)
    return x, y


@dataclass
class Step:
    """A model ready to step. Call it to run one step; it returns each phase's milliseconds
    ({fwd,bwd,comm,opt,step}_ms, for the phases this step has) and each phase's host time
    ({fwd,...}_host_ms, until its calls returned)."""

    model: Any  # whose gradients zero_grad clears when there is no optimizer
    forward_module: Any  # what the forward calls: the model, compiled, or wrapped (DDP, FSDP)
    x: Any  # (B, T) tokens on the device
    y: Any  # (B, T) targets on the device
    mode: str  # forward | forward-backward | train
    device: str
    amp_dtype: Any = None  # torch.autocast's dtype; None: no autocast
    optimizer: Any = None  # train mode only
    scaler: Any = None  # fp16 loss scaling
    finish: Callable[[], None] | None = None  # between backward and optimizer (DDP)
    start: Callable[[], None] | None = None  # before the forward, in the step's time (DDP)
    # after the optimizer's zero_grad, the model's gradients cleared too: a user's sharded
    # optimizer may clear its own shard's alone, which the course's test lets pass
    clear_grads: bool = False
    last_loss: Any = None  # the last step's loss, detached (read it when convenient)
    logits_dtype: str | None = None  # of the first step's logits, as autocast left them
    _device_type: str = field(init=False, default="cpu")

    def __post_init__(self) -> None:
        import torch

        self._device_type = torch.device(self.device).type

    def loss(self) -> Any:
        """The forward phase's work: logits under autocast, then the float32 loss."""
        import torch

        grad = contextlib.nullcontext() if self.mode != "forward" else torch.no_grad()
        amp = self.amp_dtype
        with grad, torch.autocast(self._device_type, dtype=amp, enabled=amp is not None):
            logits = self.forward_module(self.x)  # (B, T, V)
            if self.logits_dtype is None:
                self.logits_dtype = str(logits.dtype).removeprefix("torch.")
            return cross_entropy(logits, self.y)

    def __call__(
        self,
        phase: Callable[[str], contextlib.AbstractContextManager] | None = None,
        forward: Callable[[], Any] | None = None,
        before_optimizer: Callable[[], None] = lambda: None,
        after_optimizer: Callable[[], None] = lambda: None,
    ) -> dict[str, float]:
        """One step. `phase(name)` wraps each phase (forward, backward, comm, optimizer):
        NVTX ranges by default, profiler ranges or memory peaks for the experiments that
        need them; `forward` replaces `loss` (to count what it saves); the optimizer hooks
        run directly before and after `optimizer.step()`."""
        if phase is None:
            from cs336sys.measure.nvtx import nvtx_range as phase
        times: dict[str, float] = {}
        t0 = time.perf_counter()
        if self.start is not None:
            self.start()
        with self._timed("fwd", times, phase):
            loss = (forward or self.loss)()
        self.last_loss = loss.detach()
        if self.mode != "forward":
            with self._timed("bwd", times, phase):
                (self.scaler.scale(loss) if self.scaler is not None else loss).backward()
            if self.finish is not None:
                with self._timed("comm", times, phase):
                    self.finish()
            if self.optimizer is not None:
                with self._timed("opt", times, phase):
                    before_optimizer()
                    if self.scaler is not None:
                        self.scaler.step(self.optimizer)
                        self.scaler.update()
                    else:
                        self.optimizer.step()
                    after_optimizer()
                    # as the course's tests call it: a sharded optimizer of the user's may
                    # define zero_grad(self) alone (None is torch's default since 2.0)
                    self.optimizer.zero_grad()
            if self.clear_grads:
                self.model.zero_grad(set_to_none=True)
        times["step_ms"] = (time.perf_counter() - t0) * 1e3
        if self.mode == "forward-backward":
            self.model.zero_grad(set_to_none=True)  # untimed: this mode has no optimizer
        return times

    def _timed(self, short: str, times: dict[str, float], phase: Callable):
        return timed_phase(self.device, short, times, phase)


@contextlib.contextmanager
def timed_phase(device: str, short: str, times: dict[str, float], phase: Callable) -> Iterator[None]:
    """Time one phase into `times[f"{short}_ms"]`, inside `phase(name)`, ending with a device
    sync inside the range so that the phase's kernels finish within it; the host time until
    the phase's calls returned, before the sync, goes into `times[f"{short}_host_ms"]`
    (measure/timing.py, launch-bound)."""
    t0 = time.perf_counter()
    with phase(PHASES[short]):
        yield
        host = time.perf_counter()
        synchronize(device)
    times[f"{short}_ms"] = (time.perf_counter() - t0) * 1e3
    times[f"{short}_host_ms"] = (host - t0) * 1e3


def make_step(
    model: Any,
    *,
    vocab_size: int,
    batch: int,
    seq: int,
    mode: str,
    precision: str,
    optimizer: str,
    compile: bool,
    device: str,
    seed: int,
) -> Step:
    """The step of `model` (made by make_model) for one point of a model sweep."""
    import torch

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
    x, y = make_batch(seed, batch, seq, vocab_size)
    training = mode != "forward"
    return Step(
        model=model,
        forward_module=torch.compile(model, backend=compile_backend()) if compile else model,
        x=x.to(device),
        y=y.to(device),
        mode=mode,
        device=device,
        amp_dtype=autocast_dtype(precision),
        optimizer=make_optimizer(optimizer, model.parameters()) if mode == "train" else None,
        # fp16 needs loss scaling so small gradients do not flush to zero.
        scaler=torch.amp.GradScaler(torch.device(device).type)
        if precision == "fp16" and training
        else None,
    )


def run_steps(step: Step, warmup: int, iters: int, **call: Any) -> tuple[dict, dict, list]:
    """`warmup` untimed and `iters` timed calls of `step`: (warm-up samples, timed samples,
    every step's loss), samples as {phase_ms: [ms, ...]}."""
    from cs336sys.measure.nvtx import measured

    warm: dict[str, list[float]] = {}
    timed: dict[str, list[float]] = {}
    losses = []

    def one(i: int, into: dict[str, list[float]]) -> None:
        for k, v in step(**call).items():
            into.setdefault(k, []).append(v)
        losses.append(step.last_loss)  # read back later: no extra sync per step
        step_done(i + 1, warmup + iters)

    for i in range(warmup):
        one(i, warm)
    with measured():  # what --nsys records: the timed steps only
        for i in range(warmup, warmup + iters):
            one(i, timed)
    return warm, timed, [float(v) for v in losses]


# -- what a step's time means: throughput, shared by `model` and `step` ---------------------


def throughput_metrics(stat: str) -> tuple:
    """The declarations of `throughput`'s metrics, from the `stat` ("mean" or "median") of
    the step time they divide by."""
    return (
        Metric("params", "", "parameters of the model"),
        Metric("tokens_per_step", "tokens", "batch × seq"),
        Metric("tokens_per_s", "tokens/s", f"tokens per step / {stat} step time"),
        Metric("flops_per_step", "FLOP", "model FLOPs of one step (PaLM convention)"),
        Metric("tflops", "TFLOP/s", f"achieved: FLOPs per step / {stat} step time"),
        Metric("peak_tflops", "TFLOP/s", "one GPU's dense peak for this precision"),
        Metric("mfu", "", "model FLOPs utilisation: tflops / (peak_tflops × the ranks, where several)"),
        Metric("flops_basis", "", "formula (models/flops.py), or counted (FlopCounterMode) for "
               "a user's model whose matmuls differ from the formula's, or formula, uncounted "
               "where a user's model could not be counted"),
    )


def throughput(model: Any, config: Any, batch: int, seq: int, mode: str,
               step_ms: float, device: str, precision: str) -> dict[str, Any]:
    """params, tokens per step and per second, model FLOPs, achieved TFLOP/s and MFU (where
    the GPU's peak is known) of a step of `mode` that took `step_ms`. The FLOPs are the
    formula's (models/flops.py), for the user's model too when it is the same architecture;
    where its counted matmuls differ from the formula, the count (flops_basis says which)."""
    tokens = batch * seq
    flops = step_flops(config, batch, seq, mode)
    basis = "formula"
    if config.model is not None:
        counted = counted_forward_flops(config, batch, seq, model)
        formula = step_flops(config, batch, seq, "forward")
        # FlopCounterMode sees no kernel outside torch: a count that is the formula less its
        # attention is our architecture with its attention in Triton, which the formula has
        dense = formula - attention_matmul_flops(config, batch, seq)
        if counted is None:
            basis = "formula, uncounted"
        elif abs(counted - formula) > 0.01 * formula and abs(counted - dense) > 0.01 * dense:
            flops, basis = (counted if mode == "forward" else 3 * counted), "counted"
    counts = dict(params=sum(p.numel() for p in model.parameters()), tokens_per_step=tokens,
                  flops_per_step=flops, peak_tflops=peak_tflops(device_name(device), precision,
                                                                tf32=tf32_matmuls()),
                  flops_basis=basis)
    return {**counts, **rates(counts, step_ms)}


def rates(counts: dict[str, Any], step_ms: float) -> dict[str, Any]:
    """tokens_per_s, tflops and mfu of a step of `counts`' tokens and FLOPs (throughput's)
    that took `step_ms`: a point timed in rounds recomputes them from all its rounds' samples."""
    step_s = step_ms / 1e3
    tflops = counts["flops_per_step"] / step_s / 1e12
    return dict(tokens_per_s=counts["tokens_per_step"] / step_s, tflops=tflops,
                mfu=tflops / counts["peak_tflops"] if counts.get("peak_tflops") else None)


def merged_rounds(results: list[Any], phases: tuple[str, ...], stat: str,
                  peaks: tuple[str, ...]) -> Any:
    """A training-step point from its rounds (model's and step's merge): every round's timed
    samples in the order taken and the statistics of `phases` over them, the rates from the
    merged `stat` of the step time, the first round's other metrics and samples (its warm-up,
    check and build), the last round's last loss, the highest of each of `peaks`, and
    `wrong` where a round was; each round's median step in `round_medians`."""
    samples = rounds.joined(results)
    metrics = dict(results[0].metrics)
    for phase in phases:
        metrics.update(flatten(phase, samples.get(phase, [])))
    metrics.update(rates(metrics, metrics[f"step_ms_{stat}"]),
                   loss_last=results[-1].metrics["loss_last"])
    for peak in peaks:
        metrics[peak] = rounds.highest(results, peak)
    status = "wrong" if any(r.status == "wrong" for r in results) else "ok"
    return rounds.merged(results, status, metrics, {
        **results[0].samples, **samples,
        "round_medians": [r.metrics["step_ms_median"] for r in results]})


def counted_forward_flops(config: Any, batch: int, seq: int, model: Any = None) -> int | None:
    """Matmul FLOPs of one forward of the model `config` describes, counted by torch's
    FlopCounterMode on a copy built on the meta device (no memory, no compute); where the
    model cannot run there (an assert on its input's values), on `model` itself, one
    sequence, times `batch` (every matmul's FLOPs are linear in the batch); None when
    neither runs."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    try:
        meta = make_model(config, "meta", 0)
        tokens = torch.zeros(batch, seq, dtype=torch.long, device="meta")
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            meta(tokens)
        return int(counter.get_total_flops())
    except Exception:  # the user's code may not run on meta tensors
        pass
    try:
        device = next(model.parameters()).device
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(torch.zeros(1, seq, dtype=torch.long, device=device))  # (1, T)
        return batch * int(counter.get_total_flops())
    except Exception:  # nor on its own device: the formula stands, said uncounted
        return None
