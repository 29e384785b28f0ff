"""The ranks' side of a launch, as the parent reads it: each rank's value through its pipe,
rank 0's emits as they come, and, where the run fails, which rank to blame and in what words
(a WorkerError): a rank that ended without reporting is named with how it ended and its last
words on stderr (rank_stderr.py); of the errors ranks report, the one that names the user's
code comes first, the others being, most often, what its failure did to them.
"""

from __future__ import annotations

from typing import Any

from cs336sys.parallel.rank_stderr import RankStderr


class WorkerError(RuntimeError):
    """A rank failed. `rank` is the rank blamed (`collect`), `traceback` its traceback."""

    def __init__(self, rank: int, message: str, tb: str, pids: list[int] | None = None,
                 status: str | None = None):
        super().__init__(f"rank {rank} failed: {message}")
        self.rank = rank
        self.traceback = tb
        self.pids = pids or []
        self.message = message
        self.status = status  # how the rank's code says to store the point (sweep/ranks)


# After a rank's error, how long the other ranks have to report theirs: the cause may be a
# peer's (a timeout in the student's code on rank 0) while this rank only saw its connection
# close (Gloo's "Connection closed by peer", raised in cs336sys's own collective), and
# whichever pipe was read first was blamed.
GRACE_S = 1.0
# What a rank sees of a peer that failed or gave up: never the cause while another rank's
# error is something else (a rank-0-only broadcast blamed the peer's wait, not the timeout).
CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer")
# How long a collective may block before the group gives up (launcher.timeout_s).
# Generous, because a 1 GB all-reduce over Gloo on a laptop takes seconds; override with
# CS336SYS_DIST_TIMEOUT.
DEFAULT_TIMEOUT_S = 300.0
# A collective that timed out: said with its likely cause in the user's distributed code.
TIMED_OUT = ("Timed out waiting", "collective operation timeout")
TIMEOUT_HINT = (" (a collective waited the process group's timeout, CS336SYS_DIST_TIMEOUT "
                f"seconds, {DEFAULT_TIMEOUT_S:g} by default, for a rank that never joined it: "
                "do all ranks call the same collectives, in the same order?)")


def collect(procs, conns, on_emit, stderr: RankStderr) -> list[Any]:
    """Every rank's returned value, in rank order, rank 0's emits handed to `on_emit` as they
    come. Where a rank fails, a WorkerError: a rank that ended without reporting, or, of the
    errors the ranks report within GRACE_S of the first, the first that names the user's
    code (its file and line) and is no peer's lost connection, else the first that names
    it, else the first; a timeout with its likely cause."""
    import time
    from multiprocessing.connection import wait

    results: dict[int, Any] = {}
    errors: dict[int, tuple] = {}  # rank: (message, traceback, status, where), as reported
    pids = [p.pid for p in procs]
    rank_of = {id(c): rank for rank, c in enumerate(conns)}
    open_ = list(conns)
    deadline = None
    while len(results) + len(errors) < len(procs) and open_:
        left = 0.5 if deadline is None else deadline - time.monotonic()
        if left <= 0:
            break
        ready = wait(open_, timeout=min(0.5, left))
        stderr.copy()
        for conn in ready:
            rank = rank_of[id(conn)]
            try:
                kind, payload = conn.recv()
            except (EOFError, OSError):  # the rank ended
                open_.remove(conn)
                if rank not in results and rank not in errors and not errors:
                    procs[rank].join(timeout=1.0)
                    said, tail = _unreported(procs, rank, stderr)
                    raise WorkerError(rank, said, tail, pids) from None
                continue
            if kind == "emit":
                if on_emit is not None and rank == 0:
                    on_emit(payload)
            elif kind == "done":
                results[rank] = payload
            else:
                errors[rank] = payload
                deadline = deadline or time.monotonic() + GRACE_S
    if not errors:
        return [results[r] for r in range(len(procs))]
    first = next(iter(errors))
    # Rank 0 may have finished (and emitted) the point before this one after a rank already
    # failed: pipes of different ranks are not ordered. Deliver what it still has on its way.
    if 0 not in errors and 0 not in results:
        _drain(conns[0], on_emit)
    dead = _silently_dead(procs, reported={*results, *errors})
    if dead is not None:
        # A peer that vanished is the cause; the ranks that reported saw their connection drop.
        said, tail = _unreported(procs, dead, stderr)
        raise WorkerError(dead, f"{said} (rank {first} then failed: {errors[first][0]})",
                          tail or errors[first][1], pids)
    named = [r for r, e in errors.items() if e[3]]  # in the user's code
    causes = [r for r in named if not any(c in errors[r][0] for c in CONSEQUENCES)]
    chosen = (causes or named or [first])[0]
    message, tb, status, _ = errors[chosen]
    if any(t in message for t in TIMED_OUT):
        message += TIMEOUT_HINT
    raise WorkerError(chosen, message, tb, pids, status)


def _unreported(procs, rank: int, stderr: RankStderr) -> tuple[str, str]:
    """Why rank `rank` ended without reporting, in one line, and its stderr's last lines."""
    line, tail = stderr.last_words(rank)
    said = f"process {_ended(procs[rank].exitcode)} without reporting"
    return (f"{said}; its last words on stderr: {line}" if line else said), tail


def _ended(exitcode: int | None) -> str:
    """How a rank's process ended, in words: a SIGKILL is named with its usual cause here,
    the kernel's OOM killer (every local rank's buffers share this host's memory), a
    SIGABRT with its own (Gloo's checks and NCCL's watchdog end a process so)."""
    if exitcode == -9:
        return ("was killed by SIGKILL, most often the operating system's OOM killer: the "
                "ranks together needed more of this host's memory than it has")
    if exitcode == -6:
        return "aborted (SIGABRT: a C++ exception nothing caught, or a failed check)"
    if exitcode is not None and exitcode < 0:
        import signal

        try:
            return f"was killed by {signal.Signals(-exitcode).name}"
        except ValueError:
            pass
    return f"exited with code {exitcode}"


def _drain(conn, on_emit, quiet_s: float = 0.3, limit_s: float = 3.0) -> None:
    """Hand rank 0's emits still in its pipe to `on_emit`, until it has been quiet for
    `quiet_s` (at most `limit_s`)."""
    import time

    end = time.monotonic() + limit_s
    while time.monotonic() < end:
        try:
            if not conn.poll(quiet_s):
                return
            kind, payload = conn.recv()
        except (EOFError, OSError):
            return
        if kind == "emit" and on_emit is not None:
            on_emit(payload)


def _silently_dead(procs, reported: set[int]) -> int | None:
    for rank, p in enumerate(procs):
        if rank not in reported:
            p.join(timeout=0.2)
            if p.exitcode not in (None, 0):
                return rank
    return None
