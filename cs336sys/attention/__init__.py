"""Attention implementations, selected by name through a torch-free registry.

Importing this package does not import torch; the implementations themselves are imported
only when `get(name)` is called or a FlashAttention class is first accessed:

    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton
    o = FlashAttention2Triton.apply(q, k, v, True)   # q, k, v: (B, T, D) or (B, H, T, D)
"""

from cs336sys.attention.registry import get, names, register
from cs336sys.measure.lazy import attach

# The FlashAttention classes import torch.
__getattr__, __dir__, _ON_FIRST_USE = attach(__name__, {
    "cs336sys.attention.flash_torch": ("FlashAttention2Torch",),
    "cs336sys.attention.flash_triton": ("FlashAttention2Triton",),
})

__all__ = [*_ON_FIRST_USE, "get", "names", "register"]
