"""What the distributed commands (`comm`, `ddp`) share: backend and world-size checks, rank-0
recording, and running a sweep as one process group per world size.

Locally each world size is one launch (spawned ranks); under torchrun the command is already
one of the ranks and joins the group torchrun made. Only rank 0 writes rows (DESIGN.md).
A failed point ends its group: it is stored (`oom` or `error`, with the failing rank's
traceback) and a fresh group runs the points that remain.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from cs336sys.cli.common import fail, positive_ints, recording


def torchrun_rank() -> int | None:
    """This process's rank when torchrun started it, else None (no torch import)."""
    from cs336sys.parallel.launcher import under_torchrun

    return int(os.environ["RANK"]) if under_torchrun() else None


def resolve_backend(backend: str | None, device: str) -> tuple[str, str]:
    """(backend, device) from the options: NCCL needs CUDA, Gloo runs on CPU tensors."""
    from cs336sys.bench.device import resolve_device
    from cs336sys.parallel.launcher import BACKENDS, default_backend

    try:
        dev = resolve_device(device)
    except ValueError as exc:
        fail(exc)
    if backend is None:
        backend = default_backend(dev)
    if backend not in BACKENDS:
        fail(f"--backend: unknown value {backend!r}; choose from {', '.join(BACKENDS)}")
    if backend == "nccl" and not dev.startswith("cuda"):
        fail("--backend nccl needs CUDA GPUs (one per rank); use --backend gloo on CPU")
    if backend == "gloo":
        dev = "cpu"  # Gloo here moves CPU tensors; GPU collectives are NCCL's job
    return backend, "cuda" if dev.startswith("cuda") else "cpu"


def world_sizes(values: Sequence[str] | None, backend: str, default: Sequence[int]) -> list[int]:
    """The --world-size list: under torchrun its world; defaults capped at what the host runs."""
    from cs336sys.parallel.launcher import check_world_size, max_local_world_size

    given = positive_ints(values, "--world-size")
    if torchrun_rank() is not None:
        ws = int(os.environ["WORLD_SIZE"])
        if given and given != [ws]:
            fail(f"--world-size {','.join(map(str, given))}: torchrun started {ws} ranks")
        return [ws]
    cap = max_local_world_size("cuda" if backend == "nccl" else "cpu")
    if not given:
        given = [w for w in default if w <= cap] or [min(default)]
    for w in given:
        try:
            check_world_size(w, backend)
        except ValueError as exc:
            fail(f"--world-size: {exc}")
    return given


class _RankNRecorder:
    """Ranks other than 0 under torchrun measure but never write."""

    errors = 0

    def pending(self, experiment: str, specs: list, resume: bool) -> list:
        return specs

    def add(self, *args: Any, **kwargs: Any) -> None:
        return None


@contextmanager
def rank0_recording(db: Path, command: str, device: str, resume: bool) -> Iterator[Any]:
    rank = torchrun_rank()
    if rank is not None and resume:
        # Ranks must run identical point lists; only rank 0 can read its store.
        fail("--resume is not supported under torchrun")
    if rank:
        yield _RankNRecorder()
        return
    with recording(db, command, device) as rec:
        yield rec


def run_groups(
    rec: Any,
    experiment: str,
    groups: dict[int, list],
    worker: Callable[..., Any],
    backend: str,
) -> list[tuple[Any, Any]]:
    """Run each world size's specs in one process group; store each result as it arrives."""
    from cs336sys.bench.result import Result, is_oom
    from cs336sys.parallel.launcher import WorkerError, launch
    from cs336sys.store.db import now

    results: list[tuple[Any, Any]] = []
    total = sum(len(s) for s in groups.values())
    show = torchrun_rank() in (None, 0)
    with typer.progressbar(length=total, label=experiment, file=_stderr(show)) as bar:
        for ws, specs in groups.items():
            todo = list(specs)
            while todo:
                done: list[int] = []

                def store(message, todo=todo, done=done):
                    index, started, result = message
                    rec.add(experiment, todo[index].settings(), result, started)
                    results.append((todo[index], result))
                    done.append(index)
                    bar.update(1)

                started = now()
                try:
                    launch(worker, ws, backend, args=(todo,), on_emit=store)
                    todo = []
                except WorkerError as exc:
                    failed = todo[len(done)]
                    status = "oom" if is_oom(exc) else "error"
                    result = Result(status, error=f"{exc}\n{exc.traceback}".strip())
                    rec.add(experiment, failed.settings(), result, started)
                    results.append((failed, result))
                    bar.update(1)
                    todo = todo[len(done) + 1 :]
                except Exception as exc:
                    if torchrun_rank() is None:
                        raise
                    # Under torchrun the group is torchrun's and cannot be rebuilt without the
                    # failed rank: rank 0 stores the point it failed on, then the run ends.
                    failed = todo[len(done)]
                    status = "oom" if is_oom(exc) else "error"
                    text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}".strip()
                    rec.add(experiment, failed.settings(), Result(status, error=text), started)
                    raise
    return results


def _stderr(show: bool):
    import sys

    return sys.stderr if show else open(os.devnull, "w")  # noqa: SIM115
