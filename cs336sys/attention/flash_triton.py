"""`triton`: FlashAttention-2 as Triton kernels, forward and backward.

    O = softmax(Q K^T / sqrt(d)) V

The forward is one kernel (Dao 2023, Algorithm 1): a program per (query tile, batch*head)
keeps its tile of Q, the running max m_i, running sum l_i and the float32 accumulator O_i on
chip while it walks the key tiles, and writes O_i and the logsumexp L_i = m_i + log(l_i)
once. The backward (Algorithm 2) recomputes P = exp(S - L) from L instead of storing the
(T_q, T_k) matrix (Dao et al. 2022, Section 3.1), in three kernels: D = rowsum(O * dO), then
dK and dV with one program per key tile looping over query tiles, then dQ with one program
per query tile looping over key tiles. Splitting dQ from dK/dV means no two programs write
the same rows, so there are no atomics and the results are deterministic. The kernels are in
`flash_triton_kernels.py`; this module checks inputs, picks tile sizes and launches them.

    o = flash_attention_triton(q, k, v, is_causal=True)   # q (B, [H,] T_q, D); k, v (B, [H,] T_k, D)
    o = FlashAttention2Triton.apply(q, k, v, True)         # the same, as an autograd.Function

Inputs are float32, bfloat16 or float16 with a head dim from 16 to 128 (any, not only powers
of two), and any sequence lengths. With `is_causal`, query i sees keys j <= i, top-left
aligned as in torch SDPA, also when T_q != T_k.

On CUDA the tile sizes, warps and pipeline stages are autotuned per (T_q, T_k, head dim,
causal, dtype). Without CUDA the kernels run only in Triton's interpreter, which must be
switched on with TRITON_INTERPRET=1 before this module is imported; it then uses fixed
16 x 16 tiles.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import inspect
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
import triton

from cs336sys.attention import flash_triton_kernels as kernels

__all__ = ["INTERPRETED", "FlashAttention2Triton", "check_available", "flash_attention_triton"]

# The kernels were defined by Triton's interpreter (TRITON_INTERPRET=1 at import time), so they
# run on CPU tensors only; otherwise they are compiled for CUDA.
INTERPRETED: bool = kernels.INTERPRETED



def _squeeze_interpreted_scalars() -> None:
    """Let Triton 3.6's interpreter run with NumPy >= 2.4.

    The interpreter holds a computed scalar (a loop bound such as `hi`) as a 1-element array
    and turns it into a Python int with int(array), which NumPy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"), so `range(lo, hi, K_TILE)`
    fails. Triton 3.7+ squeezes the array first; this does the same on older releases. It
    touches only the interpreter (TRITON_INTERPRET=1), never compiled kernels.
    """
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "squeezes_index", False):
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.squeezes_index = True
    interpreter._patch_lang_tensor = patched


if INTERPRETED:
    _squeeze_interpreted_scalars()

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
MIN_HEAD_DIM, MAX_HEAD_DIM = 16, 128
# (Q_TILE, K_TILE) in the interpreter: tl.dot's minimum, as larger tiles only slow it down.
# Tests set unequal tiles to exercise the tile arithmetic that the GPU configs rely on.
INTERPRETER_TILES = (16, 16)
LOG2E = 1.4426950408889634


def check_available(device: torch.device | str) -> None:
    """Raise RuntimeError unless the kernels can run on tensors on `device`."""
    device_type = torch.device(device).type
    if device_type == "cuda" and INTERPRETED:
        raise RuntimeError(
            "--impl triton got CUDA tensors but TRITON_INTERPRET=1 was set when its kernels "
            "were defined, so they run only in Triton's interpreter on CPU tensors; unset "
            "TRITON_INTERPRET to run them on the GPU."
        )
    if device_type != "cuda" and not INTERPRETED:
        raise RuntimeError(
            "--impl triton needs CUDA, or TRITON_INTERPRET=1 to run the kernels in Triton's "
            "interpreter on CPU."
        )


# --------------------------------------------------------------------------------------------
# Tile sizes: autotuned on CUDA, fixed in the interpreter
#
# Each kernel owns one tile for its whole life (forward and dQ: a query tile; dK/dV: a key
# tile), kept on chip, and streams tiles of the other sequence through shared memory,
# num_stages deep. The candidate lists are small and hand-picked, as in Triton's
# fused-attention tutorial; a per-call pruner then drops the configs that would not fit
# (shared memory) or would spill registers. Its estimates were calibrated against the
# shared memory, registers and spills of sm_90 compiles of these kernels.

# Shared memory a config may plan for. H100 and H200 have 227 KiB per block; deeper
# pipelines than fit below this do not pay for the occupancy they cost.
SMEM_BUDGET = 200 * 1024


def _config(q_tile: int, k_tile: int, warps: int, stages: int):
    return triton.Config({"Q_TILE": q_tile, "K_TILE": k_tile}, num_warps=warps, num_stages=stages)


# 16-bit inputs: tensor-core dots. Wide owned tiles re-read the streamed operand fewer times.
FWD_CONFIGS = [
    _config(*c)
    for c in [
        (128, 128, 8, 2), (128, 128, 8, 3), (128, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 4),
        (128, 32, 4, 3), (128, 32, 8, 3), (64, 64, 4, 3), (64, 64, 4, 4), (64, 32, 4, 3),
    ]
]  # fmt: skip
DKDV_CONFIGS = [
    _config(*c)
    for c in [
        (32, 128, 8, 2), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 2),
        (32, 64, 4, 3), (64, 64, 4, 2), (64, 64, 8, 2), (16, 64, 4, 2),
    ]
]  # fmt: skip
DQ_CONFIGS = [
    _config(*c)
    for c in [
        (128, 32, 8, 2), (128, 32, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 2),
        (64, 32, 4, 3), (64, 64, 4, 2), (128, 32, 4, 2),
    ]
]  # fmt: skip
# float32 inputs: input_precision="ieee" runs the dots on the CUDA cores (FMA), where each
# thread holds whole rows of both operands, so only small tiles stay in registers.
FP32_CONFIGS = [
    _config(*c)
    for c in [
        (16, 16, 4, 2), (32, 16, 8, 2), (16, 32, 8, 2), (32, 32, 4, 2), (64, 32, 8, 2),
        (32, 64, 8, 2), (64, 64, 8, 2),
    ]
]  # fmt: skip


@dataclass(frozen=True)
class _Tuning:
    """What a kernel keeps on chip, for the pruner's shared-memory and register estimates."""

    configs: list  # candidates for 16-bit inputs (float32 inputs use FP32_CONFIGS)
    owned: str  # "Q_TILE" or "K_TILE": the tile a program owns
    n_owned: int  # (owned, BLOCK_D) operands held in shared memory for the whole program
    n_streamed: int  # (streamed, BLOCK_D) operands loaded per key/query step, per stage
    n_acc: int  # float32 (owned, BLOCK_D) accumulators in registers
    n_scores: int  # float32 (Q_TILE, K_TILE) tiles live at once (S, P, dP, dS)
    max_regs: int  # most estimated float32 values per thread before ptxas spills


