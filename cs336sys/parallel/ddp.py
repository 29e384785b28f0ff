"""Data-parallel training: four home-made DDP wrappers and torch's DDP beside them.

Every rank holds a full replica of the model and trains on its own slice of the global batch;
averaging the gradients across ranks before `optimizer.step()` keeps the replicas identical,
as if one process had trained on the whole batch (when the slices are equal and the loss is a
mean). The wrappers differ only in *how* and *when* they average (the DDP issue):

- `NaiveDDP`: one blocking all-reduce per parameter gradient, after backward.
- `FlatDDP`: the gradients flattened into one buffer, one blocking all-reduce, after backward.
- `DDPIndividualParameters`: an async all-reduce per gradient, launched from a
  post-accumulate-grad hook as soon as the gradient is ready, so communication overlaps the
  rest of backward; `finish_gradient_synchronization` waits for the handles.
- `DDPBucketed`: the same overlap, with parameters grouped (in reverse registration order,
  roughly the order backward produces them) into buckets of at most `bucket_size_mb` MiB,
  one all-reduce per bucket: fewer, larger messages.
- `TorchDDP`: torch.nn.parallel.DistributedDataParallel, the production baseline.

Usage, the same for all (`make_ddp` picks one by name):

    ddp = DDPBucketed(model, bucket_size_mb=25)  # broadcasts rank 0's parameters and buffers
    loss = loss_fn(ddp(x), y); loss.backward()
    ddp.finish_gradient_synchronization()        # the only call between backward and step
    optimizer.step()

Parameters with requires_grad=False are not communicated; a Parameter shared by two modules
(tied weights) is synchronised once. A trainable parameter with no gradient this step (unused)
is reduced as zeros, because every rank must launch the same collectives in the same order;
afterwards its .grad is the average (zeros where no rank used it), not None.
`comm_calls` and `comm_bytes` count the all-reduces launched and the bytes they reduced,
cumulatively, so a benchmark can take per-step differences; `allreduce_ms` is the last step's
time with one of them in flight, launch to completion (parallel/in_flight.py): the
collectives alone, without the flattening and copying back that finish_gradient_synchronization
also does, and hidden behind backward or not.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from cs336sys.measure.nvtx import nvtx_range
from cs336sys.parallel.in_flight import InFlight

IMPLS = ("naive", "flat", "overlap", "bucketed", "torch")
BUCKETED_IMPLS = ("bucketed", "torch")  # the impls that take a bucket size
DEFAULT_BUCKET_MB = 25.0  # torch DDP's default bucket_cap_mb
MIB = 2**20


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module) -> None:
    """Rank 0's parameters (frozen ones too) and buffers on every rank: the replicas must be
    identical, not only in what they train."""
    for t in [*module.parameters(), *module.buffers()]:
        if t.is_contiguous():
            dist.broadcast(t.detach(), src=0)
        else:  # collectives need contiguous memory
            tmp = t.detach().contiguous()
            dist.broadcast(tmp, src=0)
            t.copy_(tmp)


@dataclass
class _Reduction:
    """One all-reduce in flight: which gradients it carries and the buffer it reduces."""

    params: list[nn.Parameter]
    grads: list[torch.Tensor]  # the gradients (zeros for unused params), same order
    buffer: torch.Tensor  # grads[0] itself, or all grads flattened: (sum of numels,)
    work: dist.Work | None  # None when the all-reduce was blocking


class _DDPBase(nn.Module):
    """What the home-made wrappers share: the module, its trainable parameters, the initial
    broadcast, the counters, and launching/completing the all-reduce of a group of grads."""

    def __init__(self, module: nn.Module):
        super().__init__()
        if not dist.is_initialized():
            raise RuntimeError("DDP needs an initialised process group (see parallel.launch)")
        self.module = module
        self.world_size = dist.get_world_size()
        self.comm_calls = 0
        self.comm_bytes = 0
        self._in_flight = InFlight()  # each all-reduce's launch-to-completion interval
        # named_parameters() yields each Parameter once, by identity, in registration order
        # (a tied weight under its first name), so tied weights are reduced exactly once.
        named = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
        self.param_names = [n for n, _ in named]
        self._params = [p for _, p in named]
        self._name_of = {id(p): n for n, p in named}
        # Not counted: the counters are about gradient traffic.
        broadcast_from_rank0(module)

    def forward(self, *args, **kwargs):
        return self.module(*args, **kwargs)

    def finish_gradient_synchronization(self) -> None:
        raise NotImplementedError

    @property
    def allreduce_ms(self) -> float:
        """Milliseconds of the last step (ended by finish_gradient_synchronization) with at
        least one of its all-reduces in flight: the union of their intervals."""
        return self._in_flight.last_step_ms

    def _launch(self, params: list[nn.Parameter], async_op: bool) -> _Reduction:
        """Start summing the gradients of `params` (one dtype and device) across ranks."""
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        if len(grads) == 1 and grads[0].is_contiguous():
            buffer = grads[0]  # reduce in place: no copy
        else:
            buffer = _flatten_dense_tensors(grads)  # (sum of numels,)
        self.comm_calls += 1
        self.comm_bytes += _nbytes(buffer)
        # Gloo has no ReduceOp.AVG: sum here, divide in _complete. The NVTX range (on under
        # --nsys) names the gradients, so that a timeline shows which launch overlaps what.
        with nvtx_range(f"all-reduce {self._named(params)}"):
            interval = self._in_flight.start(buffer)
            work = self._in_flight.track(
                interval, dist.all_reduce(buffer, op=dist.ReduceOp.SUM, async_op=True))
        if not async_op:  # blocking: waited for here, as all_reduce(async_op=False) does
            work.wait()
            work = None
        return _Reduction(params, grads, buffer, work)

    def _named(self, params: list[nn.Parameter]) -> str:
        """The first gradient's name, and how many more the buffer holds."""
        first = self._name_of.get(id(params[0]), "?")
        return first if len(params) == 1 else f"{first} +{len(params) - 1}"

    @torch.no_grad()
    def _complete(self, r: _Reduction) -> None:
        """Wait for the sum, turn it into the mean and put it back into each .grad."""
        if r.work is not None:
            r.work.wait()
        r.buffer.div_(self.world_size)
        if r.buffer is not r.grads[0]:
            for g, avg in zip(r.grads, _unflatten_dense_tensors(r.buffer, r.grads), strict=True):
                g.copy_(avg)  # avg: a view of the buffer shaped like g
        for p, g in zip(r.params, r.grads, strict=True):
            p.grad = g  # only changes anything for params that had no grad


