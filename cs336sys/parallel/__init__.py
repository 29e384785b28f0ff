"""Distributed training on several ranks: the launcher, the DDP family, optimizer state
sharding (ShardedOptimizer) and fully sharded data parallelism (FSDP).

Importing this package does not import torch: the launcher imports it when it runs, and the
DDP names below load on first use. The CLI still imports it inside commands only.
"""

from cs336sys.measure.lazy import attach
from cs336sys.parallel.launcher import RankContext, launch, under_torchrun
from cs336sys.parallel.rank_results import WorkerError

# Given on first use because importing `cs336sys.parallel.launcher` runs this file, and the
# CLI relies on that import being torch-free (a rank of torchrun's imports it as it starts).
__getattr__, __dir__, _ON_FIRST_USE = attach(__name__, {
    "cs336sys.parallel.ddp": ("IMPLS", "DDPBucketed", "DDPIndividualParameters", "FlatDDP",
                              "NaiveDDP", "TorchDDP", "make_ddp"),
    "cs336sys.parallel.sharded_optimizer": ("ShardedOptimizer",),
    "cs336sys.parallel.fsdp": ("FSDP",),
})

__all__ = ["RankContext", "WorkerError", "launch", "under_torchrun", *_ON_FIRST_USE]
