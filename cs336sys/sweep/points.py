"""Sweep expansion: list-valued options become the cartesian product of their values; each
point has a key, and a point that cannot be built is a SpecError."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import numbers
import re
from collections.abc import Callable, Iterable
from typing import Any

from cs336sys.measure.device import resolve_device


class SpecError(ValueError):
    """A sweep option that cannot be turned into points; the message names the option the
    way the command line spells it (`--size: unknown size 'huge'; ...`)."""


# ModelConfig's fields as the command line spells them: its ValueErrors name the fields
# (the Python API's words), a refusal on the command line names the options typed.
SHAPE_OPTIONS = {"max_context_length": "the model's maximum context length",
                 "context_length": "--seq", "d_model": "--d-model", "d_ff": "--d-ff",
                 "num_layers": "--num-layers", "num_heads": "--num-heads",
                 "vocab_size": "--vocab-size"}


def shape_error(exc: ValueError) -> SpecError:
    """A ModelConfig's ValueError as a refusal naming options (`context_length=70000 is
    above ...` -> `--seq 70000 is above ...`)."""
    message = str(exc)
    for field, option in SHAPE_OPTIONS.items():
        message = re.sub(rf"\b{field}=(\S+?)(?=[\s.,;]|$)", rf"{option} \1", message)
        message = re.sub(rf"\b{field}\b", option, message)
    return SpecError(message)


def split_list(values: Iterable[str] | None) -> list[str]:
    """`--size small,medium --size large` -> ['small', 'medium', 'large'] (order kept, no dups)."""
    out: list[str] = []
    for value in values or []:
        for item in str(value).split(","):
            item = item.strip()
            if item and item not in out:
                out.append(item)
    return out


def expand(axes: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of the axes' values, the first axis varying slowest."""
    names = list(axes)
    return [
        dict(zip(names, combo, strict=True))
        for combo in itertools.product(*(axes[n] for n in names))
    ]


# A Spec field that says how a run is made, not which point it measures (whether this round
# checks the user's code): `dataclasses.field(default=..., metadata=NOT_A_SETTING)`. It is
# left out of the point's settings (`settings_of`) and of its view's columns (settings_keys).
NOT_A_SETTING = {"setting": False}


def is_setting(field: dataclasses.Field) -> bool:
    """Whether a Spec's field is one of its point's settings (not NOT_A_SETTING)."""
    return field.metadata.get("setting", True)


def settings_of(spec: Any) -> dict[str, Any]:
    """A Spec dataclass's settings: every field but those NOT_A_SETTING, by name."""
    return {f.name: getattr(spec, f.name) for f in dataclasses.fields(spec) if is_setting(f)}


def point_key(experiment: str, settings: dict[str, Any]) -> str:
    """Identity of a sweep point: the same experiment with the same settings (`--resume`)."""
    text = experiment + "\n" + json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def told_apart(names: list[str], settings: list[dict[str, Any]]) -> list[str]:
    """Each point's name in words (`names`), with the settings that tell it from the
    points whose names read the same after it, as key=value: a profile of naive and of
    sdpa attention was two tables, report sections and nsys files named alike."""
    out = list(names)
    for name in set(names):
        same = [i for i, n in enumerate(names) if n == name]
        if len(same) < 2:
            continue
        keys = sorted({k for i in same for k in settings[i]})
        differ = [k for k in keys if len({json.dumps(settings[i].get(k), sort_keys=True,
                                                     default=str) for i in same}) > 1]
        for i in same:
            words = [f"{k}={settings[i][k]}" for k in differ if settings[i].get(k) is not None]
            out[i] = " ".join([name, *words])
    return out


def distinct(experiment: str, specs: list) -> list:
    """`specs` in order, each point once: two spellings of one value (`--seq 64,064`,
    `--bucket-mb 1,1.0`) make one point, measured once, not two rows that read the same."""
    first: dict[str, Any] = {}
    for spec in specs:
        first.setdefault(point_key(experiment, spec.settings()), spec)
    return list(first.values())


# Upper bounds where a typo would run for days (docs/bad-input.md).
MAX_STEPS = 10**6
# Any count or size: torch takes sizes as 64-bit integers and SQLite stores 64-bit integers,
# so a larger one would fail deep inside a point (or the store) instead of at the option.
MAX_SIZE = 2**62


def one_value_options(specs: Callable[..., Any]) -> Callable[..., Any]:
    """A `specs` function that refuses a list for an option that takes one value (SpecError,
    as the command line refuses a second value): `device=["cpu"]`, `size=["8b", "xl"]` for
    plan's one size ended in an AttributeError deep inside. An option takes a list where its
    annotation says so (Iterable, Sequence or list)."""
    import functools
    import inspect

    one = {name for name, p in inspect.signature(specs).parameters.items()
           if p.kind == p.KEYWORD_ONLY
           and not any(word in str(p.annotation) for word in ("Iterable", "Sequence", "list"))}

    @functools.wraps(specs)
    def checked(*args: Any, **options: Any) -> Any:
        for name, value in options.items():
            if name in one and isinstance(value, (list, tuple, set, frozenset)):
                raise SpecError(f"--{name.replace('_', '-')} takes one value, got {value!r}")
        return specs(*args, **options)

    return checked


def one_integer(n: Any, option: str) -> int:
    """A count or size option's one value, from Python as from the command line: an integer,
    not a list (`iters=[2]`), a string or a bool (SpecError naming the option)."""
    if isinstance(n, bool) or not isinstance(n, numbers.Integral):
        raise SpecError(f"{option} takes one integer, got {n!r}")
    return int(n)


def check_size(n: int, option: str) -> None:
    """Refuse a count or size above MAX_SIZE (SpecError naming the option)."""
    if one_integer(n, option) > MAX_SIZE:
        raise SpecError(f"{option}: {n} is too large (at most 2^62)")


def positive_sizes(**given: int | None) -> dict[str, int | None]:
    """Options of one count or size each (d_model=..., heads=...): None, or positive and at
    most MAX_SIZE; a SpecError names the option (--d-model). Returned as given."""
    for name, n in given.items():
        option = "--" + name.replace("_", "-")
        if n is None:
            continue
        if one_integer(n, option) <= 0:
            raise SpecError(f"{option} must be positive, got {n}")
        check_size(n, option)
    return given


MAX_SEED = 2**62  # seeds are offset per rank and for the data: stay inside torch's 64 bits


def _given(values: Iterable[Any] | Any) -> list[Any]:
    """A list option's values as given from Python: one value (a string included) is a
    list of one, never the characters of "128"."""
    if isinstance(values, str | bytes) or not isinstance(values, Iterable):
        return [values]
    return list(values)


def listed(values: Iterable[Any] | Any, option: str, default: Iterable[Any] = ()) -> list[Any]:
    """A list option's items; `default` when it was not given. Given but empty (`--size ""`)
    is a SpecError: an empty value must not quietly mean the default. From Python, one value
    is a list of one and a string is split as the command line splits it: `seq="128,256"`
    and `seq=128` are `seq=[128, 256]` and `seq=[128]`."""
    if values is None:
        return list(default)
    values = _given(values)
    # str.strip: any Unicode space (a non-breaking one pasted from a web page, say) is blank
    if not values or any(not str(v).replace(",", " ").strip() for v in values):
        raise SpecError(f"{option}: empty value; give at least one")
    return split_list(values)


def checkpoint_list(values: Iterable[Any] | None, option: str = "--checkpoint") -> list[str]:
    """`--checkpoint none,groups:14,14,6,sqrt` -> ['none', 'groups:14,14,6', 'sqrt']: the
    block counts after `groups:` belong to it, not to the list. From Python, one string is
    a list of one (`checkpoint="every:1"`)."""
    values = ["none"] if values is None else _given(values)
    listed(values, option)  # refuses an empty value
    out: list[str] = []
    tokens = [t.strip() for v in values for t in str(v).split(",") if t.strip()]
    for token in tokens:
        if token.isdigit() and out and out[-1].startswith("groups:"):
            out[-1] += "," + token
        else:
            out.append(token)
    return list(dict.fromkeys(out))


def closest(value: str, allowed: Iterable[str]) -> str | None:
    """The allowed name closest to `value` (in any case; `trition` -> `triton`), or None when
    none is close: for a "did you mean"."""
    import difflib

    by_lower = {str(a).lower(): str(a) for a in allowed}
    close = difflib.get_close_matches(str(value).lower(), list(by_lower), n=1, cutoff=0.6)
    return by_lower[close[0]] if close else None


def unknown(option: str, value: Any, allowed: Iterable[Any], what: str = "value",
            rule: str | None = None) -> SpecError:
    """The error for `value` not among `allowed`: the closest one, when one is close
    (`--impl trition`: did you mean 'triton'?), then all of them, or the `rule` that makes
    them where they are too many to list."""
    allowed = [str(a) for a in allowed]
    near = closest(value, allowed)
    hint = f" (did you mean {near!r}?)" if near else ""
    choose = f"give {rule}" if rule else f"choose from {', '.join(allowed)}"
    return SpecError(f"{option}: unknown {what} {value!r}{hint}; {choose}")


def choices(
    values: Iterable[str] | None, allowed: Iterable[str], option: str, default: Iterable[str] = (),
    rule: str | None = None,
) -> list[str]:
    """Split a list option and check every value is one of `allowed` (SpecError if not,
    naming them all or the `rule` that makes them)."""
    allowed = list(allowed)
    out = listed(values, option, default)
    for v in out:
        if v not in allowed:
            raise unknown(option, v, allowed, rule=rule)
    return out


def positive_ints(
    values: Iterable[Any] | None, option: str, default: Iterable[int] = ()
) -> list[int]:
    """Split a list option of positive integers (`--seq 128,256`)."""
    items = listed(values, option, default)
    if values is None:
        return items
    out = []
    for v in items:
        try:
            n = int(v)
        except ValueError:
            raise SpecError(f"{option}: {v!r} is not an integer") from None
        if n <= 0:
            raise SpecError(f"{option} must be positive, got {n}")
        check_size(n, option)
        out.append(n)
    return out


def warmups(values: Iterable[Any] | int | None, default: int) -> list[int]:
    """--warmup as a list of step counts, each zero or more (`--warmup 0,1,2,5`, the
    warm-up study); one int is a list of one; `default` when not given."""
    if values is None or isinstance(values, int):
        return [default if values is None else values]
    out = []
    for v in listed(values, "--warmup"):
        try:
            out.append(int(v))
        except ValueError:
            raise SpecError(f"--warmup: {v!r} is not an integer") from None
    return list(dict.fromkeys(out))


def counts(warmup: int, steps: int, steps_option: str = "--iters") -> None:
    """Refuse a non-positive number of timed steps, a negative warm-up, and either above
    MAX_STEPS."""
    steps, warmup = one_integer(steps, steps_option), one_integer(warmup, "--warmup")
    if steps <= 0:
        raise SpecError(f"{steps_option} must be positive, got {steps}")
    if warmup < 0:
        raise SpecError(f"--warmup must be zero or more, got {warmup}")
    for option, n in ((steps_option, steps), ("--warmup", warmup)):
        if n > MAX_STEPS:
            raise SpecError(f"{option} must be at most {MAX_STEPS:,}, got {n:,}")


# The longest a point may be asked to keep sampling (--min-time): one hour.
MAX_MIN_TIME = 3600.0


def min_time(value: float | None, on_cuda: bool) -> float:
    """--min-time in seconds: what was given, else 1 s on CUDA (measure/sampling.py) and
    0 on a CPU (where a point's samples are its --iters); refused outside [0, MAX_MIN_TIME]."""
    if value is None:
        return 1.0 if on_cuda else 0.0
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpecError(f"--min-time takes one number of seconds, got {value!r}")
    if not 0 <= value <= MAX_MIN_TIME:  # NaN too
        raise SpecError(f"--min-time must be from 0 to {MAX_MIN_TIME:g} seconds, got {value}")
    return float(value)


def rounds(value: int | None, on_cuda: bool, iters: int) -> int:
    """--rounds: what was given, else 3 on CUDA (where clocks drift) and 1 on a CPU; from
    1 to --iters, since each round takes its share of the timed calls."""
    value = (3 if on_cuda else 1) if value is None else one_integer(value, "--rounds")
    if not 1 <= value <= iters:
        raise SpecError(f"--rounds must be from 1 to --iters ({iters}), got {value}")
    return value


def check_seed(seed: int) -> None:
    """Seeds are torch's 64-bit integers, offset per rank and for the data."""
    if not 0 <= one_integer(seed, "--seed") <= MAX_SEED:
        raise SpecError(f"--seed must be from 0 to 2**62 ({MAX_SEED}), got {seed}")


def device_choice(choice: str) -> str:
    """The device for `--device` (auto, cpu, cuda, cuda:N), or SpecError."""
    try:
        return resolve_device(choice)
    except ValueError as exc:
        raise SpecError(str(exc)) from None


def check_triton(on_cuda: bool, option: str) -> None:
    """Refuse the Triton kernels where they cannot run, before anything is written."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        raise SpecError(f"{option} needs the triton package (pip install triton)")
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if not on_cuda and not interpreting:
        raise SpecError(f"{option} needs CUDA, or TRITON_INTERPRET=1 to run the kernels in "
                        "Triton's interpreter on CPU (slow; rows are marked interpreted)")
    if on_cuda and interpreting:
        raise SpecError("TRITON_INTERPRET=1 runs Triton kernels on CPU tensors only: unset it, "
                        "or pass --device cpu")
