"""The kernel paths of the Triton FlashAttention-2, read once from the environment.

    CS336SYS_TRITON_TMA=0          Hopper: the pointer loads instead of the default tensor
                                   descriptors (TMA), which won on an H200: 5.33 ms against
                                   5.64 at the leaderboard shape (reports/nvidia-h200)
    CS336SYS_TRITON_HEAVY_FIRST=1  causal forward and dQ kernels: the query tiles launched
                                   last first, the longest programs first (not yet timed)
    CS336SYS_TRITON_LAZY_RESCALE=1 forward: the running max, and with it the rescaling of O
                                   and l, moved only when it grows past a threshold (not
                                   yet timed)
    CS336SYS_TRITON_WARP_SPECIALIZE=1
                                   TMA build: the forward's key loop and the dK/dV kernel's
                                   query loop, each one loop that Triton splits into a
                                   loading warp group and computing ones (not yet timed; not
                                   with lazy-rescale, whose branch it cannot split)
    CS336SYS_TRITON_ATOMIC_DQ=1    backward: dQ added with atomics in the dK/dV kernel (opt-in:
                                   it lost there, 4.20 ms of backward against 3.96)
    CS336SYS_TRITON_REDUCE_DQ=1    the same, each dQ tile added by one TMA reduction instead
                                   of per-element atomics, where the TMA build runs (not yet
                                   timed)

A label names the departures from the default, joined by '+' in that order: loads, schedule,
forward loop, dQ sum (`pointer+heavy-first+atomic-dq`); "default" names none.

Kept apart from flash_triton.py so that it imports neither torch nor triton: a sweep names
the requested paths in each point's settings (`triton_opt_in`) before any kernel loads, and
`--resume` then tells a pointer point from a default one. The environment gives the default;
`cs336sys attention --triton-opt-in default,pointer,...` sweeps them side by side in one run
(flash_triton.opted_in switches them per point). TMA runs only where it can (compute
capability >= 9, 16-bit inputs, a layout that suits it), else the pointer loads: what ran
is stored as `triton_kernels`. Before 0.3, TMA was opt-in and "default" meant pointer loads.
"""

from __future__ import annotations

import itertools
import os
from typing import NamedTuple


class Paths(NamedTuple):
    tma: bool  # tiles through tensor descriptors where they can run
    heavy_first: bool  # causal query tiles in reverse launch order
    lazy_rescale: bool  # the forward's running max moved only past a threshold
    warp_specialize: bool  # forward and dK/dV loops split into warp groups (needs tma)
    atomic_dq: bool  # dQ added in the dK/dV kernel (5 tile products instead of 7)
    reduce_dq: bool  # ... by TMA reductions (needs tma)


# The variables read here, in Paths' order: what a caller that asks for paths by label
# clears, so that the environment's own choice does not leak in.
VARIABLES = ("CS336SYS_TRITON_TMA", "CS336SYS_TRITON_HEAVY_FIRST", "CS336SYS_TRITON_LAZY_RESCALE",
             "CS336SYS_TRITON_WARP_SPECIALIZE", "CS336SYS_TRITON_ATOMIC_DQ",
             "CS336SYS_TRITON_REDUCE_DQ")


# flash_torch.py's: 0 runs its backward eager, 1 compiled; unset, compiled where it can
FLASH_TORCH_COMPILE = "CS336SYS_FLASH_TORCH_COMPILE"
# The launch's switches, 0 turning each off (flash_triton_tuning.py, flash_triton.py)
LAUNCH_VARIABLES = ("CS336SYS_TRITON_AUTOTUNE", "CS336SYS_TRITON_DIRECT_LAUNCH")


