"""Activation checkpointing for a Transformer LM that is not ours (`--model` with
`--checkpoint`): its blocks, the ModuleList of `num_layers` modules its forward runs one
after another (the course's `self.layers`), found or named with `--blocks`, grouped as
cs336sys's model groups its own (models/config.checkpoint_groups) without changing the
user's code.

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


def blocks_of(model: nn.Module, num_layers: int, where: str | None = None,
              needs: str = "--checkpoint on {name}: checkpointing") -> nn.Module:
    """The model's blocks: the module at the dotted path `where` (`--blocks`), else its
    `layers` ModuleList, else its only ModuleList (at any depth: GPT-2's `transformer.h`) of
    `num_layers` modules; ValueError saying what `needs` them (checkpointing) when there is
    none."""
    name = type(model).__name__
    if where is not None:
        try:
            found = model.get_submodule(where)
        except AttributeError:
            raise ValueError(f"--blocks {where}: {name} has no submodule {where!r}") from None
        if not isinstance(found, (nn.ModuleList, nn.Sequential)) or len(found) != num_layers:
            what = (f"{len(found)} modules" if isinstance(found, (nn.ModuleList, nn.Sequential))
                    else f"a {type(found).__name__}")
            raise ValueError(f"--blocks {where}: {name}.{where} is {what}, not the nn.ModuleList "
                             f"(or nn.Sequential) of its {num_layers} blocks")
        return found
    found = getattr(model, "layers", None)
    if isinstance(found, nn.ModuleList) and len(found) == num_layers:
        return found
    lists = [(path, m) for path, m in model.named_modules()
             if isinstance(m, nn.ModuleList) and len(m) == num_layers]
    if len(lists) == 1:
        return lists[0][1]
    named = f" ({', '.join(path for path, _ in lists)}): name one with --blocks" if lists else ""
    sequential = [path for path, m in model.named_modules()
                  if isinstance(m, nn.Sequential) and len(m) == num_layers and path]
    if not lists and sequential:  # taken when named, never guessed
        named = (f"; an nn.Sequential of {num_layers} ({', '.join(sequential)}) is taken when "
                 f"named: --blocks {sequential[0]}")
    raise ValueError(
        f"{needs.format(name=name)} needs its {num_layers} blocks in one "
        "nn.ModuleList that its forward calls one after another (the course's `self.layers`); "
        f"found {len(lists)} such lists{named}")


def found_blocks(model: nn.Module, num_layers: int, where: str | None = None) -> list[nn.Module]:
    """The blocks `blocks_of` finds, as a list; none when it finds none, for a caller that
    can do without them (compile the whole model; shard it as one FSDP unit)."""
    try:
        return list(blocks_of(model, num_layers, where))
    except ValueError:
        return []


def checkpoint_blocks(model: nn.Module, num_layers: int, groups: list[int],
                      where: str | None = None) -> nn.Module:
    """Checkpoint `model`'s blocks (at `where`, else found) in consecutive groups of `groups`
    sizes (summing to num_layers), in place; returns the model. ValueError when a group of
    several blocks would change what the model computes (check_chained)."""
    blocks = blocks_of(model, num_layers, where)
    check_chained(model, blocks, grouped=max(groups) > 1)
    start = 0
    for size in groups:
        group = list(blocks)[start:start + size]
        group[0].forward = types.MethodType(_group_forward([b.forward for b in group]), group[0])
        for block in group[1:]:
            block.forward = types.MethodType(_passes_through, block)
        start += size
    return model


def block_output(out: Any) -> Any:
    """A block's output as the residual stream: the tensor, or the first of a tuple or list
    (a block that returns `(hidden, cache)`, as Hugging Face's do)."""
    return out[0] if isinstance(out, tuple | list) and out else out


class NotChained(ValueError):
    """A model whose blocks cannot be checkpointed in groups of several, or at all."""


def check_chained(model: nn.Module, blocks: nn.Module, grouped: bool = True) -> None:
    """NotChained unless the model's forward calls each block once (a block's forward is what
    is wrapped: a model that calls its blocks' parts itself, `l["attn"](x)`, would run with
    nothing checkpointed) and, where `grouped`, hands each block's output, unchanged, to the
    next block: what running a group of blocks as one function needs. A model that adds the
    residual between blocks (`h = h + block(h)`) can only be checkpointed block by block.

    Probed with one forward of two tokens, in eval mode (no dropout draws a random number)
    and without gradients, on the model's device (the meta device costs nothing)."""
    handed_on: list[bool] = []
    last: list[torch.Tensor] = []

    def record(module: nn.Module, args: tuple, out: Any) -> None:
        if last:
            handed_on.append(bool(args) and args[0] is last[-1])
        last.append(out)

    hooks = [block.register_forward_hook(record) for block in blocks]
    param = next(model.parameters())
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            model(torch.zeros((1, 2), dtype=torch.long, device=param.device))
    finally:
        model.train(was_training)
        for hook in hooks:
            hook.remove()
    if len(last) != len(blocks):
        raise NotChained(
            f"--checkpoint on {type(model).__name__}: its forward called its {len(blocks)} "
            f"blocks' forward {len(last)} times, not once each (it calls their parts itself?), "
            "so checkpointing a block's forward would leave its activations as they are; have "
            "the forward call each block")
    if grouped and not all(handed_on):
        raise NotChained(
            f"--checkpoint on {type(model).__name__}: its forward does not hand each block's "
            "output straight to the next block (it changes it in between, as a residual added "
            "outside the block does), so a group of blocks cannot run as one; checkpoint them "
            "one by one with every:1")


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
