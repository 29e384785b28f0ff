"""Attention implementations by name.

The model looks its attention function up by the string in `ModelConfig.attention`, so a
new implementation (FlashAttention-2 in PyTorch, a Triton kernel, a compiled variant) is one
`register` call and never an edit to the model. The table lives in bench/registry.py; this
module fills it with the kernels of this package, and answers the user's own
implementations (`yours-torch`, `yours-triton`, one-off `yours...` targets) from
cs336sys.yours.

This module must not import torch: the CLI imports it to validate `--attention` and has to
start fast. Targets are therefore "module:function" strings imported only in `get`.

Every registered function has the signature `fn(q, k, v, is_causal=False) -> Tensor` on
(..., T, D) tensors, the same contract as `torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cs336sys import yours
from cs336sys.bench.registry import ATTENTION

# name -> "module:function"; insertion order is the order shown to users.
for _name, _target in {
    "naive": "cs336sys.attention.reference:naive_attention",
    "sdpa": "cs336sys.attention.reference:sdpa_attention",
    "compiled": "cs336sys.attention.compiled:compiled_attention",
    "flash-torch": "cs336sys.attention.flash_torch:flash_attention_torch",
    "triton": "cs336sys.attention.flash_triton:flash_attention_triton",
}.items():
    ATTENTION.register(_name, _target)

names = ATTENTION.names
register = ATTENTION.register


def choices() -> list[str]:
    """Every name an option may take: ours, then the user's (yours-torch, yours-triton and
    the one-off targets registered for attention)."""
    return [*ATTENTION.names(), *yours.names("attention")]


def get(name: str) -> Callable[..., Any]:
    """The function registered as `name`, or the user's implementation of that name."""
    if yours.is_yours(name) and name not in ATTENTION.names():
        from cs336sys.yours.implementations import attention_function

        return attention_function(name)
    return ATTENTION.get(name)
