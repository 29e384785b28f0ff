"""Model sizes: a frozen config, the named presets, and the exact parameter count.

This module must not import torch: the CLI imports it to validate `--size` and friends and
has to start fast.

The presets are the CS336 assignment-2 size table (GPT-2 small..large shapes, Radford et al.
2019, then xl and 10B). The table follows the handout release in use (`handout()`): the 2026
release's xl is 2560 wide with 32 layers, the 2025 release's xl is GPT-2 xl (1600 wide, 48
layers) and its 2560-wide model is called 2.7B. Every other name means one model in both:
2.7B and 10B are accepted whichever release is in use. `tiny` is not a GPT-2 size; it is the
assignment-1 TinyStories model.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from cs336sys.attention import registry
from cs336sys.sweep.points import settings_of, unknown

# The handout releases whose size tables cs336sys knows, newest (the default) first.
HANDOUTS = ("2026", "2025")
HANDOUT_ENV = "CS336SYS_HANDOUT"
# The one size name whose model changed between releases: release -> xl's shape.
XL = {"2026": (2560, 10240, 32, 32), "2025": (1600, 6400, 48, 25)}

# name -> (d_model, d_ff, num_layers, num_heads), for the handout release in use (presets()).
PRESETS: dict[str, tuple[int, int, int, int]] = {
    "tiny": (512, 1344, 4, 16),
    "small": (768, 3072, 12, 12),
    "medium": (1024, 4096, 24, 16),
    "large": (1280, 5120, 36, 20),
    "xl": XL[HANDOUTS[0]],
    "2.7B": (2560, 10240, 32, 32),
    "10B": (4608, 12288, 50, 36),
    # The CS336 2026 leaderboard model: a Qwen-sized 8B with an untied head.
    "8b": (4096, 11008, 34, 32),
}
# Presets whose vocabulary is not the default 10,000: the 8B uses Qwen's tokenizer.
PRESET_VOCAB: dict[str, int] = {"8b": 151_936}


@dataclass(frozen=True)
class ModelConfig:
    """Shape of a Transformer LM; `attention` names an entry of the attention registry."""

    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    context_length: int = 512
    # The longest sequence the model accepts, like GPT-2's n_ctx or Llama's
    # max_position_embeddings: the longest sequence the attention benchmarks use (65,536),
    # and a cap that turns a mistyped --seq 1000000 into a clear refusal instead
    # of a run that swaps the host before it fails (docs/bad-input.md, docs/experiments/memory.md).
    max_context_length: int = 65_536
    rope_theta: float = 10_000.0
    attention: str = "naive"
    # Activation checkpointing: "none", "every:K" (groups of K blocks), "sqrt" (groups of
    # about sqrt(num_layers) blocks, Chen et al. 2016, "Training Deep Nets with Sublinear
    # Memory Cost") or "groups:A,B,..." (uneven groups summing to num_layers).
    checkpoint: str = "none"
    # Whose Transformer LM: None for cs336sys's TransformerLM, else the user's class, built
    # with the course's constructor (vocab_size, context_length, d_model, num_layers,
    # num_heads, d_ff, rope_theta): "cs336_basics" (the course's BasicsTransformerLM) or
    # "package.module:Class". Its attention is its own; checkpointing groups its blocks
    # (models/checkpointing.py).
    model: str | None = None
    # Where the user's model keeps its blocks, as a dotted attribute path ("layers",
    # "transformer.h"): what --checkpoint wraps. None: found (models/checkpointing.py).
    blocks: str | None = None

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    @classmethod
    def of(cls, point: object) -> ModelConfig:
        """The config a sweep point describes: its attributes named like fields (d_model,
        d_ff, ..., attention, checkpoint), `seq` as the context length; the others keep their
        defaults."""
        names = (f.name for f in dataclasses.fields(cls))
        values = {n: getattr(point, n) for n in names if hasattr(point, n)}
        if hasattr(point, "seq"):
            values["context_length"] = point.seq
        return cls(**values)

    def validate(self) -> None:
        """Raise ValueError, with one sentence saying what is wrong, if the shape is invalid."""
        for name in ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size", "context_length",
                     "max_context_length"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}.")
        if self.context_length > self.max_context_length:
            raise ValueError(
                f"context_length={self.context_length} is above the model's maximum context "
                f"length {self.max_context_length}."
            )
        if not self.rope_theta > 0:
            raise ValueError(f"rope_theta must be positive, got {self.rope_theta!r}.")
        if self.d_model % self.num_heads != 0:
            raise ValueError(
                f"d_model={self.d_model} is not divisible by num_heads={self.num_heads}."
            )
        if self.d_head % 2 != 0:
            raise ValueError(
                f"d_head = d_model / num_heads = {self.d_head} must be even, because RoPE "
                "rotates pairs of dimensions."
            )
        checkpoint_groups(self.checkpoint, self.num_layers)  # raises ValueError if invalid
        if self.model is not None:
            return  # the user's model brings its own attention
        if self.attention not in registry.choices():
            raise ValueError(
                f"unknown attention {self.attention!r}; choose from {', '.join(registry.choices())}."
            )


@dataclass(frozen=True)
class ModelShape:
    """What every Spec of a point that runs the Transformer LM starts with: the size preset,
    the shape it resolved to (overrides applied) and the sequence length."""

    size: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int
    seq: int  # the sequence length, the model's context length

    def config(self) -> ModelConfig:
        """The model this point builds (ModelConfig.of: the shape, the attention and
        checkpointing where the point has them)."""
        return ModelConfig.of(self)

    def settings(self) -> dict[str, object]:
        """Every field but those NOT_A_SETTING: what the store keeps as the point's settings."""
        return settings_of(self)

    @staticmethod
    def of(size: str, config: ModelConfig) -> dict[str, object]:
        """The fields of a point of preset `size` whose model is `config`."""
        return {"size": size, "d_model": config.d_model, "d_ff": config.d_ff,
                "num_layers": config.num_layers, "num_heads": config.num_heads,
                "vocab_size": config.vocab_size, "seq": config.context_length}


