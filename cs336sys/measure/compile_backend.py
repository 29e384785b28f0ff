"""The backend every `--compile` (and the `compiled` attention) hands torch.compile."""

from __future__ import annotations

import os

ENV = "CS336SYS_COMPILE_BACKEND"


def compile_backend() -> str:
    """inductor, torch.compile's own default and what cs336sys times, unless
    CS336SYS_COMPILE_BACKEND names another backend. `aot_eager` traces with dynamo and
    AOTAutograd and generates no code: seconds where inductor takes half a minute on a CPU,
    to check that code compiles (graph breaks, hooks traced into a graph), never to time it.
    The store records the variable with the invocation (measure/provenance.py)."""
    return os.environ.get(ENV) or "inductor"


def backend_problem() -> str | None:
    """Why CS336SYS_COMPILE_BACKEND names no backend torch.compile has, in one line, or None
    (unset or empty: inductor). A typo failed every compiled point of a sweep
    (`InvalidBackend`) instead of the command."""
    value = os.environ.get(ENV)
    if not value:
        return None
    from torch._dynamo import list_backends

    if value not in {"inductor", *list_backends(exclude_tags=())}:
        named = ", ".join(sorted({"inductor", *list_backends()}))
        return f"{ENV} must name a torch.compile backend ({named}), got {value!r}"
    return None