_TUNING = {
    "fwd": _Tuning(FWD_CONFIGS, "Q_TILE", 1, 2, 1, 1, 128),
    "dkdv": _Tuning(DKDV_CONFIGS, "K_TILE", 2, 2, 2, 2, 160),
    "dq": _Tuning(DQ_CONFIGS, "Q_TILE", 2, 2, 1, 2, 128),
}


# float32 (FMA) dots: most Q_TILE * K_TILE * BLOCK_D products per thread before spilling.
FP32_MAX_PRODUCTS_PER_THREAD = 256


def _fits(cfg, t: _Tuning, block_d: int, elem: int) -> bool:
    """Whether a config's tiles fit shared memory and registers, for this head dim and dtype."""
    q_tile, k_tile = cfg.kwargs["Q_TILE"], cfg.kwargs["K_TILE"]
    owned = cfg.kwargs[t.owned]
    streamed = k_tile if t.owned == "Q_TILE" else q_tile
    smem = (owned * t.n_owned + streamed * t.n_streamed * cfg.num_stages) * block_d * elem
    threads = 32 * cfg.num_warps
    if elem == 4:
        regs_ok = q_tile * k_tile * block_d / threads <= FP32_MAX_PRODUCTS_PER_THREAD
    else:
        regs_ok = (t.n_acc * owned * block_d + t.n_scores * q_tile * k_tile) / threads <= t.max_regs
    return smem <= SMEM_BUDGET and regs_ok


