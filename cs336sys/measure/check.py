"""Checked before timed: tensors an implementation produced against an independent reference.

A point that fails its check is still measured, but stored with status `wrong` and never
counted as a winner (the report's ratios, fastest and speed-ups read `ok` rows only): a
fast wrong kernel must not look like a win. The rule is torch.allclose's, elementwise:

    |x - ref| <= atol + rtol · |ref|

and the figures kept are the largest |x - ref| per tensor group and, for a failure, which
tensor was off and by how much. torch is imported by the caller's tensors only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Verdict:
    passed: bool
    metrics: dict[str, Any] = field(default_factory=dict)
    why: str | None = None  # for a failure: the tensor that was off, by how much


def check(got: Mapping[str, Any], want: Mapping[str, Any], rtol: float, atol: float,
          against: str = "a float64 reference") -> Verdict:
    """Compare each tensor of `got` with the one of the same name in `want` (a missing or
    misshapen one fails). Metrics: `max_err` (the first tensor's largest |x - ref|, the
    output), `max_err_grad` (the largest over the others, the gradients, when there are
    any), `check` (pass or fail), `check_rtol`, `check_atol`."""
    worst: dict[str, float] = {}
    failures = []
    for name, ref in want.items():
        x = got.get(name)
        if x is None or tuple(x.shape) != tuple(ref.shape):
            shape = None if x is None else tuple(x.shape)
            failures.append(f"{name} has shape {shape}, expected {tuple(ref.shape)}")
            worst[name] = float("inf")
            continue
        diff = (x.detach().to(ref.dtype) - ref).abs()
        worst[name] = float(diff.max()) if diff.numel() else 0.0
        excess = diff - rtol * ref.abs()
        if diff.numel() and not bool((excess <= atol).all()):  # NaN fails too
            bad = int((~(excess <= atol)).sum())
            nan = int(x.detach().isnan().sum()) - int(ref.isnan().sum())
            finite = diff[~diff.isnan()]
            # "off by up to nan" hid how many were NaN (a row that saw no key: 0/0)
            off = (f"off by up to {float(finite.max()):.3g}" if finite.numel() else "off")
            failures.append(f"{name} {off} at {bad:,} of {diff.numel():,} elements"
                            + (f", {nan:,} of them NaN" if nan > 0 else ""))
    names = list(want)
    metrics: dict[str, Any] = {
        "max_err": worst.get(names[0]) if names else None,
        "check": "fail" if failures else "pass",
        "check_rtol": rtol,
        "check_atol": atol,
    }
    if len(names) > 1:
        metrics["max_err_grad"] = max(worst[n] for n in names[1:])
    why = None
    if failures:
        why = (f"wrong: {'; '.join(failures)} (against {against}, |x - ref| <= {atol:g} + "
               f"{rtol:g}·|ref|)")
    return Verdict(not failures, metrics, why)
