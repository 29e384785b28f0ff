"""Count what a training step sends: calls and bytes of each kind of collective.

Every c10d collective, whether our wrappers call it or torch's DDP, ZeroRedundancyOptimizer
or FSDP2 do, goes through the dispatcher as an op of the `c10d` namespace, where a
TorchDispatchMode sees it. Bytes follow nccl-tests' size S: the whole buffer for all-reduce
and broadcast, the gathered (output) buffer for all-gather, the full (input) buffer for
reduce-scatter; coalesced forms add up their tensors.

    with CommCounter() as comm:
        loss.backward(); ddp.finish_gradient_synchronization(); optimizer.step()
    comm.bytes["all_gather"], comm.calls["reduce_scatter"]

A dispatch mode sees every op, so it slows a step down: count in a step that is not timed.

S is the size of each call, not what it moves: what a rank sends (`sent`) is what compares
collectives of different kinds (the handout's "communication volume" of a sharded optimizer
against DDP's). In the ring algorithms (and a broadcast's chain) an all-reduce of S bytes
over n ranks sends 2(n-1)/n S from each rank, the others (n-1)/n S on average. With Ψ bytes
of gradients, DDP sends 2(n-1)/n Ψ; the course's sharded optimizer adds a broadcast of the
parameters, (n-1)/n Ψ more (1.5x DDP), where ZeRO's reduce-scatter and all-gather send as
much as DDP (Rajbhandari et al. 2020, §7).
"""

from __future__ import annotations

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from cs336sys.parallel.plan_math import sent_bytes

KINDS = ("all_reduce", "broadcast", "all_gather", "reduce_scatter")

# c10d op name -> (kind, which argument holds the tensors whose size counts)
_OPS = {
    "allreduce_": ("all_reduce", 0),
    "allreduce_coalesced_": ("all_reduce", 0),
    "broadcast_": ("broadcast", 0),
    "_allgather_base_": ("all_gather", 0),  # (output, input, ...)
    "allgather_into_tensor_coalesced_": ("all_gather", 0),
    "allgather_": ("all_gather", 0),  # (output lists, inputs, ...)
    "_reduce_scatter_base_": ("reduce_scatter", 1),  # (output, input, ...)
    "reduce_scatter_tensor_coalesced_": ("reduce_scatter", 1),
    "reduce_scatter_": ("reduce_scatter", 1),  # (outputs, input lists, ...)
}


class CommCounter(TorchDispatchMode):
    """calls[kind] and bytes[kind] of the collectives run while it is entered."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = dict.fromkeys(KINDS, 0)
        self.bytes = dict.fromkeys(KINDS, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func.name().split("::")
        if len(packet) == 2 and packet[0] == "c10d":
            op = packet[1].split(".")[0]
            if op in _OPS:
                kind, arg = _OPS[op]
                tensors = [t for t in tree_flatten(args[arg])[0] if torch.is_tensor(t)]
                self.calls[kind] += 1
                self.bytes[kind] += sum(t.numel() * t.element_size() for t in tensors)
        return func(*args, **(kwargs or {}))

    def sent(self, world_size: int) -> float:
        """Bytes a rank sends in the collectives counted, the ranks' mean (module docstring)."""
        return sum(sent_bytes(kind, n, world_size) for kind, n in self.bytes.items())

    def figures(self, world_size: int) -> dict[str, float]:
        """What ddp stores of a step: each kind's calls and bytes (S), their sum
        (comm_bytes) and what a rank sends (sent_bytes)."""
        out: dict[str, float] = {}
        for kind in KINDS:
            out[f"{kind.replace('_', '')}_bytes"] = self.bytes[kind]
            out[f"{kind.replace('_', '')}_calls"] = self.calls[kind]
        return {**out, "comm_bytes": sum(self.bytes.values()), "sent_bytes": self.sent(world_size)}
