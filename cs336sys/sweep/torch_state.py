"""torch's process-wide switches, kept across one point: what the code under test turns
(`torch.set_default_dtype(torch.float64)`, `torch.set_grad_enabled(False)`, a function of
`torch.nn.functional` replaced) is put back before the next point, which would otherwise be
measured under it, cs336sys's own implementations too (their float64 points were stored as
fp32 and `ok`; with gradients off, `adamw` failed for a kernel before it).

`kept()` wraps one point; it yields a list that names, once the point is over, what it had
changed, which `said` puts in the runner's words for stderr.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

# (name, getter, setter) of each switch kept; the getters and setters are torch's own. Not
# the float32 matmul precision: code sets TF32 on purpose at import (once, in the first
# point that imports it), a point's TF32 is recorded as it ran (measure/device.tf32_matmuls),
# and put back after that point the user's later points ran without what they asked.
_SWITCHES = (
    ("default dtype", "get_default_dtype", "set_default_dtype"),
    ("gradient mode", "is_grad_enabled", "set_grad_enabled"),
    ("anomaly detection", "is_anomaly_enabled", "set_anomaly_enabled"),
    ("deterministic algorithms", "are_deterministic_algorithms_enabled",
     "use_deterministic_algorithms"),
    ("default device", "get_default_device", "set_default_device"),
)
_PATCHED_MODULES = ("torch", "torch.nn.functional")  # whose functions code may replace


def _switches(torch: Any) -> dict[str, Any]:
    """Each switch's value; one whose getter raises is not kept."""
    out = {}
    for name, get, _ in _SWITCHES:
        try:
            out[name] = getattr(torch, get)()
        except (AttributeError, RuntimeError):
            continue
    return out


def _functions() -> dict[str, dict[str, Any]]:
    return {m: dict(vars(sys.modules[m])) for m in _PATCHED_MODULES if m in sys.modules}


@contextlib.contextmanager
def kept() -> Iterator[list[str]]:
    """Run the block; then put back each of torch's switches (_SWITCHES) and every function
    of torch and torch.nn.functional it changed, and list them in the yielded list. Without
    torch imported (plan, report) nothing is kept."""
    changed: list[str] = []
    torch = sys.modules.get("torch")
    if torch is None:
        yield changed
        return
    switches, functions = _switches(torch), _functions()
    try:
        yield changed
    finally:
        now = _switches(torch)
        for name, _, set_ in _SWITCHES:
            if name in switches and name in now and now[name] != switches[name]:
                getattr(torch, set_)(switches[name])
                changed.append(f"{name} {now[name]} (put back to {switches[name]})")
        for module, before in functions.items():
            live = vars(sys.modules[module])
            # torch's own wrappers are left (importing torch._dynamo wraps manual_seed)
            for attr in [a for a, f in before.items() if live.get(a) is not f
                         and getattr(live.get(a), "__wrapped__", None) is not f]:
                setattr(sys.modules[module], attr, before[attr])
                changed.append(f"{module}.{attr} replaced (put back)")


def said(changed: list[str]) -> str:
    """The line on stderr for what `kept()` put back (one process and rank 0 alike)."""
    return f"cs336sys: the point left {'; '.join(changed)}"