def checkpoint_groups(spec: str, num_layers: int) -> list[int] | None:
    """The blocks of each checkpointed group, in order, for `spec` (none -> None); ValueError
    if it is invalid.

    every:K   groups of K blocks, the last one shorter when K does not divide num_layers;
    sqrt      every:K with K about sqrt(num_layers) (Chen et al. 2016);
    groups:A,B,...  uneven groups that sum to num_layers (e.g. groups:14,14,6 for
              the 34-layer 8B, to find the largest model that fits one GPU and its cost).
    """
    if spec == "none":
        return None
    head, _, rest = spec.partition(":")
    if head == "groups":
        sizes = rest.split(",")
        # ASCII digits: a superscript two is a digit to isdigit(), and int() of it raises a
        # message naming no option
        if not rest or not all(_count(s) >= 1 for s in sizes):
            raise ValueError(
                f"checkpoint {spec}: groups:A,B,... takes positive block counts, e.g. groups:2,2,1."
            )
        groups = [int(s) for s in sizes]
        if sum(groups) != num_layers:
            raise ValueError(
                f"checkpoint {spec}: the groups sum to {sum(groups)}, not num_layers={num_layers}."
            )
        return groups
    k = checkpoint_group(spec, num_layers)
    return [k] * (num_layers // k) + ([num_layers % k] if num_layers % k else [])


def _count(text: str) -> int:
    """`text` as a count written in ASCII digits, else 0 (a superscript two, an
    Arabic-Indic or a full-width digit are digits to str.isdigit, the last two to int())."""
    text = text.strip()
    return int(text) if text.isascii() and text.isdigit() else 0


def checkpoint_group(spec: str, num_layers: int) -> int | None:
    """Blocks per checkpointed group for `spec` (none -> None; the largest group for uneven
    groups:A,B,...); ValueError if it is invalid."""
    if spec == "none":
        return None
    if spec == "sqrt":
        return max(1, round(math.sqrt(num_layers)))
    if spec.startswith("groups:"):
        return max(checkpoint_groups(spec, num_layers))
    head, _, k = spec.partition(":")
    if head != "every" or _count(k) < 1:
        raise ValueError(
            f"checkpoint must be none, every:K (K >= 1), sqrt or groups:A,B,..., got {spec!r}."
        )
    if int(k) > num_layers:
        raise ValueError(f"checkpoint {spec}: K={k} is larger than num_layers={num_layers}.")
    return int(k)


_RELEASE: ContextVar[str | None] = ContextVar("handout", default=None)


def handout_release(value: object, option: str = "--handout") -> str:
    """`value` as a release of HANDOUTS ("2025", 2026, " 2026 "); SpecError naming them if
    it is none."""
    text_value = str(value).strip()
    if text_value not in HANDOUTS:
        raise unknown(option, text_value, HANDOUTS, "handout release")
    return text_value


def handout() -> str:
    """The handout release in use: the one `using_handout` set, else CS336SYS_HANDOUT, else
    the newest."""
    chosen = _RELEASE.get()
    if chosen is not None:
        return chosen
    return handout_release(os.environ.get(HANDOUT_ENV) or HANDOUTS[0], HANDOUT_ENV)


@contextmanager
def using_handout(release: object | None) -> Iterator[str]:
    """Within the block, size names mean `release`'s models (None: the environment's or
    the newest); yields the release."""
    token = _RELEASE.set(None if release is None else handout_release(release))
    try:
        yield handout()
    finally:
        _RELEASE.reset(token)


def presets(release: str | None = None) -> dict[str, tuple[int, int, int, int]]:
    """The size table of `release` (default: the one in use): PRESETS with that release's xl."""
    return {**PRESETS, "xl": XL[handout_release(release) if release else handout()]}


def preset_name(size: str) -> str:
    """The preset `size` names, in any case (`2.7b`, `8B`, `Small`), as PRESETS spells it;
    SpecError (a ValueError) naming the presets if none."""
    for name in presets():
        if name.lower() == size.strip().lower():
            return name
    raise unknown("--size", size, presets(), "size")


def from_preset(size: str, **overrides: object) -> ModelConfig:
    """The config for preset `size` (any case) of the handout release in use, with non-None
    `overrides` (any ModelConfig field) applied."""
    size = preset_name(size)
    d_model, d_ff, num_layers, num_heads = presets()[size]
    config = ModelConfig(d_model=d_model, d_ff=d_ff, num_layers=num_layers, num_heads=num_heads,
                         vocab_size=PRESET_VOCAB.get(size, 10_000))
    # None means "not given on the command line", so the preset's value stays.
    given = {key: value for key, value in overrides.items() if value is not None}
    fields = {f.name for f in dataclasses.fields(ModelConfig)}
    unknown = sorted(set(given) - fields)
    if unknown:
        raise TypeError(f"unknown ModelConfig field(s): {', '.join(unknown)}")
    config = dataclasses.replace(config, **given)
    config.validate()
    return config


def param_count(config: ModelConfig) -> int:
    """Exact number of parameters of `TransformerLM(config)`, computed from the shapes.

    Embedding V*d; per layer q, k, v, o projections 4*d*d, SwiGLU w1, w2, w3 3*d*d_ff and two
    RMSNorm gains 2*d; final RMSNorm d; untied LM head d*V. No biases anywhere.
    """
    d, d_ff, n_layers, vocab = config.d_model, config.d_ff, config.num_layers, config.vocab_size
    per_layer = 4 * d * d + 3 * d * d_ff + 2 * d
    return vocab * d + n_layers * per_layer + d + d * vocab
