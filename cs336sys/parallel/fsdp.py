"""Fully sharded data parallelism, written to be read (ZeRO stage 3, Rajbhandari et al. 2020;
PyTorch FSDP, Zhao et al. 2023).

Every parameter with two or more dimensions (embedding, linear and any other weight matrix)
is sharded: its fp32 values are flattened, padded to a multiple of the world size, and each
rank keeps one contiguous slice as the Parameter the optimizer steps. One-dimensional
parameters (norm gains, biases) are small and stay replicated, like DDP's.

A module that holds sharded weights is a *unit*. Around each unit's forward:

  pre-forward   its full weights are all-gathered (a slice from every rank) and put on the
                module, and the gathers of the next two units are started (prefetch, never
                more than two units ahead: the memory of three units' weights at most).
                "Next" is in the order the units ran in the previous forward (FSDP1's
                forward prefetch), in registration order on the first, skipping units that
                already ran in this forward;
  forward       the module computes with the full weights as with any tensor;
  post-forward  the full weights are dropped from the module. Autograd would keep them alive
                for backward, so a saved-tensor hook replaces each saved full weight by a
                token while the unit runs, and backward gathers the weight again when it
                unpacks the token.

Backward visits the units in about the reverse of forward's order. When it gathers a unit's
weights again, it starts the gathers of the next two units in that order whose backward
needs a weight (an embedding's does not): prefetch as in forward, bounded the same way.

The root -- the unit whose forward finished last: the LM head of a Transformer, the wrapped
module itself when it holds weights -- keeps its full weights from forward to backward,
which starts with it: gathering them again at once would send them twice (FSDP2 does not
reshard its root after forward either). The unit that finished its forward stays gathered
until the next one starts (still three units' weights at most), so the last one is known
when the forward returns.

In backward, the gradient of a full weight arrives (summed over every use) in the autograd
Function that gathered it, which starts an async reduce-scatter: each rank receives the sum
over ranks of its slice of the gradient. finish_gradient_synchronization waits for them,
turns sums into means, sets them as the slices' .grad (fp32), and all-reduces the gradients
of the replicated parameters.

`comm_ms` is the wall time of the last step (up to finish_gradient_synchronization) during
which at least one of these collectives -- all-gathers in forward and backward,
reduce-scatters, the all-reduce -- was in flight, from launch to completion: the union of
their intervals (parallel/in_flight.py). It counts communication hidden behind compute too.

With compute_dtype (bf16/fp16), slices are cast before the all-gather, so communication and
compute run in that dtype, and gradients are reduce-scattered in it; the master slices, the
gradients the optimizer sees and the optimizer state stay fp32. Biases and frozen weights are
cast with their layers; modules of 1-D parameters alone (norms) stay fp32, as the handout's.

    fsdp = FSDP(model, compute_dtype=torch.bfloat16)  # broadcasts rank 0's weights, shards
    opt = torch.optim.AdamW(fsdp.parameters(), lr=1e-3)  # slices + replicated params
    loss_fn(fsdp(x), y).backward()
    fsdp.finish_gradient_synchronization()
    opt.step(); opt.zero_grad()
    fsdp.comm_ms  # that step's time with a collective in flight
    fsdp.full_state_dict()  # {name: full tensor} by the names of the unwrapped model

A weight shared by two modules (tied embedding and LM head) is one slice, gathered for each
use; both uses' gradients reach it. Parameters with requires_grad=False are left as they are.
"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from cs336sys.measure.nvtx import nvtx_range
from cs336sys.parallel.collectives import all_gather_flat, reduce_scatter_flat
from cs336sys.parallel.ddp import broadcast_from_rank0
from cs336sys.parallel.in_flight import InFlight

PREFETCH = 2  # units whose gathers may run ahead of the unit computing (forward and backward)


class Released(torch.Tensor):
    """A sharded weight's stand-in on its module between forwards: the weight's shape and
    dtype on the meta device, no memory. Computing with it is an error that says why: with
    a plain meta tensor a tied weight read outside its module's forward (`x @
    self.emb.weight.T`) trained on garbage, as torch 2.13 returns uninitialised memory for
    a CPU tensor times a meta one."""

    METADATA = frozenset({"shape", "dtype", "device", "ndim", "layout", "is_meta", "is_cuda",
                          "requires_grad", "is_leaf", "grad_fn", "grad", "names"})

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        # what it is may be read (.shape, .device); a view of it (.T) would compute
        attribute = getattr(getattr(func, "__self__", None), "__name__", None)
        if getattr(func, "__name__", "") == "__get__" and attribute in cls.METADATA:
            with torch._C.DisableTorchFunctionSubclass():
                return func(*args, **(kwargs or {}))
        raise RuntimeError(
            "FSDP: a sharded weight was used outside its own module's forward, where only "
            "this rank's shard of it exists (a weight tied by reading `module.weight` "
            "directly, as `x @ self.embedding.weight.T`): call the module that owns it, or "
            "tie the two modules to one parameter, which FSDP gathers for each")

    @staticmethod
    def of(shape: torch.Size, dtype: torch.dtype) -> Released:
        return torch.empty(shape, dtype=dtype, device="meta").as_subclass(Released)


@dataclass
class Sharded:
    """One sharded weight: this rank's fp32 slice of it, and how to rebuild the whole."""

    names: list[str]  # its names in the unwrapped module (several when tied)
    shape: torch.Size
    numel: int
    shard: nn.Parameter  # (padded numel / world,) fp32: what the optimizer steps
    grad_parts: list[tuple[torch.Tensor, dist.Work | None]] = field(default_factory=list)


@dataclass
class Unit:
    """A module that holds sharded weights directly, and which of its attributes they are."""

    index: int
    module: nn.Module
    attrs: list[tuple[str, Sharded]]  # (attribute name on module, sharded weight)
    name: str = ""  # the module's name in the wrapped model: its NVTX ranges say it


class FSDP(nn.Module):
    """Shards `module`'s weights over the ranks; see the module docstring."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("FSDP needs an initialised process group (see parallel.launch)")
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.comm_calls = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
        self.comm_bytes = {"all_gather": 0, "reduce_scatter": 0, "all_reduce": 0}
        self._in_flight = InFlight()  # each collective's launch-to-completion interval
        self._timing = True  # False in a forward without grad: no training step to time
        broadcast_from_rank0(module)  # every rank shards the same weights
        self.sharded: list[Sharded] = []
        self.units: list[Unit] = []
        self._shard_module()
        self.shards = nn.ParameterList([s.shard for s in self.sharded])
        self.replicated = [p for p in module.parameters() if p.requires_grad]  # 1-D, left
        # under a compute dtype: the units' biases, frozen weights' modules; norms stay fp32
        units = {id(unit.module) for unit in self.units}
        self._cast_params = {
            f"{name}.{attr}" if name else attr: p for name, m in module.named_modules()
            if id(m) in units or any(q.dim() > 1 for q in m.parameters(recurse=False))
            for attr, p in m.named_parameters(recurse=False) if p.is_floating_point()}
        # forward
        self._gathered: dict[int, tuple[list[torch.Tensor], list]] = {}  # unit -> (fulls, works)
        self._hooks: dict[int, ExitStack] = {}
        self._order: list[int] = []  # units in the order the previous forward ran them
        self._ran: list[int] = []  # ... and the current one
        self._ran_set: set[int] = set()
        self._running: dict[int, tuple[list[torch.Tensor], dict]] = {}  # unit -> fulls, saved
        self._last: tuple[Unit, list[torch.Tensor], dict] | None = None  # see _keep_root
        # backward: per forward, each unit run's weights saved as tokens, in forward order
        self._plan: list[list[Sharded]] = []
        self._inflight: dict[int, tuple[torch.Tensor, object]] = {}  # id(Sharded) -> gather
        self._regathered: dict[int, torch.Tensor] = {}  # id(Sharded) -> full, in backward
        self._done: set[int] = set()  # id(Sharded) whose gradient backward has produced
        for unit in self.units:
            # Eager even inside a compiled block (step's compile switch): the gathers read
            # Python state, which dynamo would guard on and recompile for at every unit; run
            # eager, they are graph breaks, and the code between the units is compiled.
            unit.module.register_forward_pre_hook(
                torch.compiler.disable(self._make_pre_forward(unit)))
            unit.module.register_forward_hook(torch.compiler.disable(self._make_post_forward(unit)))

    @property
    def comm_ms(self) -> float:
        """Milliseconds of the last step (ended by finish_gradient_synchronization) with at
        least one of this wrapper's collectives in flight: the union of their intervals."""
        return self._in_flight.last_step_ms

    # -- sharding ------------------------------------------------------------------------

    @torch.no_grad()
    def _shard_module(self) -> None:
        by_param: dict[int, Sharded] = {}
        names = {}  # id(param) -> every name it has (tied weights have several)
        for name, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), []).append(name)
        module_names = {id(m): name or "(root)" for name, m in self.module.named_modules()}
        for module in self.module.modules():
            attrs = []
            for attr, p in list(module.named_parameters(recurse=False)):
                if p.dim() < 2 or not p.requires_grad:
                    continue
                if id(p) not in by_param:
                    by_param[id(p)] = self._shard(p, names[id(p)])
                attrs.append((attr, by_param[id(p)]))
                # The module no longer owns the weight: between forwards it holds a
                # placeholder (shape and dtype, no memory); in its forward, the full weight.
                del module._parameters[attr]
                setattr(module, attr, Released.of(p.shape, self._dtype()))
            if attrs:
                self.units.append(Unit(len(self.units), module, attrs, module_names[id(module)]))
        self.sharded = list(by_param.values())

    def _shard(self, p: nn.Parameter, names: list[str]) -> Sharded:
        per_rank = math.ceil(p.numel() / self.world_size)
        flat = torch.zeros(per_rank * self.world_size, dtype=torch.float32, device=p.device)
        flat[: p.numel()] = p.detach().reshape(-1)  # (padded,) the tail is padding
        mine = flat[self.rank * per_rank : (self.rank + 1) * per_rank].clone()  # (per_rank,)
        return Sharded(names, p.shape, p.numel(), nn.Parameter(mine))

    # -- gathering -----------------------------------------------------------------------

    def _start_gather(self, s: Sharded):
        """(full padded buffer in the compute dtype, work) for one weight: async all-gather."""
        shard = s.shard.detach()
        if self.compute_dtype is not None:
            shard = shard.to(self.compute_dtype)  # cast before communication
        out = torch.empty(shard.numel() * self.world_size, dtype=shard.dtype, device=shard.device)
        self.comm_calls["all_gather"] += 1
        self.comm_bytes["all_gather"] += out.numel() * out.element_size()
        return out, self._timed(shard, lambda: all_gather_flat(out, shard, async_op=True))

    def _timed(self, tensor: torch.Tensor, launch):
        """launch() an async collective on `tensor`, its interval recorded for comm_ms;
        returns what to wait() on."""
        if not self._timing:
            return launch()
        interval = self._in_flight.start(tensor)
        return self._in_flight.track(interval, launch())

    def _prefetch(self, index: int) -> None:
        if index not in self._gathered:
            # NVTX ranges (on under --nsys) named after the unit: a timeline shows each
            # all-gather's launch and, in _take, any wait for one that came late
            with nvtx_range(f"all-gather {self.units[index].name}"):
                parts = [self._start_gather(s) for _, s in self.units[index].attrs]
            self._gathered[index] = ([b for b, _ in parts], [w for _, w in parts])

    def _prefetch_forward(self, unit: Unit) -> None:
        """Start the gathers of the next PREFETCH units expected after `unit` in this
        forward: the previous forward's order (registration order on the first), without
        the units that already ran in this one."""
        order = self._order or range(len(self.units))
        at = len(self._ran) - 1  # where `unit` runs, if this forward repeats the last
        if at >= len(order) or order[at] != unit.index:
            at = order.index(unit.index) if unit.index in order else len(order)
        ahead: list[int] = []
        for i in range(at + 1, len(order)):
            if len(ahead) == PREFETCH:
                break
            if order[i] not in self._ran_set and order[i] not in ahead:
                ahead.append(order[i])
        for index in ahead:
            self._prefetch(index)

    def _take(self, unit: Unit) -> list[torch.Tensor]:
        """The unit's full weights (gathered now, or by an earlier prefetch), shaped."""
        self._prefetch(unit.index)
        buffers, works = self._gathered.pop(unit.index)
        with nvtx_range(f"wait for all-gather {unit.name}"):
            for w in works:
                w.wait()
        return [b[: s.numel].view(s.shape) for b, (_, s) in zip(buffers, unit.attrs, strict=True)]

    def _start_regather(self, s: Sharded) -> None:
        if id(s) not in self._regathered and id(s) not in self._inflight:
            with nvtx_range(f"all-gather {s.names[0]} (backward)"):
                self._inflight[id(s)] = self._start_gather(s)

    def _regather(self, s: Sharded, plan: list[list[Sharded]], at: int) -> torch.Tensor:
        """The full weight again, in backward (once per backward however many uses), for
        the unit run `plan[at]`; starts the gathers of the PREFETCH unit runs before it in
        `plan` (forward's order, so next in backward) whose weights backward will need."""
        self._start_regather(s)
        ahead = 0
        for earlier in reversed(plan[:at]):
            if ahead == PREFETCH:
                break
            pending = [t for t in earlier if id(t) not in self._done]
            for t in pending:
                self._start_regather(t)
            ahead += bool(pending)
        if id(s) in self._inflight:
            buffer, work = self._inflight.pop(id(s))
            work.wait()
            self._regathered[id(s)] = buffer[: s.numel].view(s.shape)
        return self._regathered[id(s)]

    def _drop_gathers(self) -> None:
        """Wait for gathers nobody will use (collectives must complete) and drop them."""
        for _, works in self._gathered.values():
            for w in works:
                w.wait()
        for _, work in self._inflight.values():
            work.wait()
        self._gathered.clear()
        self._inflight.clear()

    # -- hooks ---------------------------------------------------------------------------

    def _make_pre_forward(self, unit: Unit):
        def pre_forward(module, args):
            self._last = None  # a unit started after it: its full weights may go now
            if self.compute_dtype is not None:  # inputs in the dtype of the weights
                args = tuple(self._cast(a) for a in args)
            self._ran.append(unit.index)
            self._ran_set.add(unit.index)
            fulls = self._take(unit)
            self._prefetch_forward(unit)
            saved: dict[int, Sharded] = {}  # the weights autograd saves in this run
            if torch.is_grad_enabled():
                self._plan.append([])
                stack = ExitStack()
                stack.enter_context(self._saved_as_tokens(fulls, unit, saved))
                self._hooks[unit.index] = stack
            self._running[unit.index] = (fulls, saved)
            for (attr, s), full in zip(unit.attrs, fulls, strict=True):
                setattr(module, attr, _Gathered.apply(s.shard, full, self, s))
            return args

        return pre_forward

    def _cast(self, x):
        if torch.is_tensor(x) and x.is_floating_point():
            return x.to(self.compute_dtype)
        return x

    def _make_post_forward(self, unit: Unit):
        def post_forward(module, args, output):
            stack = self._hooks.pop(unit.index, None)
            if stack is not None:
                stack.close()
            for attr, s in unit.attrs:  # off the module: back to placeholders
                setattr(module, attr, Released.of(s.shape, self._dtype()))
            # The full weights die here, but for the unit that finished last, until the
            # next one starts: if none does, the forward is over and this is the root.
            fulls, saved = self._running.pop(unit.index)
            self._last = (unit, fulls, saved)

        return post_forward

    def _keep_root(self) -> None:
        """At the end of a forward: the root's full weights that autograd saved are kept
        for backward, which starts with them (FSDP2's reshard_after_forward=False root)."""
        if self._last is not None:
            unit, fulls, saved = self._last
            for full, (_, s) in zip(fulls, unit.attrs, strict=True):
                if id(s) in saved:
                    self._regathered[id(s)] = full
        self._last = None

    def _dtype(self) -> torch.dtype:
        return self.compute_dtype or torch.float32

    def _saved_as_tokens(self, fulls: list[torch.Tensor], unit: Unit, saved: dict):
        """While the unit runs, autograd saves its full weights as tokens, not tensors;
        `saved` collects the weights it saved (those backward gathers again)."""
        storages = {f.untyped_storage().data_ptr(): s for f, (_, s) in zip(fulls, unit.attrs, strict=True)}
        plan, at = self._plan, len(self._plan) - 1

        def pack(t: torch.Tensor):
            s = storages.get(t.untyped_storage().data_ptr()) if t.device.type != "meta" else None
            if s is None:
                return t
            if id(s) not in saved:
                saved[id(s)] = s
                plan[at].append(s)
            return _Token(s, t.shape, t.stride(), t.storage_offset(), plan, at)

        def unpack(x):
            if not isinstance(x, _Token):
                return x
            full = self._regather(x.sharded, x.plan, x.at)
            return full.as_strided(x.shape, x.stride, x.offset)

        return torch.autograd.graph.saved_tensors_hooks(pack, unpack)

    # -- the training step ---------------------------------------------------------------

    def forward(self, *args, **kwargs):
        # Whatever a forward without backward left (gathers, a kept root) is stale once an
        # optimizer step has changed the slices: tokens of an earlier forward still work,
        # they gather again.
        self._drop_gathers()
        self._regathered.clear()
        self._done.clear()
        self._ran, self._ran_set, self._plan, self._last = [], set(), [], None
        self._running.clear()  # left by a forward that raised
        self._timing = torch.is_grad_enabled()  # an eval forward is not part of a step
        try:
            if self.compute_dtype is None:
                return self.module(*args, **kwargs)
            # A unit's replicated parameters (a Linear's bias) in the compute dtype too,
            # through a differentiable cast: their gradients still reach the fp32 parameters.
            # (functional_call swaps them in for this call only.)
            args = tuple(self._cast(a) for a in args)
            cast = {n: p.to(self.compute_dtype) for n, p in self._cast_params.items()}
            return torch.func.functional_call(self.module, cast, args, kwargs)
        finally:
            # Gathers prefetched for units this forward did not run would be stale after
            # the optimizer step: wait for them (collectives must complete) and drop them.
            self._drop_gathers()
            self._order = self._ran  # what the next forward prefetches by
            self._keep_root()

    def _grad_ready(self, s: Sharded, grad_full: torch.Tensor) -> None:
        """Called from backward with a full weight's gradient: start reduce-scattering it."""
        self._regathered.pop(id(s), None)  # every use of the weight is done with it
        self._done.add(id(s))  # backward prefetch skips it
        per_rank = s.shard.numel()
        flat = torch.zeros(per_rank * self.world_size, dtype=grad_full.dtype, device=grad_full.device)
        flat[: s.numel] = grad_full.reshape(-1)  # (padded,)
        out = torch.empty(per_rank, dtype=flat.dtype, device=flat.device)
        self.comm_calls["reduce_scatter"] += 1
        self.comm_bytes["reduce_scatter"] += flat.numel() * flat.element_size()
        with nvtx_range(f"reduce-scatter {s.names[0]}"):
            work = self._timed(flat, lambda: reduce_scatter_flat(out, flat, async_op=True))
        s.grad_parts.append((out, work))

    @torch.no_grad()
    def finish_gradient_synchronization(self) -> None:
        """Slices get the mean gradient of their part of each weight (fp32); replicated
        parameters the mean of their gradients. The only call between backward and step;
        it ends the step that `comm_ms` measures."""
        self._timing = True
        for s in self.sharded:
            if not s.grad_parts:
                continue
            total = None
            for out, work in s.grad_parts:
                work.wait()
                total = out.float() if total is None else total + out.float()
            s.grad_parts.clear()
            total /= self.world_size
            s.shard.grad = total if s.shard.grad is None else s.shard.grad + total
        self._drop_gathers()  # backward prefetches of units whose backward did not run
        self._regathered.clear()
        self._done.clear()
        groups: dict[tuple, list[nn.Parameter]] = {}
        for p in self.replicated:
            groups.setdefault((p.dtype, p.device), []).append(p)
        for group in groups.values():
            grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in group]
            flat = _flatten_dense_tensors(grads)  # (sum of numels,)
            self.comm_calls["all_reduce"] += 1
            self.comm_bytes["all_reduce"] += flat.numel() * flat.element_size()
            with nvtx_range("all-reduce the replicated gradients"):
                self._timed(flat, lambda flat=flat: dist.all_reduce(flat, async_op=True)).wait()
            flat /= self.world_size
            for p, g in zip(group, _unflatten_dense_tensors(flat, grads), strict=True):
                p.grad = g.clone()
        self._in_flight.close_step()

    @torch.no_grad()
    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer, whole, by the names of the unwrapped module (each
        name of a tied weight). A collective: call it on every rank."""
        out = {}
        for s in self.sharded:
            buffer = torch.empty(s.shard.numel() * self.world_size, dtype=torch.float32,
                                 device=s.shard.device)
            all_gather_flat(buffer, s.shard.detach())
            for name in s.names:
                out[name] = buffer[: s.numel].view(s.shape).clone()
        out.update({n: p.detach().clone() for n, p in self.module.named_parameters()})
        out.update({n: b.detach().clone() for n, b in self.module.named_buffers()})
        return out


@dataclass
class _Token:
    """A full weight that autograd saved, by reference: gathered again when unpacked. `plan`
    is its forward's unit runs (the weights each saved), `at` the run that saved it."""

    sharded: Sharded
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int
    plan: list[list[Sharded]]
    at: int


class _Gathered(torch.autograd.Function):
    """shard -> the full weight gathered from it; backward hands the full weight's gradient
    to FSDP, which reduce-scatters it (async) back to the shard in
    finish_gradient_synchronization, so autograd gets no gradient for the shard itself."""

    @staticmethod
    def forward(ctx, shard, full, fsdp, sharded):
        ctx.fsdp, ctx.sharded = fsdp, sharded
        return full

    @staticmethod
    def backward(ctx, grad_full):
        ctx.fsdp._grad_ready(ctx.sharded, grad_full)
        return None, None, None, None
