"""Memory of the Transformer LM's forward pass or training step, measured and accounted.

One MemorySpec is one point of a sweep: a ModelSpec (built by the CLI's `model_specs`, the
same validation and expansion as `cs336sys model`) plus where to write a snapshot. `run`:

1. builds the model and measures the bytes it holds after initialisation;
2. runs `warmup` untracked steps (the optimizer's state exists from the first one on) and
   `steps` timed steps, also untracked so that the times carry no measuring overhead;
3. runs one measured step, with peaks per phase (forward, backward, optimizer), the bytes
   live just before and just after `optimizer.step()`, and the bytes saved for backward
   (saved-tensor hooks, parameters excluded).

Where the bytes come from: on CUDA the caching allocator (`memory_allocated`,
`max_memory_allocated` after `reset_peak_memory_stats`, `max_memory_reserved`), minus what
was allocated before the point began; elsewhere `LiveTensorTracker`, which counts live
tensor storages the same way (not RSS). The analytic breakdown beside them follows the
accounting of Rajbhandari et al. 2020 (ZeRO, §3.1): fp32 parameters 4P bytes, gradients
4P, Adam's two moments 8P; plus the activations saved for backward, counted tensor by
tensor in `block_saved_bytes` for fp32 and naive attention, and the residual-stream tensor
B·T·d·bytes that each checkpointed group keeps.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cs336sys.bench.result import Result
from cs336sys.bench.stats import flatten
from cs336sys.experiments.model import ModelSpec
from cs336sys.models.config import ModelConfig, checkpoint_group

EXPERIMENT = "memory"
MODES = ("forward", "train")


@dataclass(frozen=True)
class MemorySpec:
    model: ModelSpec
    snapshot: str | None = None  # directory for the timeline PNG (and the CUDA pickle)

    def settings(self) -> dict[str, Any]:
        s = self.model.settings()
        for unused in ("compile", "nvtx"):  # always off here: not part of the point
            s.pop(unused, None)
        s["snapshot"] = self.snapshot
        return s

    def label(self) -> str:
        """A file-name-safe name for this point's snapshot files."""
        m = self.model
        parts = [m.size, f"T{m.context_length}", f"B{m.batch_size}", m.mode, m.precision,
                 m.attention, m.optimizer, f"ck-{m.checkpoint.replace(':', '')}"]  # fmt: skip
        return "memory-" + "-".join(parts)


# -- analytic accounting --------------------------------------------------------------------


