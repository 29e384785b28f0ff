"""Whether a folder can be written, asked before any work starts (bad input is refused up
front: docs/bad-input.md)."""

from __future__ import annotations

import tempfile
from pathlib import Path


def why_unwritable(folder: str | Path) -> str | None:
    """Why files cannot be written into `folder` (created if missing), or None when they can.

    The nearest existing ancestor must be a folder we can create a file in. It is tried:
    permission bits and os.access say yes to root even on /proc or a read-only mount.
    """
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        return "exists and is not a directory"
    existing = folder
    while not existing.exists():
        # a link to a missing path, or a loop, does not exist either: its parent may well
        # be writable, and making the folder through it failed after the point had run
        if existing.is_symlink():
            return f"{existing} is a symbolic link to a missing path or a loop"
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None


def git_top(start: str | Path | None = None) -> Path | None:
    """The top folder of the git checkout `start` (default: the current folder) is in, or
    None outside one. A `.git` file counts too (worktrees, submodules)."""
    here = Path(start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / ".git").exists():
            return folder
    return None


def repository_root(adapters: str | Path) -> Path:
    """The folder whose packages an adapters file imports: the one holding `tests/` in the
    course layout (`<repo>/tests/adapters.py`), else the file's own folder."""
    adapters = Path(adapters).resolve()
    return adapters.parent.parent if adapters.parent.name == "tests" else adapters.parent


def user_data_dir() -> Path:
    """Where a user's own data goes: $XDG_DATA_HOME or ~/.local/share on Linux, Application
    Support on macOS, %LOCALAPPDATA% on Windows; a `cs336sys` folder in it."""
    import os
    import sys

    if sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    elif sys.platform == "win32":
        base = Path(os.environ.get("LOCALAPPDATA") or Path.home() / "AppData" / "Local")
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "cs336sys"


def default_store(start: str | Path | None = None) -> Path:
    """The results store a command uses without --db or CS336SYS_DB: db/results.db at the
    top of the git checkout you stand in (never a new ./db in whatever folder that is), or
    results.db in the user's data folder outside a checkout (docs/store.md)."""
    top = git_top(start)
    return top / "db" / "results.db" if top is not None else user_data_dir() / "results.db"
