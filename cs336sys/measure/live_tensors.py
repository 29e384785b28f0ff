"""Live tensor bytes on any device: a tracker of tensor storages from creation to free.

On CUDA the caching allocator answers "how much memory do tensors hold, and what was the
peak?" (`torch.cuda.max_memory_allocated`). A CPU has no such allocator, and the process's
RSS is the wrong figure: it includes the Python heap, freed memory glibc has not returned,
and pages never touched. This module counts what the CUDA figure counts, on any device: the
bytes of tensor storages alive at each moment.

How: a `TorchDispatchMode` (the Python dispatch hook that `torch.utils._python_dispatch`
documents for "observing every ATen op") sees the output of every operator, including those
run by the autograd engine during backward (the mode is thread-local state that autograd
propagates to its worker). Each output storage that does not alias an input is new: its
bytes are added, and a `weakref.finalize` on the storage subtracts them when it is freed.
PyTorch keeps a storage's Python object alive exactly as long as the C++ storage (PyObject
preservation), so the finalizer fires when the memory is released, wherever that happens
(a Python `del`, the autograd engine dropping a saved tensor, an optimizer's temporary).
Views and in-place results share their input's storage and are not counted again; every
storage is counted once, however many tensors view it.

Storages resized directly (`UntypedStorage.resize_`, which is not an ATen op: FSDP2 frees
and re-allocates its unsharded weights this way) are seen too: while the tracker is entered,
`resize_` reports to it.

What it does not see: memory inside an operator that never becomes a tensor (a kernel's
workspace), and tensors created before the tracker was entered, unless `adopt`ed.

    tracker = LiveTensorTracker(record=True)
    with tracker:
        model = TransformerLM(config)          # parameters counted at creation
        with tracker.phase("forward"):
            loss = model(x).sum()
    tracker.peak, tracker.current, tracker.events
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass(frozen=True)
class Event:
    """One change of the live bytes: a storage allocated (+) or freed (-)."""

    index: int  # order of the event since the tracker was made
    time_s: float  # perf_counter() seconds since the tracker was made
    delta: int  # bytes allocated (> 0) or freed (< 0)
    live: int  # live tensor bytes after the event
    phase: str  # label of the phase the event happened in ("" outside any phase)
    op: str  # the operator that allocated it (frees carry the allocating op too)
    allocated: int | None  # the device allocator's figure at that moment, when a probe is given


def storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """(id of the C++ storage, bytes), or None for tensors without a plain storage.

    Meta tensors have a storage that reports bytes but holds none (shape-only placeholders,
    such as FSDP's for weights between forwards): they are not memory.
    """
    if t.device.type == "meta":
        return None
    local = getattr(t, "_local_tensor", None)  # a DTensor: its memory is its local shard's
    if isinstance(local, torch.Tensor):
        t = local
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError, TypeError):  # sparse, nested, fake tensors
        return None
    return storage._cdata, storage.nbytes()


def _storage(t: torch.Tensor) -> torch.UntypedStorage:
    """The storage behind t (a DTensor's local shard's), for tensors storage_key accepts."""
    local = getattr(t, "_local_tensor", None)
    return (local if isinstance(local, torch.Tensor) else t).untyped_storage()


class LiveTensorTracker(TorchDispatchMode):
    """Current and peak bytes of live tensor storages created under it (or adopted).

    `record=True` keeps one `Event` per allocation and free, for a memory timeline; `probe`
    (e.g. `torch.cuda.memory_allocated`) is sampled at each event next to the tracker's count.
    The tracker holds no reference to any tensor: counting never changes what is freed.
    """

    def __init__(self, record: bool = False, probe: Callable[[], int] | None = None):
        super().__init__()
        self.record = record
        self.probe = probe
        self.current = 0
        self.peak = 0
        self.events: list[Event] = []
        self.phases: list[tuple[str, int, int]] = []  # (label, first event, end event)
        self._live: dict[int, int] = {}  # storage id -> bytes counted for it
        self._phase = ""
        self._aside = 0  # inside aside(): nothing is counted
        self._t0 = time.perf_counter()
        self._count = 0
        # Finalizers may run on the autograd engine's thread; RLock, since a free can fire
        # from garbage collection triggered while this thread already holds the lock.
        self._lock = threading.RLock()

    # -- counting ---------------------------------------------------------------------------

    def _event(self, delta: int, op: str) -> None:
        self._count += 1
        if self.record:
            self.events.append(
                Event(
                    index=self._count,
                    time_s=time.perf_counter() - self._t0,
                    delta=delta,
                    live=self.current,
                    phase=self._phase,
                    op=op,
                    allocated=self.probe() if self.probe else None,
                )
            )

    def _track(self, storage: torch.UntypedStorage, op: str) -> int:
        """Count `storage` if it is new; returns the bytes added."""
        key, nbytes = storage._cdata, storage.nbytes()
        with self._lock:
            known = self._live.get(key)
            if known is not None:
                if known == nbytes:
                    return 0
                # resized in place (an out= argument, resize_): count the difference
                self._live[key] = nbytes
                self.current += nbytes - known
                self.peak = max(self.peak, self.current)
                self._event(nbytes - known, op)
                return nbytes - known
            self._live[key] = nbytes  # empty storages too: an out= buffer grows later
            if nbytes:
                self.current += nbytes
                self.peak = max(self.peak, self.current)
                self._event(nbytes, op)
        finalizer = weakref.finalize(storage, self._free, key, op)
        finalizer.atexit = False  # at interpreter exit nobody reads the count
        return nbytes

    def _free(self, key: int, op: str) -> None:
        with self._lock:
            nbytes = self._live.pop(key, None)
            if not nbytes:
                return
            self.current -= nbytes
            self._event(-nbytes, op)

    def adopt(self, tensors: Iterable[Any]) -> int:
        """Count tensors created before the tracker was entered (parameters, optimizer
        state, inputs); already counted storages are skipped. Returns the bytes added."""
        added = 0
        for t in tensors:
            if isinstance(t, torch.Tensor) and storage_key(t) is not None:
                added += self._track(_storage(t), "adopted")
        return added

    def __enter__(self):
        resize = torch.UntypedStorage.resize_
        tracker = self

        def tracked_resize(storage, size):
            out = resize(storage, size)
            if not tracker._aside:
                tracker._track(storage, "storage.resize_")
            return out

        self._resize = resize
        torch.UntypedStorage.resize_ = tracked_resize
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self._aside:
            return out
        inputs = {
            k[0]
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and (k := storage_key(t)) is not None
        }
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and (k := storage_key(t)) is not None:
                # a view or in-place result is not a new storage; an out= argument may have
                # been resized
                if k[0] not in inputs or k[0] in self._live:
                    self._track(_storage(t), str(func.overloadpacket))
        return out

    @contextmanager
    def aside(self) -> Iterator[None]:
        """Tensors made inside are not counted, now or when freed: what a check keeps (a
        copy of the gradients) is the tool's memory, not the measured code's."""
        self._aside += 1
        try:
            yield
        finally:
            self._aside -= 1

    # -- phases and peaks ---------------------------------------------------------------------

    def start_recording(self) -> None:
        """Record events and phases from now on, numbering events from 1 again."""
        with self._lock:
            self.record, self.events, self.phases, self._count = True, [], [], 0

    def reset_peak(self) -> None:
        """Start a new peak from the bytes live now (as torch.cuda.reset_peak_memory_stats)."""
        with self._lock:
            self.peak = self.current

    @contextmanager
    def phase(self, label: str) -> Iterator[None]:
        """Label the events inside the block (forward, backward, optimizer...)."""
        previous, first = self._phase, self._count + 1
        self._phase = label
        try:
            yield
        finally:
            self._phase = previous
            self.phases.append((label, first, self._count))