def block_saved_bytes(batch: int, seq: int, d_model: int, d_ff: int, num_heads: int) -> int:
    """Bytes one fp32 TransformerBlock with naive causal attention saves for backward.

    Counted from cs336sys/models/transformer.py, each storage once, parameters excluded:
      - each RMSNorm keeps its input x, the normalised x/rms (both B·T·d) and rms (B·T);
      - the q, k, v projections share their (normed) input, B·T·d; the rotated q and k and
        v are kept by the two attention matmuls, 3·B·T·d; the output projection keeps its
        input, B·T·d; the FFN's w1 and w3 share their input, B·T·d. With the two norms'
        2·2·B·T·d that is 10·B·T·d;
      - SwiGLU keeps w1 x (for SiLU), SiLU(w1 x) and w3 x (for the product) and the product
        (for w2): 4·B·T·d_ff;
      - softmax keeps its output P, B·H·T² (the P·V matmul keeps the same storage);
      - RoPE keeps its cos and sin rows for q and for k: 4 tables of T·D/2 = 2·T·d_head;
      - the causal mask, T² booleans (1 byte each).
    """
    elements = (
        10 * batch * seq * d_model
        + 4 * batch * seq * d_ff
        + batch * num_heads * seq * seq
        + 2 * batch * seq  # the two norms' rms
        + 2 * seq * (d_model // num_heads)  # RoPE cos/sin rows
    )
    return 4 * elements + seq * seq


def model_saved_bytes(config: ModelConfig, batch: int, seq: int) -> int:
    """Bytes the fp32 LM with naive attention saves for backward, cross-entropy included.

    Without checkpointing: every block (`block_saved_bytes`). With groups of K blocks
    checkpointed (non-reentrant), only each group's input (the residual stream, B·T·d) and
    the positions (T int64) are saved; the group is recomputed in backward. Outside the
    blocks: the token ids (B·T int64, for the embedding), the final norm (2·B·T·d + B·T),
    the LM head's input (B·T·d), the log-softmax output (B·T·V), the targets (B·T int64)
    and nll_loss's total weight (one fp32 scalar).
    """
    B, T, d, V = batch, seq, config.d_model, config.vocab_size
    group = checkpoint_group(config.checkpoint, config.num_layers)
    if group is None:
        blocks = config.num_layers * block_saved_bytes(B, T, d, config.d_ff, config.num_heads)
    else:
        n_groups = -(-config.num_layers // group)  # ceil
        blocks = n_groups * 4 * B * T * d + 8 * T
    outside = 8 * B * T + 4 * (2 * B * T * d + B * T) + 4 * B * T * d + 4 * B * T * V + 8 * B * T
    return blocks + outside + 4  # + nll_loss's total_weight, one fp32 scalar


# -- measuring ------------------------------------------------------------------------------


def run(spec: MemorySpec) -> Result:
    import torch
    import torch.nn.functional as F

    from cs336sys.bench.device import synchronize
    from cs336sys.bench.live_tensors import LiveTensorTracker
    from cs336sys.bench.memory import CudaProbe, TrackerProbe, optimizer_tensors
    from cs336sys.bench.saved_tensors import saved_bytes_excluding
    from cs336sys.bench.timeline import cuda_memory_history, draw_timeline
    from cs336sys.experiments.model import _make_optimizer
    from cs336sys.models.transformer import TransformerLM

    m = spec.model
    torch.manual_seed(m.seed)
    device = torch.device(m.device)
    on_cuda = device.type == "cuda"
    config = m.config()
    training = m.mode == "train"
    snapshot = Path(spec.snapshot) if spec.snapshot else None

    # -- 1. the model, measured as it is made ---------------------------------------------
    tracker = None
    if on_cuda:
        probe: Any = CudaProbe(device)
        with device:
            model = TransformerLM(config)
    else:
        tracker = LiveTensorTracker()
        probe = TrackerProbe(tracker)
        with tracker:
            model = TransformerLM(config)
    init_bytes = probe.current()
    params = list(model.parameters())
    n_params = sum(p.numel() for p in params)
    optimizer = _make_optimizer(m.optimizer, params) if training else None

    B, T = m.batch_size, m.context_length
    x = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)
    y = torch.randint(0, config.vocab_size, (B, T), device=device)  # (B, T)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(m.precision)
    scaler = torch.amp.GradScaler(device.type) if m.precision == "fp16" and training else None

    def forward_loss() -> torch.Tensor:
        # The logits (B, T, V) die when this returns, as in a training loop that keeps only
        # the loss; log-softmax's output stays if autograd saved it.
        grad_mode = contextlib.nullcontext() if training else torch.no_grad()
        autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
        with grad_mode, autocast:
            logits = model(x)  # (B, T, V)
            return F.cross_entropy(logits.flatten(0, 1), y.flatten())

    no_phase = contextlib.nullcontext
    live: dict[str, float] = {}

    def step(phase=lambda label: no_phase(), forward=forward_loss) -> dict[str, float]:
        """One step; `phase(label)` wraps each phase, `live` gets the optimizer readings."""
        t0 = time.perf_counter()
        with phase("forward"):
            loss = forward()
            synchronize(m.device)
        t1 = time.perf_counter()
        times = {"fwd_ms": (t1 - t0) * 1e3}
        if training:
            with phase("backward"):
                (scaler.scale(loss) if scaler else loss).backward()
                synchronize(m.device)
            t2 = time.perf_counter()
            with phase("optimizer"):
                live["before_opt"] = probe.current()
                if scaler:
                    scaler.step(optimizer)
                    scaler.update()
                else:
                    optimizer.step()
                synchronize(m.device)
                live["after_opt"] = probe.current()
                optimizer.zero_grad(set_to_none=True)
            t3 = time.perf_counter()
            times.update(bwd_ms=(t2 - t1) * 1e3, opt_ms=(t3 - t2) * 1e3)
        times["step_ms"] = (time.perf_counter() - t0) * 1e3
        live["loss"] = float(loss.detach())
        return times

    # -- 2. warm-up and timed steps, untracked --------------------------------------------
    warm: dict[str, list[float]] = {}
    timed: dict[str, list[float]] = {}
    for i in range(m.warmup + m.steps):
        for k, v in step().items():
            (warm if i < m.warmup else timed).setdefault(k, []).append(v)

    # -- 3. the measured step ----------------------------------------------------------------
    peaks: dict[str, int] = {}
    reserved: list[int] = []

    @contextlib.contextmanager
    def phase(label: str):
        # A peak per phase; the step's peak is the largest (a reset forgets earlier peaks).
        probe.reset_peak()
        with tracker.phase(label) if tracker is not None else no_phase():
            yield
        peaks[label] = probe.peak()
        if (r := probe.peak_reserved()) is not None:
            reserved.append(r)

    residual: list[torch.dtype] = []
    hook = model.ln_final.register_forward_pre_hook(
        lambda mod, args: residual.append(args[0].dtype)
    )
    saved: list[int] = []

    def measured_forward() -> torch.Tensor:
        loss, nbytes = saved_bytes_excluding(forward_loss, exclude=params)
        saved.append(nbytes)
        return loss

    if snapshot is not None and on_cuda:
        # The PNG needs the tracker's events on CUDA too, next to the allocator's figure.
        tracker = LiveTensorTracker(probe=lambda: probe.current())
    if tracker is not None:
        tracker.adopt([*params, *model.buffers(), *optimizer_tensors(optimizer), x, y])
        if scaler is not None:
            tracker.adopt(t for t in vars(scaler).values() if isinstance(t, torch.Tensor))
        if snapshot is not None:
            tracker.start_recording()
    pickle = snapshot / f"{spec.label()}.pickle" if snapshot is not None and on_cuda else None
    if snapshot is not None:
        snapshot.mkdir(parents=True, exist_ok=True)
    with cuda_memory_history(pickle), tracker if tracker is not None else no_phase():
        step(phase, forward=measured_forward)
    hook.remove()
    peak = max(peaks.values())

    png = None
    if snapshot is not None and tracker is not None:
        title = (f"{m.size} T={T} B={B} {m.mode} {m.precision} checkpoint={m.checkpoint} "
                 f"on {m.device}: live tensor bytes in one step")  # fmt: skip
        png = draw_timeline(tracker.events, tracker.phases, snapshot / f"{spec.label()}.png", title)

    # -- metrics -----------------------------------------------------------------------------
    metrics: dict[str, Any] = {}
    for name in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
        metrics.update(flatten(name, timed.get(name, [])))
    residual_dtype = residual[0] if residual else torch.float32
    if not training:
        act_analytic: int | None = 0  # nothing is saved without grad
    elif m.precision == "fp32" and m.attention == "naive":
        act_analytic = model_saved_bytes(config, B, T)
    else:  # mixed precision and other kernels keep other tensors: not modelled
        act_analytic = None
    metrics.update(
        peak_source="cuda_allocator" if on_cuda else "live_tensors",
        init_bytes=init_bytes,
        peak_bytes=peak,
        peak_reserved_bytes=max(reserved) if reserved else None,
        fwd_peak_bytes=peaks.get("forward"),
        bwd_peak_bytes=peaks.get("backward"),
        opt_peak_bytes=peaks.get("optimizer"),
        before_opt_bytes=live.get("before_opt") if training else None,
        after_opt_bytes=live.get("after_opt") if training else None,
        saved_bytes=saved[0],
        # the analytic breakdown
        params=n_params,
        param_bytes=4 * n_params,
        grad_bytes=4 * n_params if training else 0,
        optim_bytes=8 * n_params if training else 0,  # AdamW: exp_avg and exp_avg_sq, fp32
        act_bytes_analytic=act_analytic,
        residual_bytes=B * T * config.d_model * residual_dtype.itemsize,
        residual_dtype=str(residual_dtype).removeprefix("torch."),
        checkpoint_group=checkpoint_group(m.checkpoint, m.num_layers),
        lowest_peak=None,  # set by the CLI once every checkpoint setting of the group ran
        loss=live.get("loss"),
        snapshot_png=str(png) if png else None,
        snapshot_pickle=str(pickle) if pickle else None,
    )
    return Result("ok", metrics=metrics, samples={**timed, "warmup": warm})
