"""Distributed training on several ranks: the launcher, the DDP family, optimizer state
sharding (ShardedOptimizer) and fully sharded data parallelism (FSDP).

Importing this package does not import torch: the launcher imports it when it runs, and the
DDP names below load on first use. The CLI still imports it inside commands only.
"""

from cs336sys.parallel.launcher import RankContext, WorkerError, launch, under_torchrun

# Lazy (PEP 562) because importing `cs336sys.parallel.launcher` runs this file, and the CLI
# relies on that import being torch-free (cli/distributed.py).
_DDP_NAMES = (
    "IMPLS",
    "DDPBucketed",
    "DDPIndividualParameters",
    "FlatDDP",
    "NaiveDDP",
    "TorchDDP",
    "make_ddp",
)


_SHARDING_NAMES = {"ShardedOptimizer": "sharded_optimizer", "FSDP": "fsdp"}


def __getattr__(name: str):
    import importlib

    if name in _DDP_NAMES:
        return getattr(importlib.import_module("cs336sys.parallel.ddp"), name)
    if name in _SHARDING_NAMES:
        return getattr(importlib.import_module(f"cs336sys.parallel.{_SHARDING_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RankContext", "WorkerError", "launch", "under_torchrun", *_DDP_NAMES,
           *_SHARDING_NAMES]  # fmt: skip
