"""Distributed training on several ranks: the launcher and the DDP family.

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


def __getattr__(name: str):
    if name in _DDP_NAMES:
        from cs336sys.parallel import ddp

        return getattr(ddp, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RankContext", "WorkerError", "launch", "under_torchrun", *_DDP_NAMES]
