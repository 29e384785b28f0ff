"""How one point of `cs336sys ddp` is put together, and what its memory per rank should be.

The data-parallel family (docs/experiments/ddp.md, with "Sharding"), all around the same
Transformer LM and AdamW:

  naive, flat, overlap, bucketed, torch   full replicas, gradients averaged (cs336sys.parallel
                                          DDP wrappers; torch = DistributedDataParallel), each
                                          with the optimizer state
                                            none  whole on every rank,
                                            own   sharded by cs336sys.parallel.ShardedOptimizer,
                                            zero  sharded by torch's ZeroRedundancyOptimizer;
  fsdp                                    cs336sys.parallel.FSDP: weights, gradients and
                                          optimizer state sharded;
  torch-fsdp                              FSDP2: fully_shard on every block, then the root.

Precision bf16 means autocast for the replicated impls and each FSDP's own mixed precision
(compute in bf16, fp32 master weights) for the sharded ones.

Expected bytes per rank, for P trainable parameters of which P1 are one-dimensional, n ranks,
fp32 weights and gradients and AdamW's two fp32 moments (Rajbhandari et al. 2020, Fig. 1:
"Ψ" there is P here):

              parameters        gradients         optimizer state
  replicas    4P                4P                8P   (own, zero: 8P / n)
  fsdp        4(P - P1)/n + 4P1 same              2 x parameters
  torch-fsdp  4P / n            4P / n            8P / n
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from cs336sys import yours
from cs336sys.experiments import ddp_yours
from cs336sys.experiments.training_check import every_name
from cs336sys.experiments.training_step import adamw_kwargs
from cs336sys.measure.dtypes import autocast_dtype
from cs336sys.measure.memory import held
from cs336sys.sweep.declaration import Column, metric_table

REPLICA_IMPLS = ("naive", "flat", "overlap", "bucketed", "torch")
FSDP_IMPLS = ("fsdp", "torch-fsdp")
IMPLS = REPLICA_IMPLS + FSDP_IMPLS
# the impls of ours that time their collectives in flight (parallel/in_flight.py), by property
IN_FLIGHT = {"fsdp": "comm_ms", **dict.fromkeys(("naive", "flat", "overlap", "bucketed"),
                                                "allreduce_ms")}


@dataclass
class Setup:
    """A wrapped model ready to train, and where its parts live on this rank."""

    module: Any  # what the step calls: the wrapper (or the FSDP2-sharded model)
    optimizer: Any
    state_holder: Any  # the optimizer object whose .state holds this rank's state
    finish: Callable[[], None]  # between backward and optimizer.step()
    autocast: bool  # precision through torch.autocast (replicas) or the wrapper (FSDP)
    params: list  # this rank's parameter tensors (local shards of sharded ones)
    replicated: list  # the parameters every rank must hold identically
    start: Callable[[], None] | None = None  # before each step's forward (a user's hook)
    # {name: full tensor} of the unwrapped model, on every rank (a collective for FSDPs)
    full_params: Callable[[], dict] | None = None


def fully_sharded(impl: str) -> bool:
    """Whether `impl` shards parameters, gradients and optimizer state: ours or torch's FSDP,
    or the user's (as their adapters or a one-off name register it)."""
    return impl in FSDP_IMPLS or ddp_yours.kind_of(impl) == "fsdp"


def init_seed(impl: str, seed: int, rank: int) -> int:
    """The seed of this rank's model. The replicas start from distinct weights on purpose:
    the handout has a DDP broadcast rank 0's, and the course's DDP tests seed each rank
    differently to check it. An FSDP gets the same weights on every rank, as the course's
    FSDP test builds them: the handout asks an FSDP to shard, not to broadcast, so an FSDP
    that shards what each rank was given is right (measured: such an FSDP, passing the
    course's FSDP test, was 1.1 off with distinct weights per rank)."""
    return seed if fully_sharded(impl) else seed + 1000 * rank


