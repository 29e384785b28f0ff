"""Attention implementations, selected by name through a torch-free registry.

Importing this package does not import torch; the implementations themselves are imported
only when `get(name)` is called or a FlashAttention class is first accessed:

    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton
    o = FlashAttention2Triton.apply(q, k, v, True)   # q, k, v: (B, T, D) or (B, H, T, D)
"""

from __future__ import annotations

from typing import Any

from cs336sys.attention.registry import get, names, register

__all__ = ["FlashAttention2Torch", "FlashAttention2Triton", "get", "names", "register"]


def __getattr__(name: str) -> Any:
    """The FlashAttention classes, imported on first use: they import torch (PEP 562)."""
    if name == "FlashAttention2Torch":
        from cs336sys.attention.flash_torch import FlashAttention2Torch

        return FlashAttention2Torch
    if name == "FlashAttention2Triton":
        from cs336sys.attention.flash_triton import FlashAttention2Triton

        return FlashAttention2Triton
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