def _pruner(t: _Tuning):
    """early_config_prune for triton.autotune: keep the configs that fit this call."""

    def prune(configs, named_args, **kwargs):
        args = {**named_args, **kwargs}
        block_d, elem = args["BLOCK_D"], args["Q"].element_size()
        # A tile longer than the (power-of-two rounded) sequence only computes padding.
        cap = {
            "Q_TILE": max(16, triton.next_power_of_2(args["N_Q"])),
            "K_TILE": max(16, triton.next_power_of_2(args["N_K"])),
        }
        pool = FP32_CONFIGS if elem == 4 else t.configs
        fitting = [c for c in pool if _fits(c, t, block_d, elem)]
        kept = [c for c in fitting if all(c.kwargs[n] <= cap[n] for n in cap)]
        # Never prune everything: fall back to the smallest tiles.
        smallest = min(fitting or pool, key=lambda c: c.kwargs["Q_TILE"] * c.kwargs["K_TILE"])
        return kept or [smallest]

    return prune


_KERNELS = {
    "fwd": kernels._attn_fwd_kernel,
    "dkdv": kernels._attn_bwd_dkdv_kernel,
    "dq": kernels._attn_bwd_dq_kernel,
}
# The best tiles depend on the sequence lengths, head dim and masking; triton.autotune adds
# the dtypes of the tensor arguments to this key itself.
TUNING_KEY = ["N_Q", "N_K", "HEAD_DIM", "IS_CAUSAL"]


_AUTOTUNE_PARAMETERS = inspect.signature(triton.autotune).parameters


@functools.cache
def _autotuned(name: str):
    """The kernel wrapped in triton.autotune, built on first use (CUDA only)."""
    tuning = _TUNING[name]
    # Keep the tuning results on disk where this Triton can: every command is a new process,
    # and tuning the same shape again (timing every candidate; compiled kernels are cached on
    # disk by Triton anyway) is wasted where GPU time is scarce. Tuning cost most of the H100
    # reference sweep: 246 s for 16 shapes.
    cache = {"cache_results": True} if "cache_results" in _AUTOTUNE_PARAMETERS else {}
    # Every config is listed (16-bit and float32) so that the pruner may return any of them.
    return triton.autotune(
        configs=tuning.configs + FP32_CONFIGS,
        key=TUNING_KEY,
        prune_configs_by={"early_config_prune": _pruner(tuning)},
        **cache,
    )(_KERNELS[name])


# Autotuning compiles and times every fitting candidate for every new shape: the GPU tests
# spent 320 s of an H100 on it. Where the tiles are not what is being measured (tests, quick
# checks) they can be pinned: each kernel then runs the first candidate that fits the call,
# in the order of the lists above (`pinned_tiles()`, or CS336SYS_TRITON_AUTOTUNE=0).
_AUTOTUNE: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cs336sys_triton_autotune", default=os.environ.get("CS336SYS_TRITON_AUTOTUNE", "1") != "0"
)


@contextlib.contextmanager
def pinned_tiles(pinned: bool = True) -> Iterator[None]:
    """Inside, the kernels run pinned tiles instead of autotuning (on CUDA)."""
    token = _AUTOTUNE.set(not pinned)
    try:
        yield
    finally:
        _AUTOTUNE.reset(token)


def pinned_config(name: str, named_args: dict) -> Any:
    """The config kernel `name` runs with pinned tiles: the first candidate the pruner keeps
    for these arguments (their head dim, dtype and sequence lengths)."""
    return _pruner(_TUNING[name])(None, named_args)[0]


