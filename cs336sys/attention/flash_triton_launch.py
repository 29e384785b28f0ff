"""One launch of a FlashAttention-2 kernel with everything but its tensors fixed, and the
plan of a call signature: the launches flash_triton.py repeats on every call after the first;
and the tensors as the kernels take them (views) and give them back (outputs).

Launching Triton's compiled handle directly, with every argument fixed but the tensors,
instead of through its JIT launcher, took a forward call at seq 1024 on an H200 from 99 us of
host time to 68 us, and forward+backward from 598 to 372 (benchmarks/attention_host_overhead.py,
reports/nvidia-h200/owed.log).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from cs336sys.attention.flash_triton_tma import ensure_allocator


class Launch:
    """One kernel launch with everything but the tensor arguments fixed.

    `args` are the arguments after the tensors (strides, sizes, scales) and `meta` the
    constexprs with the chosen tiles and compile options. Given `compiled`, the CompiledKernel
    that Triton's launcher returned for the same arguments, calls run that handle with every
    argument in signature order, constexprs included, as JITFunction.run does (Triton 3.6 to
    3.9). That is sound because the plan's key fixes all that Triton specialized the kernel on:
    dtypes, integer values (sizes, strides) and 16-byte alignment of the pointers.
    """

    __slots__ = ("kernel", "grid", "args", "meta", "device", "run", "run_args")

    def __init__(self, kernel, grid, args, meta, device, compiled=None):
        self.kernel, self.grid, self.args, self.meta = kernel, grid, args, meta
        self.device = device  # CUDA device index, None on CPU (the interpreter)
        self.run = self.run_args = None
        if compiled is not None:
            if hasattr(compiled, "result"):  # a future, where Triton compiles asynchronously
                compiled = compiled.result()
            # Every parameter after the tensors: `args` by position, then constexprs by name.
            n_constexprs = sum(n in meta for n in kernel.arg_names)
            n_tensors = len(kernel.arg_names) - len(args) - n_constexprs
            names = kernel.arg_names[n_tensors:]
            named = {**dict(zip(names, args, strict=False)), **meta}
            self.run_args = tuple(named[n] for n in names)
            self.run = compiled[grid]

    def __call__(self, *tensors: torch.Tensor) -> None:
        if self.device is not None and torch.cuda.current_device() != self.device:
            with torch.cuda.device(self.device):
                return self(*tensors)
        if self.run is not None:
            self.run(*tensors, *self.run_args)
        else:
            self.kernel[self.grid](*tensors, *self.args, **self.meta)


@dataclass(eq=False)
class Plan:
    """The launches of one call signature, and how many calls reused them."""

    launches: tuple[Launch, ...]
    views: bool  # a tensor must go through kernel_view (a reshape or a copy) on every call
    variant: str = "pointer"  # or "tma": the kernels' descriptor build (constexpr TMA)
    heavy_first: bool = False  # a causal forward plan with its tiles reversed (HEAVY_FIRST)
    lazy_rescale: bool = False  # a forward plan rescaling O and l lazily (LAZY_RESCALE)
    warp_specialize: bool = False  # a forward plan of one warp-specialised loop
    atomic_dq: bool = False  # a backward plan of the atomic-dQ kernels (ATOMIC_DQ)
    reduce_dq: bool = False  # ... adding dQ with TMA reductions (REDUCE_DQ, DQ_TMA)
    hits: int = 0

    def reuse(self) -> None:
        """Count a call that runs this plan again. Descriptor kernels need Triton's allocator
        in the calling thread (a ContextVar, and autograd runs the backward in its own thread
        on CUDA): one read once it is set."""
        self.hits += 1
        if self.variant == "tma":
            ensure_allocator()


# --------------------------------------------------------------------------------------------
# Kernel views and outputs


def dot_flags(dtype: torch.dtype, interpreted: bool) -> dict:
    """Precision constexprs of the kernels for inputs of `dtype`.

    PRECISION: IEEE float32 products for float32 inputs (not TF32, which would round them to
    10 mantissa bits); for 16-bit inputs it is ignored and tensor cores multiply natively.
    UPCAST_DOT and ROUND_BF16 work around two bfloat16 bugs of the Triton 3.9 interpreter
    (tl.dot returns garbage, float32 -> bf16 casts truncate); never set on a GPU.
    """
    interpreted_bf16 = interpreted and dtype == torch.bfloat16
    return {
        "PRECISION": "ieee" if dtype == torch.float32 else "tf32",
        "UPCAST_DOT": interpreted_bf16,
        "ROUND_BF16": interpreted_bf16,
    }


def kernel_view(t: torch.Tensor) -> torch.Tensor:
    """t as the kernels take it: (B, T, D) or (B, H, T, D), any strides but a unit one along
    D. A copy only where no view has that form (D not unit-stride, or leading dims beyond
    two that do not flatten); the model's (B, H, T, D) views of (B, T, H, D) pass as they are.
    """
    if t.dim() > 4:
        t = t.reshape(-1, *t.shape[-2:])  # (N, T, D)
    return t if t.stride(-1) == 1 else t.contiguous()


def new_like(t: torch.Tensor) -> torch.Tensor:
    """An output for input t: t's layout where the kernels can write it as it is (O then
    comes in the model's (B, T, H, D) memory order, so its transpose back is free), else
    contiguous in t's shape."""
    if t.dim() <= 4 and t.stride(-1) == 1:
        return torch.empty_like(t)
    return torch.empty(t.shape, dtype=t.dtype, device=t.device)


def bht_strides(t: torch.Tensor) -> tuple[int, int, int]:
    """(batch, head, sequence) strides of a kernel view; a 3-D one has a single head."""
    s = t.stride()
    return (s[0], 0, s[1]) if t.dim() == 3 else s[:3]


def forward_outputs(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """What a forward call allocates: O (..., T_q, D) in q's layout where it can be written
    as it is (new_like) and the float32 logsumexp L (..., T_q). Allocated in the caller's
    shape, not as views of other buffers: autograd forbids in-place changes to a view
    returned by a custom Function, and O is handed to the model."""
    return new_like(q), torch.empty(q.shape[:-1], dtype=torch.float32, device=q.device)
