"""Tile sizes of the FlashAttention-2 Triton kernels: autotuned on CUDA, or pinned.

The candidate configs per kernel, the pruner that keeps those fitting a call, the autotuned
kernels, and `pinned_tiles()` for when tiles are not what is measured. The host launchers in
`flash_triton.py` use these once per call signature and reuse the choice.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
from collections.abc import Iterator
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import triton

from cs336sys.attention import flash_triton_backward as backward
from cs336sys.attention import flash_triton_kernels as kernels

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
]
DKDV_CONFIGS = [
    _config(*c)
    for c in [
        (32, 128, 8, 2), (32, 128, 8, 3), (64, 128, 8, 2), (64, 128, 8, 3), (32, 64, 4, 2),
        (32, 64, 4, 3), (64, 64, 4, 2), (64, 64, 8, 2), (16, 64, 4, 2),
    ]
]
DQ_CONFIGS = [
    _config(*c)
    for c in [
        (128, 32, 8, 2), (128, 32, 8, 3), (128, 64, 8, 2), (128, 64, 8, 3), (64, 32, 4, 2),
        (64, 32, 4, 3), (64, 64, 4, 2), (128, 32, 4, 2),
    ]
]
# float32 inputs: input_precision="ieee" runs the dots on the CUDA cores (FMA), where each
# thread holds whole rows of both operands, so only small tiles stay in registers.
FP32_CONFIGS = [
    _config(*c)
    for c in [
        (16, 16, 4, 2), (32, 16, 8, 2), (16, 32, 8, 2), (32, 32, 4, 2), (64, 32, 8, 2),
        (32, 64, 8, 2), (64, 64, 8, 2),
    ]
]


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
    # Where the estimate fails: per BLOCK_D bucket, the (Q_TILE, K_TILE, warps, stages) of
    # 16-bit configs that compiled for sm_90 without spills; they replace the register estimate.
    spill_free: dict | None = None
    # Arguments the kernel adds into rather than stores: autotune zeroes them per trial.
    reset_to_zero: list | None = None


_TUNING = {
    "fwd": _Tuning(FWD_CONFIGS, "Q_TILE", 1, 2, 1, 1, 128),
    "dkdv": _Tuning(DKDV_CONFIGS, "K_TILE", 2, 2, 2, 2, 160),
    "dq": _Tuning(DQ_CONFIGS, "Q_TILE", 2, 2, 1, 2, 128),
}
# The kernels' descriptor (TMA) build holds the same tiles on chip: the same candidates and
# estimates, tuned and cached under their own names. Offline sm_90 compiles
# (Triton 3.6 and 3.9, bf16, d 64-128) used the shared memory estimated here to within 1 KiB,
# without spills (forward and dQ: 3-33 % fewer registers than the pointer kernels, dK/dV
# about as many); their speed is unmeasured.
_TUNING.update({f"{name}_tma": _TUNING[name] for name in ("fwd", "dkdv", "dq")})
# The TMA forward also tries 256-query tiles where the estimate keeps them (d 64 and below):
# built offline for sm_90 (Triton 3.9, bf16, d 64, 8 warps) it held them in 200 registers
# without a spill, the pointer forward in 253. Its speed is unmeasured; the autotuner times it
# beside the others, and pinned tiles (the lists' first fit) are unchanged.
FWD_TMA_CONFIGS = FWD_CONFIGS + [_config(256, 64, 8, 2), _config(256, 64, 8, 3)]
_TUNING["fwd_tma"] = replace(_TUNING["fwd"], configs=FWD_TMA_CONFIGS)
# With atomic dQ the dK/dV kernel also holds a float32 (Q_TILE, BLOCK_D) dQ partial per query
# step, and the estimate above did not predict its spills (d 128 at 64 x 64 spilled 176 bytes,
# 16 x 128 none). So its candidates are those that compiled for sm_90 without a spill, pointer
# and TMA variants, Triton 3.6 and 3.9 (`python benchmarks/sm90_compile.py --only attention`
# prints a sample): 8 warps only, as every 4-warp candidate spilled in the TMA variant.
_ATOMIC_D64 = [(64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 2), (32, 128, 8, 3),
               (64, 64, 8, 2), (64, 64, 8, 3)]
_ATOMIC_D128 = [(32, 64, 8, 2), (16, 128, 8, 2), (16, 64, 8, 2), (32, 64, 8, 3), (16, 128, 8, 3)]
# n_acc, n_scores and max_regs are unread where spill_free is given (16-bit inputs).
_ATOMIC = _Tuning([_config(*c) for c in _ATOMIC_D64 + _ATOMIC_D128], "K_TILE", 2, 2, 2, 2, 0,
                  spill_free={64: set(_ATOMIC_D64 + _ATOMIC_D128), 128: set(_ATOMIC_D128)},
                  reset_to_zero=["dQ"])
_TUNING.update({"dkdv_atomic": _ATOMIC, "dkdv_atomic_tma": _ATOMIC, "dkdv_reduce_tma": _ATOMIC})
# The warp-specialised forward (WARP_SPECIALIZE, TMA build): Triton splits its loop only at 4
# warps a group (it then runs 12: one group loads, two compute, 168 registers each before
# setmaxnreg moves them), and not at 8. These compiled for sm_90 split and without a spill,
# Triton 3.6 and 3.9, bf16 (`python benchmarks/sm90_compile.py --only warp-specialize`);
# 256 x 128 spilled at d 64. Each computing group takes half the query tile, so no tile is
# below 128 rows: a wgmma's 64 each, as in FlashAttention-3. The smem estimate is low for them
# (the split adds barriers and buffers: d 128 at 128 x 128, 197 KiB built against 160
# estimated), within the 227 KiB they have.
_WS_D64 = [(128, 128, 4, 2), (128, 128, 4, 3), (128, 64, 4, 3), (256, 64, 4, 2)]
_WS_D128 = [(128, 128, 4, 2), (128, 64, 4, 2), (128, 64, 4, 3)]


def _split(d64: list, d128: list, like: str) -> _Tuning:
    """A warp-specialised kernel's tuning: `like`'s, with the hand-checked candidates."""
    return replace(_TUNING[like], configs=[_config(*c) for c in dict.fromkeys(d128 + d64)],
                   spill_free={64: set(d64 + d128), 128: set(d128)})


_TUNING["fwd_ws_tma"] = _split(_WS_D64, _WS_D128, "fwd")
# The default backward's dK/dV kernel, likewise (the dQ kernel's and the atomic dQ's loops do
# not split): it owns a key tile, halved between its computing groups, so 128 keys; at d 128
# 64 x 128 spilled 40 bytes.
_TUNING["dkdv_ws_tma"] = _split([(64, 128, 4, 2), (32, 128, 4, 2), (64, 128, 4, 3),
                                 (32, 128, 4, 3)],
                                [(32, 128, 4, 2), (16, 128, 4, 2), (32, 128, 4, 3)], "dkdv")


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
    elif t.spill_free is not None:
        bucket = min(b for b in t.spill_free if b >= block_d)
        regs_ok = (q_tile, k_tile, cfg.num_warps, cfg.num_stages) in t.spill_free[bucket]
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
    "pre": backward._attn_bwd_preprocess,  # the atomic-dQ backward's D; never tuned
    "fwd": kernels._attn_fwd_kernel,
    "dkdv": backward._attn_bwd_dkdv_kernel,
    "dq": backward._attn_bwd_dq_kernel,
    # The TMA build of the same kernels (the launchers pass TMA=True), tuned apart.
    "fwd_tma": kernels._attn_fwd_kernel,
    "dkdv_tma": backward._attn_bwd_dkdv_kernel,
    "dq_tma": backward._attn_bwd_dq_kernel,
    # The dK/dV kernel with ATOMIC_DQ: tuned under its own names (other tiles may win, and
    # the autotuner must zero the dQ buffer it adds into before each trial).
    "dkdv_atomic": backward._attn_bwd_dkdv_kernel,
    "dkdv_atomic_tma": backward._attn_bwd_dkdv_kernel,
    "dkdv_reduce_tma": backward._attn_bwd_dkdv_kernel,  # DQ_TMA: dQ by TMA reductions
    # WARP_SPECIALIZE: 4-warp groups, other tiles
    "fwd_ws_tma": kernels._attn_fwd_kernel,
    "dkdv_ws_tma": backward._attn_bwd_dkdv_kernel,
}
# The best tiles depend on the sequence lengths, head dim and masking; triton.autotune adds
# the dtypes of the tensor arguments to this key itself. TMA is in it because "fwd" and
# "fwd_tma" (and so on) tune one JITFunction with the same candidates: the results Triton
# caches on disk (cache_results) are keyed on the function, the key and the configs only;
# DQ_TMA and WARP_SPECIALIZE, for the same reason, where the kernel takes them
# ("dkdv_atomic_tma", "..._reduce_tma"; "*_ws_tma"). HEAVY_FIRST and LAZY_RESCALE are not:
# an opt-in point runs the tiles tuned at its shape by whichever point ran first, so that side
# by side the opt-in alone differs.
TUNING_KEY = ["N_Q", "N_K", "HEAD_DIM", "IS_CAUSAL", "TMA"]
_SPLIT_KEYS = ("DQ_TMA", "WARP_SPECIALIZE")  # in the key of the kernels that take them


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
        key=TUNING_KEY + [n for n in _SPLIT_KEYS if n in _KERNELS[name].arg_names],
        prune_configs_by={"early_config_prune": _pruner(tuning)},
        reset_to_zero=tuning.reset_to_zero,
        **cache,
    )(_KERNELS[name])


# Autotuning compiles and times every fitting candidate for every new shape: the GPU tests
# spent 320 s of an H100 on it. Where the tiles are not what is being measured (tests, quick
# checks) they can be pinned: each kernel then runs the first candidate that fits the call,
# in the order of the lists above (`pinned_tiles()`, or CS336SYS_TRITON_AUTOTUNE=0).
# Process-wide, not a ContextVar: on CUDA autograd runs backward in its own device thread,
# where a ContextVar set around `.backward()` is not seen, so backward autotuned anyway.
class _Switch:
    """A process-wide flag with ContextVar-like get/set/reset."""

    def __init__(self, value: bool) -> None:
        self._value = value

    def get(self) -> bool:
        return self._value

    def set(self, value: bool) -> bool:
        old, self._value = self._value, value
        return old

    def reset(self, token: bool) -> None:
        self._value = token


_AUTOTUNE = _Switch(os.environ.get("CS336SYS_TRITON_AUTOTUNE", "1") != "0")


@contextlib.contextmanager
def pinned_tiles(pinned: bool = True) -> Iterator[None]:
    """Inside, the kernels run pinned tiles instead of autotuning (on CUDA), in every thread
    (backward's included)."""
    token = _AUTOTUNE.set(not pinned)
    try:
        yield
    finally:
        _AUTOTUNE.reset(token)


def kept_configs(name: str, named_args: dict) -> list:
    """The candidates of kernel `name` the pruner keeps for these arguments (their head dim,
    dtype and sequence lengths): what the autotuner times."""
    return _pruner(_TUNING[name])(None, named_args)


def pinned_config(name: str, named_args: dict) -> Any:
    """The config kernel `name` runs with pinned tiles: the first candidate kept."""
    return kept_configs(name, named_args)[0]


def call_args(head_dim: int, seq: int, element_size: int = 2) -> dict[str, Any]:
    """The arguments kept_configs and pinned_config read, as a call with this head dim, `seq`
    queries and keys, and inputs of `element_size` bytes (2: bf16 or fp16) passes them: for
    offline builds (benchmarks/sm90_compile.py) and tests, which make no such call."""
    inputs = SimpleNamespace(element_size=lambda: element_size)
    return {"BLOCK_D": head_dim, "Q": inputs, "N_Q": seq, "N_K": seq}
