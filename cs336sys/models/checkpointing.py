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
    sizes (summing to num_layers), in place; returns the model. NotChained when a group of
    several blocks would change what the model computes: check_chained's reasons, or, where
    it cannot see them (the forward uses a block's output beyond the next block), a probe
    forward whose logits the grouping changed (the model is then left as it was)."""
    blocks = blocks_of(model, num_layers, where)
    grouped = max(groups) > 1
    check_chained(model, blocks, grouped=grouped)
    # (on the meta device there are no values to compare: a model built there to count its
    # FLOPs, the spec's check before it, which check_chained covers)
    on_meta = next(model.parameters()).is_meta
    before = _probe(model) if grouped and not on_meta else None
    replaced = []
    start = 0
    for size in groups:
        group = list(blocks)[start:start + size]
        replaced += [(b, vars(b).get("forward")) for b in group]
        group[0].forward = types.MethodType(_group_forward([b.forward for b in group]), group[0])
        for block in group[1:]:
            block.forward = types.MethodType(_passes_through, block)
        start += size
    if before is not None and not torch.equal(_probe(model), before):
        for block, own in replaced:  # put back what the model had
            if own is None:
                del block.forward
            else:
                block.forward = own
        raise NotChained(
            f"--checkpoint on {type(model).__name__}: grouping its blocks changed its output "
            "(its forward uses a block's output beyond the next block: a sum or a skip "
            "over several layers), so a group of blocks cannot run as one; checkpoint them "
            "one by one with every:1")
    return model


def _probe(model: nn.Module) -> Any:
    """The model's output for two tokens, in eval mode (no dropout draws a random number)
    and without gradients, on the model's device (the meta device costs nothing)."""
    param = next(model.parameters())
    was_training = model.training
    try:
        model.eval()
        with torch.no_grad():
            return block_output(model(torch.zeros((1, 2), dtype=torch.long,
                                                  device=param.device)))
    finally:
        model.train(was_training)


def block_output(out: Any) -> Any:
    """A block's output as the residual stream: the tensor, or the first of a tuple or list
    (a block that returns `(hidden, cache)`, as Hugging Face's do)."""
    return out[0] if isinstance(out, tuple | list) and out else out


class NotChained(ValueError):
    """A model whose blocks cannot be checkpointed in groups of several, or at all."""


def check_chained(model: nn.Module, blocks: nn.Module, grouped: bool = True) -> None:
    """NotChained unless the model's forward calls each block once (a block's forward is what
    is wrapped: a model that calls its blocks' parts itself, `l["attn"](x)`, would run with
    nothing checkpointed) and, where `grouped`, calls them in the list's order, each with its
    input by position and the same other arguments as the first (a group runs every block
    with its first block's), and hands each block's output, unchanged, to the next block:
    what running a group of blocks as one function needs. A model that adds the residual
    between blocks (`h = h + block(h)`) can only be checkpointed block by block.

    Probed with one forward of two tokens (_probe)."""
    calls: list[tuple[int, tuple, dict, Any]] = []  # (block index, args, kwargs, output)
    index = {id(block): i for i, block in enumerate(blocks)}

    def record(module: nn.Module, args: tuple, kwargs: dict, out: Any) -> None:
        calls.append((index[id(module)], args, kwargs, out))

    hooks = [block.register_forward_hook(record, with_kwargs=True) for block in blocks]
    try:
        _probe(model)
    finally:
        for hook in hooks:
            hook.remove()
    name = type(model).__name__
    if len(calls) != len(blocks):
        raise NotChained(
            f"--checkpoint on {name}: its forward called its {len(blocks)} "
            f"blocks' forward {len(calls)} times, not once each (it calls their parts itself?), "
            "so checkpointing a block's forward would leave its activations as they are; have "
            "the forward call each block")
    if grouped:
        why = _why_not_grouped(calls)
        if why is not None:
            raise NotChained(f"--checkpoint on {name}: its forward {why}, so a group of blocks "
                             "cannot run as one; checkpoint them one by one with every:1")


def _why_not_grouped(calls: list[tuple[int, tuple, dict, Any]]) -> str | None:
    """Why the recorded block calls cannot run in groups, in words; None where they can."""
    if [i for i, *_ in calls] != list(range(len(calls))):
        return "calls its blocks in another order than its list's"
    _, args0, kwargs0, _ = calls[0]
    for n, (i, args, kwargs, _) in enumerate(calls):
        if not args:
            return f"calls block {i} with its input by keyword ({', '.join(kwargs)}=...)"
        if not _same(args[1:], args0[1:]) or not _same(kwargs, kwargs0):
            return (f"hands block {i} arguments of its own beside its input (a group runs "
                    "every block with its first block's)")
        if n:
            last = calls[n - 1][3]
            if args[0] is not last:
                return ("unpacks each block's output, a tuple, before the next block (a group "
                        "hands a block's whole output on)" if args[0] is block_output(last)
                        and last is not args[0] else
                        "does not hand each block's output straight to the next block (it "
                        "changes it in between, as a residual added outside the block does)")
    return None


def _same(a: Any, b: Any) -> bool:
    """Whether two calls' other arguments are the same: each tensor the same object (a mask
    or the RoPE angles built once), anything else equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple | list) and isinstance(b, tuple | list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if torch.is_tensor(a) and torch.is_tensor(b):  # on the meta device values are unknown
        return a is b or (a.shape == b.shape and a.dtype == b.dtype
                          and (a.is_meta or torch.equal(a, b)))
    if torch.is_tensor(a) or torch.is_tensor(b):
        return False
    try:
        return bool(a == b)
    except Exception:  # an object whose == raises or is ambiguous
        return a is b


def _group_forward(forwards: list[Any]) -> Any:
    """The forward of a group's first block: every block of the group in order, under
    checkpoint when gradients are taken."""

    def run(x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        for forward in forwards:
            x = forward(x, *args, **kwargs)
        return x

    # a block alone is called as the model calls it (its input by keyword too: `layer(x=h)`)
    fn = forwards[0] if len(forwards) == 1 else run

    def forward(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if not torch.is_grad_enabled():
            return fn(*args, **kwargs)
        return checkpoint(fn, *args, use_reentrant=False, **kwargs)

    return forward


def _passes_through(self: nn.Module, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A block its group's first block has already run: its input is the group's output."""
    return x
