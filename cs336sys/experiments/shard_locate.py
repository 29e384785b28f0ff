"""Where a tensor an FSDP holds on rank 0 sits in the whole model, found by its values.

Before the first optimizer step, every element of a shard is a copy of one element of the
initial weights, whatever the layout: a chunk along dim 0, a strided slice, a column block,
a later rank's chunk, or one flat buffer of many weights under a name of the FSDP's own
(`flat_shard`). Initial weights are drawn at random, so most values occur once in the model
(98.4 % of 1M, 72.9 % of 20M: `python benchmarks/shard_locate.py`), and an element whose
value occurs once is at that one place; at least half of a shard's elements must be found so (LOCATED_SHARE), within the
one weight its name ends in where it has one. The shard's gradient is then compared, element
by element, with the reference's gradient at those places: no layout has to be guessed, and
a gradient that belongs to other places than the weights it is held with (a reduce-scatter's
result kept by the wrong rank) shows as such.
"""

from __future__ import annotations

from typing import Any, NamedTuple

# Fewer located elements than this share of a tensor's is no location: its values were not
# the initial weights (a master copy cast to 16 bits, a rank's own initialisation). Values
# rounded through 16 bits meet the model's exactly representable ones by chance: in a 22.7M
# TransformerLM, 15.4 % of bf16-rounded shards' values (14.1 % fp16) were found, 80 % of
# those in other weights; 83.3 % of exact shards' (benchmarks/shard_locate.py).
LOCATED_SHARE = 0.5
# Past this many parameters values repeat too often to place a shard (27.1 % of 100M occur
# once) and sorting the model costs seconds (13 s for 100M here) and gigabytes: shards are
# left to their names.
MAX_LOCATED = 30_000_000


class Located(NamedTuple):
    """Elements `at` of a rank's flattened tensor are the model's flattened elements `where`."""

    at: Any
    where: Any


class WholeModel:
    """The reference's parameters as one flat vector (in its names' order), with the values
    that occur once in it sorted, to locate a rank's tensor by value."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        import torch

        self.names = list(tensors)
        self.offsets: dict[str, tuple[int, int]] = {}
        start = 0
        for name, t in tensors.items():
            self.offsets[name] = (start, start + t.numel())
            start += t.numel()
        self.size = start
        self.values, self.order = torch.empty(0), torch.empty(0, dtype=torch.long)
        if self.size > MAX_LOCATED:  # (nothing sorted: locate() says None)
            return
        flat = torch.cat([t.detach().float().cpu().reshape(-1) for t in tensors.values()])
        values, order = flat.sort()
        once = torch.ones(values.numel(), dtype=torch.bool)
        same = values[1:] == values[:-1]
        once[1:] &= ~same
        once[:-1] &= ~same
        self.values, self.order = values[once], order[once]

    def flatten(self, tensors: dict[str, Any]) -> Any:
        """`tensors` (by the reference's names, shaped as the model's) as one vector in this
        model's order; zeros for a name missing."""
        import torch

        return torch.cat([tensors[n].detach().float().cpu().reshape(-1) if n in tensors
                          else torch.zeros(hi - lo) for n, (lo, hi) in self.offsets.items()])

    def locate(self, tensor: Any) -> Located | None:
        """Where the elements of `tensor` (flattened) whose values occur once in the model
        are; None where fewer than LOCATED_SHARE of them (or none) are found, or the model
        is past MAX_LOCATED parameters."""
        import torch

        if not self.values.numel() or self.size > MAX_LOCATED:
            return None
        v = tensor.detach().float().cpu().reshape(-1)
        i = torch.searchsorted(self.values, v).clamp(max=self.values.numel() - 1)
        found = self.values[i] == v
        if int(found.sum()) < max(1, LOCATED_SHARE * v.numel()):
            return None
        at = found.nonzero().squeeze(1)
        return Located(at, self.order[i[at]])

    def names_at(self, where: Any) -> list[str]:
        """The names of the parameters the flat positions `where` fall in, in model order."""
        return [n for n, (lo, hi) in self.offsets.items()
                if bool(((where >= lo) & (where < hi)).any())]

    def shifted(self, where: Any, name: str, by: int) -> Any:
        """Positions `where`, inside parameter `name`, moved `by` elements along its
        flattened tensor (wrapping around): where another rank's chunk of it lies."""
        lo, hi = self.offsets[name]
        return lo + (where - lo + by) % (hi - lo)
