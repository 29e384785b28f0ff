"""A course-layout `tests/adapters.py`: found, read without running it, then imported.

The course (Stanford CS336, assignment 2) has students fill in `tests/adapters.py`: one
function per thing they implement, each raising NotImplementedError until they do. Two
generations of that file exist, and both are understood here (`ENTRIES`):

    2026: get_flashattention_autograd_function_pytorch(), ..._triton(), get_ddp(module) with
          ddp_on_after_backward(model, optimizer), get_fsdp(module, compute_dtype=None) with
          fsdp_on_after_backward(model, optimizer) and fsdp_gather_full_params(model),
          get_sharded_optimizer(params, optimizer_cls, **kwargs);
    2025: the same two FlashAttention functions, get_ddp_individual_parameters(module) with
          ddp_individual_parameters_on_after_backward(model, optimizer),
          get_ddp_bucketed(module, bucket_size_mb) with ddp_bucketed_on_after_backward and
          ddp_bucketed_on_train_batch_start(model, optimizer), get_sharded_optimizer(...).

Which functions a file implements is read from its syntax tree, without importing it: a
function whose body (docstring aside) is only `raise NotImplementedError` is not implemented.
So the command can say what it found before any user code runs, and a file that would not
import still gets a clear line. Importing it (`Adapters.module`) puts the repository root
on `sys.path`, with a `cs336-basics/` folder beside `tests/` when there is one (the course
layout), so that the file's own imports (`from cs336_systems.flash import ...`) resolve.

No torch here: the CLI reads adapters files before it decides to import anything heavy.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import os
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import ModuleType

from cs336sys.measure.paths import git_top, repository_root
from cs336sys.sweep.result import user_frame

ENV = "CS336SYS_ADAPTERS"  # the adapters file to use, when --adapters is not given


class AdaptersError(Exception):
    """The adapters file cannot be used (missing, unreadable, does not import); the message is
    one line for the user."""


@dataclass(frozen=True)
class Entry:
    """A user implementation that an adapters file provides, and the functions behind it."""

    impl: str  # the name a command option takes: `--impl yours-torch`
    kind: str  # attention | ddp | fsdp | optimizer (sharded) | adamw
    functions: tuple[str, ...]  # the getter first, then its hooks
    what: str  # in words, for the summary line

    @property
    def getter(self) -> str:
        """The getter as a message names it: `get_ddp() of the adapters file`."""
        return f"{self.functions[0]}() of the adapters file"


ENTRIES = (
    Entry("yours-torch", "attention", ("get_flashattention_autograd_function_pytorch",),
          "FlashAttention-2 in PyTorch"),
    Entry("yours-triton", "attention", ("get_flashattention_autograd_function_triton",),
          "FlashAttention-2 in Triton"),
    Entry("yours", "ddp", ("get_ddp", "ddp_on_after_backward"), "DDP (2026)"),
    Entry("yours-individual", "ddp", ("get_ddp_individual_parameters",
                                      "ddp_individual_parameters_on_after_backward"),
          "DDP, an all-reduce per parameter (2025)"),
    Entry("yours-bucketed", "ddp", ("get_ddp_bucketed", "ddp_bucketed_on_after_backward",
                                    "ddp_bucketed_on_train_batch_start"),
          "DDP, bucketed (2025)"),
    Entry("yours-fsdp", "fsdp", ("get_fsdp", "fsdp_on_after_backward", "fsdp_gather_full_params"),
          "FSDP (2026)"),
    Entry("yours", "optimizer", ("get_sharded_optimizer",), "sharded optimizer"),
    # assignment 1's adapters: the AdamW class, for --optimizer yours-adamw
    Entry("yours-adamw", "adamw", ("get_adamw_cls",), "AdamW (assignment 1)"),
)


def entries(kind: str) -> dict[str, Entry]:
    """The entries of one kind, by impl name."""
    return {e.impl: e for e in ENTRIES if e.kind == kind}


FOUND = "found at the top of this checkout"  # how a file nobody named was found


def find(given: str | Path | None = None, start: str | Path | None = None) -> tuple[Path, str] | None:
    """The adapters file to use and how it was found: `given` (--adapters), else the
    CS336SYS_ADAPTERS variable, else `tests/adapters.py` at the top of the git checkout of
    `start` (the current folder) when it exists; None when there is none. A path that is
    given but missing is an AdaptersError."""
    # --adapters takes CS336SYS_ADAPTERS as its value when not typed: a missing file named
    # there is said to be the variable's, which the user may not know is set
    said = ENV if given is not None and str(given) == os.environ.get(ENV) else "--adapters"
    for path, how in ((given, said), (os.environ.get(ENV) or None, ENV)):
        if path is not None:
            path = Path(path).expanduser()
            if path.is_dir():  # (an empty --adapters too, read as `.`)
                raise AdaptersError(f"{how}{'=' if how == ENV else ' '}{path}: a folder; give "
                                    "the adapters file (tests/adapters.py)")
            if not path.is_file():
                raise AdaptersError(f"{how}{'=' if how == ENV else ' '}{path}: no such file")
            return path.resolve(), how
    top = git_top(start)
    if top is not None and (top / "tests" / "adapters.py").is_file():
        return (top / "tests" / "adapters.py").resolve(), FOUND
    return None


def implemented_functions(source: str, filename: str = "<adapters>") -> dict[str, bool]:
    """Every top-level function of `source` -> whether it is implemented (its body is more
    than a docstring and `raise NotImplementedError`). SyntaxError as AdaptersError."""
    try:
        tree = ast.parse(source, filename=filename)
    except SyntaxError as exc:
        raise AdaptersError(f"{filename}:{exc.lineno}: SyntaxError: {exc.msg}") from None
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]  # the docstring
            out[node.name] = not (len(body) == 1 and _raises_not_implemented(body[0]))
    return out


def _raises_not_implemented(stmt: ast.stmt) -> bool:
    if not isinstance(stmt, ast.Raise) or stmt.exc is None:
        return False
    exc = stmt.exc.func if isinstance(stmt.exc, ast.Call) else stmt.exc
    return isinstance(exc, ast.Name) and exc.id == "NotImplementedError"


class Adapters:
    """One adapters file: where it is, what it implements, and the module once imported."""

    def __init__(self, path: str | Path, how: str = "--adapters") -> None:
        self.path = Path(path).resolve()
        self.how = how  # how it was found, for the summary line
        self.root = repository_root(self.path)
        try:
            self.source = self.path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise AdaptersError(f"cannot read {self.path}: {exc}") from None
        self.unparsed: str | None = None
        try:
            self.functions = implemented_functions(self.source, self.shown)
        except AdaptersError as exc:
            if how != FOUND:  # named: refused at once
                raise
            # found, not named: a file being edited stops only the commands that ask for
            # its implementations (`attention --impl sdpa` ran into its SyntaxError)
            self.functions, self.unparsed = {}, str(exc)

    @property
    def shown(self) -> str:
        """The file's path as the user would type it: relative to the current folder when
        it is inside it."""
        try:
            return str(self.path.relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(self.path)

    def has(self, entry: Entry) -> bool:
        """The file defines the entry's getter."""
        return entry.functions[0] in self.functions

    def implements(self, entry: Entry) -> bool:
        """The entry's getter is defined and is more than `raise NotImplementedError`."""
        return self.functions.get(entry.functions[0], False)

    def unfinished(self, entry: Entry) -> bool:
        """The entry's getter is defined and is only `raise NotImplementedError` (its
        points are `skipped`, read from the file without running it)."""
        return self.has(entry) and not self.implements(entry)

    def unwritten(self, entry: Entry) -> list[str]:
        """The entry's functions (getter or hooks) the file defines as only `raise
        NotImplementedError`: its points are skipped wherever one of them is called."""
        return [f for f in entry.functions if self.functions.get(f) is False]

    @property
    def generation(self) -> str:
        """Which course generation's DDP functions the file has: 2026, 2025, both, or None."""
        new = any(f in self.functions for f in ("get_ddp", "get_fsdp"))
        old = any(f in self.functions for f in ("get_ddp_individual_parameters", "get_ddp_bucketed"))
        return {(True, False): "2026", (False, True): "2025", (True, True): "2025 and 2026"}.get((new, old), "")

    def summary(self) -> str:
        """One line: the file, how it was found, and what it implements."""
        def name(e: Entry) -> str:
            return f"--shard-optimizer {e.impl}" if e.kind == "optimizer" else e.impl

        present = [e for e in ENTRIES if self.has(e)]
        done = [name(e) for e in present if self.implements(e)]
        todo = [name(e) for e in present if not self.implements(e)]
        gen = f", {self.generation} functions" if self.generation else ""
        parts = [f"implemented: {', '.join(done) or 'none'}"]
        if todo:
            parts.append(f"not implemented: {', '.join(todo)}")
        return f"adapters: {self.shown} ({self.how}{gen}); " + "; ".join(parts)

    def search_path(self) -> list[Path]:
        """What goes on sys.path to import the file: the root, and cs336-basics/ beside it."""
        basics = self.root / "cs336-basics"
        return [self.root, *([basics] if basics.is_dir() else [])]

    @cached_property
    def module(self) -> ModuleType:
        """The file, imported (once); any failure to import is an AdaptersError naming the
        file and line."""
        importable_from(self.search_path(), fresh=True)
        name = "cs336sys_adapters_" + hashlib.sha1(str(self.path).encode()).hexdigest()[:10]
        spec = importlib.util.spec_from_file_location(name, self.path)
        if spec is None or spec.loader is None:  # pragma: no cover - a .py file always has one
            raise AdaptersError(f"cannot import {self.shown}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        # any failure in the user's import is theirs, exit() at its top level too (which
        # ended the command with exit code 0 and not a word)
        except (Exception, SystemExit) as exc:
            del sys.modules[name]
            where = user_frame(exc, self.root) or self.shown
            raise AdaptersError(f"cannot import {self.shown}: {where}: "
                                f"{type(exc).__name__}: {exc}".strip()) from None
        return module

    def function(self, name: str):
        """The adapters function `name` (importing the file), or None when it has none."""
        if self.unparsed is not None:
            raise AdaptersError(self.unparsed)
        return getattr(self.module, name, None)


def importable_from(folders: list[Path], fresh: bool = False) -> None:
    """Make the packages in `folders` the ones `import` finds: the folders go first on
    sys.path, and modules already imported under the same names from somewhere else
    (another repository's `cs336_systems`, an earlier adapters file in the same notebook)
    are forgotten, so that the user's imports resolve to this repository. With `fresh`,
    those imported from `folders` are forgotten too: a notebook that edits its kernel and
    calls `yours.use()` again measures the edited code."""
    for folder in reversed(folders):
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))
    names = {child.name for folder in folders for child in folder.iterdir()
             if child.is_dir() and (child / "__init__.py").exists() and child.name != "tests"}
    roots = [str(f.resolve()) for f in folders]
    for mod_name, mod in list(sys.modules.items()):
        if mod_name.split(".")[0] not in names or mod is None:
            continue
        where = getattr(mod, "__file__", None) or ""
        if where and (fresh or not any(str(Path(where).resolve()).startswith(r) for r in roots)):
            del sys.modules[mod_name]
