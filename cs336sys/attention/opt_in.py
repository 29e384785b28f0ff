"""The opt-in paths of the Triton FlashAttention-2, read once from the environment.

    CS336SYS_TRITON_TMA=1        Hopper: tiles move through tensor descriptors (TMA)
    CS336SYS_TRITON_ATOMIC_DQ=1  backward: dQ added with atomics in the dK/dV kernel

Kept apart from flash_triton.py so that it imports neither torch nor triton: a sweep names
the requested paths in each point's settings (`triton_opt_in`) before any kernel loads, and
`--resume` then tells a TMA point from a default one. The environment gives the default;
`cs336sys attention --triton-opt-in default,tma,...` sweeps them side by side in one run
(flash_triton.opted_in switches them per point).
"""

from __future__ import annotations

import os


def _on(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


TMA = _on("CS336SYS_TRITON_TMA")
ATOMIC_DQ = _on("CS336SYS_TRITON_ATOMIC_DQ")


CHOICES = ("default", "tma", "atomic-dq", "tma+atomic-dq")


def requested() -> str:
    """The opt-ins set in this process's environment: 'default', or those on joined by '+'
    (one of CHOICES)."""
    on = [name for name, flag in (("tma", TMA), ("atomic-dq", ATOMIC_DQ)) if flag]
    return "+".join(on) or "default"


def flags(choice: str) -> tuple[bool, bool]:
    """(tma, atomic_dq) of a label; ValueError for one not in CHOICES."""
    if choice not in CHOICES:
        raise ValueError(f"unknown Triton opt-in {choice!r}; choose from {', '.join(CHOICES)}")
    return "tma" in choice.split("+"), "atomic-dq" in choice.split("+")
