"""Before a point of the Transformer LM runs: the memory it needs and roughly how long it
takes, from the analytic models the project already has.

Memory follows ZeRO's accounting (Rajbhandari et al. 2020, §3.1) as experiments/memory.py
does: the weights (4 bytes a parameter, 2 in bf16), when gradients are taken the gradients
(as many) and the activations saved for backward (`models/saved.model_saved_bytes`: fp32, every
tensor counted, checkpointed groups keeping their inputs; without the T x T softmax of
naive attention where a fused kernel runs), when training AdamW's two fp32 moments (8
bytes a parameter); without gradients, the largest transient buffers of one block and the
logits. Plus MARGIN for what the accounting leaves out (workspaces, the allocator's
rounding). benchmarks/preflight_estimate.py sets the estimate against the peak measured on a
CPU (1.06x to 1.24x on the CI box); tests/test_preflight.py holds it within 1x to 1.5x.

Time: the point's FLOPs (models/flops.py, 3x the forward for a training step) over the
device's rate, measured once per process with a matmul (a CPU) or its dense peak (a GPU),
for every warm-up and timed step. Rough, and only said where a sweep would run long.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from cs336sys import yours
from cs336sys.attention.diagnosis import NOT_JUDGED, untested_dims
from cs336sys.measure.device import peak_tflops
from cs336sys.measure.units import format_duration
from cs336sys.models.config import checkpoint_groups, param_count
from cs336sys.models.flops import attention_forward_flops, step_flops
from cs336sys.models.saved import block_saved_bytes, model_saved_bytes
from cs336sys.sweep.declaration import metric_table
from cs336sys.yours.implementations import uses_triton

# Workspaces, the allocator's rounding, the optimizer's temporaries: on top of the accounting.
MARGIN = 1.10
# Attention kernels that never hold the T x T scores (FlashAttention-2 and the user's).
FUSED = ("flash-torch", "triton", "yours-torch", "yours-triton")
# SDPA's backends that hold them: only the math one. Flash, memory-efficient and cuDNN keep
# O(T) statistics, and `auto` picks one of them wherever it can (on CUDA, and the CPU's flash
# kernel); counting the scores for them skipped SDPA at seq 65536 on an H200 as needing
# ~423 GiB (reports/nvidia-h200). Where `auto` does fall back to math, an out-of-memory
# point is stored as such.
SDPA_MATERIALISING = ("math",)


@dataclass(frozen=True)
class Estimate:
    """What a point needs: peak bytes (and their parts, for the message) and seconds."""

    bytes: int
    parts: str  # "weights 7.4 GiB, gradients 7.4 GiB, AdamW 15 GiB, activations 2.1 GiB"
    seconds: float | None = None
    not_started: str = ""  # why the point is not started (too long interpreted, unsafe)

    def refusal(self, spec: Any) -> str | None:
        """Why the point `spec` would not fit on its device now, or run far too long (stored
        with it as skipped), or None. On CPU ranks share the host's memory, which the whole
        model's estimate bounds from below whatever a wrapper shards (the leaderboard's 8B
        on a laptop); on CUDA each rank has a GPU that holds a sharded wrapper's share,
        which the estimate does not give, so ranked CUDA points are not refused on memory."""
        if self.not_started:
            return self.not_started
        device = str(spec.device)
        if device.startswith("cuda") and getattr(spec, "world_size", 1) > 1:
            return None
        free = available_bytes(device)
        if free is None or self.bytes <= free:
            return None
        where = "this GPU has" if device.startswith("cuda") else "this machine has"
        return (f"needs ~{_gib(self.bytes)} ({self.parts}, +{round(100 * (MARGIN - 1))}%), "
                f"{where} {_gib(free)} free; --force runs it")

    def metrics(self) -> dict[str, Any]:
        return {"est_peak_bytes": self.bytes, "est_s": self.seconds}


# The estimate, stored beside what was measured (every experiment that declares `estimate`).
METRICS = metric_table("""
    est_peak_bytes  bytes  the peak memory estimated before the point ran (experiments/preflight.py)
    est_s           s      the time estimated before it ran: its FLOPs over the device's rate