def _groups_by_dtype(params: list[nn.Parameter]) -> list[list[nn.Parameter]]:
    """Parameters split by (dtype, device), order kept: a flat buffer holds one dtype."""
    groups: dict[tuple, list[nn.Parameter]] = {}
    for p in params:
        groups.setdefault((p.dtype, p.device), []).append(p)
    return list(groups.values())


class NaiveDDP(_DDPBase):
    """One blocking all-reduce per parameter gradient, after backward."""

    def finish_gradient_synchronization(self) -> None:
        for p in self._params:
            self._complete(self._launch([p], async_op=False))
        self._in_flight.close_step()


class FlatDDP(_DDPBase):
    """All gradients flattened into one buffer (one per dtype), one blocking all-reduce."""

    def finish_gradient_synchronization(self) -> None:
        for group in _groups_by_dtype(self._params):
            self._complete(self._launch(group, async_op=False))
        self._in_flight.close_step()


class _OverlapDDP(_DDPBase):
    """Async all-reduces of buckets of gradients, launched from post-accumulate-grad hooks.

    Buckets are launched strictly in bucket order: a bucket whose gradients are ready waits
    for the buckets before it. Backward readies them roughly in that order anyway, and a
    fixed order is what keeps ranks matched when a parameter is used on some ranks and not
    on others (its hook fires on some ranks only; the ranks that lack it launch it, and the
    buckets after it, in finish). torch's DDP Reducer launches its buckets in order for the
    same reason.
    """

    def __init__(self, module: nn.Module, bucket_size_bytes: float):
        super().__init__(module)
        self._buckets = _make_buckets(self._params, bucket_size_bytes)
        names = {id(p): n for n, p in zip(self.param_names, self._params, strict=True)}
        self.buckets = [[names[id(p)] for p in b] for b in self._buckets]
        self._bucket_of = {id(p): i for i, b in enumerate(self._buckets) for p in b}
        self._reset()
        # A weak reference: hooks of a discarded wrapper must neither keep it alive nor act.
        ref = weakref.ref(self)

        def hook(p: nn.Parameter) -> None:
            ddp = ref()
            if ddp is not None:
                ddp._grad_ready(p)

        self._hook_handles = [p.register_post_accumulate_grad_hook(hook) for p in self._params]

    def _reset(self) -> None:
        self._missing = [len(b) for b in self._buckets]  # grads not yet ready, per bucket
        self._fired: set[int] = set()
        self._next = 0  # the next bucket to launch
        self._inflight: list[_Reduction] = []

    @property
    def num_inflight(self) -> int:
        """All-reduces launched this step and not yet waited for."""
        return len(self._inflight)

    def _grad_ready(self, p: nn.Parameter) -> None:
        if id(p) in self._fired:
            # A second backward before finish would add fresh local grads to grads that are
            # being (or were) reduced; torch's DDP refuses this too (use one backward per step).
            raise RuntimeError(
                "a gradient became ready twice before finish_gradient_synchronization()"
            )
        self._fired.add(id(p))
        self._missing[self._bucket_of[id(p)]] -= 1
        self._launch_ready()

    def _launch_ready(self) -> None:
        while self._next < len(self._buckets) and self._missing[self._next] == 0:
            self._inflight.append(self._launch(self._buckets[self._next], async_op=True))
            self._next += 1

    def finish_gradient_synchronization(self) -> None:
        # Buckets whose hooks did not all fire (unused parameters) go now, reduced as zeros.
        self._missing = [0] * len(self._buckets)
        self._launch_ready()
        with nvtx_range("wait for the gradients' all-reduces"):
            for r in self._inflight:
                self._complete(r)
        self._in_flight.close_step()
        self._reset()


