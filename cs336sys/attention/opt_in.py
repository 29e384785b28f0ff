"""The opt-in paths of the Triton FlashAttention-2 (issue 15), read once from the environment.

    CS336SYS_TRITON_TMA=1        Hopper: tiles move through tensor descriptors (TMA)
    CS336SYS_TRITON_ATOMIC_DQ=1  backward: dQ added with atomics in the dK/dV kernel

Kept apart from flash_triton.py so that it imports neither torch nor triton: a sweep names
the requested paths in each point's settings (`triton_opt_in`) before any kernel loads, and
`--resume` then tells a TMA point from a default one.
"""

from __future__ import annotations

import os


def _on(name: str) -> bool:
    return os.environ.get(name, "0") == "1"


TMA = _on("CS336SYS_TRITON_TMA")
ATOMIC_DQ = _on("CS336SYS_TRITON_ATOMIC_DQ")


def requested() -> str:
    """'default', or the opt-ins set in this process's environment joined by '+'."""
    on = [name for name, flag in (("tma", TMA), ("atomic-dq", ATOMIC_DQ)) if flag]
    return "+".join(on) or "default"
