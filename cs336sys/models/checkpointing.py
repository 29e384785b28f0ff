"""Activation checkpointing for a Transformer LM that is not ours (`--model` with
`--checkpoint`): its blocks, found as the ModuleList of `num_layers` modules its forward runs
one after another (the course's `self.layers`), grouped as cs336sys's model groups its own
(models/config.checkpoint_groups) without changing the user's code.

The first block of each group runs the whole group under torch.utils.checkpoint (non-reentrant,
the mode PyTorch recommends), the others pass their input through: the model's forward still
calls every block in order, its parameters keep their names, and only each group's input is
saved for backward (Chen et al. 2016, "Training Deep Nets with Sublinear Memory Cost").
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def blocks_of(model: nn.Module, num_layers: int) -> nn.ModuleList:
    """The model's blocks: its `layers` ModuleList, else its only ModuleList child of
    `num_layers` modules; ValueError saying what checkpointing needs when there is none."""
    found = getattr(model, "layers", None)
    if isinstance(found, nn.ModuleList) and len(found) == num_layers:
        return found
    lists = [m for m in model.children() if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if len(lists) == 1:
        return lists[0]
    raise ValueError(
        f"--checkpoint on {type(model).__name__}: checkpointing needs its {num_layers} blocks in "
        "one nn.ModuleList that its forward calls one after another (the course's "
        f"`self.layers`); found {len(lists)} such lists")


def checkpoint_blocks(model: nn.Module, num_layers: int, groups: list[int]) -> nn.Module:
    """Checkpoint `model`'s blocks in consecutive groups of `groups` sizes (summing to
    num_layers), in place; returns the model."""
    blocks = blocks_of(model, num_layers)
    start = 0
    for size in groups:
        group = list(blocks)[start:start + size]
        group[0].forward = types.MethodType(_group_forward([b.forward for b in group]), group[0])
        for block in group[1:]:
            block.forward = types.MethodType(_passes_through, block)
        start += size
    return model


def _group_forward(forwards: list[Any]) -> Any:
    """The forward of a group's first block: every block of the group in order, under
    checkpoint when gradients are taken."""

    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        for forward in forwards:
            x = forward(x, *args, **kwargs)
        return x

    def forward(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if not torch.is_grad_enabled():
            return run(x, *args, **kwargs)
        return checkpoint(run, x, *args, use_reentrant=False, **kwargs)

    return forward


def _passes_through(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A block its group's first block has already run: its input is the group's output."""
    return x
