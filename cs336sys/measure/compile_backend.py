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
