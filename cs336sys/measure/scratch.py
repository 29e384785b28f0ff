"""Temporary folders named for the process that made them, which a later command removes
once that process is gone.

A command killed by SIGKILL (the OOM killer's, `kill -9`) never reaches its clean-up: a
`db merge` left a whole copy of the other store under /tmp each time, and a ranked command
its ranks' stderr files. Each folder's name holds its maker's process id, its maker holds a
lock on a file in it while it lives (a maker in another PID namespace sharing /tmp has a pid
that reads as gone here), and making one removes those whose maker is gone by both counts.

    with scratch("cs336sys-merge-") as tmp:   # /tmp/cs336sys-merge-<pid>-<random>
        ...
"""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

LOCK = ".cs336sys-lock"  # in each folder, locked (flock) by its maker while it lives
FRESH_S = 60.0  # a folder without a lock younger than this is being made
_held: dict[str, int] = {}  # folder -> the descriptor that holds its lock


def folder(prefix: str) -> str:
    """A new folder `<prefix><pid>-<random>` in the temporary directory, after removing the
    orphans of `prefix`; the caller removes it with `remove`."""
    remove_orphans(prefix)
    path = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")
    fd = os.open(os.path.join(path, LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # (a process in another PID namespace sees its pid gone)
    _held[path] = fd
    return path


def remove(path: str) -> None:
    """Remove a folder `folder` made, and let go of its lock."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _held.pop(path, None)
    if fd is not None:
        os.close(fd)


@contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A `folder(prefix)` for the block, removed after it."""
    path = folder(prefix)
    try:
        yield path
    finally:
        remove(path)


def _in_use(path: str) -> bool:
    """Whether a live process holds the folder's lock (or, without one yet, made it lately:
    between its mkdtemp and its lock)."""
    try:
        fd = os.open(os.path.join(path, LOCK), os.O_RDONLY)
    except FileNotFoundError:
        try:
            return time.time() - os.stat(path).st_mtime < FRESH_S
        except OSError:
            return False
    except OSError:  # another user's: left alone
        return True
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except OSError:
        return True
    finally:
        os.close(fd)


def remove_orphans(prefix: str) -> None:
    """Remove the folders of `prefix` whose maker is gone: its process id names no process
    here and no process holds the folder's lock (a maker in another PID namespace, sharing
    this /tmp, has a pid that reads as gone here)."""
    root = tempfile.gettempdir()
    try:
        names = [n for n in os.listdir(root) if n.startswith(prefix)]
    except OSError:
        return
    for name in names:
        pid = name[len(prefix):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue  # (an older release's folder names no process: left alone)
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            if not _in_use(os.path.join(root, name)):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except OSError:  # another user's process, alive
            pass
