"""The user's AdamW, for the problem that asks to profile a training step "with your
implementation of AdamW" (nsys_profile (d)): `handout run --yours` times that step with it.

Found as assignment 1's adapters find it, `get_adamw_cls()` where the adapters file
implements it, else as the course layout has it, the `AdamW` class of
`cs336_basics/optimizer.py` (the package `--model cs336_basics` builds the model from). Both
are read from their files, nothing imported, so `cs336sys handout` lists at once; the
command that runs it checks the class against torch's AdamW before it is timed.
"""

from __future__ import annotations

import ast
import importlib.machinery
from pathlib import Path

from cs336sys.measure.paths import git_top
from cs336sys.yours.adapters import Adapters, AdaptersError, entries, find

BASICS = "cs336_basics.optimizer:AdamW"
GETTER = entries("adamw")["yours-adamw"]


def option() -> str | None:
    """The `--optimizer` value that runs the user's AdamW, or None where none is found."""
    adapters = _adapters()
    if adapters is not None and adapters.implements(GETTER):
        return GETTER.impl
    files = _optimizer_files(adapters.root if adapters is not None else None)
    return f"yours={BASICS}" if any(_defines_adamw(p) for p in files) else None


def unfound(problems: list) -> list[str]:
    """What `handout run --yours` says before it runs `problems` where one of them asks for
    the user's AdamW and none is found: a line, or none."""
    if option() is not None or not any(r.your_adamw for p in problems for r in p.runs):
        return []
    return [(f"your AdamW was not found (your adapters file implements no "
            f"{GETTER.functions[0]}(), no cs336_basics/optimizer.py defines AdamW): "
            f"nsys_profile (d)'s training step runs "
            f"cs336sys's adamw; time yours with `cs336sys profile model --model cs336_basics "
            f"--mode train --optimizer yours=package.module:AdamW`.")]


def _adapters() -> Adapters | None:
    """The adapters file the run reads, or None (one that cannot be read is said by the
    commands that read it)."""
    try:
        found = find()
        return Adapters(*found) if found is not None else None
    except (AdaptersError, OSError):
        return None


def _optimizer_files(adapters_root: Path | None) -> list[Path]:
    """Where cs336_basics/optimizer.py may be: in the course layout's cs336-basics/ beside the
    adapters file's tests/ or at the top of this checkout, then where the package is installed."""
    tops = dict.fromkeys(t for t in (adapters_root, git_top()) if t is not None)
    roots = [top / "cs336-basics" for top in tops]
    try:  # on sys.path, not the module imported already (a command's, from another root)
        spec = importlib.machinery.PathFinder.find_spec("cs336_basics")
    except (ImportError, ValueError):
        spec = None
    installed = list(spec.submodule_search_locations or []) if spec is not None else []
    return [*(r / "cs336_basics" / "optimizer.py" for r in roots),
            *(Path(p) / "optimizer.py" for p in installed)]


def _defines_adamw(path: Path) -> bool:
    """Whether the file binds `AdamW` at its top level: a class, an assignment or an import."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, SyntaxError, ValueError):
        return False
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == "AdamW":
            return True
        if isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == "AdamW" for t in targets):
                return True
        if isinstance(node, ast.ImportFrom | ast.Import):
            if any((a.asname or a.name) == "AdamW" for a in node.names):
                return True
    return False
