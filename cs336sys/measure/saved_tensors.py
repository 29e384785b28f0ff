"""What autograd keeps for backward: in total (saved-tensor hooks) and per operation.

`saved_bytes_excluding` counts, with `torch.autograd.graph.saved_tensors_hooks`, the bytes
of every storage saved for backward while `fn` runs, each storage once, leaving out the
storages of `exclude` (the parameters: they exist whether or not anything is saved, and are
accounted for separately). Under autocast a weight's 16-bit copy is not a parameter: it is
made for the forward and held for backward, so it counts.

`saved_by_node` answers "which operations hold that memory?". A pack hook cannot see which
autograd node is saving, so instead the graph is walked after the forward: every node
exposes what it saved as `_saved_<name>` attributes (built-in ops, see
torch/csrc/autograd/generated/python_functions.cpp) or `saved_tensors` (custom Functions,
including the single `CompiledFunctionBackward` node of a torch.compile'd region). A storage
saved by several nodes (the normed input that the q, k and v projections all save) is split
equally among them, so the per-node bytes add up to the total and the shares to 1.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from cs336sys.measure.live_tensors import storage_key


def _keys(tensors: Iterable[torch.Tensor]) -> set[int]:
    return {k[0] for t in tensors if (k := storage_key(t)) is not None}


def saved_bytes_excluding(
    fn: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()
) -> tuple[Any, int]:
    """Run `fn`; return its output and the bytes saved for backward, `exclude` left out."""
    skip = _keys(exclude)
    storages: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        key = storage_key(t)
        if key is not None and key[0] not in skip:
            storages[key[0]] = key[1]
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = fn()
    return out, sum(storages.values())


def _graph(root: Any) -> list[Any]:
    """Every autograd node reachable from `root` (a grad_fn), each once."""
    seen: set[Any] = set()
    stack, nodes = [root], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return nodes


def _saved_of(node: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    for name in dir(node):
        if name.startswith("_saved_"):
            value = getattr(node, name)
            values = value if isinstance(value, (tuple, list)) else [value]
            out += [v for v in values if isinstance(v, torch.Tensor)]
    if not out and hasattr(node, "saved_tensors"):  # custom / compiled autograd Functions
        try:
            out += [t for t in node.saved_tensors if isinstance(t, torch.Tensor)]
        except RuntimeError:  # already freed by a backward
            pass
    return out


def _saved_storages(output: torch.Tensor, exclude: Iterable[torch.Tensor]
                    ) -> Iterator[tuple[str, set[tuple[int, int]]]]:
    """Each node of `output`'s graph that saves a storage outside `exclude`: its name and
    those storages, (key, bytes)."""
    skip = _keys(exclude)
    for node in _graph(output.grad_fn):
        keys = {k for t in _saved_of(node) if (k := storage_key(t)) is not None
                and k[0] not in skip}
        if keys:
            yield node.name(), keys


def saved_storages(output: torch.Tensor, exclude: Iterable[torch.Tensor] = ()
                   ) -> list[tuple[str, set[tuple[int, int]]]]:
    """One walk of `output`'s graph (_saved_storages), for saving_nodes and saved_by_node
    to share (`walked=`)."""
    return list(_saved_storages(output, exclude))


def saving_nodes(output: torch.Tensor, exclude: Iterable[torch.Tensor] = (),
                 walked: list | None = None) -> Counter:
    """How many nodes of each name in `output`'s graph save a tensor (`exclude` left out):
    MulBackward0's bytes in saved_by_node are those of every multiplication of the block.
    `walked`: saved_storages' walk, taken instead of walking again."""
    return Counter(name for name, _ in walked or _saved_storages(output, exclude))


def saved_by_node(output: torch.Tensor, exclude: Iterable[torch.Tensor] = (),
                  walked: list | None = None) -> dict[str, float]:
    """Bytes saved for backward in `output`'s graph, by autograd node name (e.g.
    'SoftmaxBackward0'), shared storages split equally; `exclude` left out. Sorted, largest
    first. Call before backward frees the saved tensors. `walked` as saving_nodes takes it."""
    savers: dict[int, list[str]] = defaultdict(list)  # storage -> names of saving nodes
    sizes: dict[int, int] = {}
    for name, keys in walked or _saved_storages(output, exclude):
        for key, nbytes in keys:
            savers[key].append(name)
            sizes[key] = nbytes
    per_node: dict[str, float] = defaultdict(float)
    for key, names in savers.items():
        for name in names:
            per_node[name] += sizes[key] / len(names)
    return dict(sorted(per_node.items(), key=lambda kv: -kv[1]))
