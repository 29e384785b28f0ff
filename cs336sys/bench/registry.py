"""Implementations by name, imported only when asked for.

A lower layer sometimes has to call something that a higher layer provides: the
Transformer LM (models/) runs whichever attention kernel its config names, and the kernels
live in attention/. Rather than import upwards, the model asks a Registry here by name; the
attention package fills it with "module:function" targets when it is imported, and the
package root (cs336sys/__init__.py) imports it first of all. See docs/architecture.md.

No torch here: the CLI validates names through a registry and has to start fast. Targets
are imported only in `get`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


class Registry:
    """name -> "package.module:function", in registration order."""

    def __init__(self, what: str) -> None:
        self.what = what
        self._targets: dict[str, str] = {}

    def names(self) -> list[str]:
        """Registered names, in registration order (the order shown to users)."""
        return list(self._targets)

    def register(self, name: str, target: str) -> None:
        """Register `target` ("package.module:function") under `name`.

        Registering the same target twice is a no-op; re-using a name for a different target
        raises, because silently swapping the code behind a name would corrupt benchmark rows.
        """
        module, sep, func = target.partition(":")
        if not name or not sep or not module or not func:
            raise ValueError(
                f"{self.what} target must look like 'package.module:function', got {target!r}"
            )
        existing = self._targets.get(name)
        if existing is not None and existing != target:
            raise ValueError(f"{self.what} {name!r} is already registered as {existing!r}")
        self._targets[name] = target

    def get(self, name: str) -> Callable[..., Any]:
        """Import and return the function registered under `name`."""
        target = self._targets.get(name)
        if target is None:
            raise ValueError(f"unknown {self.what} {name!r}; choose from {', '.join(self.names())}")
        module, _, func = target.partition(":")
        return getattr(importlib.import_module(module), func)


# The attention kernels, filled by cs336sys/attention/registry.py.
ATTENTION = Registry("attention")
