"""The one map from the precision names users type (fp32, bf16, fp16) to dtypes.

torch-free: `torch_dtype` imports torch when called. Autocast runs in the low dtype of bf16
and fp16; fp32 means no autocast at all.
"""

from __future__ import annotations

from typing import Any

# name -> the torch dtype's attribute name
TORCH_NAMES: dict[str, str] = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
PRECISIONS = tuple(TORCH_NAMES)


def torch_dtype(precision: str) -> Any:
    """torch.float32 / torch.bfloat16 / torch.float16 for 'fp32' / 'bf16' / 'fp16'."""
    import torch

    return getattr(torch, TORCH_NAMES[precision])


def autocast_dtype(precision: str) -> Any:
    """The dtype torch.autocast computes in for `precision`; None for fp32 (no autocast)."""
    return None if precision == "fp32" else torch_dtype(precision)


def itemsize(precision: str) -> int:
    """Bytes per element: the bit width the dtype's name ends with, over 8."""
    return int(TORCH_NAMES[precision][-2:]) // 8


def matmul_precision(precision: str, param_dtype: str = "fp32") -> str:
    """The dtype a step's matmuls run in, whose peak its MFU is against: `precision`'s
    autocast, or 16-bit weights (`--param-dtype bf16`) that run 16-bit without one."""
    return precision if param_dtype == "fp32" else param_dtype
