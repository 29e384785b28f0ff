"""FSDPs as students write them for the course, right and wrong (copied into a course-layout
repository as cs336_systems/gallery_fsdp.py by tests/test_gallery_parallel.py).

`FSDP`: the weights of cs336_basics' `Linear` and `Embedding` modules sharded by rows across
ranks, every other parameter (the RMSNorm gains) replicated, with its gradient all-reduced
(sum, async) from a post-accumulate hook and divided by the world size in
finish_gradient_synchronization(); compute in `compute_dtype` when given, fp32 master
shards. Like the handout's FSDP it broadcasts nothing: each rank shards the model it was
given, which the course's test builds alike on every rank. It passes the course's
tests/test_fsdp.py in fp32 and fp16.

`LeavesGradFull`: each sharded weight's gradient reduced but left full-size on its shard;
the course's test names the shapes, and AdamW fails on them.

`ForgetsReplicated`: the same, with the replicated parameters' all-reduce forgotten.

`StaleShards`: the same, each shard handed the gradient reduced at the step before (zeros at
the first); the course's test fails it at step 0.

`KeepsModelElsewhere`: right, but keeps the model as `.model`; the course's gradient-sync
test reads `fsdp_model.module`.

`ShardsNorms`: right in training, but shards the RMSNorm gains too, which the handout asks
left whole; the course's test finds their gradients differ between ranks.

`GathersToRankZero`: right, but gathers the full parameters to rank 0 alone (as for a
checkpoint); the other ranks return their shards, which the course's test compares too.

`CompileReady`: the same, its gathering hooks registered under torch.compiler.disable, so that
a compiled block runs them eager (the step's compile switch) instead of tracing them.
"""

import torch
import torch.distributed as dist
from cs336_basics.model import Embedding, Linear, RMSNorm
from torch import nn


class FSDP(nn.Module):
    kinds = (Linear, Embedding)  # the modules whose weights are sharded

    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self.chunk = self._chunk()
        self.handles = []
        self.replicated = []
        sharded = set()
        for m in module.modules():
            if not isinstance(m, self.kinds):
                continue
            w = m.weight
            sharded.add(id(w))
            m.full_shape = tuple(w.shape)
            m.rows = -(-w.shape[0] // self.world)
            padded = torch.zeros(m.rows * self.world, *w.shape[1:], dtype=w.dtype, device=w.device)
            padded[: w.shape[0]] = w.data
            m.shard = padded[self.chunk * m.rows : (self.chunk + 1) * m.rows].clone()
            w.data = m.shard
            m.register_forward_pre_hook(self._hook(self._gather))
            m.register_forward_hook(self._hook(self._release))
            m.register_full_backward_pre_hook(self._hook(self._gather_for_backward))
            w.register_post_accumulate_grad_hook(self._reduce_sharded(m))
        for p in module.parameters():
            if id(p) not in sharded and p.requires_grad:
                self.replicated.append(p)
                p.register_post_accumulate_grad_hook(self._reduce_replicated)

    def _hook(self, fn):
        return fn

    def _chunk(self):
        """Which chunk of each weight this rank holds."""
        return self.rank

    def _in_order(self, parts):
        """The ranks' shards, gathered in rank order, in the order of their chunks."""
        return parts

    def _full(self, m):
        parts = [torch.empty_like(m.shard) for _ in range(self.world)]
        dist.all_gather(parts, m.shard)
        full = torch.cat(self._in_order(parts))[: m.full_shape[0]]
        return full if self.compute_dtype is None else full.to(self.compute_dtype)

    def _gather(self, m, args):
        m.weight.data = self._full(m)

    def _release(self, m, args, out):
        m.weight.data = m.shard

    def _gather_for_backward(self, m, grad_output):
        m.weight.data = self._full(m)

    def _reduce_sharded(self, m):
        def hook(p):
            grad = p.grad.float()
            padded = torch.zeros(m.rows * self.world, *grad.shape[1:], dtype=grad.dtype, device=grad.device)
            padded[: grad.shape[0]] = grad
            dist.all_reduce(padded)
            p.data = m.shard
            p.grad = padded[self.chunk * m.rows : (self.chunk + 1) * m.rows] / self.world

        return hook

    def _reduce_replicated(self, p):
        self.handles.append(dist.all_reduce(p.grad, async_op=True))

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self):
        for handle in self.handles:
            handle.wait()
        self.handles.clear()
        for p in self.replicated:
            if p.grad is not None:
                p.grad /= self.world

    def full_state_dict(self):
        out = {}
        modules = dict(self.module.named_modules())
        for name, p in self.module.named_parameters():
            owner = modules[name.rpartition(".")[0]]
            if isinstance(owner, self.kinds):
                parts = [torch.empty_like(owner.shard) for _ in range(self.world)]
                dist.all_gather(parts, owner.shard)
                out[name] = torch.cat(self._in_order(parts))[: owner.full_shape[0]]
            else:
                out[name] = p.data
        return out


