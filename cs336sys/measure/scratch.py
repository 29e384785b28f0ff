"""Temporary folders named for the process that made them, which a later command removes
once that process is gone.

A command killed by SIGKILL (the OOM killer's, `kill -9`) never reaches its clean-up: a
`db merge` left a whole copy of the other store under /tmp each time, and a ranked command
its ranks' stderr files. Each folder's name holds its maker's process id, and making one
removes those whose maker no longer runs.

    with scratch("cs336sys-merge-") as tmp:   # /tmp/cs336sys-merge-<pid>-<random>
        ...
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager


def folder(prefix: str) -> str:
    """A new folder `<prefix><pid>-<random>` in the temporary directory, after removing the
    orphans of `prefix`; the caller removes it."""
    remove_orphans(prefix)
    return tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-")


@contextmanager
def scratch(prefix: str) -> Iterator[str]:
    """A `folder(prefix)` for the block, removed after it."""
    path = folder(prefix)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def remove_orphans(prefix: str) -> None:
    """Remove the folders of `prefix` whose maker is gone."""
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
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        except OSError:  # another user's process, alive
            pass