def build(impl: str, sharding: str | None, bucket_mb: float | None, precision: str, model, device,
          make_optimizer: Callable[[list], Any] | None = None, num_layers: int = 0,
          blocks: str | None = None, optimizer_cls: Any = None):
    """Wrap `model` (built on `device`) as `impl` with an AdamW over what this rank holds
    (`optimizer_cls`, ours by default, or `make_optimizer(params)` where given and the
    optimizer is not sharded); the user's wrappers and sharded optimizer
    (experiments/ddp_yours.py) too. torch-fsdp makes a unit of
    each of the model's `num_layers` blocks before the root, found as --checkpoint finds them
    (at the dotted path `blocks` where given); the whole model is one unit without them."""
    import torch

    from cs336sys.models.adamw import AdamW
    from cs336sys.parallel.ddp import make_ddp

    low = autocast_dtype(precision)  # None for fp32
    kind = ddp_yours.kind_of(impl)
    adamw_cls = optimizer_cls or AdamW

    def adamw(params: list) -> Any:
        if make_optimizer is not None:
            return make_optimizer(params)
        return adamw_cls(params, **adamw_kwargs(adamw_cls))

    if impl in REPLICA_IMPLS or kind == "ddp":
        start = None
        if kind == "ddp":
            wrapper, finish_with, start_with = ddp_yours.replica(impl, model, bucket_mb)
        else:
            wrapper = make_ddp(impl, model, bucket_size_mb=bucket_mb)
            finish_with, start_with = (lambda opt: wrapper.finish_gradient_synchronization()), None
        # the wrapper's, as the course's tests take them: a DDP may train a copy of the module
        params = list(wrapper.parameters())
        if yours.is_yours(sharding):
            # a generator, as the course's test passes model.parameters(): a sharded optimizer
            # that reads them twice, or takes len() of them, fails there and so here
            opt = holder = ddp_yours.optimizer(sharding, iter(params), adamw_cls,
                                               **adamw_kwargs(adamw_cls))
        elif sharding == "ours":
            from cs336sys.parallel.sharded_optimizer import ShardedOptimizer

            opt = ShardedOptimizer(params, adamw_cls, **adamw_kwargs(adamw_cls))
            holder = opt.local
        elif sharding == "zero":
            from torch.distributed.optim import ZeroRedundancyOptimizer

            opt = ZeroRedundancyOptimizer(params, optimizer_class=adamw_cls,
                                          **adamw_kwargs(adamw_cls))
            holder = opt.optim
        else:
            opt = holder = adamw(params)
        if start_with is not None:
            start = lambda: start_with(opt)  # noqa: E731
        return Setup(wrapper, opt, holder, lambda: finish_with(opt), True, params, params,
                     start=start, full_params=lambda: every_name(wrapper))
    if kind == "fsdp":
        wrapper, finish_with, full = ddp_yours.sharded(impl, model, low)
        params = list(wrapper.parameters())
        opt = adamw(params)
        return Setup(wrapper, opt, opt, lambda: finish_with(opt), False, params, [],
                     full_params=full)
    if impl == "fsdp":
        from cs336sys.parallel.fsdp import FSDP

        wrapper = FSDP(model, compute_dtype=low)
        params = list(wrapper.parameters())
        opt = adamw(params)
        return Setup(wrapper, opt, opt, wrapper.finish_gradient_synchronization, False, params,
                     wrapper.replicated, full_params=wrapper.full_state_dict)
    if impl == "torch-fsdp":
        import torch.distributed as dist
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        from cs336sys.models.checkpointing import found_blocks
        from cs336sys.parallel.ddp import broadcast_from_rank0

        # fully_shard keeps each rank's own slice of whatever that rank built: start from
        # rank 0's weights, as the other wrappers do, or the ranks shard different models.
        broadcast_from_rank0(model)
        mesh = init_device_mesh(torch.device(device).type, (dist.get_world_size(),))
        mp = MixedPrecisionPolicy(param_dtype=low, reduce_dtype=low) if low else MixedPrecisionPolicy()
        for block in found_blocks(model, num_layers, blocks):
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        opt = adamw(list(model.parameters()))
        return Setup(model, opt, opt, lambda: None, False, list(model.parameters()), [])
    raise ValueError(f"impl must be one of {IMPLS}, not {impl!r}")


