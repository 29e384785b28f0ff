"""What `cs336sys plan` counts of a model: its parameter tensors under a TP split, the bytes
a token keeps for backward per layer, its forward FLOPs, the all-reduces TP adds per phase,
what a parameter costs in memory, and what FSDP gathers at once. Two models:

- `transformer`: cs336sys's Transformer LM (experiments/plan.py's docstring has its
  conventions: bf16 weights and gradients and fp32 AdamW state, 2 + 2 + 12 bytes a
  parameter, ZeRO's accounting);
- `ffn2`: the 2025 handout's XXL (`communication_accounting`, `--size xxl`): blocks of two
  linear layers, d_model -> d_ff -> d_model, no activation function, no attention, no
  embeddings and no output layer; master weights, accumulated gradients and AdamW state in
  fp32 (4 + 4 + 8 bytes a parameter), activations and gradient communication in bf16; with
  TP, W1 split by columns and W2 by rows (one all-reduce of the output per block in forward,
  one of the input's gradient in backward). Under FSDP its memory is the handout's (b):
  weights, gradients, optimizer state and half the activations ("in practice every second
  layer") sharded over the N devices, the other half whole on each, and no gathered weights.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from cs336sys.models.config import ModelConfig
from cs336sys.models.flops import forward_flops

E = 2  # bytes per bf16 element
BLOCKS = ("transformer", "ffn2")
# The 2025 handout's XXL: d_model, d_ff and blocks (its heads and vocabulary do not exist).
XXL = {"d_model": 16384, "d_ff": 53248, "num_layers": 126, "num_heads": 1, "vocab_size": 1}


@dataclass(frozen=True)
class Transformer:
    """cs336sys's Transformer LM."""

    matrices: int = 3  # in each FFN: SwiGLU's w1, w2, w3
    bytes_per_param: tuple[tuple[str, int], ...] = (("params", 2), ("grads", 2), ("opt_state", 12))
    # FSDP splits the batch: every activation a device keeps is of its own B/N tokens
    fsdp_activation_share: float = 1.0
    gathered_units: int = 2  # FSDP: the unit computing and the next one, prefetched

    def tensors(self, cfg: ModelConfig, y: int = 1) -> list[int]:
        """Elements of each parameter tensor on one device of a TP group of `y` (y=1: the
        whole model; sums to param_count). Split tensors round up: vocabulary and d_ff are
        padded to a multiple of y, as Megatron pads its vocabulary."""
        d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
        split_v, split_f = math.ceil(v / y) * d, math.ceil(f / y) * d
        per_layer = [d * d // y] * 4 + [split_f] * 3 + [d, d]  # q k v o, w1 w2 w3, two norms
        return [split_v, *per_layer * cfg.num_layers, d, split_v]  # embedding ... norm, head

    def unit(self, local: list[int]) -> int:
        """Elements of the largest FSDP unit: a layer, or the embedding (= the head)."""
        return max(sum(local[1:10]), local[0])

    def activation_bytes(self, cfg: ModelConfig, y: int = 1) -> tuple[float, float, float]:
        """(per layer, checkpointed per layer, head) bytes a token keeps under TP `y`."""
        d, f, h, v = cfg.d_model, cfg.d_ff, cfg.num_heads, cfg.vocab_size
        layer = 8 * d + (8 * d + 8 * f + 4 * h) / y
        return layer, 2 * d, 4 * d + 6 * v / y

    def forward_flops(self, cfg: ModelConfig, sequences: int, seq: int) -> float:
        return forward_flops(cfg, sequences, seq)

    def tp_reduces(self, cfg: ModelConfig) -> int:
        """All-reduces of the B x D activations per phase under TP."""
        return 2 * cfg.num_layers + 1


@dataclass(frozen=True)
class TwoMatrixFFN:
    """The 2025 handout's XXL blocks (module docstring)."""

    matrices: int = 2
    bytes_per_param: tuple[tuple[str, int], ...] = (("params", 4), ("grads", 4), ("opt_state", 8))
    # the handout's (b): half the activations sharded over the FSDP degree, half whole on each
    # device, and only the state and those activations counted (no gathered weights)
    fsdp_activation_share: float = 0.5
    gathered_units: int = 0

    def tensors(self, cfg: ModelConfig, y: int = 1) -> list[int]:
        split_f = math.ceil(cfg.d_ff / y) * cfg.d_model
        return [split_f, split_f] * cfg.num_layers  # W1 (D x F/y), W2 (F/y x D)

    def unit(self, local: list[int]) -> int:
        return local[0] + local[1]  # one block

    def activation_bytes(self, cfg: ModelConfig, y: int = 1) -> tuple[float, float, float]:
        """Per token and block, bf16: W1's input (whole on every TP device) and W2's input
        (split); checkpointed, the block's input alone; no head."""
        return E * cfg.d_model + E * cfg.d_ff / y, E * cfg.d_model, 0.0

    def forward_flops(self, cfg: ModelConfig, sequences: int, seq: int) -> float:
        return 2 * sequences * seq * self.matrices * cfg.d_model * cfg.d_ff * cfg.num_layers

    def tp_reduces(self, cfg: ModelConfig) -> int:
        return cfg.num_layers


ACCOUNTING = {"transformer": Transformer(), "ffn2": TwoMatrixFFN()}


def sharded(numels: list[int], x: int) -> int:
    """Elements one of `x` FSDP devices holds: each tensor padded to a multiple of x."""
    return sum(math.ceil(k / x) for k in numels)


def gathered_bytes(model: Transformer | TwoMatrixFFN, local: list[int]) -> int:
    """What FSDP holds gathered at once beside the shards: its units, in bf16."""
    return model.gathered_units * E * model.unit(local)


def token_bytes(model: Transformer | TwoMatrixFFN, cfg: ModelConfig,
                y: int = 1) -> tuple[float, float]:
    """(without, with full checkpointing) the bytes one token keeps for backward under TP
    `y`: every layer's and the head's; checkpointed, each layer's input and one layer
    recomputed."""
    layer, kept, head = model.activation_bytes(cfg, y)
    return cfg.num_layers * layer + head, cfg.num_layers * kept + layer + head


def fsdp_fit(model: Transformer | TwoMatrixFFN, cfg: ModelConfig, tokens: int,
             cap: float) -> tuple[int | None, int | None]:
    """(the smallest FSDP degree N whose memory per device fits `cap` bytes, the largest
    batch in tokens that some N fits), each None where there is none (the second: every
    batch fits at some N). Per device, S the state's bytes (params, grads, optimizer), a the
    bytes a token keeps, s the share of the activations FSDP shards (xxl: the handout's half)
    and G the gathered units: M(N) = (S + s B a)/N + G + (1 - s) B a, so N >= (S + s B a) /
    (cap - G - (1 - s) B a) -- the 2025 communication_accounting (b)'s threshold. Real N,
    each tensor's padding to a multiple of N left out; N = 1 holds no gathered unit (but
    its state, 16 bytes a parameter, is more than G: where G fills the device, 0 tokens)."""
    local = model.tensors(cfg)
    state = sum(per for _, per in model.bytes_per_param) * sum(local)
    per_token, _ = token_bytes(model, cfg)
    share, gathered = model.fsdp_activation_share, gathered_bytes(model, local)
    whole = (1 - share) * per_token  # bytes a token keeps on every device, whatever N
    # no batch fits where the gathered units alone fill the device
    tokens_max = max(0, math.floor((cap - gathered) / whole)) if whole else (
        None if gathered < cap else 0)
    if state + tokens * per_token <= cap:
        return 1, tokens_max
    room = cap - gathered - whole * tokens
    if room <= 0:
        return None, tokens_max
    return max(2, math.ceil((state + share * tokens * per_token) / room)), tokens_max