""")


def _gib(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{n / 2**10:.3g} KiB"


def _fused(attention: str | None) -> bool:
    """Whether a model's attention holds no T x T scores: the fused kernels, and SDPA, whose
    `auto` picks a backend that keeps O(T) statistics (SDPA_MATERIALISING): the step's
    baseline, whose 8B points were skipped as needing ~245 GiB on an H200."""
    return (attention or "naive") in (*FUSED, "sdpa")


# The share of the fp32 count of saved activations a 16-bit autocast step holds on CUDA: its
# matmuls save bf16 inputs. The H200's xl step (reports/nvidia-h200, bf16, B4 T512, 48 layers
# of d 1600) peaked at 38,263 MiB, 7.6 GiB over its 29.8 GiB of weights, gradients and AdamW,
# where the fp32 count gives 15.4 GiB: the whole count made the default step (8 layers of the
# 8B at context 8192) need 104 GiB and be skipped on an 80 GB H100. On a CPU the count stays
# whole (a bf16 tiny step there peaked within 6 % of fp32's), as there the kernel's OOM
# killer, not an OutOfMemoryError, ends a point the estimate lets through.
HALF_ACTIVATIONS = 0.5


def model_estimate(spec: Any) -> Estimate:
    """The estimate of a ModelShape point (model, memory's model, step): its `batch`,
    `mode` (step: train), `precision` (16-bit on CUDA: HALF_ACTIVATIONS), `attention`,
    `checkpoint` and `param_dtype`."""

    config = spec.config()
    B, T = spec.batch, spec.seq
    mode = getattr(spec, "mode", "train")
    p = param_count(config)
    weight = 2 if getattr(spec, "param_dtype", "fp32") == "bf16" else 4
    parts = {"weights": weight * p}
    if mode in ("forward-backward", "train"):
        parts["gradients"] = weight * p
        acts = model_saved_bytes(config, B, T)
        # the T x T scores a fused kernel never holds, in every block's saved bytes
        scores = (4 * B * config.num_heads * T * T + T * T
                  if _fused(getattr(spec, "attention", None)) else 0)
        groups = checkpoint_groups(config.checkpoint, config.num_layers)
        if groups is None:
            acts -= config.num_layers * scores
        else:
            # checkpointing saves each group's input; the group backward recomputes holds its
            # blocks' saved tensors again (`memory --size tiny --seq 256 --batch 8 --checkpoint
            # every:4 --device cpu` peaked at 764 MiB where the group inputs alone gave 485)
            acts += max(groups) * (block_saved_bytes(B, T, config.d_model, config.d_ff,
                                                     config.num_heads) - scores)
        if str(spec.device).startswith("cuda") and getattr(spec, "precision", "fp32") != "fp32":
            acts = int(acts * HALF_ACTIVATIONS)
        parts["activations"] = acts
    else:  # no grad: one block's largest buffers at a time, then the logits
        scores = 0 if _fused(getattr(spec, "attention", None)) else config.num_heads * T * T
        block = 4 * B * (scores + 3 * T * config.d_ff + 4 * T * config.d_model)
        parts["activations"] = block + 2 * 4 * B * T * config.vocab_size
    if mode == "train":
        parts["AdamW"] = 8 * p
    total = int(MARGIN * sum(parts.values()))
    attention = getattr(spec, "attention", None) or "naive"
    dims = untested_dims(SimpleNamespace(seq=T, d_head=config.d_head))
    # the user's Triton kernel in cs336sys's model, at a size the handout never tests it
    # with: not started, as attention does not start it (`model --attention yours-triton
    # --seq 48` aborted the process: "free(): invalid size", nothing stored)
    not_started = (_unmasked_there(dims) if config.model is None and yours.is_yours(attention)
                   and _triton(attention) and dims else "")
    return Estimate(total, ", ".join(f"{k} {_gib(v)}" for k, v in parts.items()),
                    _seconds(spec, config, mode), not_started)


def _unmasked_there(dims: str) -> str:
    """Why the user's Triton kernel is not started at `dims` (`seq 48`)."""
    return (NOT_JUDGED.format(dims) + ", and without masks a kernel reads and writes past its "
            "tensors there (in Triton's CPU interpreter that corrupts this process's memory; "
            "on a GPU it may end its CUDA context); --force runs it")


def _seconds(spec: Any, config: Any, mode: str) -> float | None:
    rate = flops_per_second(spec.device)
    if not rate:
        return None
    steps = getattr(spec, "warmup", 0) + getattr(spec, "iters", 1) + 1  # + the first call
    # ranks on GPUs split the global batch's FLOPs; on a CPU they share its cores
    gpus = getattr(spec, "world_size", 1) if str(spec.device).startswith("cuda") else 1
    return steps * step_flops(config, spec.batch, spec.seq, mode) / (rate * gpus)


@functools.cache
def flops_per_second(device: str) -> float | None:
    """The device's dense fp32 rate: a GPU's known peak (a third of it: what a step reaches),
    a CPU's measured with a 512 x 512 matmul; None when neither is known."""
    import torch

    if device.startswith("cuda"):
        peak = peak_tflops(torch.cuda.get_device_name(device), "fp32", tf32=True)
        return peak * 1e12 / 3 if peak else None
    a = torch.randn(512, 512)
    a @ a  # the first call pays for the threads and the kernel's choice
    t0, n = time.perf_counter(), 0
    while time.perf_counter() - t0 < 0.05:
        a @ a
        n += 1
    return n * 2 * 512**3 / (time.perf_counter() - t0)


def available_bytes(device: str) -> int | None:
    """Memory a point may take now: a GPU's free memory, a CPU's MemAvailable (Linux);
    None where it cannot be read."""
    if device.startswith("cuda"):
        import torch

        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


# Triton's interpreter on a CPU (TRITON_INTERPRET=1) runs a kernel's every program in Python,
# at a cost per pair of tiles (a Q tile against a K tile) that hardly moves with the head
# width: on this project's 2-core box, with 16 x 16 tiles (the handout's smallest, and so
# the most pairs), 2.4-7.9 ms a pair forward and 12-19 ms backward from d 16 to 128, where
# a rate in FLOP/s moved 3x (benchmarks/preflight_estimate.py measures them).
INTERPRETED_PAIR_S = {"forward": 8e-3, "backward": 20e-3}
INTERPRETED_TILE = 16
# An interpreted point estimated above this is not started unless forced.
INTERPRETED_LIMIT_S = 180.0


def _tile_pairs(seq: int, causal: bool) -> int:
    """The (Q tile, K tile) pairs of one head at INTERPRETED_TILE: those on or below the
    diagonal where a causal kernel skips the rest."""
    n = -(-seq // INTERPRETED_TILE)
    return n * (n + 1) // 2 if causal else n * n


def _triton(impl: str) -> bool:
    """Whether `impl` is Triton code: ours, or the user's (a one-off that cannot be imported
    is left to its point, which says why)."""
    if not yours.is_yours(impl):
        return impl == "triton"
    try:
        return uses_triton(impl)
    except Exception:  # its import error is the point's to store
        return False


def attention_estimate(spec: Any) -> Estimate:
    """An attention point: q, k, v, the output and their gradients, and the T x T scores,
    probabilities and their gradient for the implementations that materialise them; time
    from its FLOPs, with Triton under the interpreter from its pairs of tiles
    (INTERPRETED_PAIR_S)."""
    import os

    size = 4 if spec.precision == "fp32" else 2
    rows = spec.batch * (spec.heads or 1)
    tensors = 8 * rows * spec.seq * spec.d_head * size  # q k v o, dq dk dv do
    parts = {"inputs and gradients": tensors}
    fused = spec.impl in FUSED or (
        spec.impl == "sdpa" and spec.sdpa_backend not in SDPA_MATERIALISING)
    if not fused:
        parts["T x T scores"] = 3 * rows * spec.seq * spec.seq * size
    fwd = attention_forward_flops(spec.batch, spec.heads or 1, spec.seq, spec.d_head, spec.causal)
    # each pass timed in its own loop: backward reruns the forward, end to end is both
    forwards = {"forward": 1, "backward": 1, "both": 3}[spec.passes]
    flops = {"forward": fwd, "backward": 3.5 * fwd, "both": 8 * fwd}[spec.passes]
    runs = spec.warmup + spec.iters + 1  # + the check against float64
    interpreted = (_triton(spec.impl) and not spec.device.startswith("cuda")
                   and os.environ.get("TRITON_INTERPRET") == "1")
    rate = flops_per_second(spec.device)
    seconds = runs * flops / rate if rate else None
    not_started = ""
    if interpreted:
        # the interpreter runs ours whole; of the user's, the forward: the handout's backward
        # is PyTorch (a Triton backward of theirs adds to it)
        ours = spec.impl == "triton"
        backwards = {"forward": 0, "backward": 1, "both": 2}[spec.passes] if ours else 0
        pairs = rows * _tile_pairs(spec.seq, spec.causal and ours)  # ours skips masked tiles
        interpreted_s = pairs * (forwards * INTERPRETED_PAIR_S["forward"]
                                 + backwards * INTERPRETED_PAIR_S["backward"])
        rest = flops - (flops if ours else forwards * fwd)
        seconds = runs * (interpreted_s + (rest / rate if rate else 0.0))
        if seconds > INTERPRETED_LIMIT_S:
            not_started = (
                f"Triton interpreted on a CPU would take ~{format_duration(seconds)} "
                f"({pairs:,} pairs of {INTERPRETED_TILE} x {INTERPRETED_TILE} tiles a pass, "
                f"{runs} runs, at ~{INTERPRETED_PAIR_S['forward'] * 1e3:g} ms a pair forward"
                + (f", {INTERPRETED_PAIR_S['backward'] * 1e3:g} backward" if backwards else "")
                + ("" if ours else "; a Triton backward of yours adds more")
                + "); a shorter --seq, or --force runs it")
    if yours.is_yours(spec.impl) and _triton(spec.impl) and untested_dims(spec):
        # Without masks, as the handout allows, such a kernel reads and writes past its
        # tensors: in the interpreter that corrupted this process's heap ("double free or
        # corruption"), which ended the sweep with the points after it unmeasured. A one-off
        # (`--impl NAME=module:attr`) whose code launches Triton is the user's kernel too.
        not_started = _unmasked_there(untested_dims(spec))
    total = int(MARGIN * sum(parts.values()))
    return Estimate(total, ", ".join(f"{k} {_gib(v)}" for k, v in parts.items()), seconds,
                    not_started)
