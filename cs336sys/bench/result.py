"""The Result of one sweep point, and the guard that turns exceptions into Results.

Out-of-memory is a result, not a crash (docs/architecture.md): the point gets status `oom` and the sweep
goes on; any other exception becomes status `error` with its message. KeyboardInterrupt is
not caught, so Ctrl-C still stops a sweep (rows already written stay).
"""

from __future__ import annotations

import gc
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


class Terminated(BaseException):
    """This process was asked to stop: SIGTERM, which `timeout`, `kill`, Slurm and `docker
    stop` send. A BaseException like KeyboardInterrupt, so that no point turns it into a row
    and the sweep goes on: it unwinds the sweep, whose finally blocks reap the ranks and
    store the interrupted point."""


def stop_on_sigterm() -> None:
    """From now on SIGTERM raises Terminated in the main thread (the CLI calls this; Python's
    default would end the process at once, leaving its ranks running)."""
    import signal

    def handler(signum: int, frame: object) -> None:
        raise Terminated(f"terminated by signal {signum} (SIGTERM)")

    signal.signal(signal.SIGTERM, handler)


@dataclass
class Result:
    status: str  # ok | oom | error | skipped
    metrics: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] | None = None
    error: str | None = None
    # When the point started (bench.clock.now) and how long it took; the sweep runner
    # stamps both where the experiment did not.
    started: str | None = None
    duration_s: float | None = None
    # Rows for tables linked to the run, by table name (a profile's `kernel_stats`).
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


_OOM_MARKERS = (
    "out of memory",  # CUDA: "CUDA out of memory. Tried to allocate ..."
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
    "not enough memory",
)


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def free_memory() -> None:
    """Give back what a failed point held, so the next point starts clean."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


def guarded(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """Run one point; never raises except KeyboardInterrupt, Terminated and SystemExit."""
    t0 = time.perf_counter()
    try:
        result = fn(*args, **kwargs)
    except Exception as exc:  # noqa: BLE001 - every failure becomes a stored row
        message = str(exc).strip()
        first_line = f"{type(exc).__name__}: {message.splitlines()[0] if message else ''}"
        if is_oom(exc):
            result = Result("oom", error=first_line)
        else:
            tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            result = Result("error", error=first_line + "\n\n" + tb)
    # Every point hands its memory back so the next one starts from an empty cache (a large
    # point after a small one must not OOM on the small one's leftovers). Only here, after the
    # except block, are a failed point's exception, traceback, frames and tensors gone.
    free_memory()
    result.duration_s = time.perf_counter() - t0
    return result
