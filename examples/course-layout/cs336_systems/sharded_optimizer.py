"""Optimizer state sharding: each rank steps only the parameters it owns, then every rank
receives the updated parameters from their owner."""

import torch
import torch.distributed as dist


class ShardedOptimizer(torch.optim.Optimizer):
    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.owner = {}
        self.local = None
        self.optimizer_cls, self.kwargs = optimizer_cls, kwargs
        super().__init__(params, kwargs)

    def add_param_group(self, group):
        super().add_param_group(group)
        mine = []
        for p in self.param_groups[-1]["params"]:
            self.owner[p] = len(self.owner) % self.world
            if self.owner[p] == self.rank:
                mine.append(p)
        local_group = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([local_group], **self.kwargs)
        else:
            self.local.add_param_group(local_group)

    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs)
        for p, owner in self.owner.items():
            dist.broadcast(p.data, src=owner)
        return loss

    def zero_grad(self, set_to_none=True):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None
