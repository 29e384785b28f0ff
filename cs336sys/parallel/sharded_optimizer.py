"""Optimizer state sharding (ZeRO stage 1, Rajbhandari et al. 2020, "ZeRO: Memory
Optimizations Toward Training Trillion Parameter Models", Section 5.1).

With plain data parallelism every rank keeps the whole optimizer state: for AdamW two fp32
moments per parameter, twice the weights. ShardedOptimizer gives each parameter one owner
rank; a rank builds the wrapped optimizer over the parameters it owns only, so it holds
about 1/world of the state. After backward (gradients already averaged by DDP) each rank
steps its own parameters, then every parameter is broadcast from its owner so that all
ranks hold identical weights again.

    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=1e-3, weight_decay=0.1)
    loss.backward(); ddp.finish_gradient_synchronization()
    opt.step(); opt.zero_grad()

Parameters are assigned largest first to the rank with the fewest elements so far (greedy
longest-processing-time scheduling), the same on every rank since every rank sees the same
parameters in the same order. Parameter groups keep their own hyper-parameters, and a group
added during training (add_param_group, e.g. to unfreeze layers) is divided among the ranks
the same way. Hyper-parameters changed on this optimizer's param_groups (an LR scheduler)
reach the wrapped optimizer at the next step. state_dict/load_state_dict save and restore
this rank's shard of the state (each rank saves its own file).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

BUCKET_BYTES = 25 * 2**20  # torch DDP's default bucket size


def _buckets(params: list[torch.Tensor], cap: int) -> list[list[torch.Tensor]]:
    """Consecutive runs of `params` of at most `cap` bytes (a larger one alone)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for p in params:
        nbytes = p.numel() * p.element_size()
        if not out or size + nbytes > cap:
            out.append([])
            size = 0
        out[-1].append(p)
        size += nbytes
    return out


class ShardedOptimizer(torch.optim.Optimizer):
    """`optimizer_cls(**kwargs)` over this rank's share of `params`; see the module docstring.

    `local` is the wrapped optimizer over this rank's parameters (None while it owns none);
    `owner[p]` is the rank that steps parameter p.
    """

    def __init__(self, params, optimizer_cls: type[torch.optim.Optimizer], **kwargs: Any):
        if not dist.is_initialized():
            raise RuntimeError("ShardedOptimizer needs an initialised process group")
        self.optimizer_cls = optimizer_cls
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.local: torch.optim.Optimizer | None = None
        self.owner: dict[torch.nn.Parameter, int] = {}
        self.elements = [0] * self.world_size  # parameters' elements owned, per rank
        # param_groups[i] -> the index of its part in local.param_groups (None: none here)
        self._local_index: list[int | None] = []
        # The base constructor validates the groups and calls add_param_group for each.
        super().__init__(params, defaults=dict(kwargs))

    def add_param_group(self, param_group: dict[str, Any]) -> None:
        super().add_param_group(param_group)  # checks, fills defaults, appends
        group = self.param_groups[-1]
        params = group["params"]
        # Largest first, ties in the given order: identical on every rank.
        for i in sorted(range(len(params)), key=lambda i: -params[i].numel()):
            r = min(range(self.world_size), key=lambda r: (self.elements[r], r))
            self.owner[params[i]] = r
            self.elements[r] += params[i].numel()
        mine = [p for p in params if self.owner[p] == self.rank]
        if not mine:
            self._local_index.append(None)
            return
        local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.defaults)
        else:
            self.local.add_param_group(local_group)
        self._local_index.append(len(self.local.param_groups) - 1)

    def _sync_hyperparameters(self) -> None:
        """Copy hyper-parameters set on param_groups (e.g. by a scheduler) to `local`."""
        for group, index in zip(self.param_groups, self._local_index, strict=True):
            if index is not None:
                local = self.local.param_groups[index]
                local.update({k: v for k, v in group.items() if k != "params"})

    @torch.no_grad()
    def step(self, closure=None, **kwargs):
        """The wrapped optimizer's step over this rank's parameters with `closure` and
        `kwargs` (the handout's `step(self, closure, **kwargs)`: LBFGS needs its closure),
        then every parameter from its owner. A rank that owns none, or a wrapped step that
        takes no closure, has the closure called here, once."""
        self._sync_hyperparameters()
        loss = None
        if closure is not None and (self.local is None or not _takes_closure(self.local)):
            with torch.enable_grad():
                loss = closure()
            closure = None
        if self.local is not None:
            stepped = self.local.step(closure, **kwargs) if closure is not None \
                else self.local.step(**kwargs)
            loss = stepped if loss is None else loss
        self._broadcast_from_owners()
        return loss

    def _broadcast_from_owners(self) -> None:
        """Every parameter from its owner, in buckets of at most BUCKET_BYTES of one owner,
        dtype and device: few messages, and a copy of at most one bucket at a time (a whole
        owner's flat copy would add half the model to the peak). A parameter larger than a
        bucket goes alone, in place, with no copy at all."""
        by_owner: dict[tuple, list[torch.Tensor]] = {}
        for group in self.param_groups:
            for p in group["params"]:
                by_owner.setdefault((self.owner[p], p.dtype, str(p.device)), []).append(p)
        # in the same order on every rank; torch cannot order dtypes, their names it can
        for (src, _, _), params in sorted(by_owner.items(),
                                          key=lambda kv: (kv[0][0], str(kv[0][1]), kv[0][2])):
            for bucket in _buckets(params, BUCKET_BYTES):
                if len(bucket) == 1 and bucket[0].is_contiguous():
                    dist.broadcast(bucket[0].detach(), src=src)
                    continue
                flat = _flatten_dense_tensors([p.detach() for p in bucket])  # (sum of numels,)
                dist.broadcast(flat, src=src)
                if src != self.rank:
                    for p, new in zip(bucket, _unflatten_dense_tensors(flat, bucket), strict=True):
                        p.copy_(new)

    def state_dict(self) -> dict[str, Any]:
        """This rank's shard: the wrapped optimizer's state dict ({} when it owns nothing)."""
        return {} if self.local is None else self.local.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore this rank's shard, saved by state_dict() on the same rank."""
        if self.local is not None:
            self.local.load_state_dict(state_dict)
        elif state_dict:
            raise ValueError("this rank owns no parameters, but the state dict is not empty")


def _takes_closure(optimizer: Any) -> bool:
    """Whether `optimizer.step` takes a closure (a student's AdamW may define step(self))."""
    import inspect

    try:
        params = inspect.signature(optimizer.step).parameters.values()
    except (TypeError, ValueError):
        return True
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
               for p in params)
