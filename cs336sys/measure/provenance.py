"""Where and how a measurement was taken: device, versions, host, git commit, and the
environment variables that change what runs.

Every probe degrades to None instead of failing: a machine without nvidia-smi, a checkout
without git, or an install outside any checkout still records what it can.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import cs336sys
from cs336sys.measure.paths import git_top, repository_root

_PACKAGE_DIR = Path(cs336sys.__file__).resolve().parent


def command_output(cmd: list[str], cwd: str | Path | None = None) -> str | None:
    """The stripped stdout of `cmd`, or None when it cannot run, fails or takes over 10 s."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def git_info(path: str | Path = _PACKAGE_DIR) -> dict[str, Any]:
    """Commit of the checkout holding `path` and whether tracked files differ from it.

    Outside a git checkout (or in one without commits) both are None.
    """
    commit = command_output(["git", "rev-parse", "HEAD"], cwd=Path(path))
    if not commit:
        return {"git_commit": None, "git_dirty": None}
    # --no-optional-locks: status would refresh the index and write it back under
    # .git/index.lock; a Ctrl-C meanwhile has subprocess.run kill git, which leaves the lock
    # behind, and the user's next git command refuses ("index.lock: File exists")
    status = command_output(["git", "--no-optional-locks", "status", "--porcelain",
                             "--untracked-files=no"], cwd=Path(path))
    return {"git_commit": commit, "git_dirty": None if status is None else int(bool(status))}


# Environment variables that change what a command measures: cs336sys's own switches (the
# opt-in Triton paths, autotuning, flash-torch's compile), Triton's interpreter, PyTorch's
# allocator, NCCL's transport choices, thread counts. Folders, the store's path and the
# distributed timeout do not.
_ENV_PREFIXES = ("CS336SYS_", "TRITON_", "NCCL_", "TORCH_", "PYTORCH_", "TORCHINDUCTOR_")
_ENV_NAMES = ("CUDA_VISIBLE_DEVICES", "OMP_NUM_THREADS", "MKL_NUM_THREADS")
# The user's code (CS336SYS_ADAPTERS, CS336SYS_YOURS) is recorded in columns of its own.
_ENV_IGNORED = ("CS336SYS_DB", "CS336SYS_DIST_TIMEOUT", "CS336SYS_ADAPTERS", "CS336SYS_YOURS")


def measurement_env(environ: dict[str, str] | None = None) -> str | None:
    """The variables of `environ` (default os.environ) that change what is measured, as a
    JSON object with sorted keys; None when there are none."""
    environ = os.environ if environ is None else environ
    kept = {k: v for k, v in environ.items()
            if (k.startswith(_ENV_PREFIXES) or k in _ENV_NAMES) and k not in _ENV_IGNORED
            and not k.endswith(("_DIR", "_PATH", "_FILE", "_HOME"))}
    return json.dumps(dict(sorted(kept.items()))) if kept else None


PREFIX = "yours"  # the user's implementations: yours, yours-torch, yours-v1=pkg.mod:Fn


def is_yours(name: str | None) -> bool:
    """Whether an implementation name is the user's (yours, yours-...)."""
    return bool(name) and (name == PREFIX or name.startswith(PREFIX + "-"))  # type: ignore[union-attr]


def measures_yours(settings: dict) -> bool:
    """Whether a run of these settings measured the user's code: an implementation of
    theirs (`yours...`) or their model (`--model`)."""
    if settings.get("model"):
        return True
    return any(isinstance(v, str) and is_yours(v) for v in settings.values())


def user_code(environ: dict[str, str] | None = None) -> dict[str, Any]:
    """Where the user's code being measured comes from (cs336sys.yours puts it in the
    environment, for this process and the ranks it starts): the repository (the folder of
    its adapters file's `tests/`, else the top of the git checkout of the current folder),
    its commit and dirty flag, and the adapters file with its sha256. {} when no user code
    is in use."""
    environ = os.environ if environ is None else environ
    adapters = environ.get("CS336SYS_ADAPTERS") or None
    if adapters is not None:
        root = repository_root(adapters)
    elif environ.get("CS336SYS_YOURS"):
        root = git_top() or Path.cwd()
    else:
        return {}
    git = git_info(root)
    digest = None
    if adapters is not None:
        try:
            digest = hashlib.sha256(Path(adapters).read_bytes()).hexdigest()
        except OSError:
            pass
    return {"user_repo": str(root), "user_commit": git["git_commit"], "user_dirty": git["git_dirty"],
            "user_changes": uncommitted(root) if git["git_commit"] else None,
            "adapters": adapters, "adapters_sha256": digest}


