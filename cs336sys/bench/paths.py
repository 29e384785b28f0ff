"""Whether a folder can be written, asked before any work starts (bad input is refused up
front: README, "Bad input")."""

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
        existing = existing.parent
    if not existing.is_dir():
        return f"{existing} is not a directory"
    try:
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        return f"cannot write in {existing} ({exc.strerror or exc})"
    return None
