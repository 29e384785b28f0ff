"""Attention implementations, selected by name through a torch-free registry.

Importing this package does not import torch; the implementations themselves are imported
only when `get(name)` is called or a FlashAttention class is first accessed:

    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton
    o = FlashAttention2Triton.apply(q, k, v, True)   # q, k, v: (B, T, D) or (B, H, T, D)
"""

from __future__ import annotations

import importlib
from typing import Any

from cs336sys.attention.registry import get, names, register

_LAZY = {
    "FlashAttention2Torch": "cs336sys.attention.flash_torch",
    "FlashAttention2Triton": "cs336sys.attention.flash_triton",
}

__all__ = ["FlashAttention2Torch", "FlashAttention2Triton", "get", "names", "register"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
