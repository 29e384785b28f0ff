"""Run a function on N ranks: spawned locally, or joined under torchrun.

    results = launch(worker, world_size=2, args=(spec,))   # spawn 2 local processes
    def worker(ctx: RankContext, spec): ...                 # runs on every rank

Locally, `launch` spawns `world_size` processes that meet on a free port of 127.0.0.1 through
env:// rendezvous (Gloo on CPU; NCCL on CUDA with one GPU per rank). Under torchrun (RANK,
WORLD_SIZE and LOCAL_RANK set, see `under_torchrun`) it joins the existing group instead and
runs the function in this very process: the same command works on a laptop and across nodes.

Failure is loud and fast: a rank that raises ends the run with a WorkerError that carries
its traceback (of ranks that raise within a second, the one whose error names the user's
code: rank_results.py); the other ranks, probably blocked in a collective, are killed
rather than left to time out, and every worker is reaped, also on Ctrl-C. A rank that dies
without reporting (an abort) is reported with its last words on stderr (rank_stderr.py).
The process-group timeout is the backstop where nothing can kill the peers (ranks on other
nodes).

Rank 0 streams results to the caller with `ctx.emit(obj)` while the run goes on, so rows can
be stored as each point finishes (docs/architecture.md); `on_emit` receives them in the parent.
Return and emit plain Python values or numpy arrays, not tensors: torch shares CPU tensors
between processes through file descriptors that vanish when the rank exits.
"""

from __future__ import annotations

import faulthandler
import os
import socket
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from cs336sys.measure.lifetime import end_with_parent
from cs336sys.parallel import fork_server
from cs336sys.parallel.rank_results import DEFAULT_TIMEOUT_S, collect
from cs336sys.parallel.rank_results import WorkerError as WorkerError  # its name here too
from cs336sys.parallel.rank_stderr import RankStderr, redirect
from cs336sys.parallel.world_size import check_world_size

