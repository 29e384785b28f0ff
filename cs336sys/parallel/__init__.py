"""Distributed training on several ranks: the launcher, the DDP family, optimizer state
sharding (ShardedOptimizer) and fully sharded data parallelism (FSDP).

Importing this package does not import torch: the launcher imports it when it runs, and the
DDP names below load on first use. The CLI still imports it inside commands only.
"""

from cs336sys.parallel.launcher import RankContext, WorkerError, launch, under_torchrun

# Lazy (PEP 562) because importing `cs336sys.parallel.launcher` runs this file, and the CLI
# relies on that import being torch-free (a rank of torchrun's imports it as it starts).
_DDP_NAMES = (
    "IMPLS",
    "DDPBucketed",
    "DDPIndividualParameters",
    "FlatDDP",
    "NaiveDDP",
    "TorchDDP",
    "make_ddp",
)


_SHARDING_NAMES = ("ShardedOptimizer", "FSDP")


def __getattr__(name: str):
    if name in _DDP_NAMES:
        from cs336sys.parallel import ddp

        return getattr(ddp, name)
    if name == "ShardedOptimizer":
        from cs336sys.parallel.sharded_optimizer import ShardedOptimizer

        return ShardedOptimizer
    if name == "FSDP":
        from cs336sys.parallel.fsdp import FSDP

        return FSDP
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RankContext", "WorkerError", "launch", "under_torchrun", *_DDP_NAMES,
           *_SHARDING_NAMES]
