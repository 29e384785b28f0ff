"""The user's code as objects the experiments call, from the adapters file or a one-off
target, and the files it came from (for the row's provenance).

Every getter here raises `Unfinished` (stored as a `skipped` row) when the adapters function
behind it still raises NotImplementedError, and UserCodeError (a bad option: exit 2 before
anything runs) when the code cannot be found at all. Calling the user's code is left to the
experiments, inside the sweep's guard, so its exceptions become `error` rows.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

from cs336sys.measure.paths import git_top
from cs336sys.sweep.points import SpecError, choices
from cs336sys.sweep.result import Unfinished, is_library_file, user_frame
from cs336sys.yours import engage, engaged, entries, is_yours, names, register, target, user_names
from cs336sys.yours.adapters import Adapters, AdaptersError, Entry, importable_from


class UserCodeError(ValueError):
    """The user's code asked for cannot be found or imported; one line for the user."""


def _adapters_for(entry: Entry) -> Adapters:
    adapters = engage()
    if adapters is None:
        name = entry.impl if entry.kind != "optimizer" else f"--shard-optimizer {entry.impl}"
        raise UserCodeError(
            f"{name} needs an adapters file: give --adapters PATH, set CS336SYS_ADAPTERS, or run "
            "from a checkout with tests/adapters.py at its top"
        )
    if adapters.function(entry.functions[0]) is None:  # imports the file (AdaptersError)
        raise UserCodeError(f"{adapters.shown} has no {entry.functions[0]}() (for {entry.impl})")
    return adapters


def check(kind: str, name: str) -> None:
    """Refuse, before anything runs, a `yours` name of `kind` whose code cannot be found:
    no adapters file, a function the file does not define, a one-off target that does not
    import."""
    if target(kind, name) is not None:
        found = load_target(target(kind, name))
        if not callable(found):  # `yours=os:path`: stored as "'module' object is not callable"
            raise UserCodeError(f"{target(kind, name)} is a {type(found).__name__}, not a "
                                f"class or function")
        if kind == "adamw" and isinstance(found, type) and not _an_optimizer(found):
            raise UserCodeError(f"{target(kind, name)} is a class, not a torch.optim.Optimizer "
                                "(assignment 1's AdamW subclasses it)")
        return
    entry = entries(kind).get(name)
    if entry is None:
        raise UserCodeError(f"unknown {kind} implementation {name!r}")
    _adapters_for(entry)  # imports the file: an error here is exit 2


def _an_optimizer(cls: type) -> bool:
    """Whether the class is a torch optimizer (one that every run would fail to build, a
    stored error on every point, is refused instead)."""
    import torch

    return issubclass(cls, torch.optim.Optimizer)


def call_adapter(entry: Entry, index: int, *args: Any, **kwargs: Any) -> Any:
    """The adapters function `entry.functions[index]` called with `args`; a hook the file
    does not define does nothing (None). NotImplementedError from the getter is Unfinished."""
    adapters = _adapters_for(entry)
    fn = adapters.function(entry.functions[index])
    if fn is None:
        return None
    try:
        return fn(*args, **kwargs)
    except NotImplementedError as exc:
        if index:
            raise
        raise Unfinished(f"{entry.functions[0]} is not implemented in {adapters.shown}"
                         + (f" ({exc})" if str(exc) else "")) from None


def search_path() -> list[Path]:
    """Where one-off targets and `--model` classes are imported from: the repository of the
    adapters file in use first, then the top of the git checkout of the current folder (else
    the folder); each with its `cs336-basics/` (the course layout). An adapters file from
    another repository (assignment 1's, for `yours-adamw`) puts its packages first; the
    current checkout's others are still found."""
    root = git_top() or Path.cwd()
    basics = root / "cs336-basics"
    here = [root, *([basics] if basics.is_dir() else [])]
    adapters = engage()
    first = adapters.search_path() if adapters is not None else []
    return [*first, *(p for p in here if p not in first)]


