"""NVTX ranges that cost nothing unless a profiling run asks for them.

The model and the attention functions mark their phases with `nvtx_range("attention")` etc.
so that an Nsight Systems timeline shows where a step's time goes. Pushing a range is a host
call per module per step, so it is off by default and a benchmark turns it on only for
profiling runs:

    with nvtx_enabled(True):
        loss = model(x).sum()

The switch is a ContextVar rather than a global so that concurrent runs (threads, tests) do
not flip each other's setting. On machines without CUDA every range is a no-op.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_NVTX_ENABLED: contextvars.ContextVar[bool] = contextvars.ContextVar(
    "cs336sys_nvtx_enabled", default=False
)


@contextmanager
def nvtx_enabled(flag: bool = True) -> Iterator[None]:
    """Turn NVTX ranges on (or off) for the code run inside this block."""
    token = _NVTX_ENABLED.set(bool(flag))
    try:
        yield
    finally:
        _NVTX_ENABLED.reset(token)


@contextmanager
def nvtx_range(name: str) -> Iterator[None]:
    """An NVTX range named `name` when enabled and CUDA is available, else nothing."""
    # While torch.compile traces, skip the ContextVar lookup entirely so that the range
    # never causes a graph break; compiled regions are profiled as one kernel group anyway.
    if not torch.compiler.is_compiling() and _NVTX_ENABLED.get() and torch.cuda.is_available():
        with torch.cuda.nvtx.range(name):
            yield
    else:
        yield
