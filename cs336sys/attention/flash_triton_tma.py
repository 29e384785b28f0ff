"""Host side of the kernels' TMA build: which layouts it takes, and descriptor scratch.

Every kernel of `flash_triton_kernels.py` and `flash_triton_backward.py` takes a constexpr
TMA. Set (on GPUs of compute capability >= 9 with 16-bit inputs, unless
`CS336SYS_TRITON_TMA=0`; `flash_triton._variant`), it moves the tiles of Q, K, V, O, dO, dQ,
dK and dV through tensor descriptors instead of pointers (`flash_triton_tiles._slice`), and
with the reduce-dq opt-in the atomic dQ's float32 tiles too (`_add_tile`): one 2-D
descriptor per (batch, head) slice, shape (T, HEAD_DIM), strides (stride_t, 1), block (tile,
BLOCK_D), whose loads on sm_90 are asynchronous TMA copies into shared memory that pad
out-of-bounds rows and head-dim columns with zeros. Same kernels, arguments, launch plans and
tile candidates; the launchers name the build "*_tma" so that it is tuned and cached apart
(flash_triton_tuning).

Two things the host must see to: TMA needs a 16-byte aligned base and row stride and a unit
stride along HEAD_DIM (`tma_layout_ok`, checked per launch plan; other layouts run the
pointer build), and descriptors made inside a kernel are written to a global-memory scratch
that Triton's launcher requests from the allocator given to `triton.set_allocator`
(`ensure_allocator`).

The default on Hopper for 16-bit inputs since an H200 measured it against the pointer build
(attention/opt_in.py); CS336SYS_TRITON_TMA=0 turns it off.
"""

from __future__ import annotations

import torch
import triton


def tma_layout_ok(*tensors: torch.Tensor) -> bool:
    """Whether every (B, [H,] T, D) kernel view can back a TMA descriptor per (batch, head).

    The slice base (data_ptr plus batch and head offsets) and the row stride must be 16-byte
    aligned and D unit-stride. A dimension of size one adds no offset, so its stride is free.
    """
    for t in tensors:
        size = t.element_size()
        if t.stride(-1) != 1 or t.data_ptr() % 16 or (t.stride(-2) * size) % 16:
            return False
        offsets = zip(t.shape[:-2], t.stride()[:-2], strict=True)  # batch (and head) strides
        if any((s * size) % 16 for n, s in offsets if n > 1):
            return False
    return True


def _scratch(size: int, alignment: int, stream: int | None) -> torch.Tensor:
    """Global memory for in-kernel descriptors (triton.set_allocator's contract), on the
    current CUDA device, where the launchers of flash_triton.py launch."""
    return torch.empty(size, dtype=torch.int8, device="cuda")


try:  # where Triton 3.6 to 3.9 keep the allocator, to tell whether one was set
    from triton.runtime._allocation import _NULL_ALLOCATOR, _allocator
except ImportError:  # pragma: no cover (another release: always set ours)
    _allocator = _NULL_ALLOCATOR = None


def ensure_allocator() -> None:
    """Give Triton an allocator for descriptor scratch unless the caller already set one.

    Triton 3.6 to 3.9 keep the allocator in a ContextVar, which is per thread: one set in the
    forward's thread is not seen by autograd's backward thread on CUDA. So the launchers call
    this before every descriptor launch (a ContextVar read; a set only the first time in a
    thread). Triton's fused-attention and persistent-matmul tutorials call set_allocator
    once, in their main thread, with a function like _scratch.
    """
    if _allocator is None or _allocator.get() is _NULL_ALLOCATOR:
        triton.set_allocator(_scratch)
