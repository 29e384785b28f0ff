"""Every experiment kind, in the order reports show them: one line each.

Adding an experiment kind is its module (experiments/<kind>.py, with `EXPERIMENT` and its
`Command`) and its name in KINDS (docs/architecture.md, "Adding an experiment"). The store's
views, the report's sections and the command line are derived from the declarations: the
commands pass `EXPERIMENTS` down (`Store(path, EXPERIMENTS)`, `report.render.build(...,
EXPERIMENTS)`), and `cs336sys` makes a command of each declared `Command`.

Importing this module imports none of the kinds: `EXPERIMENTS` imports them on first use
(PEP 562), and `summary(kind)` reads a kind's one-line summary from its source, so that
`cs336sys --help` lists every command without importing a single experiment.
"""

from __future__ import annotations

import ast
import functools
import tokenize
from importlib import import_module
from pathlib import Path
from typing import Any

KINDS = (
    "model",
    "attention",
    "memory",
    "memory_residuals",
    "comm",
    "ddp",
    "plan",
    "profile",
    "precision",
    "step",
)


@functools.cache
def experiments() -> tuple[Any, ...]:
    """Every kind's declaration, in KINDS' order, their modules imported on the first call."""
    return tuple(kind_of(kind) for kind in KINDS)


def __getattr__(name: str) -> Any:
    """`EXPERIMENTS`, as `experiments()` gives it."""
    if name != "EXPERIMENTS":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return experiments()


def kind_of(kind: str) -> Any:
    """One kind's declaration, its module alone imported."""
    return import_module(f"{__package__}.{kind}").EXPERIMENT


def by_kind() -> dict[str, Any]:
    """The declarations by experiment kind."""
    return {e.kind: e for e in experiments()}


def summary(kind: str) -> str:
    """The first paragraph of the kind module's docstring, on one line: what its command
    does, as `cs336sys --help` lists it. Read from the source, so the module is not imported
    (the interpreter's own `pydoc.source_synopsis` reads a docstring the same way)."""
    with tokenize.open(Path(__file__).with_name(f"{kind}.py")) as source:
        for token in tokenize.generate_tokens(source.readline):
            if token.type in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE):
                continue
            if token.type != tokenize.STRING:
                break
            return " ".join(ast.literal_eval(token.string).strip().split("\n\n")[0].split())
    raise ValueError(f"experiments/{kind}.py starts with no docstring: its summary is its first "
                     "paragraph")