def _launch(name: str, grid, *args, **constexprs) -> None:
    """Launch kernel `name`: fixed 16 x 16 tiles in the interpreter, autotuned (or pinned)
    on CUDA."""
    kernel = _KERNELS[name]
    if INTERPRETED:
        q_tile, k_tile = INTERPRETER_TILES
        kernel[grid](*args, **constexprs, Q_TILE=q_tile, K_TILE=k_tile)
    elif not _AUTOTUNE.get():
        cfg = pinned_config(name, {**dict(zip(kernel.arg_names, args, strict=False)), **constexprs})
        kernel[grid](*args, **constexprs, **cfg.kwargs, num_warps=cfg.num_warps,
                     num_stages=cfg.num_stages)  # fmt: skip
    else:
        _autotuned(name)[grid](*args, **constexprs)


def _on_device(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it t's device."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()


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


def _as_3d(t: torch.Tensor) -> torch.Tensor:
    """(..., T, D) -> contiguous (N, T, D): each (batch, head) pair is one program column."""
    return t.contiguous().view(-1, t.shape[-2], t.shape[-1])


def _dot_flags(dtype: torch.dtype) -> dict:
    """Precision constexprs of the kernels for inputs of `dtype`.

    PRECISION: IEEE float32 products for float32 inputs (not TF32, which would round them to
    10 mantissa bits); for 16-bit inputs it is ignored and tensor cores multiply natively.
    UPCAST_DOT and ROUND_BF16 work around two bfloat16 bugs of the Triton 3.9 interpreter
    (tl.dot returns garbage, float32 -> bf16 casts truncate); never set on a GPU.
    """
    interpreted_bf16 = INTERPRETED and dtype == torch.bfloat16
    return {
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "UPCAST_DOT": interpreted_bf16,
        "ROUND_BF16": interpreted_bf16,
    }


def attention_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the forward kernel: O (..., T_q, D) in q's dtype and L (..., T_q) float32.

    L is the natural-log logsumexp of each row of scaled scores, over the keys it sees.
    """
    _check_inputs(q, k, v)
    q3, k3, v3 = _as_3d(q), _as_3d(k), _as_3d(v)
    n, n_q, d = q3.shape
    n_k = k3.shape[1]
    # Allocated in the caller's shape, not as views of (N, T_q, ...) buffers: autograd forbids
    # in-place changes to a view returned by a custom Function, and O is handed to the model.
    o = torch.empty(q.shape, dtype=q.dtype, device=q.device)  # (..., T_q, D)
    lse = torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)  # (..., T_q)
    o3, lse2 = o.view(n, n_q, d), lse.view(n, n_q)

    def grid(meta):
        return (triton.cdiv(n_q, meta["Q_TILE"]), n)

    with _on_device(q):
        _launch(
            "fwd", grid, q3, k3, v3, o3, lse2,
            q3.stride(0), q3.stride(1), k3.stride(0), k3.stride(1),
            n_q, n_k, LOG2E / math.sqrt(d),
            HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), IS_CAUSAL=bool(is_causal),
            **_dot_flags(q.dtype),
        )  # fmt: skip
    return o, lse


def _bwd_preprocess(o: torch.Tensor, do: torch.Tensor) -> torch.Tensor:
    """Launch the preprocess kernel: D = rowsum(O * dO), float32 (N, T_q).

    Called by attention_backward with checked, contiguous (N, T_q, D) tensors.
    """
    n, n_q, d = o.shape
    delta = torch.empty(n, n_q, dtype=torch.float32, device=o.device)
    q_tile = INTERPRETER_TILES[0] if INTERPRETED else 64
    with _on_device(o):
        kernels._attn_bwd_preprocess[(triton.cdiv(n_q, q_tile), n)](
            o, do, delta, o.stride(0), o.stride(1), n_q,
            HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), Q_TILE=q_tile,
        )  # fmt: skip
    return delta


def _bwd_dkdv(q, k, v, do, lse, delta, is_causal):
    """Launch the dK/dV kernel; returns dK, dV like k and v.

    Called by attention_backward with checked, contiguous (N, T, D) tensors, L and D (N, T_q).
    """
    n, n_q, d = q.shape
    n_k = k.shape[1]
    dk, dv = torch.empty_like(k), torch.empty_like(v)

    def grid(meta):
        return (triton.cdiv(n_k, meta["K_TILE"]), n)

    with _on_device(q):
        _launch(
            "dkdv", grid, q, k, v, do, lse, delta, dk, dv,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            n_q, n_k, 1.0 / math.sqrt(d), LOG2E / math.sqrt(d),
            HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), IS_CAUSAL=bool(is_causal),
            **_dot_flags(q.dtype),
        )  # fmt: skip
    return dk, dv


def _bwd_dq(q, k, v, do, lse, delta, is_causal):
    """Launch the dQ kernel; returns dQ like q. Inputs as for _bwd_dkdv."""
    n, n_q, d = q.shape
    n_k = k.shape[1]
    dq = torch.empty_like(q)

    def grid(meta):
        return (triton.cdiv(n_q, meta["Q_TILE"]), n)

    with _on_device(q):
        _launch(
            "dq", grid, q, k, v, do, lse, delta, dq,
            q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            n_q, n_k, 1.0 / math.sqrt(d), LOG2E / math.sqrt(d),
            HEAD_DIM=d, BLOCK_D=triton.next_power_of_2(d), IS_CAUSAL=bool(is_causal),
            **_dot_flags(q.dtype),
        )  # fmt: skip
    return dq


def attention_backward(q, k, v, o, lse, do, is_causal=False):
    """dQ, dK, dV (shaped and typed like q, k, v) from the forward's O and L and dO."""
    _check_inputs(q, k, v)
    if o.shape != q.shape or do.shape != q.shape or lse.shape != q.shape[:-1]:
        raise ValueError(
            f"expected O and dO shaped like q {tuple(q.shape)} and L like {tuple(q.shape[:-1])}, "
            f"got {tuple(o.shape)}, {tuple(do.shape)} and {tuple(lse.shape)}"
        )
    q3, k3, v3, o3 = _as_3d(q), _as_3d(k), _as_3d(v), _as_3d(o)
    do3 = _as_3d(do.to(q.dtype))
    lse3 = lse.contiguous().view(q3.shape[:2])  # (N, T_q)
    delta = _bwd_preprocess(o3, do3)
    dk, dv = _bwd_dkdv(q3, k3, v3, do3, lse3, delta, is_causal)
    dq = _bwd_dq(q3, k3, v3, do3, lse3, delta, is_causal)
    return dq.view(q.shape), dk.view(k.shape), dv.view(v.shape)


# --------------------------------------------------------------------------------------------
# Public API


class FlashAttention2Triton(torch.autograd.Function):
    """FlashAttention-2 with Triton kernels for forward and backward.

    FlashAttention2Triton.apply(q, k, v, is_causal=False) -> O, for q (B, [H,] T_q, D) and
    k, v (B, [H,] T_k, D). For backward it saves exactly (Q, K, V, O, L), L being the float32
    logsumexp of shape (B, [H,] T_q): O(T d) memory, no (T_q, T_k) matrix.
    """

    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        o, lse = attention_forward(q, k, v, is_causal)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.is_causal = is_causal
        return o

    @staticmethod
    def backward(ctx, do):
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = attention_backward(q, k, v, o, lse, do, ctx.is_causal)
        return dq, dk, dv, None


def flash_attention_triton(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False
) -> torch.Tensor:
    """softmax(q k^T / sqrt(D)) v by the FlashAttention-2 Triton kernels, differentiable.

    q (..., T_q, D); k and v (..., T_k, D) with the same leading dims, typically (B, T, D) or
    (B, H, T, D); float32, bfloat16 or float16; 16 <= D <= 128. Returns (..., T_q, D) in q's
    dtype. With `is_causal`, query i sees keys j <= i (top-left aligned, as torch SDPA).
    """
    return FlashAttention2Triton.apply(q, k, v, is_causal)
