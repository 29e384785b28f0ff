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


class CudaProbe:
    """The allocator's figures, relative to what was allocated before the point began."""

    def __init__(self, device) -> None:
        import torch

        self.torch, self.device = torch, device
        self.base = torch.cuda.memory_allocated(device)
        self.base_reserved = torch.cuda.memory_reserved(device)

    def current(self) -> int:
        return self.torch.cuda.memory_allocated(self.device) - self.base

    def reset_peak(self) -> None:
        self.torch.cuda.reset_peak_memory_stats(self.device)

    def peak(self) -> int:
        return self.torch.cuda.max_memory_allocated(self.device) - self.base

    def peak_reserved(self) -> int | None:
        return self.torch.cuda.max_memory_reserved(self.device) - self.base_reserved


class TrackerProbe:
    """The live-tensor tracker's figures, with CudaProbe's interface (CPU)."""

    def __init__(self, tracker) -> None:
        self.tracker = tracker

    def current(self) -> int:
        return self.tracker.current

    def reset_peak(self) -> None:
        self.tracker.reset_peak()

    def peak(self) -> int:
        return self.tracker.peak

    def peak_reserved(self) -> None:
        return None  # no caching allocator to reserve anything


def optimizer_tensors(optimizer) -> list:
    """The tensors in an optimizer's state (moments, step counts held as tensors), and in
    the state of the optimizers it holds as attributes, alone or in a list, tuple or dict
    (a sharded optimizer that steps its own shard with an inner optimizer keeps the state
    there). The course's tests ask a sharded optimizer only for step() and zero_grad():
    one that is no torch Optimizer has no state of its own."""
    if optimizer is None:
        return []

    def state_of(value: Any) -> list:
        state = getattr(value, "state", None)
        return list(state.values()) if hasattr(state, "values") else []

    states = state_of(optimizer)
    for value in getattr(optimizer, "__dict__", {}).values():
        held = value.values() if isinstance(value, dict) else \
            value if isinstance(value, (list, tuple)) else [value]
        states += [s for inner in held if inner is not optimizer and hasattr(inner, "param_groups")
                   for s in state_of(inner)]
    return [v for state in states if hasattr(state, "values") for v in state.values()
            if hasattr(v, "untyped_storage")]


def _local(t):
    """A DTensor's local shard (FSDP2), or the tensor itself."""
    return t.to_local() if hasattr(t, "to_local") else t


def storage_bytes(tensors, elements: bool = False) -> int:
    """Bytes of the storages behind `tensors`, each storage once; with `elements`, their
    elements (a share of the whole where dtypes differ: bf16 weights, fp32 master shards)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is None or t.device.type == "meta":
            continue
        local = _local(t)
        storage = local.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes() // (local.element_size() if elements else 1)
    return sum(seen.values())


def held(params: list, optimizer, elements: bool = False) -> dict[str, int]:
    """Bytes (with `elements`, elements) held in parameters, their gradients and the
    optimizer's state, by inspection: what the accounting's 4P, 4P and 8P are measured
    against (a sharded rank's own share)."""
    return {
        "params": storage_bytes(params, elements),
        "grads": storage_bytes((p.grad for p in params), elements),
        # step counters held as 0-d tensors are not state the accounting counts
        "opt_state": storage_bytes((t for t in optimizer_tensors(optimizer)
                                    if _local(t).dim() > 0), elements),
    }
