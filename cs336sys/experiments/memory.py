"""Memory of the Transformer LM's forward pass or training step, measured and accounted.

One MemorySpec is one point of a sweep: a ModelSpec (built by `model.specs`, the same
validation and expansion as `cs336sys model`) plus where to write a snapshot. `run` takes
the training step of experiments/training_step.py and:

1. builds the model and measures the bytes it holds after initialisation;
2. runs `warmup` untracked steps (the optimizer's state exists from the first one on) and
   `iters` timed steps, also untracked so that the times carry no measuring overhead;
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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cs336sys.experiments import memory_section, preflight
from cs336sys.experiments import model as model_exp
from cs336sys.experiments.checks import CHECK_METRICS, before_timing, judged, user_code
from cs336sys.experiments.model import ModelSpec
from cs336sys.experiments.training_step import make_model, make_step, run_steps
from cs336sys.measure.memory import CudaProbe, TrackerProbe, held, optimizer_tensors
from cs336sys.measure.paths import why_unwritable
from cs336sys.measure.stats import flatten
from cs336sys.measure.timeline import cuda_memory_history, draw_timeline
from cs336sys.measure.timing import launch_metrics
from cs336sys.models.config import checkpoint_group
from cs336sys.models.saved import model_saved_bytes
from cs336sys.sweep.declaration import (
    HOST_BOUND,
    MODEL_COLUMN,
    AroundPoint,
    Column,
    Experiment,
    Ratio,
    Table,
    column_table,
    launch,
    metric_table,
    setting_columns,
    settings_keys,
    timing,
)
from cs336sys.sweep.points import SpecError, choices, one_value_options
from cs336sys.sweep.result import Result

MODES = ("forward", "train")


@dataclass(frozen=True)
class MemorySpec(AroundPoint):
    point: ModelSpec
    snapshot: str | None = None  # directory for the timeline PNG (and the CUDA pickle)

    @property
    def model(self) -> ModelSpec:
        """`point`, by its name until 0.3 (CHANGELOG); it goes in the next release."""
        return self.point

    def settings(self) -> dict[str, Any]:
        s = self.point.settings()
        for unused in _UNUSED:  # always off here: not part of the point
            s.pop(unused, None)
        s["snapshot"] = self.snapshot
        return s

    def label(self) -> str:
        """A file-name-safe name for this point's snapshot files, with the model's shape: a
        size's name alone gave an overridden dimension, or the other handout's xl, the same
        file as the preset, and a report showed one run's timeline under the other's caption."""
        m = self.point
        shape = f"d{m.d_model}-ff{m.d_ff}-L{m.num_layers}-H{m.num_heads}-V{m.vocab_size}"
        parts = [m.size, shape, f"T{m.seq}", f"B{m.batch}", m.mode, m.precision,
                 m.model or m.attention, m.optimizer, f"ck-{m.checkpoint.replace(':', '')}"]
        return "memory-" + "-".join(parts)


@contextlib.contextmanager
def unused_name(folder: Path, label: str) -> Iterator[str]:
    """`label`, or `label-2`, `-3`, ...: the first name no earlier run's PNG or pickle in
    `folder` has, held for the run by creating its PNG empty, exclusively (O_EXCL), so that
    two runs started together do not take one name (they wrote one file and both rows named
    it); the empty file goes where the run leaves it empty (it failed). A later run of the
    same point (another commit, --label) wrote over the earlier one's timeline, which its
    stored row still named."""
    name, n = label, 1
    while True:
        if not (folder / f"{name}.pickle").exists():
            try:
                (folder / f"{name}.png").open("x").close()
                break
            except FileExistsError:
                pass
        n += 1
        name = f"{label}-{n}"
    held = folder / f"{name}.png"
    try:
        yield name
    finally:
        if held.is_file() and held.stat().st_size == 0:
            held.unlink()


_UNUSED = ("compile", "nvtx", "rounds")


@one_value_options
def specs(*, mode: Iterable[str] | None = None, snapshot: str | Path | None = None,
          **model_options: Any) -> list[MemorySpec]:
    """The points of a memory sweep: `model.specs(**model_options)` (no compile, no NVTX)
    with `mode` forward or train, each writing its timeline into `snapshot` (a directory,
    created if missing) when given. SpecError names the first bad option."""
    modes = choices(mode, MODES, "--mode", default=["train"])
    points = model_exp.specs(mode=modes, compile=False, rounds=1, **model_options)
    where = check_snapshot(snapshot)
    tracked = where is not None or not points[0].device.startswith("cuda")
    if tracked and any(p.attention == "compiled" for p in points):
        # torch.compile runs no compiled code under a TorchDispatchMode: the bytes were naive
        # attention's, to the byte, stored as compiled's
        raise SpecError(
            "--attention compiled: memory counts tensors with a dispatch mode on a CPU and for "
            "--snapshot, under which torch.compile runs the attention uncompiled; measure it on "
            "CUDA without --snapshot (the allocator's peaks), or a compiled block with "
            "`cs336sys memory residuals --compile`")
    return [MemorySpec(p, snapshot=where) for p in points]


def check_snapshot(path: str | Path | None) -> str | None:
    """Refuse a --snapshot directory that cannot be created or written, before any work."""
    if path is None:
        return None
    if not str(path).strip():  # (Path("") is ".": an empty value would mean this folder)
        raise SpecError("--snapshot: empty value; give a folder")
    problem = why_unwritable(path)
    if problem:
        raise SpecError(f"--snapshot {path}: {problem}")
    return str(path)


# -- measuring ------------------------------------------------------------------------------


def moments_bytes(optimizer: str | None, params: list) -> int:
    """AdamW's exp_avg and exp_avg_sq of the parameters that require grad: cs336sys's keep
    them in float32 (models/adamw.state_dtype: 8 bytes an element); torch's, and an AdamW of
    yours made with zeros_like(p), in the parameter's dtype (a bf16 model's: 4)."""
    ours = optimizer is None or optimizer.startswith("adamw")
    return sum(p.numel() * (8 if ours else 2 * p.element_size())
               for p in params if p.requires_grad)


def run(spec: MemorySpec) -> Result:
    import torch

    from cs336sys.measure.live_tensors import LiveTensorTracker
    from cs336sys.measure.saved_tensors import saved_bytes_excluding

    m = spec.point
    device = torch.device(m.device)
    on_cuda = device.type == "cuda"
    config = m.config()
    training = m.mode == "train"
    snapshot = Path(spec.snapshot) if spec.snapshot else None
    # the user's model or kernel and AdamW, before the probe's baseline: nothing of the
    # check's is counted
    checked = before_timing(config, m.optimizer, m.device, m.seed, m.batch)

    # -- 1. the model, measured as it is made ---------------------------------------------
    tracker = None
    if on_cuda:
        probe: Any = CudaProbe(device)
        model = make_model(config, m.device, m.seed)
    else:
        tracker = LiveTensorTracker()
        probe = TrackerProbe(tracker)
        with tracker:
            model = make_model(config, m.device, m.seed)
    init_bytes = probe.current()
    params = list(model.parameters())  # a lazy one is counted once a forward made it
    step = make_step(model, vocab_size=config.vocab_size, batch=m.batch, seq=m.seq,
                     mode=m.mode, precision=m.precision, optimizer=m.optimizer, compile=False,
                     device=m.device, seed=m.seed)
    B, T = m.batch, m.seq
    no_phase = contextlib.nullcontext
    live: dict[str, float] = {}
    parts: dict[str, int] = {}  # by inspection at the two moments: <moment>_<part>

    def moment(when: str) -> Callable[[], None]:
        def read() -> None:
            live[when] = probe.current()
            parts.update({f"{when}_{k}_bytes": v
                          for k, v in held(params, step.optimizer).items()})
        return read

    # -- 2. warm-up and timed steps, untracked --------------------------------------------
    warm, timed, losses = run_steps(step, m.warmup, m.iters)

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

    from cs336sys.models.checkpointing import block_output

    residual: list[torch.dtype] = []
    block = last_block(model, config)
    hook = block.register_forward_hook(  # (a block may return a tuple: Hugging Face's)
        lambda mod, args, out: residual.append(getattr(block_output(out), "dtype", None))) \
        if block is not None else None
    saved: list[int] = []

    def measured_forward() -> torch.Tensor:
        # The logits (B, T, V) die when the loss is returned, as in a training loop that
        # keeps only the loss; log-softmax's output stays if autograd saved it.
        loss, nbytes = saved_bytes_excluding(step.loss, exclude=params)
        saved.append(nbytes)
        return loss

    if snapshot is not None and on_cuda:
        # The PNG needs the tracker's events on CUDA too, next to the allocator's figure.
        tracker = LiveTensorTracker(probe=lambda: probe.current())
    if tracker is not None:
        tracker.adopt([*params, *model.buffers(), *optimizer_tensors(step.optimizer), step.x,
                       step.y])
        if step.scaler is not None:
            tracker.adopt(t for t in vars(step.scaler).values() if isinstance(t, torch.Tensor))
        if snapshot is not None:
            tracker.start_recording()
    png = pickle = None
    with contextlib.ExitStack() as hold:
        if snapshot is not None:
            snapshot.mkdir(parents=True, exist_ok=True)
            name = hold.enter_context(unused_name(snapshot, spec.label()))
            pickle = snapshot / f"{name}.pickle" if on_cuda else None
        with cuda_memory_history(pickle), tracker if tracker is not None else no_phase():
            step(phase, forward=measured_forward,
                 before_optimizer=moment("before_opt"), after_optimizer=moment("after_opt"))
        if hook is not None:
            hook.remove()
        live["loss"] = float(step.last_loss)
        peak = max(peaks.values())
        if snapshot is not None and tracker is not None:
            title = (f"{m.size} T={T} B={B} {m.mode} {m.precision} checkpoint={m.checkpoint}"
                     f"{memory_section.whose(m.settings())} on {m.device}: live tensor bytes "
                     "in one step")
            png = draw_timeline(tracker.events, tracker.phases, snapshot / f"{name}.png", title)

    # -- metrics -----------------------------------------------------------------------------
    metrics: dict[str, Any] = {}
    for name in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms"):
        metrics.update(flatten(name, timed.get(name, [])))
    # None: a model whose blocks are not found, or whose last block's output is no tensor
    residual_dtype = next((dtype for dtype in residual if dtype is not None), None)
    if not training:
        act_analytic: int | None = 0  # nothing is saved without grad
    elif m.precision == "fp32" and m.attention == "naive":
        act_analytic = model_saved_bytes(config, B, T)
    else:  # mixed precision and other kernels keep other tensors: not modelled
        act_analytic = None
    n_params = sum(p.numel() for p in params)
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
        **parts,
        saved_bytes=saved[0],
        # the analytic breakdown
        params=n_params,
        # in the parameters' own dtype: a model of yours in bf16 holds 2P (4P read 2x)
        param_bytes=sum(p.numel() * p.element_size() for p in params),
        grad_bytes=sum(p.numel() * p.element_size() for p in params if p.requires_grad)
        if training else 0,
        optim_bytes=moments_bytes(m.optimizer, params) if training else 0,
        act_bytes_analytic=act_analytic,
        residual_bytes=(B * T * config.d_model * residual_dtype.itemsize
                        if residual_dtype is not None else None),
        residual_dtype=str(residual_dtype).removeprefix("torch.") if residual_dtype else None,
        checkpoint_group=checkpoint_group(m.checkpoint, m.num_layers),
        lowest_peak=None,  # set by mark_lowest once every checkpoint setting of the group ran
        loss=live.get("loss"),
        loss_first=losses[0] if losses else live.get("loss"),
        # absolute: a report run from another folder than a relative --snapshot's finds them;
        # not resolved, so that the path still ends with the folder as given (a symlink)
        snapshot_png=str(png.absolute()) if png else None,
        snapshot_pickle=str(pickle.absolute()) if pickle else None,
    )
    metrics.update(launch_metrics(timed, ("fwd", "bwd", "opt"), m.device))
    if checked is not None:
        metrics["code"] = user_code(config, model, step.optimizer)
    return judged(checked, metrics, losses, samples={**timed, "warmup": warm})


def last_block(model: Any, config: Any) -> Any:
    """The module whose output is the residual stream the blocks hand to the final norm: the
    last block (found as --checkpoint finds them, or at --blocks); None when they cannot be
    found (the residual's dtype is then not recorded)."""
    from cs336sys.models.checkpointing import blocks_of

    try:
        return blocks_of(model, config.num_layers, config.blocks)[-1]
    except ValueError:
        return None


# -- the checkpointing trade-off ----------------------------------------------------------------


def checkpoint_group_of(spec: MemorySpec) -> tuple:
    """Points that differ only in --checkpoint form a group."""
    return tuple(sorted((k, str(v)) for k, v in spec.settings().items() if k != "checkpoint"))


def mark_lowest(group: list[tuple[MemorySpec, Result]]) -> None:
    """Once a group has run, flag the ok points with the lowest peak (`lowest_peak` true, the
    others false; left null where fewer than two points ran ok). Ties are all marked."""
    ok = [r for _, r in group if r.status == "ok"]
    if len(ok) < 2:  # nothing to compare with
        return
    lowest = min(r.metrics["peak_bytes"] for r in ok)
    for r in ok:
        r.metrics["lowest_peak"] = r.metrics["peak_bytes"] == lowest


# -- the declaration ------------------------------------------------------------------------


def _VS_NONE(metric: str) -> Ratio:  # reads as a constant in the table
    """`metric` of a point against the same point with --checkpoint none."""
    return Ratio(lambda r: r.get(metric), {"checkpoint": "none"}, ("checkpoint",), speedup=False)


TABLE = Table(
    "Peak memory of each point, measured beside its accounting",
    (
        *setting_columns("size seq batch mode precision ckpt=checkpoint optimizer"),
        MODEL_COLUMN,
        Column("attention", "attention", setting=True),
        *column_table("""
            peak MiB                    peak_bytes          mib
            fwd peak MiB                fwd_peak_bytes      mib
            bwd peak MiB                bwd_peak_bytes      mib
            opt peak MiB                opt_peak_bytes      mib
            saved MiB                   saved_bytes         mib
            activations MiB (analytic)  act_bytes_analytic  mib
            residual MiB                residual_bytes      mib       optional
            step ms                     step_ms             mean_std
        """),
        # What checkpointing changes is the activations: the backward peak and the saved
        # bytes, against no checkpointing. The whole step's peak is often the optimizer's,
        # the same for every policy, so it is not what is compared.
        Column("bwd peak vs none", ratio=_VS_NONE("bwd_peak_bytes"),
               note="'vs none': the backward peak and the saved bytes against the same point "
               "without checkpointing (0.50x: half); the optimizer's peak, the same for every "
               "policy, stands apart in its own column."),
        Column("saved vs none", ratio=_VS_NONE("saved_bytes")),
        HOST_BOUND,
    ),
    note="Peaks are those of one measured step after the timed ones; 'saved' is what autograd "
    "keeps for backward.",
)

EXPERIMENT = Experiment(
    kind="memory",
    title="Memory: peaks and activation checkpointing",
    spec=MemorySpec,
    run=run,
    settings=(*settings_keys(ModelSpec, drop=_UNUSED), "snapshot"),
    metrics=(
        *metric_table("""
            peak_source          -      cuda_allocator or live_tensors: where the bytes come from
            init_bytes           bytes  live after the model was built
            peak_bytes           bytes  peak of the measured step
            peak_reserved_bytes  bytes  CUDA: peak reserved by the caching allocator
            fwd_peak_bytes       bytes  peak of the forward phase
            bwd_peak_bytes       bytes  peak of the backward phase
            opt_peak_bytes       bytes  peak of the optimizer phase
            before_opt_bytes     bytes  live just before optimizer.step()
            after_opt_bytes      bytes  live just after optimizer.step()
            before_opt_params_bytes     bytes  held in parameters just before optimizer.step(),
                                                 by inspection
            before_opt_grads_bytes      bytes  held in gradients just before optimizer.step()
            before_opt_opt_state_bytes  bytes  held in the optimizer's state just before its step
            after_opt_params_bytes      bytes  held in parameters just after optimizer.step()
            after_opt_grads_bytes       bytes  held in gradients just after optimizer.step()
            after_opt_opt_state_bytes   bytes  held in the optimizer's state just after its step
            saved_bytes          bytes  saved for backward, parameters excluded
            params               -      parameters of the model
            param_bytes          bytes  analytic: the parameters in their dtype (4P in fp32)
            grad_bytes           bytes  analytic: the same of those that require grad, when training
            optim_bytes          bytes  analytic: AdamW's two moments of those: 8P in cs336sys's (fp32), twice the parameters' bytes in torch's and yours
            act_bytes_analytic   bytes  analytic activations (fp32, naive attention)
            residual_bytes       bytes  the residual stream B·T·d, what a checkpointed group keeps
            residual_dtype       -      dtype of the residual stream
            checkpoint_group     -      blocks per checkpointed group (K)
            lowest_peak          -      lowest peak among the points that differ in checkpoint
        """),
        *timing("fwd_ms", "forward pass with the loss"),
        *timing("bwd_ms", "backward pass"),
        *timing("opt_ms", "optimizer step and zero_grad"),
        *timing("step_ms", "whole step"),
        *metric_table("""
            loss             -  loss of the measured step
            loss_first       -  loss of the first step
            snapshot_png     -  the timeline PNG written with --snapshot
            snapshot_pickle  -  CUDA: the memory_viz pickle written with --snapshot
        """),
        *CHECK_METRICS,
        *launch(("fwd", "bwd", "opt")),
        *preflight.METRICS,
    ),
    estimate=lambda spec: preflight.model_estimate(spec.point),
    tables=(TABLE,),
    compare="peak_bytes",
    section=memory_section.section,
    draws=True,
    group_by=checkpoint_group_of,
    across=mark_lowest,
)
