"""A package's names given on first use (PEP 562), the way scientific-python's lazy_loader
attaches them (SPEC 1): the package's `__init__` says which module holds each name, and that
module is imported when one of its names is first read. So `import cs336sys.parallel` (which
every rank's launcher runs) stays free of torch, and `cs336sys sql` never imports
sqlite-utils, while `from cs336sys.parallel import FSDP` works as if the name were defined
there. The modules are named in full, in a literal dict, so that the import graph
(tests/test_layering.py) reads them as the package's imports.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable
from importlib import import_module
from typing import Any


def attach(
    package: str, names_by_module: dict[str, Iterable[str]]
) -> tuple[Callable[[str], Any], Callable[[], list[str]], list[str]]:
    """`__getattr__, __dir__, names = attach(__name__, {"cs336sys.parallel.fsdp": ["FSDP"]})`
    in a package's `__init__`: its module `__getattr__` and `__dir__`, and the names it gives
    (for `__all__`). A name read once is kept in the package, as an import would keep it."""
    where = {name: module for module, names in names_by_module.items() for name in names}

    def __getattr__(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def __dir__() -> list[str]:
        return sorted(set(vars(sys.modules[package])) | set(where))

    return __getattr__, __dir__, list(where)