def uncommitted(root: str | Path) -> str | None:
    """The sha256 of a checkout's uncommitted Python code: its tracked .py files' diff
    against HEAD and its untracked .py files that git does not ignore, by name and content;
    None when there is none, or git cannot say. Not its other files: the store and reports
    cs336sys writes inside it change with every command."""
    git = ["git", "--no-optional-locks"]
    try:
        diff = subprocess.run([*git, "diff", "HEAD", "--binary", "--", "*.py"], cwd=root,
                              capture_output=True, timeout=10)
        others = subprocess.run([*git, "ls-files", "--others", "--exclude-standard", "-z",
                                 "--", "*.py"], cwd=root, capture_output=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    names = sorted(n for n in others.stdout.split(b"\0") if n)
    if diff.returncode or others.returncode or not (diff.stdout or names):
        return None
    digest = hashlib.sha256(diff.stdout)
    for name in names:
        try:
            content = (Path(root) / os.fsdecode(name)).read_bytes()
        except OSError:  # removed meanwhile
            content = b""
        digest.update(b"\0" + name + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def package_version(dist: str) -> str | None:
    """The installed version of the distribution `dist`, or None where it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    out = command_output(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
    return out.splitlines()[0].strip() if out else None


def collect(device: str = "cpu") -> dict[str, Any]:
    """Provenance of a measurement on `device` ('cpu', 'cuda', 'cuda:N').

    On CUDA the GPU fields describe the GPUs; on CPU `gpu` is 'cpu' and `cpu` names the model.
    Device 'none' is a command that computes on no device (`cs336sys plan`): torch is not
    imported (its version comes from the package metadata, the CUDA version is left out)
    and the GPU fields are nvidia-smi's, where there is one.
    """
    if device == "none":
        return _without_torch()
    import torch

    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "device": device,
        "cpu": cpu_model(),
        "torch_version": torch.__version__,
        "triton_version": package_version("triton"),
        "python_version": platform.python_version(),
        "cs336sys_version": cs336sys.__version__,
        "cuda_version": torch.version.cuda,
        "driver_version": None,
        "gpu": "cpu",
        "gpu_count": 0,
        "gpu_memory_gb": None,
        "env": measurement_env(),
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        index = torch.device(device).index or 0
        props = torch.cuda.get_device_properties(index)
        info.update(
            gpu=props.name,
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gb=round(props.total_memory / 2**30, 2),
            driver_version=_driver_version(),
        )
    info.update(git_info())
    info.update(user_code())
    return info


def smi_gpus() -> tuple[str, int, float | None] | None:
    """(name of the first GPU, how many, its memory in GiB) from nvidia-smi, without torch;
    None where there is no nvidia-smi or it fails."""
    out = command_output(["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"])
    lines = [line.split(",") for line in (out or "").splitlines() if "," in line]
    if not lines:
        return None
    name, mib = lines[0][0].strip(), lines[0][1].strip()
    try:
        gib = round(float(mib) / 1024, 2)
    except ValueError:  # "[N/A]"
        gib = None
    return name, len(lines), gib


def _without_torch() -> dict[str, Any]:
    gpu = smi_gpus()
    info: dict[str, Any] = {
        "host": socket.gethostname(),
        "device": "none",
        "cpu": cpu_model(),
        "torch_version": package_version("torch"),
        "triton_version": package_version("triton"),
        "python_version": platform.python_version(),
        "cs336sys_version": cs336sys.__version__,
        "cuda_version": None,
        "driver_version": _driver_version() if gpu else None,
        "gpu": gpu[0] if gpu else "cpu",
        "gpu_count": gpu[1] if gpu else 0,
        "gpu_memory_gb": gpu[2] if gpu else None,
        "env": measurement_env(),
    }
    info.update(git_info())
    return info
