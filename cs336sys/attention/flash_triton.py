"""`triton`: FlashAttention-2 as Triton kernels, forward and backward.

    O = softmax(Q K^T / sqrt(d)) V

The forward is one kernel (Dao 2023, Algorithm 1): a program per (query tile, batch*head)
keeps its tile of Q, the running max m_i, running sum l_i and the float32 accumulator O_i on
chip while it walks the key tiles, and writes O_i and the logsumexp L_i = m_i + log(l_i)
once. The backward (Algorithm 2) recomputes P = exp(S - L) from L instead of storing the
(T_q, T_k) matrix (Dao et al. 2022, Section 3.1), in two kernels: D = rowsum(O * dO) and dQ,
with one program per query tile looping over key tiles, then dK and dV with one program per
key tile looping over query tiles (reading D). Splitting dQ from dK/dV means no two programs
write the same rows, so there are no atomics and the results are deterministic. The kernels are in
`flash_triton_kernels.py` and `flash_triton_backward.py`, their tile sizes in
`flash_triton_tuning.py`; this module checks inputs and launches them, through a launch plan
cached per call signature.

    o = flash_attention_triton(q, k, v, is_causal=True)   # q (B, [H,] T_q, D); k, v (B, [H,] T_k, D)
    o = FlashAttention2Triton.apply(q, k, v, True)         # the same, as an autograd.Function

Inputs are float32, bfloat16 or float16 with a head dim from 16 to 128 (any, not only powers
of two), and any sequence lengths. With `is_causal`, query i sees keys j <= i, top-left
aligned as in torch SDPA, also when T_q != T_k. Any strides with a unit one along the head
dim are taken as they are (no copy), and O comes back in q's memory order.

On CUDA the tile sizes, warps and pipeline stages are autotuned per (T_q, T_k, head dim,
causal, dtype). Without CUDA the kernels run only in Triton's interpreter, which must be
switched on with TRITON_INTERPRET=1 before this module is imported; it then uses fixed
16 x 16 tiles.

Hopper GPUs run the kernels' TMA build on 16-bit inputs (tensor descriptors,
`flash_triton_tma.py`). Opt-ins (attention/opt_in.py) reverse the causal query tiles' launch
order, rescale the forward's accumulator lazily, split the forward's and the dK/dV kernel's
loops into warp groups, or add dQ inside the dK/dV kernel instead of recomputing S and dP in a
dQ kernel: with atomics, or with TMA reductions.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os

import torch
import triton

from cs336sys.attention import flash_triton_kernels as kernels
from cs336sys.attention import opt_in
from cs336sys.attention.flash_triton_launch import Launch as _Launch
from cs336sys.attention.flash_triton_launch import Plan as _Plan
from cs336sys.attention.flash_triton_launch import (
    bht_strides,
    dot_flags,
    forward_outputs,
    kernel_view,
    new_like,
)
from cs336sys.attention.flash_triton_tma import ensure_allocator, tma_layout_ok
from cs336sys.attention.flash_triton_tuning import (  # noqa: F401 (FP32_CONFIGS, ...: re-exported)
    _AUTOTUNE,
    _KERNELS,
    _TUNING,
    FP32_CONFIGS,
    FWD_CONFIGS,
    _autotuned,
    pinned_config,
    pinned_tiles,
)
from cs336sys.measure import triton_support
from cs336sys.measure.triton_support import check_available as _available

__all__ = ["INTERPRETED", "FlashAttention2Triton", "check_available", "flash_attention_triton"]

# The kernels were defined by Triton's interpreter (TRITON_INTERPRET=1 at import time), so they
# run on CPU tensors only; otherwise they are compiled for CUDA.
INTERPRETED: bool = kernels.INTERPRETED

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
# (Q_TILE, K_TILE) in the interpreter: tl.dot's minimum, as larger tiles only slow it down.
# Tests set unequal tiles to exercise the tile arithmetic that the GPU configs rely on.
INTERPRETER_TILES = (16, 16)
LOG2E = 1.4426950408889634


def check_available(device: torch.device | str) -> None:
    """Raise RuntimeError unless the kernels can run on tensors on `device`."""
    _available(device, INTERPRETED, "--impl triton")


# Hopper path: the kernels' TMA build (constexpr TMA) moves tiles through tensor descriptors
# instead of per-element pointers and masks, the default since it beat the pointer loads on
# an H200 (opt_in.py): where CS336SYS_TRITON_TMA is not 0, the GPU has compute capability
# >= 9, the inputs are 16-bit and every layout suits TMA (tma_layout_ok); else the pointer
# kernels. float32 keeps them: its FMA dots reading TMA-filled shared memory spilled in sm_90
# builds. FORCE_TMA, what tests set: the descriptor build wherever the layout allows.
TMA, FORCE_TMA = opt_in.TMA, False
HEAVY_FIRST = opt_in.HEAVY_FIRST  # causal forward and dQ: the longest tiles first (opt-in)
LAZY_RESCALE = opt_in.LAZY_RESCALE  # forward: O and l rescaled past a threshold (opt-in)
WARP_SPECIALIZE = opt_in.WARP_SPECIALIZE  # TMA: forward, dK/dV loops in warp groups (opt-in)
# Atomic dQ (flash_triton_kernels.py, "Atomic dQ", opt-in): D alone, then the dK/dV kernel
# adding dQ into a zeroed float32 buffer (5 tile products instead of 7; dQ no longer bit-for-bit
# reproducible), cast to dQ's dtype: with atomics, or (REDUCE_DQ, TMA build) a TMA reduction.
ATOMIC_DQ, REDUCE_DQ = opt_in.ATOMIC_DQ, opt_in.REDUCE_DQ


@functools.cache
def _hopper_or_newer(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index)[0] >= 9


@contextlib.contextmanager
def opted_in(choice: str):
    """Inside, calls run the opt-in paths `choice` names (attention/opt_in.CHOICES) instead
    of the environment's. Plans are keyed on them, so none is reused across a switch."""
    global TMA, HEAVY_FIRST, LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ
    saved = TMA, HEAVY_FIRST, LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ
    TMA, HEAVY_FIRST, LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ = opt_in.flags(choice)
    try:
        yield
    finally:
        TMA, HEAVY_FIRST, LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ = saved


