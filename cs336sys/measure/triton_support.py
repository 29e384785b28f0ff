"""What every Triton kernel module of the package shares (attention/flash_triton*, and
models/adamw_kernels, models/fused_ce_triton): whether Triton's interpreter defined the
kernels (and, if so, the interpreter made fit for NumPy >= 2.4 and for descriptor
reductions), the one refusal when tensors are on the wrong side of that, the
interpreter's bfloat16 rounding fix, and which optional features this release builds.
Imported only by kernel modules, so importing triton here is fine.
"""

from __future__ import annotations

import inspect

import torch
import triton
import triton.language as tl
from triton.runtime.interpreter import InterpretedFunction

# What this Triton can build of the attention kernels' Hopper paths: tensor descriptors made
# inside a kernel (the TMA build), their atomic_add (TMA reductions, the reduce-dq opt-in) and
# tl.range's warp_specialize (the warp-specialize opt-in). The launchers ask for a path only
# where the release has it, and fall back as they do where the GPU lacks it; a row's
# triton_kernels says what ran. Triton 3.6 and 3.9 have all three.
HAS_DESCRIPTORS = hasattr(tl, "make_tensor_descriptor")
HAS_DESCRIPTOR_REDUCTIONS = HAS_DESCRIPTORS and hasattr(
    getattr(tl, "tensor_descriptor", None), "atomic_add")
HAS_WARP_SPECIALIZE = hasattr(tl, "range") and (
    "warp_specialize" in inspect.signature(tl.range).parameters)


def interpreted(kernel: object) -> bool:
    """True when `kernel` was defined by Triton's interpreter (TRITON_INTERPRET=1 at import
    time): it then runs on CPU tensors only; otherwise it is compiled for CUDA. Every kernel
    module asks this once at import, so the interpreter is patched here."""
    if isinstance(kernel, InterpretedFunction):
        _squeeze_interpreted_scalars()
        _interpret_descriptor_reductions()
        return True
    return False


def _interpret_descriptor_reductions() -> None:
    """Let Triton's interpreter run a tensor descriptor's `atomic_add` (float tiles).

    Compiled for sm_90, `desc.atomic_add(offsets, x)` is one TMA reduction of the tile into
    global memory, dropping what lies out of bounds; the interpreters of Triton 3.6 and 3.9
    have no `create_descriptor_reduce` and fail on it. The same sum is the interpreter's own
    atomic add of the tile's in-bounds elements, whose signature both releases share. Only
    the interpreter is touched, and only where it lacks the method.
    """
    from triton._C.libtriton import ir
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if hasattr(builder, "create_descriptor_reduce"):
        return

    def create_descriptor_reduce(self, kind, desc, value, indices):
        if kind != ir.DESCRIPTOR_REDUCE_KIND.ADD:
            raise NotImplementedError(f"descriptor reduction {kind} in the interpreter")
        ptrs, mask = desc.materialize_pointers(indices)
        return self.create_atomic_rmw(ir.ATOMIC_OP.FADD, ptrs, value, mask,
                                      ir.MEM_SEMANTIC.RELAXED, ir.MEM_SYNC_SCOPE.GPU)

    builder.create_descriptor_reduce = create_descriptor_reduce


def _squeeze_interpreted_scalars() -> None:
    """Let Triton 3.6's interpreter run with NumPy >= 2.4.

    The interpreter holds a computed scalar (a loop bound such as `hi`) as a 1-element array
    and turns it into a Python int with int(array), which NumPy 2.4 refuses ("only
    0-dimensional arrays can be converted to Python scalars"), so `range(lo, hi, K_TILE)`
    fails. Triton 3.7+ squeezes the array first; this does the same on older releases. It
    touches only the interpreter (TRITON_INTERPRET=1), never compiled kernels.
    """
    from triton.runtime import interpreter

    patch_tensor = getattr(interpreter, "_patch_lang_tensor", None)
    if patch_tensor is None or getattr(patch_tensor, "squeezes_index", False):
        return

    def patched(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.squeeze()))

    patched.squeezes_index = True
    interpreter._patch_lang_tensor = patched


def check_available(device: torch.device | str, is_interpreted: bool, what: str) -> None:
    """Raise RuntimeError, naming `what` (e.g. "adamw-triton"), unless kernels defined
    `is_interpreted` can run on tensors on `device`."""
    device_type = torch.device(device).type
    if device_type == "cuda" and is_interpreted:
        raise RuntimeError(
            f"{what} got CUDA tensors but TRITON_INTERPRET=1 was set when its kernels were "
            "defined, so they run only in Triton's interpreter on CPU tensors; unset "
            "TRITON_INTERPRET to run them on the GPU."
        )
    if device_type != "cuda" and not is_interpreted:
        raise RuntimeError(
            f"{what} needs CUDA, or TRITON_INTERPRET=1 to run its kernels in Triton's "
            "interpreter on CPU."
        )


@triton.jit
def round_bf16(x, ROUND_BF16: tl.constexpr):
    """float32 x rounded to the nearest bfloat16 (still float32) when ROUND_BF16.

    The Triton 3.9 interpreter truncates float32 -> bfloat16 casts, a 1-ulp error always
    towards zero (summed over a row of P~ or dS it more than doubles attention's gradient
    error). Rounding to nearest-even on the bit pattern first makes the truncating cast
    exact. Set it only when interpreted: GPUs round natively.
    """
    if ROUND_BF16:
        bits = x.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & -65536  # -65536 = 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x
