"""The Transformer LM, its size presets, its FLOP count and an AdamW optimizer.

Importing this package does not import torch: the config, presets, parameter count and FLOP
formulas are plain Python for the CLI, and the torch modules (`TransformerLM`, `AdamW`) are
imported on first attribute access.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from cs336sys.models.config import PRESETS, ModelConfig, from_preset, param_count
from cs336sys.models.flops import STEP_MODES, forward_flops, step_flops

if TYPE_CHECKING:
    from cs336sys.models.adamw import AdamW
    from cs336sys.models.transformer import TransformerLM

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
    """TransformerLM and AdamW, imported on first use: they import torch (PEP 562)."""
    if name == "TransformerLM":
        from cs336sys.models.transformer import TransformerLM

        return TransformerLM
    if name == "AdamW":
        from cs336sys.models.adamw import AdamW

        return AdamW
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | {"TransformerLM", "AdamW"})
