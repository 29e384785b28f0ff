"""The Transformer LM, its size presets, its FLOP count and an AdamW optimizer.

Importing this package does not import torch: the config, presets, parameter count and FLOP
formulas are plain Python for the CLI, and the torch modules (`TransformerLM`, `AdamW`) are
imported on first attribute access.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cs336sys.models.config import PRESETS, ModelConfig, from_preset, param_count
from cs336sys.models.flops import STEP_MODES, forward_flops, step_flops

if TYPE_CHECKING:
    from cs336sys.models.adamw import AdamW
    from cs336sys.models.transformer import TransformerLM

# name -> module that defines it, imported lazily because it imports torch.
_LAZY = {
    "TransformerLM": "cs336sys.models.transformer",
    "AdamW": "cs336sys.models.adamw",
}

__all__ = [
    "PRESETS",
    "STEP_MODES",
    "AdamW",
    "ModelConfig",
    "TransformerLM",
    "forward_flops",
    "from_preset",
    "param_count",
    "step_flops",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # cache, so __getattr__ runs once per name
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