def bad_variable() -> str | None:
    """Why a switch of these in the environment cannot be read, in one line, or None: each
    is 0 or 1 (or unset). `CS336SYS_TRITON_TMA=yes` read as on, `..._COMPILE=yes` failed
    every flash-torch point, and `..._AUTOTUNE=false` left autotuning on; every measuring
    command refuses them before it starts."""
    for name in (*VARIABLES, FLASH_TORCH_COMPILE, *LAUNCH_VARIABLES):
        value = os.environ.get(name, "")
        if value not in ("", "0", "1"):
            return f"{name} must be 0 or 1 (or unset), got {value!r}"
    return None


def _on(name: str) -> bool:
    assert name in VARIABLES, name
    return os.environ.get(name, "0") == "1"


TMA = os.environ.get("CS336SYS_TRITON_TMA", "1") != "0"
HEAVY_FIRST = _on("CS336SYS_TRITON_HEAVY_FIRST")
# Both forward loops asked for: the warp-specialised one, which is the newer ask
WARP_SPECIALIZE = TMA and _on("CS336SYS_TRITON_WARP_SPECIALIZE")
LAZY_RESCALE = _on("CS336SYS_TRITON_LAZY_RESCALE") and not WARP_SPECIALIZE
# An atomic dQ either way; by TMA reductions only where the TMA build runs
ATOMIC_DQ = _on("CS336SYS_TRITON_ATOMIC_DQ") or _on("CS336SYS_TRITON_REDUCE_DQ")
REDUCE_DQ = TMA and _on("CS336SYS_TRITON_REDUCE_DQ")

# Every label: a part or none from each group, in this order, but the TMA-only parts
# (warp-specialize, reduce-dq) with the pointer loads. "tma" asks for what "default" now
# does; it stays so that stored labels keep their meaning.
_GROUPS = (("", "pointer", "tma"), ("", "heavy-first"), ("", "lazy-rescale", "warp-specialize"),
           ("", "atomic-dq", "reduce-dq"))
_TMA_ONLY = ("warp-specialize", "reduce-dq")
CHOICES = tuple(
    "+".join(p for p in parts if p) or "default"
    for parts in itertools.product(*_GROUPS)
    if not (parts[0] == "pointer" and set(parts) & set(_TMA_ONLY))
)
# What an error says instead of all the labels
GRAMMAR = ("default, or a part or none of each group joined by '+' in this order: "
           + ", ".join("|".join(p for p in group if p) for group in _GROUPS)
           + " (warp-specialize and reduce-dq not with pointer)")


def beyond_loads(paths: Paths) -> list[str]:
    """The parts of the label of `paths` after the loads, in the label's order: schedule,
    forward loop, dQ sum. What flash_triton.kernels_ran names after the loads that ran."""
    dq_sum = "reduce-dq" if paths.reduce_dq else "atomic-dq"
    return [name for name, on in (("heavy-first", paths.heavy_first),
                                  ("lazy-rescale", paths.lazy_rescale),
                                  ("warp-specialize", paths.warp_specialize),
                                  (dq_sum, paths.atomic_dq)) if on]


def label(paths: Paths) -> str:
    """The label that asks for `paths`: 'default', or the departures from it joined by '+'
    (one of CHOICES; `flags` inverted)."""
    return "+".join(([] if paths.tma else ["pointer"]) + beyond_loads(paths)) or "default"


def requested() -> str:
    """The label of the paths this process's environment asks for."""
    return label(Paths(TMA, HEAVY_FIRST, LAZY_RESCALE, WARP_SPECIALIZE, ATOMIC_DQ, REDUCE_DQ))


def flags(choice: str) -> Paths:
    """The paths a label asks for; ValueError for one not in CHOICES."""
    if choice not in CHOICES:
        raise ValueError(f"unknown Triton opt-in {choice!r}; give {GRAMMAR}")
    parts = choice.split("+")
    reduce_dq = "reduce-dq" in parts
    return Paths("pointer" not in parts, "heavy-first" in parts, "lazy-rescale" in parts,
                 "warp-specialize" in parts, reduce_dq or "atomic-dq" in parts, reduce_dq)
