"""Package attributes imported on first use (PEP 562), so that importing a package stays
cheap: `import cs336sys.models` must not import torch, `import cs336sys.store.views` must
not import sqlite-utils (docs/architecture.md)."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any


def attributes(namespace: dict[str, Any], where: dict[str, str]) -> Callable[[str], Any]:
    """A module `__getattr__` for the package whose `globals()` is `namespace`: `where` maps
    a name to the module that defines it, imported when the name is first read, then cached
    in the package (so this runs once per name)."""

    def __getattr__(name: str) -> Any:
        module = where.get(name)
        if module is None:
            raise AttributeError(f"module {namespace['__name__']!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    return __getattr__
