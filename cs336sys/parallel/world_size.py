"""How many local ranks this host runs: one per GPU with NCCL; Gloo ranks on the CPU cores,
within a cap that keeps a mistyped --world-size from starting a million processes."""

from __future__ import annotations

import os


def max_local_world_size(device: str) -> int:
    """How many ranks this host runs well: one per GPU on CUDA, one per core on CPU."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.device_count()
    return os.cpu_count() or 1


# Local Gloo ranks a core at most: beyond one a core times measure contention (a warning says
# so); far beyond, the ranks measure nothing, and a million of them ran the command out of
# open files with a traceback, its store already created.
GLOO_RANKS_PER_CORE = 16
# Open files the launching process may hold per rank it starts (its pipes), generously.
FILES_PER_RANK = 16


def local_gloo_cap() -> tuple[int, str]:
    """The most local Gloo ranks this host starts, and why, in words."""
    import resource

    cores = os.cpu_count() or 1
    files = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    by_cores = GLOO_RANKS_PER_CORE * cores
    if files != resource.RLIM_INFINITY and files // FILES_PER_RANK < by_cores:
        return files // FILES_PER_RANK, f"the {files} open files a process may hold here"
    return by_cores, f"{GLOO_RANKS_PER_CORE} a core on {cores} core(s)"


# What a refusal for too few GPUs says: `handout run` tells it from the user's mistakes by it.
NCCL_RANK_PER_GPU = "GPUs for NCCL (one per rank)"


def check_world_size(world_size: int, backend: str) -> None:
    """Raise ValueError with one sentence if this host cannot run `world_size` local ranks."""
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    if backend == "gloo":
        cap, why = local_gloo_cap()
        if world_size > cap:
            raise ValueError(f"world size {world_size} is more local Gloo ranks than this host "
                             f"starts: at most {cap} ({why}); torchrun spreads more over "
                             f"machines")
    if backend == "nccl":
        import torch

        gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if world_size > gpus:
            raise ValueError(
                f"world size {world_size} needs {world_size} {NCCL_RANK_PER_GPU}; "
                f"this host has {gpus}"
            )
