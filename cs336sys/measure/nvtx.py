"""NVTX ranges that cost nothing unless a profiling run asks for them.

The model and the attention functions mark their phases with `nvtx_range("attention")` etc.
so that an Nsight Systems timeline shows where a step's time goes. Pushing a range is a host
call per module per step, so it is off by default and a benchmark turns it on only for
profiling runs:

    with nvtx_enabled(True):
        loss = model(x).sum()

The switch is a ContextVar rather than a global so that concurrent runs (threads, tests) do
not flip each other's setting. On machines without CUDA every range is a no-op.

`CS336SYS_NVTX=1` in the environment turns them on for the whole process and the ranks it
starts: `--nsys` runs each point so (measure/nsys.py). The steps a benchmark times sit inside
one range, MEASURED_RANGE (`measured()`), which `nsys --capture-range=nvtx` records alone.

`profiler_ranges(True)` makes the same ranges visible to torch.profiler as well, as
`record_function("cs336sys::<name>")` on any device: `cs336sys profile` uses them to split a
step into phases and naive attention into QKᵀ, softmax and PV. Off by default, so nothing
changes (and nothing is paid) outside profiling runs.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from cs336sys.measure.nsys import MEASURED_RANGE, nvtx_asked

_NVTX_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cs336sys_nvtx_enabled", default=False
)
_PROFILER_RANGES: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cs336sys_profiler_ranges", default=False
)
# CS336SYS_NVTX=1: on in this whole process (read once: the ranks it forks inherit it)
_ASKED = nvtx_asked()
# Prefix of the record_function names, so a profile can tell our ranges from torch's ops.
RANGE_PREFIX = "cs336sys::"


@contextmanager
def _switched(var: contextvars.ContextVar[bool], flag: bool) -> Iterator[None]:
    token = var.set(bool(flag))
    try:
        yield
    finally:
        var.reset(token)


def nvtx_enabled(flag: bool = True) -> contextlib.AbstractContextManager[None]:
    """Turn NVTX ranges on (or off) for the code run inside this block."""
    return _switched(_NVTX_ENABLED, flag)


def nvtx_on() -> bool:
    """Whether NVTX ranges are asked for here (`nvtx_enabled`, or CS336SYS_NVTX=1)."""
    return _ASKED or _NVTX_ENABLED.get()


def profiler_ranges(flag: bool = True) -> contextlib.AbstractContextManager[None]:
    """Also mark every `nvtx_range` as a torch.profiler range (`cs336sys::<name>`) in here."""
    return _switched(_PROFILER_RANGES, flag)


def _cuda() -> bool:
    """Whether NVTX ranges can reach a profiler: CUDA's NVTX needs CUDA."""
    return torch.cuda.is_available()


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range named `name` when enabled and CUDA is available, else nothing.

    Inside `profiler_ranges(True)` it is also a torch.profiler range `cs336sys::<name>`.
    """
    # While torch.compile traces, skip the ContextVar lookup entirely so that the range
    # never causes a graph break; compiled regions are profiled as one kernel group anyway.
    if torch.compiler.is_compiling():
        yield
        return
    record = _PROFILER_RANGES.get()
    nvtx = nvtx_on() and _cuda()
    if not (record or nvtx):
        yield
        return
    with contextlib.ExitStack() as stack:
        if record:
            stack.enter_context(torch.profiler.record_function(RANGE_PREFIX + name))
        if nvtx:
            stack.enter_context(torch.cuda.nvtx.range(name))
        yield


def measured() -> contextlib.AbstractContextManager[None]:
    """The range around the steps a benchmark times (MEASURED_RANGE), that nsys captures."""
    return nvtx_range(MEASURED_RANGE)
