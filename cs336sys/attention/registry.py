"""Attention implementations by name.

The model looks its attention function up here by the string in `ModelConfig.attention`, so a
new implementation (FlashAttention-2 in PyTorch, a Triton kernel, a compiled variant) is one
`register` call and never an edit to the model.

This module must not import torch: the CLI imports it to validate `--attention` and has to
start fast. Targets are therefore "module:function" strings imported only in `get`.

Every registered function has the signature `fn(q, k, v, is_causal=False) -> Tensor` on
(..., T, D) tensors, the same contract as `torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

# name -> "module:function"; insertion order is the order shown to users.
_REGISTRY: dict[str, str] = {
    "naive": "cs336sys.attention.reference:naive_attention",
    "sdpa": "cs336sys.attention.reference:sdpa_attention",
    "compiled": "cs336sys.attention.compiled:compiled_attention",
    "flash-torch": "cs336sys.attention.flash_torch:flash_attention_torch",
    "triton": "cs336sys.attention.flash_triton:flash_attention_triton",
}


def names() -> list[str]:
    """Registered attention names, in registration order."""
    return list(_REGISTRY)


def register(name: str, target: str) -> None:
    """Register `target` ("package.module:function") under `name`.

    Registering the same target twice is a no-op; re-using a name for a different target
    raises, because silently swapping the kernel behind a name would corrupt benchmark rows.
    """
    module, sep, func = target.partition(":")
    if not name or not sep or not module or not func:
        raise ValueError(
            f"attention target must look like 'package.module:function', got {target!r}"
        )
    existing = _REGISTRY.get(name)
    if existing is not None and existing != target:
        raise ValueError(f"attention {name!r} is already registered as {existing!r}")
    _REGISTRY[name] = target


def get(name: str) -> Callable[..., Any]:
    """Import and return the attention function registered under `name`."""
    target = _REGISTRY.get(name)
    if target is None:
        raise ValueError(f"unknown attention {name!r}; choose from {', '.join(names())}")
    module, _, func = target.partition(":")
    return getattr(importlib.import_module(module), func)