def kernels_ran(backward: bool) -> str:
    """The kernels the last call ran: "pointer" or "tma" (the opt-in falls back where the GPU,
    dtype or layout cannot take it; "tma/pointer" when forward and backward differ), plus
    "+heavy-first" for reversed causal tiles, "+lazy-rescale" or "+warp-specialize", and
    "+atomic-dq" or "+reduce-dq" for an atomic-dQ backward. What `cs336sys attention` stores as
    triton_kernels, read from the plans the calls ran."""
    fwd, bwd = _LAST["fwd"], _LAST["bwd"] if backward else None
    same = bwd is None or bwd.variant == fwd.variant
    loads = fwd.variant if same else f"{fwd.variant}/{bwd.variant}"
    # warp-specialize: every kernel that can split did (the atomic dQ's never can)
    split = fwd.warp_specialize and (bwd is None or bwd.atomic_dq or bwd.warp_specialize)
    ran = opt_in.Paths(fwd.variant == "tma", fwd.heavy_first, fwd.lazy_rescale, split,
                       bool(bwd and bwd.atomic_dq), bool(bwd and bwd.reduce_dq))
    return "+".join([loads, *opt_in.beyond_loads(ran)])


def _variant(*views: torch.Tensor) -> str:
    """"tma" or "pointer": the kernels a new plan launches for these kernel views (TMA where
    asked, the GPU, dtype and layout take it, and this Triton makes descriptors in kernels)."""
    t = views[0]
    wanted = FORCE_TMA or (TMA and t.is_cuda and _hopper_or_newer(t.device.index)
                           and t.dtype != torch.float32)
    ok = wanted and triton_support.HAS_DESCRIPTORS and tma_layout_ok(*views)
    return "tma" if ok else "pointer"


