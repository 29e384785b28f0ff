"""The Transformer LM, its size presets, its FLOP count and an AdamW optimizer.

Importing this package does not import torch: the config, presets, parameter count and FLOP
formulas are plain Python for the CLI, and the torch modules (`TransformerLM`, `AdamW`) are
imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cs336sys.bench.lazy import attributes
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


__getattr__ = attributes(globals(), _LAZY)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
