"""The Transformer LM, its size presets, its FLOP count and an AdamW optimizer.

Importing this package does not import torch: the config, presets, parameter count and FLOP
formulas are plain Python for the CLI, and the torch modules (`TransformerLM`, `AdamW`) are
imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from cs336sys.measure.lazy import attach
from cs336sys.models.config import PRESETS, ModelConfig, from_preset, param_count
from cs336sys.models.flops import STEP_MODES, forward_flops, step_flops

if TYPE_CHECKING:
    from cs336sys.models.adamw import AdamW
    from cs336sys.models.transformer import TransformerLM

# TransformerLM and AdamW import torch.
__getattr__, __dir__, _ = attach(__name__, {
    "cs336sys.models.transformer": ("TransformerLM",),
    "cs336sys.models.adamw": ("AdamW",),
})

__all__ = ["PRESETS", "STEP_MODES", "AdamW", "ModelConfig", "TransformerLM", "forward_flops",
           "from_preset", "param_count", "step_flops"]
