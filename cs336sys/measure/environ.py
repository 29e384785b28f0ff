"""Environment variables set for a while and put back as they were: what a child process,
or a library that reads its settings from the environment when it starts work, sees."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator


@contextlib.contextmanager
def environ(**values: str) -> Iterator[None]:
    """Each NAME=value set inside the block; afterwards each as it was (unset where it was)."""
    with kept(*values):
        os.environ.update(values)
        yield


@contextlib.contextmanager
def kept(*names: str) -> Iterator[None]:
    """The variables `names` as they are now, put back after the block whatever it set or
    unset (unset where they were)."""
    before = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
