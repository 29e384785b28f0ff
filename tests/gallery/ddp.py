"""DDPs and sharded optimizers as students write them, right and wrong (copied into a
course-layout repository as cs336_systems/gallery_ddp.py by tests/test_gallery_parallel.py).
Each wrapper broadcasts rank 0's weights, as the handout asks of a DDP."""

import copy

import torch
import torch.distributed as dist
from torch import nn


class _Hooked(nn.Module):
    """Rank 0's weights, then a post-accumulate hook on every parameter."""

    BROADCAST = True

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        self.handles = []
        for t in [*module.parameters(), *module.buffers()] if self.BROADCAST else ():
            dist.broadcast(t.data, src=0)
        for p in module.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self.hook)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()


class AverageInHooks(_Hooked):
    """Right: each gradient divided by the world size in its hook, then summed (async)."""

    def hook(self, p):
        p.grad.div_(self.world)
        self.handles.append(dist.all_reduce(p.grad, async_op=True))


class TakesX(AverageInHooks):
    """Right, its forward written for the model's input alone, as many are: the course's
    tests call it so; the step's fused loss passes targets= on to the model."""

    def forward(self, x):
        return self.module(x)


class FinishNotWritten(AverageInHooks):
    """Not finished: the handout's (optional) hook left as the stub."""

    def finish_gradient_synchronization(self):
        raise NotImplementedError


class NeverWaits(AverageInHooks):
    """Wrong: its all-reduces launched in the hooks and never waited for; the optimizer may
    step on gradients they have not reached yet (which the course's test fails)."""

    def finish_gradient_synchronization(self):
        self.handles.clear()


class AverageAfter(_Hooked):
    """Right: summed (async) in the hooks, divided once all have arrived."""

    def hook(self, p):
        self.handles.append(dist.all_reduce(p.grad, async_op=True))

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(self.world)


class TrainsACopy(AverageInHooks):
    """Right: wraps a copy of the module; the course's tests step ddp_model.parameters()."""

    def __init__(self, module):
        super().__init__(copy.deepcopy(module))


class CountsBuckets(AverageInHooks):
    """Right: keeps how many buckets it has in `buckets`, a number."""

    def __init__(self, module):
        super().__init__(module)
        self.buckets = 1


class NeverBroadcasts(AverageInHooks):
    """Wrong: each rank trains from the weights it built (the handout has rank 0's sent)."""

    BROADCAST = False


class SyncsOnce(AverageInHooks):
    """Wrong: a count of the gradients reduced, never reset, stops it after the first step
    (the course's test, one step, passes it)."""

    def __init__(self, module):
        super().__init__(module)
        self.left = sum(p.requires_grad for p in module.parameters())

    def hook(self, p):
        if self.left > 0:
            self.left -= 1
            super().hook(p)


class Summed(_Hooked):
    """Wrong: summed, never divided by the world size."""

    def hook(self, p):
        self.handles.append(dist.all_reduce(p.grad, async_op=True))


class DividedTwice(AverageAfter):
    """Wrong: divides in the hooks' wait and again after them."""

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        for p in self.module.parameters():
            if p.grad is not None:
                p.grad.div_(self.world)


class EarlyBucket(nn.Module):
    """Wrong: one bucket of every gradient, all-reduced as soon as its first gradient
    arrives, with the ones not yet computed counted as zero."""

    def __init__(self, module):
        super().__init__()
        self.module = module
        self.world = dist.get_world_size()
        self.params = [p for p in module.parameters() if p.requires_grad]
        self.sent = None
        for t in [*module.parameters(), *module.buffers()]:
            dist.broadcast(t.data, src=0)
        for p in self.params:
            p.register_post_accumulate_grad_hook(self.hook)

    def hook(self, p):
        if self.sent is not None:
            return
        grads = [q.grad if q.grad is not None else torch.zeros_like(q) for q in self.params]
        flat = torch.cat([g.reshape(-1) for g in grads])
        self.sent = (flat, dist.all_reduce(flat, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        flat, handle = self.sent
        handle.wait()
        self.sent = None
        offset = 0
        for p in self.params:
            p.grad = (flat[offset : offset + p.numel()].view_as(p) / self.world).clone()
            offset += p.numel()


class ShardedByCount(torch.optim.Optimizer):
    """Right: each parameter to the rank holding the fewest elements so far."""

    def __init__(self, params, optimizer_cls, **kwargs):
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.owner, self.load = {}, [0] * self.world
        self.local, self.optimizer_cls, self.kwargs = None, optimizer_cls, kwargs
        super().__init__(params, kwargs)

    def add_param_group(self, group):
        super().add_param_group(group)
        mine = []
        for p in self.param_groups[-1]["params"]:
            owner = min(range(self.world), key=lambda r: self.load[r])
            self.owner[p], self.load[owner] = owner, self.load[owner] + p.numel()
            if owner == self.rank:
                mine.append(p)
        local = {**{k: v for k, v in group.items() if k != "params"}, "params": mine}
        if self.local is None:
            self.local = self.optimizer_cls([local], **self.kwargs)
        else:
            self.local.add_param_group(local)

    def step(self, closure=None, **kwargs):
        loss = self.local.step(closure, **kwargs) if self.stepping() else None
        for p, owner in self.owner.items():
            dist.broadcast(p.data, src=owner)
        return loss

    def stepping(self):
        return True


class NeverStepsLastShard(ShardedByCount):
    """Wrong: the last rank never steps its shard."""

    def stepping(self):
        return self.rank != self.world - 1


class ZeroGradOfItsOwn(ShardedByCount):
    """Right: zero_grad(self), taking no argument, as the course's tests call it."""

    def zero_grad(self):
        for group in self.param_groups:
            for p in group["params"]:
                p.grad = None


class ZeroesItsShardAlone(ShardedByCount):
    """zero_grad() clears its own shard's gradients alone: under DDP in a loop that trusts
    it the others add up over the steps, but the course's sharded-optimizer test, without
    DDP, passes it, so ddp passes it too, with a note."""

    def zero_grad(self, set_to_none=True):
        self.local.zero_grad(set_to_none=set_to_none)


class NoTorchOptimizer:
    """Right: step() and zero_grad() alone, all the course's tests ask; no torch Optimizer,
    its inner one kept in a list."""

    def __init__(self, params, optimizer_cls, **kwargs):
        rank, world = dist.get_rank(), dist.get_world_size()
        self.owner = [(p, i % world) for i, p in enumerate(params)]
        self.inners = [optimizer_cls([p for p, o in self.owner if o == rank], **kwargs)]

    def zero_grad(self):
        for p, _ in self.owner:
            p.grad = None

    @torch.no_grad()
    def step(self, closure=None):
        self.inners[0].step()
        for p, owner in self.owner:
            dist.broadcast(p.data, src=owner)