def no_grad_sync(impl: str, module):
    """Backward without the gradient reduction: torch DDP's no_sync(), FSDP2's switch."""
    import contextlib

    if impl == "torch":
        return module.no_sync()

    @contextlib.contextmanager
    def fsdp2():
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    return fsdp2()


def param_spread(setup) -> float | None:
    """Largest difference of any replicated parameter element between ranks: 0 when the
    wrapper did its job (None when every parameter is sharded). One parameter at a time:
    the check costs two copies of the largest."""
    import torch.distributed as dist

    if not setup.replicated:
        return None
    spread = 0.0
    for p in setup.replicated:
        hi = p.detach().float().clone()
        lo = hi.clone()
        dist.all_reduce(hi, op=dist.ReduceOp.MAX)
        dist.all_reduce(lo, op=dist.ReduceOp.MIN)
        spread = max(spread, float((hi - lo).max()))
    return spread


def split(setup: Setup, when: str) -> dict[str, int]:
    """Bytes this rank holds in parameters, gradients and optimizer state, by inspection, at
    the moment `when` (`init_params`, ...)."""
    return {f"{when}_{k}": v for k, v in held(setup.params, setup.state_holder).items()}


def expected(impl: str, sharding: str | None, world: int, n_params: int, n_1d: int) -> dict[str, float]:
    """The bytes per rank of the table in the module docstring. The user's FSDP is held to
    the fully sharded ideal (as torch-fsdp), the user's sharded optimizer to 8P / n."""
    sharded = fully_sharded(impl)
    if impl == "fsdp":
        params = 4 * (n_params - n_1d) / world + 4 * n_1d
    elif sharded:
        params = 4 * n_params / world
    else:
        params = 4 * n_params
    shards_state = sharding in ("ours", "zero") or yours.is_yours(sharding)
    state = 2 * params if sharded else 8 * n_params / (world if shards_state else 1)
    return {"params": params, "grads": params, "opt_state": state}


# A sharded rank holds 1/N of the whole, give or take what is left replicated (our FSDP's
# norms) or unevenly split; past this much more, rank 0 holds too much of it.
SHARE_SLACK = 0.10


# A user's FSDP that shards no weight of cs336sys's model most likely wraps the classes of
# their own (the course's tests wrap cs336_basics.model's Linear and Embedding).
NOT_OUR_LAYERS = ("; your FSDP sharded no weight of cs336sys's model, which is built of "
                  "torch.nn.Linear and torch.nn.Embedding: an FSDP that wraps "
                  "cs336_basics.model's Linear and Embedding, as the course's tests do, shards "
                  "on your model (--model cs336_basics)")