def _on_device(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it t's device."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


# --------------------------------------------------------------------------------------------
# Launch plans: what a call needs beyond its tensors, worked out once per call signature
#
# At seq 1024 one forward call cost 0.19 ms of host time on an H100 host while its
# kernel ran 0.14 ms, and the model calls attention 48 times per xl forward. Most of that was
# per-call work whose answer never changes for the same inputs: input checks, `.contiguous()`
# copies, the autotuner's key and cache lookup, and Triton's argument binding and
# specialization key. A call now looks up a plan keyed on everything that decides the launch
# (`_signature`: shapes, strides, dtypes, devices, pointer alignment; causal; tiling mode),
# allocates its outputs and launches. The first call with a new key takes the full path
# (checks, tile choice, Triton's own launcher, which compiles) and records the plan. Later
# calls on CUDA launch the compiled kernel handle directly (flash_triton_launch.Launch);
# CS336SYS_TRITON_DIRECT_LAUNCH=0 goes through Triton's JIT launcher instead, with the chosen
# tiles passed explicitly (skipping the autotuner's lookup).
DIRECT_LAUNCH = os.environ.get("CS336SYS_TRITON_DIRECT_LAUNCH", "1") != "0"


_PLANS: dict[tuple, _Plan] = {}  # one entry per call signature seen; a few dozen in a sweep
_LAST: dict[str, _Plan] = {}  # "fwd", "bwd": the plan the last call ran (kernels_ran)


def _signature(*tensors: torch.Tensor) -> tuple:
    """What a plan depends on: the tiling mode, and each tensor's shape, strides, dtype, device
    and pointer alignment (Triton specializes pointer arguments on 16-byte alignment)."""
    mode = (INTERPRETED, INTERPRETER_TILES, _AUTOTUNE.get(), TMA, FORCE_TMA, HEAVY_FIRST,
            LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ, DIRECT_LAUNCH)
    return (*mode, *[(t.shape, t.stride(), t.dtype, t.device, t.data_ptr() % 16) for t in tensors])


def _fixed_tiles(name: str, named_args: dict) -> tuple[dict, dict]:
    """Tiles and compile options of kernel `name` where nothing is tuned: the D kernel of the
    atomic-dQ backward, the interpreter, and pinned tiles on CUDA (`pinned_tiles`)."""
    if name == "pre":  # a streaming row reduction: one fixed tile
        return {"Q_TILE": INTERPRETER_TILES[0] if INTERPRETED else 64}, {}
    if INTERPRETED:
        return dict(zip(("Q_TILE", "K_TILE"), INTERPRETER_TILES, strict=True)), {}
    cfg = pinned_config(name, named_args)
    return dict(cfg.kwargs), {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}


def _first_launch(name: str, grid_of, tensors: tuple, args: tuple, constexprs: dict) -> _Launch:
    """Launch kernel `name` through Triton's launcher with the tiles it gets here (fixed in the
    interpreter, pinned or autotuned on CUDA) and return the _Launch that repeats it.

    grid_of(tiles) -> grid, for the tile sizes (a dict with Q_TILE and/or K_TILE).
    """
    kernel = _KERNELS[name]
    if name.endswith("_tma"):
        ensure_allocator()  # descriptor scratch for Triton's launcher
    with _on_device(tensors[0]):
        if name not in _TUNING or INTERPRETED or not _AUTOTUNE.get():  # "pre": never tuned
            named = dict(zip(kernel.arg_names, (*tensors, *args), strict=False))
            tiles, options = _fixed_tiles(name, {**named, **constexprs})
            meta, grid = {**constexprs, **tiles, **options}, grid_of(tiles)
            compiled = kernel[grid](*tensors, *args, **meta)
        else:
            tuner = _autotuned(name)
            compiled = tuner[grid_of](*tensors, *args, **constexprs)
            cfg = tuner.best_config
            options = {"num_warps": cfg.num_warps, "num_stages": cfg.num_stages}
            meta, grid = {**constexprs, **cfg.kwargs, **options}, grid_of(cfg.kwargs)
        device = tensors[0].device.index if tensors[0].is_cuda else None
        direct = DIRECT_LAUNCH and not INTERPRETED and compiled is not None
        return _Launch(kernel, grid, args, meta, device, compiled if direct else None)


# --------------------------------------------------------------------------------------------
# Host launchers


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("k", k), ("v", v)):
        if t.dtype != q.dtype or t.device != q.device:
            raise ValueError(
                f"q and {name} must share dtype and device, got {q.dtype} on {q.device} "
                f"and {t.dtype} on {t.device}"
            )
    if q.dtype not in DTYPES:
        raise ValueError(f"dtype must be float32, bfloat16 or float16, got {q.dtype}")
    if q.dim() < 3 or k.shape != v.shape or q.shape[:-2] != k.shape[:-2]:
        raise ValueError(
            "expected q (..., T_q, D) and k, v (..., T_k, D) with the same leading dims, got "
            f"{tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    d = q.shape[-1]
    if k.shape[-1] != d or not MIN_HEAD_DIM <= d <= MAX_HEAD_DIM:
        raise ValueError(
            f"head dim must match across q, k, v and lie in [{MIN_HEAD_DIM}, {MAX_HEAD_DIM}], "
            f"got {d} and {k.shape[-1]}"
        )
    if q.numel() == 0 or k.numel() == 0:
        raise ValueError("attention needs at least one query and one key")
    check_available(q.device)


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: O (..., T_q, D) in q's dtype and L (..., T_q) float32.

    L is the natural-log logsumexp of each row of scaled scores, over the keys it sees.
    """
    key = ("fwd", bool(is_causal), *_signature(q, k, v))
    plan = _PLANS.get(key)
    if plan is None:
        _check_inputs(q, k, v)
    o, lse = forward_outputs(q)
    if plan is None:
        _PLANS[key] = _LAST["fwd"] = _forward_plan(q, k, v, o, lse, bool(is_causal))
        return o, lse
    _LAST["fwd"] = plan
    plan.reuse()
    if plan.views:
        plan.launches[0](*map(kernel_view, (q, k, v, o)), lse)
    else:
        plan.launches[0](q, k, v, o, lse)
    return o, lse


def _forward_plan(q, k, v, o, lse, is_causal: bool) -> _Plan:
    """Plan, and run, the first forward call of a signature (inputs already checked)."""
    views = tuple(map(kernel_view, (q, k, v, o)))
    q4, k4, v4, o4 = views
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    batch, heads = q4.shape[0], (q4.shape[1] if q4.dim() == 4 else 1)

    def grid(tiles):
        return (triton.cdiv(n_q, tiles["Q_TILE"]), heads, batch)

    args = (*bht_strides(q4), *bht_strides(k4), *bht_strides(v4), *bht_strides(o4),
            n_q, n_k, LOG2E / math.sqrt(d))
    variant, heavy = _variant(*views), HEAVY_FIRST and is_causal
    split = WARP_SPECIALIZE and variant == "tma" and triton_support.HAS_WARP_SPECIALIZE
    constexprs = dict(HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), IS_CAUSAL=is_causal,
                      **dot_flags(q.dtype, INTERPRETED), TMA=variant == "tma", HEAVY_FIRST=heavy,
                      LAZY_RESCALE=LAZY_RESCALE, WARP_SPECIALIZE=split)
    name = "fwd_ws_tma" if split else "fwd_tma" if variant == "tma" else "fwd"
    launch = _first_launch(name, grid, (*views, lse), args, constexprs)
    copied = any(a is not b for a, b in zip(views, (q, k, v, o), strict=True))
    return _Plan((launch,), copied, variant, heavy_first=heavy, lazy_rescale=LAZY_RESCALE,
                 warp_specialize=split)


def attention_backward(q, k, v, o, lse, do, is_causal=False):
    """dQ, dK, dV (shaped and typed like q, k, v) from the forward's O and L and dO.

    Two launches: D = rowsum(O * dO), float32 (..., T_q), and dQ; then dK and dV, which
    read D. With ATOMIC_DQ: D; then dK, dV and dQ, float32; then dQ cast to q's dtype.
    """
    key = ("bwd", bool(is_causal), *_signature(q, k, v, o, lse, do))
    plan = _PLANS.get(key)
    if plan is None:
        _check_inputs(q, k, v)
        if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:-1]:
            raise ValueError(
                f"expected O and dO shaped like q {tuple(q.shape)} and L like "
                f"{tuple(q.shape[:-1])}, got {tuple(o.shape)}, {tuple(do.shape)} and "
                f"{tuple(lse.shape)}"
            )
    if do.dtype != q.dtype:
        do = do.to(q.dtype)
    delta = torch.empty(lse.shape, dtype=torch.float32, device=lse.device)  # like L
    dq, dk, dv = new_like(q), new_like(k), new_like(v)
    tensors = (q, k, v, o, lse, do, dq, dk, dv)
    if plan is None:
        _PLANS[key] = _LAST["bwd"] = _backward_plan(*tensors, delta, bool(is_causal))
        return dq, dk, dv
    _LAST["bwd"] = plan
    plan.reuse()
    if plan.views:
        tensors = _backward_views(*tensors)
    q, k, v, o, lse, do, dq4, dk4, dv4 = tensors
    if plan.atomic_dq:
        pre, dkdv = plan.launches
        pre(o, do, delta)
        _summed_dq(dq4, lambda dq_sum: dkdv(q, k, v, do, lse, delta, dk4, dv4, dq_sum))
        return dq, dk, dv
    dq_, dkdv = plan.launches
    dq_(q, k, v, o, do, lse, delta, dq4)
    dkdv(q, k, v, do, lse, delta, dk4, dv4, dq4)  # dq4 unread: ATOMIC_DQ is off
    return dq, dk, dv


def _summed_dq(dq: torch.Tensor, launch):
    """launch(dq_sum) -> its result, for the atomic-dQ kernel, which adds into dq_sum: a
    zeroed float32 dQ, dq itself when float32, else a buffer with dq's strides (they are part
    of the plan) cast into dq afterwards."""
    if dq.dtype == torch.float32:
        return launch(dq.zero_())
    dq_sum = torch.zeros_like(dq, dtype=torch.float32)
    result = launch(dq_sum)
    dq.copy_(dq_sum)
    return result


def _backward_views(q, k, v, o, lse, do, dq, dk, dv) -> tuple[torch.Tensor, ...]:
    """The backward's tensors as its kernels take them; L as contiguous (B*H, T_q) rows."""
    return (*map(kernel_view, (q, k, v, o)), lse.contiguous(),
            *map(kernel_view, (do, dq, dk, dv)))