def load_target(spec: str) -> Any:
    """The object at "package.module:Object" (UserCodeError naming the file and line when it
    does not import).

    The adapters file in use is imported first: its import forgets the repository's modules
    (Adapters.module), and after this one it would make a second cs336_basics beside the
    one `--model cs336_basics` built from, whose Linear an FSDP's isinstance never matches."""
    adapters = engaged()
    if adapters is not None:
        try:
            _ = adapters.module
        except AdaptersError:
            pass  # said where the adapters' own implementations are asked for
    importable_from(search_path())
    module_name, _, attr = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            obj = getattr(obj, part)
    except (Exception, SystemExit) as exc:  # whatever the user's import raises, exit too
        where = user_frame(exc)
        raise UserCodeError(f"cannot import {spec}: {where + ': ' if where else ''}"
                            f"{type(exc).__name__}: {exc}") from None
    return obj


# `--model cs336_basics`: the course's Transformer LM, from the cs336-basics/ folder of a
# course-layout repository (or wherever the package is installed).
COURSE_MODEL = "cs336_basics.model:BasicsTransformerLM"
# The course's constructor, which `--model` classes take (filled from a size preset).
MODEL_ARGUMENTS = ("vocab_size", "context_length", "d_model", "num_layers", "num_heads", "d_ff",
                   "rope_theta")


def model_class(source: str) -> Any:
    """The user's Transformer LM class for `--model source` ("cs336_basics" or
    "package.module:Class"); recorded as user code (measure/provenance.user_code)."""
    where = COURSE_MODEL if source == "cs336_basics" else source
    try:
        register("model", source, where)
    except ValueError:
        raise UserCodeError(f"--model {source}: give cs336_basics or package.module:Class") from None
    try:
        cls = load_target(where)
    except UserCodeError as exc:  # the newcomer's case: run from outside their checkout
        if source == "cs336_basics" and "No module named 'cs336_basics'" in str(exc):
            raise UserCodeError(f"--model cs336_basics: {exc}; run from your assignment "
                                "checkout (the one with cs336-basics/), or give --adapters "
                                "PATH of its tests/adapters.py") from None
        raise
    if not callable(cls):
        raise UserCodeError(f"--model {source}: {where} is not a class")
    import torch

    if isinstance(cls, type) and not issubclass(cls, torch.nn.Module):  # (a factory may be)
        raise UserCodeError(f"--model {source}: {where} is a class but not a torch.nn.Module: "
                            "cs336sys trains, checkpoints and shards it as one")
    try:
        signature = inspect.signature(cls)
    except (TypeError, ValueError):  # no signature to read: its build says what is wrong
        return cls
    try:
        signature.bind(**dict.fromkeys(MODEL_ARGUMENTS))
    except TypeError as exc:  # refused before any point, not an error stored at each
        raise UserCodeError(
            f"--model {source}: {where} is built with the course's keywords "
            f"({', '.join(MODEL_ARGUMENTS)}), and its constructor says: {exc}; a subclass "
            "whose __init__ takes them and hands them to yours under its names measures it") from None
    return cls


def build_model(config: Any) -> Any:
    """The user's model for `config` (a ModelConfig whose `model` names it), built with the
    course's constructor from the config's shape."""
    cls = model_class(config.model)
    return cls(**{name: getattr(config, name) for name in MODEL_ARGUMENTS})


def uses_triton(name: str) -> bool:
    """Whether the user's attention `name` runs Triton code: yours-triton, or a one-off
    target whose code launches a Triton kernel (`_runs_triton`). Its module is imported
    already where the point runs it."""
    if name == "yours-triton":
        return True
    where = target("attention", name)
    return where is not None and _runs_triton(load_target(where))