def shares(impl: str, sharding: str | None, params: list[int], opt_state: list[int],
           whole: int, model: str | None = None) -> dict[str, Any]:
    """Rank 0's share of one whole copy of the parameters (`whole` bytes, or elements) and
    of AdamW's whole state (two moments per parameter), from each rank's bytes (elements
    where `whole` counts them: the step's bf16 weights) (rank 0 first); where
    the point is meant to shard them (an FSDP: both; a sharded optimizer: the state), what
    rank 0 holds past 1/N + SHARE_SLACK: `not_sharded` where the ranks together hold more
    than one copy (each holds it whole), else `uneven` (split, rank 0 has the most)."""
    world = len(params)
    fsdp = fully_sharded(impl)
    wholes = {"parameters": whole, "optimizer state": 2 * whole}
    by_rank = {"parameters": params, "optimizer state": opt_state}
    rank0 = {what: by_rank[what][0] / wholes[what] if whole else None for what in wholes}
    out: dict[str, Any] = {"param_rank0_share": rank0["parameters"],
                           "opt_state_rank0_share": rank0["optimizer state"]}
    meant = (["parameters"] if fsdp else []) + (
        ["optimizer state"] if fsdp or sharding not in (None, "none") else [])
    over = {what: rank0[what] for what in meant
            if rank0[what] is not None and rank0[what] > 1 / world + SHARE_SLACK}
    copies = {what: sum(by_rank[what]) / wholes[what] for what in over}
    said = (f"rank 0 holds {', '.join(f'{w} {share:.0%}' for w, share in over.items())} of the "
            f"whole, more than 1/{world} + {SHARE_SLACK:.0%}")
    replicated = any(c > 1 + SHARE_SLACK for c in copies.values())
    out["not_sharded"] = said + "; the ranks hold " + ", ".join(
        f"{c:.1f} copies of the {w}" for w, c in copies.items()) if replicated else None
    if replicated and fsdp and model is None and yours.is_yours(impl) \
            and copies.get("parameters", 0) >= world - SHARE_SLACK:  # every rank all of them
        out["not_sharded"] += NOT_OUR_LAYERS
    out["uneven"] = said + "; the other ranks the rest" if over and not replicated else None
    return out


def stored_as_fsdp(impl: Any) -> bool:
    """Whether a stored point's `impl` shards parameters, gradients and optimizer state (ours,
    torch's, or a user's FSDP, whose names say fsdp), read from the row alone."""
    return impl in FSDP_IMPLS or "fsdp" in str(impl)


def shares_cell(row: Any) -> str | None:
    """`params 50 %, opt 50 %` where the point shards (FSDP: both; a sharded optimizer: the
    state), with NOT SHARDED when rank 0 holds more than 1/N + 10 % of either and the ranks
    more than one copy of it, UNEVEN when they hold one copy between them."""
    fsdp = stored_as_fsdp(row.get("impl") or row.get("ddp"))  # a ddp point's, or a step's
    sharded = row.get("shard_optimizer") not in (None, "none", "")
    if not (fsdp or sharded) or row.get("opt_state_rank0_share") is None:
        return None
    parts = ([f"params {row['param_rank0_share']:.0%}"] if fsdp else []) + \
        [f"opt {row['opt_state_rank0_share']:.0%}"]
    flag = " NOT SHARDED" if row.get("not_sharded") else " UNEVEN" if row.get("uneven") else ""
    return ", ".join(parts) + flag


# What rank 0 holds of the whole (`shares`), stored by ddp and by step on ranks.
SHARE_METRICS = metric_table("""
    param_rank0_share         -         rank 0's parameter bytes over one whole copy's
    opt_state_rank0_share     -         rank 0's optimizer-state bytes over AdamW's whole
                                          state (two moments per parameter)
    not_sharded               -         where the point shards: what rank 0 holds past
                                          1/N + 10 % of the whole, the ranks more
                                          than one copy
    uneven                    -         the same, the ranks holding one copy between
                                          them (split, rank 0 the most)
""")
SHARES_COLUMN = Column(
    "rank 0 holds", cell=shares_cell, optional=True,
    note="rank 0 holds: its share of one whole copy of the parameters and of AdamW's state, "
    "where the point shards them; past 1/N + 10 %: UNEVEN where the ranks hold one copy "
    "between them, NOT SHARDED where they hold more.")


def exposed_comm(impl: str, step: Any, module: Any, iters: int,
                 bwd_ms: list[float]) -> list[float]:
    """torch's DDP and FSDP2 reduce inside the backward: each timed backward (`bwd_ms`) less
    the typical one without the gradients' reduction, `iters` of them. Not clipped at 0 per
    step (a noisy pairing read 0 ± 0, or a mean raised by the clipping)."""
    import statistics
    from dataclasses import replace

    no_optimizer = replace(step, optimizer=None, finish=None, mode="forward-backward")
    nosync = []
    for _ in range(iters):
        with no_grad_sync(impl, module):
            nosync.append(no_optimizer()["bwd_ms"])
    return [b - statistics.median(nosync) for b in bwd_ms]