BACKENDS = ("gloo", "nccl")
_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass
class RankContext:
    """What a worker needs to know about its place in the group."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: str  # "cpu" or "cuda:<local_rank>"
    _emit: Callable[[Any], None] | None = field(default=None, repr=False)

    def emit(self, obj: Any) -> None:
        """Send a picklable object to the caller's `on_emit`; only rank 0's are delivered."""
        if self.rank == 0 and self._emit is not None:
            self._emit(obj)


def under_torchrun() -> bool:
    """True when torchrun (or any env:// launcher) started this process as one rank."""
    return all(v in os.environ for v in _TORCHRUN_VARS)


def default_backend(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port of `host` (IPv4, or IPv6 with a colon) that was free a moment ago (the
    OS picks it)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def timeout_s() -> float:
    """The process-group timeout: CS336SYS_DIST_TIMEOUT seconds, or DEFAULT_TIMEOUT_S.
    ValueError, in one sentence, for anything but a positive finite number."""
    text = os.environ.get("CS336SYS_DIST_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT_S
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    # at most a year: 1e15 passed and every point failed (OverflowError inside torch)
    if not (0 < value <= MAX_TIMEOUT_S):
        raise ValueError(f"CS336SYS_DIST_TIMEOUT must be a positive number of seconds (at most "
                         f"{MAX_TIMEOUT_S:,}), got {text!r}")
    return value


MAX_TIMEOUT_S = 365 * 24 * 3600


def launch(
    fn: Callable[..., Any],
    world_size: int,
    backend: str = "gloo",
    args: tuple = (),
    on_emit: Callable[[Any], None] | None = None,
    preload: tuple[str, ...] | None = None,
) -> list[Any]:
    """Run `fn(ctx, *args)` on every rank; return the list of the ranks' return values.

    Under torchrun the list holds only this rank's value, and `world_size` must match the
    group torchrun made. `fn` must be importable by name (a module-level function), because
    spawned workers import it afresh. `preload`: the modules the fork server imports once
    for every rank (default fork_server.TRAINING_PRELOAD: torch and dynamo).
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    if under_torchrun():
        return [_join_torchrun(fn, world_size, backend, args, on_emit)]
    check_world_size(world_size, backend)
    preload = preload or fork_server.TRAINING_PRELOAD
    return _spawn(fn, world_size, backend, args, on_emit, preload)


# -- under torchrun ---------------------------------------------------------------------------


def _join_torchrun(fn, world_size, backend, args, on_emit):
    import torch.distributed as dist

    rank = int(os.environ["RANK"])
    ws = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ["LOCAL_RANK"])
    if world_size != ws:
        raise ValueError(f"torchrun started {ws} ranks but world size {world_size} was asked")
    created = not dist.is_initialized()
    die_with_parent(os.getppid())  # torchrun's agent: its ranks end with it
    ctx = _init(rank, ws, local_rank, backend, on_emit)
    try:
        return fn(ctx, *args)
    finally:
        if created:
            dist.destroy_process_group()


def _init(rank, world_size, local_rank, backend, emit) -> RankContext:
    import torch
    import torch.distributed as dist

    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = f"cuda:{local_rank}"
    if not dist.is_initialized():
        dist.init_process_group(
            backend,
            rank=rank,
            world_size=world_size,
            timeout=timedelta(seconds=timeout_s()),
        )
    return RankContext(rank, world_size, local_rank, backend, device, emit)


# -- local spawn ------------------------------------------------------------------------------
#
# Each rank reports on a pipe of its own. A multiprocessing.Queue would need named semaphores,
# which the resource tracker reports as leaked when the parent is killed; a pipe needs none,
# and a rank that dies closes its end, which the parent sees at once.


_WATCHED: int | None = None  # the parent this process already dies with


def die_with_parent(parent: int) -> None:
    """End this process when `parent` ends, also when the parent is SIGKILLed: a rank must
    never outlive the command that started it (docs/distributed.md, "No rank outlives its
    command"). `parent` is the command's pid; a rank forked by the fork server has the server
    as its parent process, which outlives the command by its own shutdown.

    Linux delivers SIGKILL at the death of the process that started this one (prctl
    PR_SET_PDEATHSIG); and a daemon thread watches `parent` itself, dead once it is gone or
    a zombie waiting to be reaped.
    """
    import threading
    import time

    global _WATCHED
    if _WATCHED == parent:
        return
    _WATCHED = parent
    end_with_parent()

    def watch() -> None:
        while _alive(parent):
            time.sleep(0.5)
        os._exit(1)

    if not _alive(parent):  # gone already
        os._exit(1)
    threading.Thread(target=watch, name="cs336sys-parent-watch", daemon=True).start()


def _alive(pid: int) -> bool:
    """Whether process `pid` runs: it exists and (where /proc says) is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except FileNotFoundError:
        if os.path.isdir("/proc/self"):
            return False
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _name_process(name: str) -> None:
    """The name `ps`, `top` and /proc/PID/comm show for this process (Linux; 15 bytes)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):  # not Linux
        pass


def _worker(fn, rank, world_size, backend, port, args, conn, parent, env, stderr) -> None:
    """Entry point of a started rank: set up the group, run, report, tear down."""
    redirect(stderr)  # first: an abort's message is all a rank that dies of one leaves
    faulthandler.enable()  # a crash's stack too, onto that file (its last words: rank_stderr)
    # The parent's environment as it is now: a rank forked from the fork server would have
    # the server's, from when the server started (the user code's variables, say).
    os.environ.clear()
    os.environ.update(env)
    _name_process(f"cs336sys-rank{rank}")
    fork_server.unblock_sigint()  # blocked where the fork server forked this rank
    die_with_parent(parent)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
    )
    try:
        import torch

        if backend == "gloo":
            # Ranks share the host's cores: without this each would start one thread per core
            # and they would fight over them, which distorts every timing.
            torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
        ctx = _init(rank, world_size, rank, backend, lambda obj: conn.send(("emit", obj)))
        value = fn(ctx, *args)
        conn.send(("done", value))
    except BaseException as exc:  # report everything, Ctrl-C included, then die
        try:
            where = getattr(exc, "cs336sys_where", None)  # the user's file:line (sweep/ranks)
            said = f"{type(exc).__name__}: {exc}"
            conn.send(("error", (f"{where}: {said}" if where else said, traceback.format_exc(),
                                 getattr(exc, "cs336sys_status", None), where)))
        except OSError:  # the parent is gone
            pass
        return
    try:
        import torch.distributed as dist

        # every rank past its set-up before any leaves: a rank that exits while another is
        # still connecting Gloo's mesh failed that one ("connectFullMesh failed ... Connection
        # closed by peer", seen on a loaded machine); a peer gone already ends it at once
        dist.barrier()
        dist.destroy_process_group()
    except Exception:  # the parent has the result already; teardown noise is not news
        pass


# How ranks start (CS336SYS_START_METHOD): `forkserver` (the default) forks each rank from a
# server process that has imported torch once, so a rank starts in a fraction of a second
# instead of the 2-3 s of CPU that importing torch takes; `spawn` starts a fresh interpreter
# per rank, the readable fallback. Neither forks the command itself, which may hold CUDA or
# threads (https://docs.python.org/3/library/multiprocessing.html#contexts-and-start-methods).
START_METHODS = ("forkserver", "spawn")


def start_method_problem() -> str | None:
    """Why CS336SYS_START_METHOD cannot be used, in one line, or None; checked before any
    point runs (it was a traceback from the sweep, invocations left behind)."""
    method = os.environ.get("CS336SYS_START_METHOD", "forkserver")
    if method not in START_METHODS:
        return (f"CS336SYS_START_METHOD must be {' or '.join(START_METHODS)} (or unset), "
                f"got {method!r}")
    return None


def _context():
    import multiprocessing as mp

    problem = start_method_problem()
    if problem:
        raise ValueError(problem)
    return mp.get_context(os.environ.get("CS336SYS_START_METHOD", "forkserver"))


@contextmanager
def started_early(preload: tuple[str, ...] | None = None) -> Iterator[None]:
    """The fork server started now, for the launches to come in this block: its imports
    (torch, dynamo) then run beside the command's own instead of after them, and the first
    launch finds it ready. A server it started is stopped again where the block ends in an
    exception (bad input, a signal) or launched nothing (every point resumed), so that none
    is left importing torch behind the command, holding its output open. Nothing is started
    under torchrun, with CS336SYS_START_METHOD=spawn, or where this process has imported
    torch already (a command run in-process after another): there is no import to overlap,
    and the first launch starts the server as it would."""
    if (under_torchrun() or os.environ.get("CS336SYS_START_METHOD", "forkserver") != "forkserver"
            or not _torch_ahead()):
        yield
        return
    before, launches = fork_server.server_pid(), _launches
    try:
        # in the try: a Ctrl-C during the start is raised once the server's pid is known
        fork_server.start(_context(), preload or fork_server.TRAINING_PRELOAD)
        yield
    except BaseException:
        if fork_server.server_pid() != before:
            fork_server.stop()
        raise
    if fork_server.server_pid() != before and _launches == launches:
        fork_server.stop()


_launches = 0  # local launches by this process (started_early: whether its server served)


def _torch_ahead() -> bool:
    """Whether this process has torch still to import (started_early)."""
    return "torch" not in sys.modules


def _spawn(fn, world_size, backend, args, on_emit, preload) -> list[Any]:
    global _launches
    ctx = _context()
    _launches += 1
    port = free_port()
    pipes = [ctx.Pipe(duplex=False) for _ in range(world_size)]  # (parent's end, rank's end)
    stderr = RankStderr(world_size)
    procs = [
        ctx.Process(
            target=_worker,
            args=(fn, rank, world_size, backend, port, args, pipes[rank][1], os.getpid(),
                  dict(os.environ), stderr.paths[rank]),
            daemon=True,
            name=f"cs336sys-rank{rank}",
        )
        for rank in range(world_size)
    ]
    finished = stopped = False
    try:
        if ctx.get_start_method() == "forkserver":
            fork_server.start(ctx, preload)
        for p, (_, end) in zip(procs, pipes, strict=True):
            p.start()
            end.close()  # the rank holds it now: its death closes the pipe
        results = collect(procs, [r for r, _ in pipes], on_emit, stderr)
        finished = True
        return results
    except BaseException as exc:
        stopped = not isinstance(exc, Exception)  # a signal (sweep/stopping.py): the command ends
        raise
    finally:
        # After a failure or a signal the others are likely blocked in a collective: kill
        # them now rather than wait for the group timeout.
        _reap(procs, grace_s=10.0 if finished else 0.0)
        for r, _ in pipes:
            r.close()
        stderr.close()
        if stopped:
            fork_server.stop()


def _reap(procs, grace_s: float) -> None:
    """Leave no worker behind: wait up to `grace_s`, then terminate, then kill; reap all."""
    for p in procs:
        if p.pid is not None and grace_s > 0:
            p.join(timeout=grace_s)
    for p in procs:
        if p.is_alive():
            p.terminate()
    for p in procs:
        if p.pid is not None:
            p.join(timeout=5.0)
            if p.is_alive():
                p.kill()
                p.join()
