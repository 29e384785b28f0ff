"""Course-layout repositories for the tests of the user's own code (cs336sys.yours).

`course_repo` copies examples/course-layout (a 2026-generation adapters file with plain
implementations) into a fresh git repository and commits it; `edit` changes a file in it,
for the broken, wrong and partial variants each test needs.
"""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "course-layout"


def git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                         check=True)
    return out.stdout.strip()


def course_repo(tmp_path: Path, name: str = "repo", files: dict[str, str] | None = None) -> Path:
    """A committed copy of the example, with `files` (path -> text) written over it first."""
    repo = tmp_path / name
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    for path, text in (files or {}).items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-m", "first")
    return repo


GALLERY = Path(__file__).resolve().parent / "gallery"


def with_gallery(repo: Path, *names: str) -> Path:
    """`repo` with tests/gallery/<name>.py copied in as cs336_systems/gallery_<name>.py."""
    for name in names:
        shutil.copy(GALLERY / f"{name}.py", repo / "cs336_systems" / f"gallery_{name}.py")
    return repo


def edit(repo: Path, path: str, old: str, new: str, commit: str | None = None) -> None:
    """Replace `old` (which must be there) by `new` in `path`; commit with message `commit`."""
    file = repo / path
    text = file.read_text()
    assert old in text, f"{old!r} not in {path}"
    file.write_text(text.replace(old, new))
    # Python takes a module's cached bytecode for its source when the source's size and
    # mtime, in whole seconds, are the ones recorded: two edits of equal length within a
    # second ran the first one's code (a flaky test of the gallery)
    Path(importlib.util.cache_from_source(str(file))).unlink(missing_ok=True)
    if commit:
        git(repo, "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-q", "-am", commit)


def line_of(repo: Path, path: str, needle: str) -> int:
    """The 1-based line of `path` holding `needle`."""
    for i, line in enumerate((repo / path).read_text().splitlines(), start=1):
        if needle in line:
            return i
    raise AssertionError(f"{needle!r} not in {path}")


# A 2025-generation adapters file: DDP with a hook per parameter and a bucketed one.
ADAPTERS_2025 = '''
import torch

from cs336_systems.ddp import NaiveDDP


def get_flashattention_autograd_function_pytorch():
    from cs336_systems.flash_attention import FlashAttentionPytorch

    return FlashAttentionPytorch


def get_flashattention_autograd_function_triton():
    raise NotImplementedError


def get_ddp_individual_parameters(module):
    return NaiveDDP(module)


def ddp_individual_parameters_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module, bucket_size_mb):
    ddp = NaiveDDP(module)
    ddp.bucket_size_mb = bucket_size_mb
    return ddp


def ddp_bucketed_on_after_backward(ddp_model, optimizer):
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model, optimizer):
    ddp_model.batches = getattr(ddp_model, "batches", 0) + 1


def get_sharded_optimizer(params, optimizer_cls, **kwargs):
    """Not yet."""
    raise NotImplementedError("sharding comes next week")
'''
