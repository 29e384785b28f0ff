"""Your implementations, measured beside ours: FlashAttention-2, DDP, FSDP, a sharded
optimizer and a Transformer LM of your own (docs/yours.md).

Two ways in:

- an adapters file, the course's `tests/adapters.py` (adapters.py reads both generations):
  its functions become the implementations `yours-torch`, `yours-triton` (attention),
  `yours`, `yours-individual`, `yours-bucketed`, `yours-fsdp` (ddp) and the sharded
  optimizer `yours`;
- one-off targets, `NAME=package.module:Object` with NAME starting with `yours`
  (`--impl yours=my_pkg.attn:FlashFn`), for code without an adapters file.

This module holds what the current process measures: the adapters file (`use` decides it,
`engage` marks it in use once an implementation of it is asked for) and the one-off targets
(`register`). Both travel to the ranks a command spawns, and to the store's provenance
(measure/provenance.user_code), through environment variables, so a rank finds the same code
as its parent and a run records the code it measured.

    from cs336sys import yours
    yours.use("path/to/repo/tests/adapters.py")      # or CS336SYS_ADAPTERS, or found
    yours.register("attention", "yours-v2", "my_pkg.attn:FlashV2")

No torch here (the CLI imports this to validate option values).
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from cs336sys.measure.environ import kept as environ_kept
from cs336sys.measure.provenance import PREFIX, is_yours
from cs336sys.yours.adapters import ENTRIES, ENV, Adapters, AdaptersError, Entry, entries, find

__all__ = ["ENTRIES", "ENV", "Adapters", "AdaptersError", "Entry", "active", "engage",
           "engaged", "forget", "is_yours", "kept", "names", "register", "target", "use", "user_names"]

TARGETS_ENV = "CS336SYS_YOURS"  # {kind: {name: target}} of the one-off targets, as JSON

_UNSET = object()
_adapters: object = _UNSET  # Adapters | None once decided


def use(path: str | Path | None = None, start: str | Path | None = None) -> Adapters | None:
    """Decide the adapters file of this process: `path`, else CS336SYS_ADAPTERS, else
    `tests/adapters.py` at the top of the git checkout of `start` (the current folder);
    None when there is none. AdaptersError when a path given is missing or the file cannot
    be parsed. Nothing is imported yet."""
    global _adapters
    found = find(path, start)
    _adapters = Adapters(*found) if found else None
    return _adapters  # type: ignore[return-value]


def active() -> Adapters | None:
    """The adapters file decided (deciding it the first time, as `use()` does)."""
    if _adapters is _UNSET:
        return use()
    return _adapters  # type: ignore[return-value]


def engage() -> Adapters | None:
    """The adapters file, now in use: an implementation of it was asked for. From here on
    spawned ranks find it and the store records it (CS336SYS_ADAPTERS)."""
    adapters = active()
    if adapters is not None:
        os.environ[ENV] = str(adapters.path)
    return adapters


def engaged() -> Adapters | None:
    """The adapters file if one of its implementations is in use, else None."""
    return active() if os.environ.get(ENV) else None


@contextlib.contextmanager
def kept() -> Iterator[None]:
    """The adapters decision and the one-off targets as they are, put back after the block:
    a command `handout run` runs in this process engages what it measures, and the next
    one, measuring cs336sys's code, recorded the user's commit as its own."""
    global _adapters
    decided = _adapters
    try:
        with environ_kept(ENV, TARGETS_ENV):
            yield
    finally:
        _adapters = decided


def forget() -> None:
    """Back to no decision and no one-off targets (tests; a notebook switching repos)."""
    global _adapters
    _adapters = _UNSET
    os.environ.pop(ENV, None)
    os.environ.pop(TARGETS_ENV, None)


def _targets() -> dict[str, dict[str, str]]:
    try:
        found = json.loads(os.environ.get(TARGETS_ENV) or "{}")
    except ValueError:
        return {}
    return found if isinstance(found, dict) else {}


def register(kind: str, name: str, target: str) -> None:
    """Make `name` (`yours`, `yours-v2`, ...) the implementation of `kind` (attention, ddp,
    fsdp, optimizer) found at `target`, "package.module:Object"; for kind "model", `name`
    is what --model said (models/config.ModelConfig.model). ValueError when the name or the
    target is malformed."""
    if kind != "model" and not is_yours(name):  # yours2 or yours_v2 would be taken for ours
        raise ValueError(f"{name}={target}: your implementations are named yours or yours-..., "
                         f"so that tables tell them from ours")
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr or not all(p.isidentifier() for p in (*module.split("."), *attr.split("."))):
        raise ValueError(f"{name}={target}: the target must look like package.module:Object")
    targets = _targets()
    targets.setdefault(kind, {})[name] = target
    os.environ[TARGETS_ENV] = json.dumps(targets, sort_keys=True)


def target(kind: str, name: str) -> str | None:
    """The one-off target registered as `name` for `kind`, or None."""
    return _targets().get(kind, {}).get(name)


def names(kind: str) -> list[str]:
    """Every `yours` implementation of `kind` that can be asked for: the adapters' entries
    of that kind and the one-off targets registered for it."""
    return [*entries(kind), *(n for n in _targets().get(kind, {}) if n not in entries(kind))]


def one_target_each(values: Iterable[str], option: str) -> None:
    """ValueError (naming `option`) where one list gives a NAME two targets: the second
    registration replaced the first, whose point was never measured."""
    seen: dict[str, str] = {}
    for value in values:
        name, sep, where = (part.strip() for part in value.partition("="))
        if sep and seen.setdefault(name, where) != where:
            raise ValueError(f"{option}: {name} is given two targets, {seen[name]} and {where}; "
                             f"give each a name of its own ({PREFIX}-NAME=package.module:Object)")


def user_names(values: Iterable[str], kind: str, option: str) -> list[str]:
    """A list option's items with `NAME=package.module:Object` items registered for `kind`
    and replaced by NAME; ValueError (naming `option`) for a malformed one, or for a NAME
    given two targets."""
    values = list(values)
    one_target_each(values, option)
    out = []
    for value in values:
        name, sep, where = value.partition("=")
        if sep:
            try:
                register(kind, name.strip(), where.strip())
            except ValueError as exc:
                raise ValueError(f"{option}: {exc}") from None
            value = name.strip()
        out.append(value)
    return out