def _runs_triton(obj: Any, depth: int = 3) -> bool:
    """Whether `obj` (a class or function of the user's) names a Triton kernel (@triton.jit,
    @triton.autotune) in its source, or calls code of the user's that does, `depth` calls
    deep, by name or as an attribute of a module of the user's. Not its module's imports: a
    PyTorch kernel beside a Triton one in one file runs no Triton, and a Triton kernel
    re-exported from a package's __init__ does."""
    import re

    try:
        source = inspect.getsource(obj)
    except (OSError, TypeError):  # no source to read (a builtin)
        return False
    found = vars(inspect.getmodule(obj) or object())
    # a name, or a module's attribute (`kernels._fwd[grid](...)` of `import ... as kernels`)
    words = [*re.findall(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*", source),  # and each part alone
             *re.findall(r"[A-Za-z_]\w*", source)]  # (`self._kernel` of a global _kernel)
    for word in dict.fromkeys(words):
        head, *attributes = word.split(".")
        value = found.get(head)
        for name in attributes:
            if not inspect.ismodule(value) or is_library_file(getattr(value, "__file__", "")
                                                              or ""):
                break
            value = getattr(value, name, None)
        if value is None or value is obj:
            continue
        if type(value).__module__.split(".")[0] == "triton":
            return True
        if depth and (inspect.isfunction(value) or inspect.isclass(value)) \
                and not is_library_file(inspect.getsourcefile(value) or "") \
                and _runs_triton(value, depth - 1):
            return True
    return False


def attention_function(name: str) -> Callable[..., Any]:
    """`fn(q, k, v, is_causal=False)` for the user's attention `name`: an autograd.Function
    (the adapters' getters return one) through its `.apply`, a function called with the same
    four arguments in order (whatever it names the mask flag).

    The course's contract is (batch, seq, d) inputs, which is what its tests give a student's
    kernel; inputs with more leading dimensions (the model's (B, H, T, D)) reach it with them
    flattened into the batch, (B·H, T, D), and the output is shaped back. The flattening is a
    view where the inputs allow one, a copy otherwise (the model's transposed heads).

    A function whose fourth parameter is named `mask` is assignment 1's
    `scaled_dot_product_attention(Q, K, V, mask)`: it gets the boolean (T_q, T_k) mask, True
    where a query may attend (the lower triangle when causal), or without one None
    (`_with_mask`)."""
    import torch

    where = target("attention", name)
    entry = entries("attention").get(name) if where is None else None
    obj = load_target(where) if where is not None else call_adapter(entry, 0)
    source = where or entry.getter
    module = isinstance(obj, type) and issubclass(obj, torch.nn.Module)
    # a torch.autograd.Function subclass, or an instance of one: the course calls its .apply
    # (every nn.Module class has an .apply too, which takes a function to call on each child)
    if (isinstance(obj, type) and hasattr(obj, "apply") and not module) \
            or isinstance(obj, torch.autograd.Function):
        call = obj.apply
    elif isinstance(obj, torch.nn.Module):  # its .apply maps a function over children
        raise TypeError(f"{name}: {source} gave an instance of the nn.Module "
                        f"{type(obj).__name__}; expected an autograd.Function subclass (whose "
                        ".apply(q, k, v, is_causal) returns O)"
                        + (" or a function" if entry is None else ""))
    elif entry is not None and not module and not hasattr(obj, "apply"):
        # the course's tests call .apply on what the getter returns: a function fails there
        owner = getattr(obj, "__self__", None)  # FlashFn.apply: a method bound to its class
        what = (f"{owner.__name__}.{obj.__name__}" if isinstance(owner, type)
                else getattr(obj, "__qualname__", type(obj).__name__))
        raise TypeError(f"{name}: {source} gave {what}, which has no .apply: the course's "
                        f"tests call {entry.functions[0]}().apply(q, k, v, is_causal), so "
                        f"return the autograd.Function class itself")
    elif callable(obj) and not module and _takes_a_mask(obj):
        call = _with_mask(obj)
    elif callable(obj) and not module:
        call = obj
    else:
        got = f"the nn.Module class {obj.__name__}" if module else type(obj).__name__
        raise TypeError(f"{name}: {source} gave {got}; expected an autograd.Function subclass "
                        "(whose .apply(q, k, v, is_causal) returns O) or a function")

    def checked(*args: Any) -> Any:
        out = call(*args)
        if isinstance(out, (tuple, list)):  # the course's tests use the result as O
            raise TypeError(f"{name} returned a {type(out).__name__} of {len(out)}, not the "
                            f"output O: the course's .apply(q, k, v, is_causal) returns O "
                            f"alone (L is saved for backward with ctx.save_for_backward)")
        if not hasattr(out, "reshape"):  # it said "'NoneType' has no attribute 'backward'"
            raise TypeError(f"{name} returned {type(out).__name__}, not the output O (a "
                            f"tensor): does its forward end without `return`?")
        return out

    def fn(q, k, v, is_causal=False):
        if q.dim() == 3:
            return checked(q, k, v, is_causal)
        lead = q.shape[:-2]
        flat = [t.reshape(-1, *t.shape[-2:]) for t in (q, k, v)]  # (B·H, T, D)
        out = checked(*flat, is_causal)
        return out.reshape(*lead, *out.shape[-2:])  # (B, H, T, D)

    fn.__wrapped__ = obj  # type: ignore[attr-defined]  # where it came from: sources()
    return fn


def _takes_a_mask(fn: Callable[..., Any]) -> bool:
    """Whether `fn`'s fourth parameter is a mask (assignment 1's attention), not a flag."""
    import inspect

    try:
        names = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        return False
    return len(names) >= 4 and "mask" in names[3].lower()


def _with_mask(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn(q, k, v, mask)` called as `(q, k, v, is_causal)`: the causal mask, True on and
    below the diagonal (a query attends to itself and the keys before it), or no mask: the
    function's own default where it has one (assignment 1's adapter declares `mask=None`),
    else one True everywhere, since a function that must be given a mask may not take None.
    A keyword-only mask is given by its name."""
    import inspect

    import torch

    mask_param = list(inspect.signature(fn).parameters.values())[3]
    optional = mask_param.default is not inspect.Parameter.empty
    by_name = mask_param.kind is inspect.Parameter.KEYWORD_ONLY  # `(q, k, v, *, mask=None)`

    # built outside any compiled graph (`attention --compile`): the user's function gets it
    # as an input, as their model gives it; inductor failed on `mask == False` of a mask it
    # had folded into a constant ("A Boolean argument can only be used in Eq and Ne")
    @torch.compiler.disable
    def make_mask(n_q: int, n_k: int, device: Any, is_causal: bool) -> Any:
        mask = torch.ones(n_q, n_k, dtype=torch.bool, device=device)
        return mask.tril() if is_causal else mask

    def call(q: Any, k: Any, v: Any, is_causal: bool) -> Any:
        if not is_causal and optional:  # no mask: its own default (None in assignment 1's)
            return fn(q, k, v)
        mask = make_mask(q.shape[-2], k.shape[-2], q.device, is_causal)
        return fn(q, k, v, mask=mask) if by_name else fn(q, k, v, mask)

    call.__wrapped__ = fn  # type: ignore[attr-defined]
    return call


def sources(*objects: Any) -> dict[str, str]:
    """The files the user's `objects` came from (and the adapters file in use), each with
    the sha256 of its content: a row's record of exactly which code it measured. Library
    files (cs336sys, torch) are left out."""
    files: list[Path] = []
    adapters = engaged()
    if adapters is not None:
        files.append(adapters.path)
    for obj in objects:
        obj = getattr(obj, "__wrapped__", obj)
        defined = obj if inspect.isclass(obj) or inspect.isroutine(obj) or inspect.ismodule(obj) else type(obj)
        try:
            path = inspect.getsourcefile(defined)
        except TypeError:  # a builtin
            path = None
        if path and not is_library_file(path):
            files.append(Path(path).resolve())
    root = adapters.root if adapters is not None else search_path()[0]
    out = {}
    for path in dict.fromkeys(files):
        try:
            shown = str(path.relative_to(root))
        except ValueError:
            shown = str(path)
        try:
            out[shown] = hashlib.sha256(path.read_bytes()).hexdigest()
        except OSError:
            continue
    return out


def named_impl(value: str, kind: str, option: str, allowed: list[str]) -> str:
    """An option that takes one implementation, as named_impls checks it; SpecError for a
    list (its later names were dropped without a word)."""
    given = named_impls([value], kind, option, allowed)
    if len(given) != 1:
        raise SpecError(f"{option} takes one implementation, not {len(given)} "
                        f"({', '.join(given)}): run one command for each")
    return given[0]


def named_impls(values: list[str], kind: str, option: str, allowed: list[str]) -> list[str]:
    """A list option's implementations, the user's among them: `NAME=package.module:Object`
    items registered and named NAME, every name one of `allowed` or the user's, and the
    user's code found (its adapters file imported, its targets imported). SpecError, with
    the option's name, for anything that cannot run."""
    if not values:
        return []
    try:
        given = user_names(values, kind, option)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    given = choices(given, [*allowed, *(n for n in names(kind) if n not in allowed)], option)
    for name in given:
        if (is_yours(name) and name not in allowed) or target(kind, name) is not None:
            try:
                check(kind, name)
            except (UserCodeError, AdaptersError) as exc:
                raise SpecError(f"{option} {name}: {exc}") from None
    return given
