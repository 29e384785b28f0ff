"""torch.profiler events -> per-phase op/kernel summaries and the naive-attention breakdown.

A profiled step marks its phases with the ranges `cs336sys::forward`, `cs336sys::backward`
and `cs336sys::optimizer` (`nvtx_range` inside `profiler_ranges(True)`, measure/nvtx.py), and
naive attention marks `cs336sys::scores`, `cs336sys::softmax` and `cs336sys::final matmul`.
Every op or kernel is attributed to the range that contains its *start on the host*:

- CPU: each op event with its self CPU time (time in child ops excluded, so aten::matmul ->
  aten::bmm is not counted twice). User annotations (our ranges, `Optimizer.step#...`) are
  not ops: their self time is Python between ops, and is left out.
- CUDA: each kernel (and memcpy/memset) with its device time, attributed by the host event
  that launched it. The launch lies inside the phase range even though the kernel runs a
  little later; the profiled step ends each phase with a device sync inside its range.

Attribution by time, not by the call tree, because on CUDA the autograd engine runs the
backward ops on a worker thread of its own, outside the tree of the `backward` range.
Time stamps are the profiler's microseconds; everything returned is in milliseconds.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

RANGE_PREFIX = "cs336sys::"  # the prefix of measure/nvtx.py, kept here torch-free
PHASES = ("forward", "backward", "optimizer")
STEP = "step"  # kernel_stats's rows of every phase together
# Breakdown key -> the range naive_attention opens around that part (attention/reference.py).
# The scores range holds the 1/√d scaling and the causal mask too: its matrix multiplications
# are QKᵀ, its other ops "mask" (nsys_profile (e) sets the matmuls' time against the
# softmax's; on a CPU the mask's ops took 3x the QKᵀ matmul's time). PV is the final range's
# matrix multiplications alone, as QKᵀ is: the copies torch's matmul makes of its operands
# there (on a CPU 0.26 of PV's 0.64 ms a step) made PV read as slow as QKᵀ, whose copies
# counted under "mask".
PARTS = {"qk": "scores", "softmax": "softmax", "pv": "final matmul"}
PART_KEYS = ("qk", "mask", "softmax", "pv")
# The range around each call of the user's attention function (experiments/profile.py wraps
# it); its parts are told apart by order: the matmuls before the softmax are QKᵀ, the other
# ops before it "mask", the softmax, then what runs after it is PV.
USER_ATTENTION = "attention (yours)"
# ... and around each call of the softmax function it calls, where it calls one by that name
# (assignment 1 has students write their own, whose ops are max, sub, exp, sum and div): its
# ops are the softmax part, as an op named softmax is.
USER_SOFTMAX = "softmax (yours)"
SOFTMAX = re.compile(r"softmax", re.IGNORECASE)
OTHER = "(other)"
# What a matrix multiplication is called: aten's ops on a CPU (self time: matmul and linear
# are composites whose time their mm/addmm/bmm children carry); on CUDA the kernels of
# cuBLAS (gemm, Hopper's nvjet), CUTLASS and the tensor-core (xmma, wgmma) families, and
# inductor's Triton matmul templates (`triton_tem_fused_mm...`, `..._bmm...`).
MATMUL = re.compile(r"gemm|xmma|wgmma|cutlass|nvjet|cublas|^aten::(mm|addmm|bmm|baddbmm|_scaled_mm)$"
                    r"|triton_tem_.*mm", re.IGNORECASE)


class Spans:
    """Non-overlapping [start, end] intervals of one range name, searchable by time."""

    def __init__(self, spans: Iterable[tuple[float, float]]):
        ordered = sorted(spans)
        self.starts = [s for s, _ in ordered]
        self.ends = [e for _, e in ordered]

    def __len__(self) -> int:
        return len(self.starts)

    def contains(self, t: float) -> bool:
        i = bisect.bisect_right(self.starts, t) - 1
        return i >= 0 and t <= self.ends[i]

    def index(self, t: float) -> int | None:
        """Which span contains `t` (by start order), or None."""
        i = bisect.bisect_right(self.starts, t) - 1
        return i if i >= 0 and t <= self.ends[i] else None

    def total(self) -> float:
        return sum(e - s for s, e in zip(self.starts, self.ends, strict=True))


@dataclass(frozen=True)
class Item:
    """One op call (CPU) or one kernel (CUDA): its name, host start and duration, in µs."""

    name: str
    start: float
    duration: float


def ranges(events: Iterable[Any]) -> dict[str, Spans]:
    """Our ranges by name without the prefix: {'forward': Spans, 'scores': Spans, ...}.

    Only the host-side events define a range. On CUDA the profiler also reports each range
    a second time, as a device-side copy (device type CUDA) spanning only the kernels that
    the main thread launched inside it; for backward that is the one fill kernel of
    `loss.backward()` (1 µs), because autograd launches the rest from its own thread. Such a
    copy would overlap the host range and hide it from the search below.
    """
    found: dict[str, list[tuple[float, float]]] = {}
    for e in events:
        if e.name.startswith(RANGE_PREFIX) and _is_cpu(e):
            span = (e.time_range.start, e.time_range.end)
            found.setdefault(e.name[len(RANGE_PREFIX) :], []).append(span)
    return {name: Spans(spans) for name, spans in found.items()}


def _is_cpu(e: Any) -> bool:
    return str(e.device_type).rsplit(".", 1)[-1] == "CPU"


def items(events: Iterable[Any], on_cuda: bool) -> list[Item]:
    """The timed things: kernels with device time on CUDA, ops with self CPU time on CPU."""
    out = []
    for e in events:
        if not _is_cpu(e) or e.is_async:
            continue
        if on_cuda:
            if getattr(e, "is_legacy", False):  # the legacy profiler's per-op totals
                continue
            out += [Item(k.name, e.time_range.start, k.duration) for k in e.kernels]
        elif not (e.name.startswith(RANGE_PREFIX) or getattr(e, "is_user_annotation", False)):
            out.append(Item(e.name, e.time_range.start, e.self_cpu_time_total))
    return out


def summarize(
    events: Iterable[Any], on_cuda: bool, top: int
) -> tuple[list[dict[str, Any]], dict[str, float], dict[str, float]]:
    """(kernel_stats rows, ms per phase, ms per attention part) over all profiled steps.

    Rows, per phase: the `top` names by total time (rank 1 = most), then one `(other)` row
    for the rest, so the shares of a phase sum to 1; where more than one phase ran, the same
    for every phase together under STEP. `share` is of the phase's total: the sum
    of the phase's op self times (CPU) or kernel times (CUDA), not of its wall time. Parts
    count only what ran inside the forward phase (a checkpointed recompute is backward).
    """
    events = list(events)
    spans = ranges(events)
    basis = "cuda" if on_cuda else "cpu"
    per_phase: dict[str, dict[str, list[float]]] = {}  # phase -> name -> [calls, µs]
    parts = {key: 0.0 for key in PARTS if PARTS[key] in spans}
    if "qk" in parts:
        parts["mask"] = 0.0
    user_calls: dict[int, list[Item]] = {}  # forward items by the user's attention call
    for item in items(events, on_cuda):
        phase = next((p for p in PHASES if p in spans and spans[p].contains(item.start)), None)
        if phase is None:
            continue
        acc = per_phase.setdefault(phase, {}).setdefault(item.name, [0, 0.0])
        acc[0] += 1
        acc[1] += item.duration
        if phase == "forward":
            for key in PARTS.keys() & parts.keys():
                if spans[PARTS[key]].contains(item.start):
                    part = _qk_or_mask(item) if key == "qk" else _pv(item) if key == "pv" else key
                    if part is not None:
                        parts[part] += item.duration
            call = spans[USER_ATTENTION].index(item.start) if USER_ATTENTION in spans else None
            if call is not None:
                if USER_SOFTMAX in spans and spans[USER_SOFTMAX].contains(item.start):
                    item = dataclasses.replace(item, name=f"{USER_SOFTMAX}: {item.name}")
                user_calls.setdefault(call, []).append(item)
    for key, us in user_parts(user_calls.values()).items():
        parts[key] = parts.get(key, 0.0) + us

    rows: list[dict[str, Any]] = []
    totals: dict[str, float] = {}
    # every phase together: of a forward-backward point, what nsys_profile (b) asks of
    # "both forward and backward passes" (a train point's has the optimizer's too)
    if len(per_phase) > 1:
        every: dict[str, list[float]] = {}
        for names in per_phase.values():
            for name, (calls, us) in names.items():
                acc = every.setdefault(name, [0, 0.0])
                acc[0] += calls
                acc[1] += us
        per_phase[STEP] = every
    for phase in (*PHASES, STEP):
        names = per_phase.get(phase)
        if not names:
            continue
        total = sum(us for _, us in names.values())
        if phase != STEP:
            totals[phase] = total / 1e3
        ranked = sorted(names.items(), key=lambda kv: (-kv[1][1], kv[0]))
        head, rest = ranked[:top], ranked[top:]
        if rest:
            head.append((OTHER, [sum(c for _, (c, _) in rest), sum(us for _, (_, us) in rest)]))
        for rank, (name, (calls, us)) in enumerate(head, start=1):
            rows.append(
                {
                    "phase": phase,
                    "rank": rank,
                    "name": name,
                    "calls": int(calls),
                    "total_ms": us / 1e3,
                    "mean_ms": us / 1e3 / calls,
                    "share": us / total if total > 0 else 0.0,
                    "time_basis": basis,
                }
            )
    return rows, totals, {key: us / 1e3 for key, us in parts.items()}


def _qk_or_mask(item: Item) -> str:
    """Before the softmax: a matrix multiplication is QKᵀ, any other op the scale and mask."""
    return "qk" if MATMUL.search(item.name) else "mask"


def _pv(item: Item) -> str | None:
    """After the softmax: a matrix multiplication is PV; other ops (copies) are no part."""
    return "pv" if MATMUL.search(item.name) else None


def user_parts(calls: Iterable[list[Item]]) -> dict[str, float]:
    """µs of QKᵀ, its scale and mask, softmax and PV over the user's attention calls, each
    call's items split at its softmax; a call without a softmax op is not split. After the
    softmax only the matrix multiplications count (PV), as for naive attention."""
    out = dict.fromkeys(PART_KEYS, 0.0)
    split = False
    for call in calls:
        ordered = sorted(call, key=lambda i: i.start)
        soft = [n for n, i in enumerate(ordered) if SOFTMAX.search(i.name)]
        if not soft:
            continue
        split = True
        for n, item in enumerate(ordered):
            key = _qk_or_mask(item) if n < soft[0] else _pv(item) if n > soft[-1] else "softmax"
            if key is not None:
                out[key] += item.duration
    return out if split else {}


def matmul_shares(events: Iterable[Any], on_cuda: bool) -> dict[str, float]:
    """Per phase, the share of its op self time (CPU) or kernel time (CUDA) spent in matrix
    multiplications (MATMUL), and under "step" the share over every phase: what
    nsys_profile (d) asks of a forward and of a whole training step, whose optimizer adds
    element-wise kernels only (docs/experiments/profile.md: a tiny CPU step, forward 81 %,
    backward 79 %, step 45 %)."""
    events = list(events)
    spans = ranges(events)
    total: dict[str, float] = {}
    matmul: dict[str, float] = {}
    for item in items(events, on_cuda):
        phase = next((p for p in PHASES if p in spans and spans[p].contains(item.start)), None)
        if phase is None:
            continue
        total[phase] = total.get(phase, 0.0) + item.duration
        if MATMUL.search(item.name):
            matmul[phase] = matmul.get(phase, 0.0) + item.duration
    shares = {p: matmul.get(p, 0.0) / t for p, t in total.items() if t > 0}
    if shares:
        shares["step"] = sum(matmul.values()) / sum(total.values())
    return shares
