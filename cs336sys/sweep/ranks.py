"""What every distributed experiment does on its ranks: run the points of a sweep in one
process group and summarise per-rank measurements over ranks.

`serve` is the worker body the sweep runner's `process_groups` hands to the launcher: it
runs each point on every rank (the ranks stay in lock-step because they run the same points
in the same order) and rank 0 emits `(index, Result)` as each point finishes, so the caller
stores it at once. `backend_and_device` and `world_sizes` validate a distributed sweep's
options the same way for every command.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from typing import Any

from cs336sys.measure.clock import now
from cs336sys.measure.progress import hooked, on_step
from cs336sys.parallel.launcher import BACKENDS, default_backend, timeout_s, under_torchrun
from cs336sys.parallel.world_size import check_world_size, max_local_world_size
from cs336sys.sweep import torch_state
from cs336sys.sweep.points import SpecError, device_choice, positive_ints, unknown
from cs336sys.sweep.result import Result, is_oom, unwritten, user_frame

# Rank 0 tells the parent how far a point has got at most this often (and at its last step).
STEP_EVERY_S = 0.5


def serve(ctx: Any, specs: Sequence[Any], run: Callable[[Any, Any], Result]) -> None:
    """On every rank: `run(ctx, spec)` for each spec in order; rank 0 emits each Result, and
    `("step", index, done, total)` as the point's steps go by when the parent listens to
    steps through a pipe (a spawned rank; under torchrun rank 0 reports them itself)."""
    forward = ctx.rank == 0 and not hooked()
    for index, spec in enumerate(specs):
        last = [0.0]

        def step(done: int, total: int, _point: Any, index: int = index, last: list = last) -> None:
            if done == total or time.monotonic() - last[0] >= STEP_EVERY_S:
                last[0] = time.monotonic()
                ctx.emit(("step", index, done, total))

        started = now()
        t0 = time.perf_counter()
        try:
            # a switch of torch's the code under test turned is not the next point's
            with on_step(step) if forward else contextlib.nullcontext(), \
                    torch_state.kept() as changed:
                result = run(ctx, spec)
        except BaseException as exc:  # (a KeyboardInterrupt the code raised, a Cancelled...)
            # the rank's failure names the user's file and line first, as a point's error
            # does in one process (the launcher reads it: parallel must not import sweep)
            exc.cs336sys_where = user_frame(exc)
            if isinstance(exc, SystemExit) and exc.cs336sys_where:  # said as guarded says it
                exc.args = (f"it called sys.exit({exc.code!r}), which would have ended the "
                            f"command",)
            if unwritten(exc):  # a hook of the handout's left a stub: skipped, as in one process
                exc.cs336sys_status = "skipped"
            elif is_oom(exc):  # numpy's MemoryError too, which the parent sees only as text
                exc.cs336sys_status = "oom"
            raise
        if changed and ctx.rank == 0:  # said once, as guarded says it in one process
            print(torch_state.said(changed), file=sys.stderr)
        result.started = started
        result.duration_s = time.perf_counter() - t0
        ctx.emit((index, result))


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


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it, else None (no torch import)."""
    return int(os.environ["RANK"]) if under_torchrun() else None


def backend_and_device(backend: str | None, device: str) -> tuple[str, str]:
    """(backend, device) from the options: NCCL needs CUDA, Gloo runs on CPU tensors."""
    try:
        timeout_s()  # checked here, before any rank starts
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    dev = device_choice(device)
    if backend is None:
        backend = default_backend(dev)
    if backend not in BACKENDS:
        raise unknown("--backend", backend, BACKENDS)
    if backend == "nccl" and not dev.startswith("cuda"):
        raise SpecError("--backend nccl needs CUDA GPUs (one per rank); use --backend gloo on CPU")
    if backend == "gloo":
        dev = "cpu"  # Gloo here moves CPU tensors; GPU collectives are NCCL's job
    return backend, "cuda" if dev.startswith("cuda") else "cpu"


def world_sizes(values: Iterable[Any] | None, backend: str, default: Sequence[int]) -> list[int]:
    """The --world-size list: under torchrun its world; defaults capped at what the host runs."""
    given = positive_ints(values, "--world-size")
    if torchrun_rank() is not None:
        ws = int(os.environ["WORLD_SIZE"])
        if given and given != [ws]:
            raise SpecError(f"--world-size {','.join(map(str, given))}: torchrun started {ws} ranks")
        return [ws]
    cap = max_local_world_size("cuda" if backend == "nccl" else "cpu")
    if not given:
        given = [w for w in default if w <= cap] or [min(default)]
    for w in given:
        try:
            check_world_size(w, backend)
        except ValueError as exc:
            raise SpecError(f"--world-size: {exc}") from None
    return given