class LeavesGradFull(FSDP):
    """Reduces each sharded gradient, but leaves the full-size gradient on the shard: the
    course's gradient-sync test names the shapes; AdamW then fails on them."""

    def _reduce_sharded(self, m):
        def hook(p):
            dist.all_reduce(p.grad)
            p.grad /= self.world
            p.data = m.shard

        return hook


class SumsShards(FSDP):
    """Sums the sharded gradients (averages the replicated ones): AdamW moves the
    parameters as the mean would, the course's SGD test fails it."""

    def _reduce_sharded(self, m):
        average = super()._reduce_sharded(m)

        def hook(p):
            average(p)
            p.grad *= self.world

        return hook


class ForgetsReplicated(FSDP):
    def _reduce_replicated(self, p):
        pass

    def finish_gradient_synchronization(self):
        pass


class StaleShards(FSDP):
    def _reduce_sharded(self, m):
        average = super()._reduce_sharded(m)

        def hook(p):
            average(p)
            fresh = p.grad
            p.grad = getattr(m, "stale", torch.zeros_like(fresh))
            m.stale = fresh.clone()

        return hook


class CompileReady(FSDP):
    def _hook(self, fn):
        return torch.compiler.disable(fn)


class KeepsModelElsewhere(FSDP):
    def __init__(self, module, compute_dtype=None):
        super().__init__(module, compute_dtype)
        self.model = self._modules.pop("module")

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def full_state_dict(self):
        self.module = self.model
        try:
            return super().full_state_dict()
        finally:
            del self.module


class ShardsNorms(FSDP):
    kinds = (Linear, Embedding, RMSNorm)


class GathersToRankZero(FSDP):
    def full_state_dict(self):
        out = {}
        modules = dict(self.module.named_modules())
        for name, p in self.module.named_parameters():
            owner = modules[name.rpartition(".")[0]]
            if not isinstance(owner, self.kinds):
                out[name] = p.data
                continue
            parts = [torch.empty_like(owner.shard) for _ in range(self.world)] if self.rank == 0 else None
            dist.gather(owner.shard, parts, dst=0)
            out[name] = torch.cat(parts)[: owner.full_shape[0]] if self.rank == 0 else owner.shard
        return out


class GatherKeepsFull(FSDP):
    """Keeps the gathered weights as its shards: the course's test, which gathers after
    every step and trains on, fails its next step (a shard's gradient on a full weight)."""

    def full_state_dict(self):
        out = super().full_state_dict()
        modules = dict(self.module.named_modules())
        for name, p in self.module.named_parameters():
            owner = modules[name.rpartition(".")[0]]
            if isinstance(owner, self.kinds):
                owner.shard = p.data = out[name].clone()
        return out


class Reversed(FSDP):
    """Right: rank r holds chunk world - 1 - r of each weight."""

    def _chunk(self):
        return self.world - 1 - self.rank

    def _in_order(self, parts):
        return parts[::-1]


class ReversedSums(Reversed, SumsShards):
    """Sums the sharded gradients, rank 0 holding the last chunk: the gradients' check
    compared only shards laid out as a first chunk, and AdamW hid it in the parameters."""


class NaNGradients(FSDP):
    """Hands the optimizer NaN gradients from its second step on: a broken FSDP the step
    timed ok unless its losses are looked at."""

    steps = 0

    def finish_gradient_synchronization(self):
        super().finish_gradient_synchronization()
        NaNGradients.steps += 1
        if NaNGradients.steps > 1:
            for p in self.module.parameters():
                if p.grad is not None:
                    p.grad.fill_(float("nan"))
