"""Progress inside a point: the step loops report each step here, and whoever set a hook
(the CLI's progress bar) hears of it. Library code never prints (docs/architecture.md); without a hook
a report costs one ContextVar lookup.

    with on_step(lambda done, total, point: print(done, total)):
        run_steps(step, warmup=2, iters=5)     # prints 1 7, 2 7, ... 7 7

A point that times several phases in turn (attention's forward, backward and both) names
each with `phase(...)`, so that "step 4/6" says which loop it counts.

Distributed ranks have no hook of their own: rank 0 forwards its steps to the parent
(sweep/ranks.py), which reports them here with the point they belong to.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

Hook = Callable[[int, int, Any], None]
_hook: ContextVar[Hook | None] = ContextVar("cs336sys_step_hook", default=None)
_phase: ContextVar[str] = ContextVar("cs336sys_step_phase", default="")


def step_done(done: int, total: int, point: Any = None) -> None:
    """`done` of `total` steps (warm-up included) of the running point have finished;
    `point` is its spec where the caller knows it (None: the point now running here)."""
    hook = _hook.get()
    if hook is not None:
        hook(done, total, point)


def hooked() -> bool:
    """Whether anyone listens (ranks forward their steps only then)."""
    return _hook.get() is not None


@contextmanager
def on_step(hook: Hook | None) -> Iterator[None]:
    """Call `hook(done, total, point)` after every step reported inside this block."""
    token = _hook.set(hook)
    try:
        yield
    finally:
        _hook.reset(token)


@contextmanager
def phase(name: str) -> Iterator[None]:
    """The steps reported inside this block are those of `name` ("forward", "backward")."""
    token = _phase.set(name)
    try:
        yield
    finally:
        _phase.reset(token)


def current_phase() -> str:
    """The phase named by the innermost `phase(...)` block ("" outside any)."""
    return _phase.get()
