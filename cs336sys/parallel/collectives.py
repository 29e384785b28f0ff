"""Tensor collectives under the names every supported torch has.

torch 2.13 renamed the flat-tensor collectives (`all_gather_into_tensor` ->
`all_gather_single`, `reduce_scatter_tensor` -> `reduce_scatter_single`) and warns on the old
names; the GPU hosts' torch 2.11 has only the old ones. Everything in cs336sys that gathers
or scatters flat buffers (the comm benchmark, FSDP) calls these two.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_gather_flat(out: torch.Tensor, shard: torch.Tensor, async_op: bool = False):
    """out (world * n,) <- every rank's shard (n,), in rank order."""
    fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    return fn(out, shard, async_op=async_op)


def reduce_scatter_flat(out: torch.Tensor, full: torch.Tensor, async_op: bool = False):
    """out (n,) <- this rank's slice of the sum over ranks of full (world * n,)."""
    fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return fn(out, full, async_op=async_op)
