"""Memory probes that work on any device."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def saved_tensor_bytes(fn: Callable[[], Any]) -> tuple[Any, int]:
    """Run `fn` and count the bytes of the tensors autograd saves for backward.

    Counted with saved-tensor hooks, each storage once (a tensor saved by two ops, or two
    views of one buffer, hold memory once). Inputs saved by an op count too: they are kept
    alive for backward. Works on CPU, where there is no allocator to ask.
    """
    import torch

    storages: dict[tuple[str, int], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        storages[(str(t.device), storage.data_ptr())] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())