def _backward_plan(q, k, v, o, lse, do, dq, dk, dv, delta, is_causal: bool) -> _Plan:
    """Plan, and run, the first backward call of a signature (inputs already checked)."""
    given = (q, k, v, o, lse, do, dq, dk, dv)
    views = _backward_views(*given)
    q4, k4, v4, o4, lse, do4, dq4, dk4, dv4 = views
    n_q, n_k, d = q.shape[-2], k.shape[-2], q.shape[-1]
    batch, heads = q4.shape[0], (q4.shape[1] if q4.dim() == 4 else 1)
    block_d = triton.next_power_of_2(d)
    variant = _variant(q4, k4, v4, do4, dq4, dk4, dv4)  # O and L, D are read by pointers
    suffix = "_tma" if variant == "tma" else ""
    constexprs = dict(HEAD_DIM=d, BLOCK_D=block_d, IS_CAUSAL=is_causal,
                      **dot_flags(q.dtype, INTERPRETED), TMA=variant == "tma")
    scales = (n_q, n_k, 1.0 / math.sqrt(d), LOG2E / math.sqrt(d))
    qkv = (*bht_strides(q4), *bht_strides(k4), *bht_strides(v4))

    def grid(length, tile):
        return lambda tiles: (triton.cdiv(length, tiles[tile]), heads, batch)

    copied = any(a is not b for a, b in zip(views, given, strict=True))
    dkdv_args = (*qkv, *bht_strides(do4), *bht_strides(dk4), *bht_strides(dv4),
                 *bht_strides(dq4), *scales)
    if ATOMIC_DQ:
        # TMA reductions need the descriptor build, and a Triton that has them
        reduce = REDUCE_DQ and variant == "tma" and triton_support.HAS_DESCRIPTOR_REDUCTIONS
        pre = _first_launch(
            "pre", grid(n_q, "Q_TILE"), (o4, do4, delta),
            (*bht_strides(o4), *bht_strides(do4), n_q), {"HEAD_DIM": d, "BLOCK_D": block_d},
        )
        dkdv = _summed_dq(dq4, lambda dq_sum: _first_launch(
            "dkdv_reduce_tma" if reduce else "dkdv_atomic" + suffix, grid(n_k, "K_TILE"),
            (q4, k4, v4, do4, lse, delta, dk4, dv4, dq_sum), dkdv_args,
            {**constexprs, "ATOMIC_DQ": True, "DQ_TMA": reduce, "WARP_SPECIALIZE": False},
        ))
        return _Plan((pre, dkdv), copied, variant, atomic_dq=True, reduce_dq=reduce)
    # dQ first: its kernel also writes D, which the dK/dV kernel reads (split into warp groups
    # where asked: the atomic dQ's and the dQ kernel's loops do not split; its rows of L and
    # D then come by TMA, which needs 16-byte row strides).
    split = (WARP_SPECIALIZE and variant == "tma" and n_q % 4 == 0
             and triton_support.HAS_WARP_SPECIALIZE)
    dq_ = _first_launch(
        "dq" + suffix, grid(n_q, "Q_TILE"), (q4, k4, v4, o4, do4, lse, delta, dq4),
        (*qkv, *bht_strides(o4), *bht_strides(do4), *bht_strides(dq4), *scales),
        {**constexprs, "HEAVY_FIRST": HEAVY_FIRST and is_causal},
    )
    dkdv = _first_launch(
        "dkdv_ws_tma" if split else "dkdv" + suffix, grid(n_k, "K_TILE"),
        (q4, k4, v4, do4, lse, delta, dk4, dv4, dq4),
        dkdv_args, {**constexprs, "ATOMIC_DQ": False, "DQ_TMA": False, "WARP_SPECIALIZE": split},
    )
    return _Plan((dq_, dkdv), copied, variant, warp_specialize=split)


