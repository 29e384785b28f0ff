"""Attention implementations by name.

The model looks its attention function up by the string in `ModelConfig.attention`, so a
new implementation (FlashAttention-2 in PyTorch, a Triton kernel, a compiled variant) is one
entry here, or one `register` call, and never an edit to the model. The user's own
implementations (`yours-torch`, `yours-triton`, one-off `yours...` targets) are answered by
cs336sys.yours.

No torch here: the CLI imports this module to validate `--attention` and has to start fast,
so each implementation is imported only when `get` asks for it.

Every function has the signature `fn(q, k, v, is_causal=False) -> Tensor` on (..., T, D)
tensors, the contract of `torch.nn.functional.scaled_dot_product_attention`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cs336sys import yours
from cs336sys.yours.implementations import attention_function, load_target


def _naive() -> Callable[..., Any]:
    from cs336sys.attention.reference import naive_attention

    return naive_attention


def _sdpa() -> Callable[..., Any]:
    from cs336sys.attention.reference import sdpa_attention

    return sdpa_attention


def _compiled() -> Callable[..., Any]:
    from cs336sys.attention.compiled import compiled_attention

    return compiled_attention


def _flash_torch() -> Callable[..., Any]:
    from cs336sys.attention.flash_torch import flash_attention_torch

    return flash_attention_torch


def _triton() -> Callable[..., Any]:
    from cs336sys.attention.flash_triton import flash_attention_triton

    return flash_attention_triton


# Ours, in the order shown to users: name -> a function that imports the implementation.
OURS: dict[str, Callable[[], Callable[..., Any]]] = {
    "naive": _naive, "sdpa": _sdpa, "compiled": _compiled, "flash-torch": _flash_torch,
    "triton": _triton,
}
_added: dict[str, Callable[..., Any] | str] = {}  # register()ed in this process


def names() -> list[str]:
    """Ours, then those registered in this process, in order."""
    return [*OURS, *_added]


def choices() -> list[str]:
    """Every name an option may take: names(), then the user's (yours-torch, yours-triton and
    the one-off targets registered for attention)."""
    return [*names(), *(n for n in yours.names("attention") if n not in _added)]


def register(name: str, fn: Callable[..., Any] | str) -> None:
    """Add an implementation under `name`: the function, or "package.module:function" to be
    imported when first used. The same implementation twice is a no-op; another under a name
    in use raises, because silently swapping the code behind a name would corrupt rows."""
    if isinstance(fn, str):
        module, sep, attr = fn.partition(":")
        if not (module and sep and attr):
            raise ValueError(f"attention target must look like 'package.module:function', got {fn!r}")
    if name in OURS or _added.get(name, fn) != fn:
        raise ValueError(f"attention {name!r} is already registered")
    _added[name] = fn


def get(name: str) -> Callable[..., Any]:
    """The function registered as `name`, or the user's implementation of that name."""
    if name in OURS:
        return OURS[name]()
    if name in _added:
        fn = _added[name]
        if isinstance(fn, str):
            return load_target(fn)
        return fn
    if yours.is_yours(name):
        return attention_function(name)
    raise ValueError(f"unknown attention {name!r}; choose from {', '.join(choices())}")
