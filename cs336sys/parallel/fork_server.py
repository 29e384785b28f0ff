"""The fork server the launcher forks local ranks from (multiprocessing's `forkserver`
start method): what it imports once for every rank, and its start and end around signals.
docs/distributed.md, "How ranks start", says what a user sees of it.
"""

from __future__ import annotations

import os

# What the fork server imports for ranks that train: torch, and torch._dynamo, which every
# such rank imports (optimizers and FSDP wrap their steps in torch._disable_dynamo), 2 s of
# CPU per rank otherwise. Ranks that only communicate (comm) ask for torch alone: a two-rank
# `comm` command took 4.1 s instead of 5.9 s (docs/distributed.md, "How ranks start").
# Our own modules, which read the environment when imported (the kernels' opt-ins), are
# imported by each rank after it has the parent's environment; Triton reads its variables
# when used. Inductor's config is read at dynamo's import: a TORCHINDUCTOR_ variable
# changed after the fork server started does not reach its ranks.
TRAINING_PRELOAD = ("torch", "torch._dynamo")
preloaded: tuple[str, ...] = ()  # what the running fork server imported


def server_pid() -> int | None:
    """This process's fork server, if it has one (multiprocessing's record of it)."""
    from multiprocessing import forkserver

    return getattr(getattr(forkserver, "_forkserver", None), "_forkserver_pid", None)


def start(ctx, preload: tuple[str, ...]) -> None:
    """Start the command's fork server, if it has none, importing `preload`. One already
    running without all of `preload` is replaced by one that imports what both need.

    The server starts with Ctrl-C (SIGINT) blocked. A terminal sends Ctrl-C to the whole
    process group; CPython's server ignores it, but only once its imports are done, and one
    that comes during its seconds in torch's import would end it with a traceback on the
    command's stderr. A blocked signal stays blocked across fork and exec, and the server's
    own SIG_IGN later discards it. This process gets a Ctrl-C that came meanwhile as soon
    as the block is lifted; ranks lift it when they start."""
    import signal
    import threading
    from multiprocessing import forkserver, resource_tracker

    global preloaded
    up = server_pid() is not None
    if up and not set(preload) <= set(preloaded):
        stop()
        up = False
    if not up:
        preloaded = tuple(dict.fromkeys((*preloaded, *preload)))
        ctx.set_forkserver_preload(list(preloaded))
    # The server's start starts multiprocessing's resource tracker first, the same way (its
    # signals blocked), and unblocks SIGINT afterwards: start the tracker before the block.
    resource_tracker.ensure_running()
    if not hasattr(signal, "pthread_sigmask"):  # not POSIX
        forkserver.ensure_running()
        return
    # The mask is this thread's: a Ctrl-C the kernel hands to another thread of this process
    # still runs the Python handler here, between bytecodes of ensure_running, and could
    # raise after the server was spawned but before its pid was recorded, leaving it with
    # nobody to stop it. So the handler only notes the signal until the pid is recorded.
    noted: list[int] = []
    main = threading.current_thread() is threading.main_thread()
    handler = signal.signal(signal.SIGINT, lambda signum, frame: noted.append(signum)) if main else None
    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)
        if main:
            signal.signal(signal.SIGINT, handler)
            if noted:
                signal.raise_signal(signal.SIGINT)


def unblock_sigint() -> None:
    """In a rank forked by the server: take SIGINT as the command does."""
    import signal

    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


def stop() -> None:
    """End this command's fork server now: when a signal stops the command, or to replace
    it (start), never while its ranks run. The server otherwise ends when the command does,
    but not before its imports are done: stopped while it imports torch, it would hold the
    command's stderr (a pipe's reader waits) for seconds after the command has exited.
    Uses multiprocessing's own record of the server; does nothing where that is missing."""
    import signal
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    pid = getattr(server, "_forkserver_pid", None)
    if pid is None or not hasattr(server, "_stop"):
        return
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    server._stop()  # closes its pipe, reaps it, removes its socket file