# --------------------------------------------------------------------------------------------
# Under torch.compile: the launchers as two custom ops
#
# Traced directly, a kernel is compiled again by inductor under its own rules; on an H200
# with Triton 3.6 that failed inside `tl.dot` for a kernel that runs as it is. Custom ops are
# opaque to dynamo and inductor: a graph calls them with real tensors, plans and tuned tiles,
# with no graph break (PyTorch tutorial "Custom Python operators"). Their fakes allocate what
# the launchers do, so a graph plans the kernels' strides. Eager calls skip the ops' dispatch.


@torch.library.custom_op("cs336sys::flash_attention_forward", mutates_args=())
def flash_attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """O (..., T_q, D) and the float32 logsumexp L (..., T_q)."""
    return attention_forward(q, k, v, is_causal)


@flash_attention_forward.register_fake
def _(q, k, v, is_causal):
    return forward_outputs(q)


@torch.library.custom_op("cs336sys::flash_attention_backward", mutates_args=())
def flash_attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor,
    do: torch.Tensor, is_causal: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV, shaped and typed like q, k, v."""
    return attention_backward(q, k, v, o, lse, do, is_causal)


@flash_attention_backward.register_fake
def _(q, k, v, o, lse, do, is_causal):
    return new_like(q), new_like(k), new_like(v)


# --------------------------------------------------------------------------------------------
# Public API


def _forward(q, k, v, is_causal):
    """attention_forward, or under torch.compile its custom op."""
    if torch.compiler.is_compiling():
        return flash_attention_forward(q, k, v, is_causal)
    return attention_forward(q, k, v, is_causal)


def _backward(q, k, v, o, lse, do, is_causal):
    """attention_backward, or under torch.compile its custom op."""
    if torch.compiler.is_compiling():
        return flash_attention_backward(q, k, v, o, lse, do, is_causal)
    return attention_backward(q, k, v, o, lse, do, is_causal)


class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels for forward and backward.

    FlashAttention2Triton.apply(q, k, v, is_causal=False) -> O, for q (B, [H,] T_q, D) and
    k, v (B, [H,] T_k, D). For backward it saves exactly (Q, K, V, O, L), L being the float32
    logsumexp of shape (B, [H,] T_q): O(T d) memory, no (T_q, T_k) matrix. Under
    torch.compile the kernels run as custom ops, with no graph break.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = _forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v by the FlashAttention-2 Triton kernels, differentiable.

    q (..., T_q, D); k and v (..., T_k, D) with the same leading dims, typically (B, T, D) or
    (B, H, T, D); float32, bfloat16 or float16; 16 <= D <= 128. Returns (..., T_q, D) in q's
    dtype. With `is_causal`, query i sees keys j <= i (top-left aligned, as torch SDPA).
    """
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return FlashAttention2Triton.apply(q, k, v, is_causal)
    # Nothing to differentiate: skip autograd.Function's bookkeeping, a few microseconds of
    # host time per call.
    return _forward(q, k, v, is_causal)[0]
