"""Attention implementations, selected by name through a torch-free registry.

Importing this package does not import torch; the implementations themselves are imported
only when `get(name)` is called or a FlashAttention class is first accessed:

    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton
    o = FlashAttention2Triton.apply(q, k, v, True)   # q, k, v: (B, T, D) or (B, H, T, D)
"""

from __future__ import annotations

from cs336sys.attention.registry import get, names, register
from cs336sys.bench.lazy import attributes

_LAZY = {
    "FlashAttention2Torch": "cs336sys.attention.flash_torch",
    "FlashAttention2Triton": "cs336sys.attention.flash_triton",
}

__all__ = ["FlashAttention2Torch", "FlashAttention2Triton", "get", "names", "register"]


__getattr__ = attributes(globals(), _LAZY)
