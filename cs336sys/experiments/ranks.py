"""What every distributed experiment does on its ranks: run the points of a sweep in one
process group and summarise per-rank measurements over ranks.

`serve` is the worker body handed to the launcher: it runs each point on every rank (the
ranks stay in lock-step because they run the same points in the same order) and rank 0
emits `(index, started, Result)` as each point finishes, so the caller stores it at once.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

from cs336sys.bench.result import Result


def serve(ctx: Any, specs: Sequence[Any], point: Callable[[Any, Any], Result]) -> None:
    from cs336sys.store.db import now

    for index, spec in enumerate(specs):
        started = now()
        t0 = time.perf_counter()
        result = point(ctx, spec)
        result.duration_s = time.perf_counter() - t0
        ctx.emit((index, started, result))


def gather(value: Any) -> list[Any]:
    """Every rank's `value`, in rank order, on every rank."""
    import torch.distributed as dist

    out: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, value)
    return out


def over_ranks(prefix: str, per_rank: Sequence[float]) -> dict[str, float]:
    """{'<prefix>_mean', '_min', '_max'} of one number per rank (e.g. each rank's mean time)."""
    return {
        f"{prefix}_mean": statistics.fmean(per_rank),
        f"{prefix}_min": min(per_rank),
        f"{prefix}_max": max(per_rank),
    }