def _make_buckets(params: list[nn.Parameter], cap_bytes: float) -> list[list[nn.Parameter]]:
    """Greedy buckets over the parameters in reverse registration order: a new bucket when
    the next one would exceed the cap or changes dtype/device; an oversized one stands alone."""
    buckets: list[list[nn.Parameter]] = []
    size = 0
    for p in reversed(params):
        cur = buckets[-1] if buckets else None
        key = (p.dtype, p.device)
        if cur is None or size + _nbytes(p) > cap_bytes or (cur[0].dtype, cur[0].device) != key:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += _nbytes(p)
    return buckets


class DDPIndividualParameters(_OverlapDDP):
    """An async all-reduce per gradient, launched as soon as backward has accumulated it
    (and the ones before it in reverse registration order are launched, see _OverlapDDP)."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_size_bytes=0)  # every parameter its own bucket


class DDPBucketed(_OverlapDDP):
    """Gradients in buckets of at most `bucket_size_mb` MiB (2**20 bytes, like torch's
    bucket_cap_mb); a bucket's async all-reduce starts when its last gradient is ready.
    None: one bucket of unbounded size, as the course's 2025 adapter defines it."""

    def __init__(self, module: nn.Module, bucket_size_mb: float | None):
        if bucket_size_mb is not None and not bucket_size_mb > 0:
            raise ValueError(f"bucket size must be positive, got {bucket_size_mb} MB")
        size = float("inf") if bucket_size_mb is None else float(bucket_size_mb)
        super().__init__(module, bucket_size_bytes=size * MIB)
        self.bucket_size_mb = size


@dataclass
class _Counts:
    group: dist.ProcessGroup | None
    calls: int = 0
    bytes: int = 0


# No annotations on bucket and return: register_comm_hook checks them against the real types,
# and `from __future__ import annotations` turns them into strings that fail the check.
def _counting_allreduce_hook(counts: _Counts, bucket):
    counts.calls += 1
    counts.bytes += _nbytes(bucket.buffer())
    return default_hooks.allreduce_hook(counts.group, bucket)


class TorchDDP(nn.parallel.DistributedDataParallel):
    """torch's DDP with the wrappers' interface: `.module`, counters, and a no-op
    finish_gradient_synchronization (torch's DDP reduces inside backward)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float = DEFAULT_BUCKET_MB, **kw):
        # On CPU/Gloo torch wants no device_ids; on CUDA the module's device is used.
        super().__init__(module, bucket_cap_mb=bucket_size_mb, **kw)
        self._counts = _Counts(self.process_group)
        # The default hook, counted: same reduction (divide, then all-reduce), now visible.
        self.register_comm_hook(self._counts, _counting_allreduce_hook)

    @property
    def comm_calls(self) -> int:
        return self._counts.calls

    @property
    def comm_bytes(self) -> int:
        return self._counts.bytes

    def finish_gradient_synchronization(self) -> None:
        pass


def make_ddp(impl: str, module: nn.Module, bucket_size_mb: float | None = None) -> nn.Module:
    """Wrap `module` with the DDP implementation named `impl` (one of IMPLS).

    `bucket_size_mb` applies to "bucketed" and "torch" (default 25 MiB) and must be None for
    the others, so a sweep cannot record a bucket size that had no effect.
    """
    if impl not in IMPLS:
        raise ValueError(f"DDP implementation must be one of {IMPLS}, not {impl!r}")
    if bucket_size_mb is not None and impl not in BUCKETED_IMPLS:
        raise ValueError(f"DDP implementation {impl!r} takes no bucket size")
    if bucket_size_mb is not None and not bucket_size_mb > 0:
        raise ValueError(f"bucket size must be positive, got {bucket_size_mb} MB")
    size = DEFAULT_BUCKET_MB if bucket_size_mb is None else bucket_size_mb
    if impl == "naive":
        return NaiveDDP(module)
    if impl == "flat":
        return FlatDDP(module)
    if impl == "overlap":
        return DDPIndividualParameters(module)
    if impl == "bucketed":
        return DDPBucketed(module, size)
    return TorchDDP(module, bucket_size_mb=size)
