"""The user's data-parallel code in a `cs336sys ddp` point: their DDP or FSDP wrapper and
their sharded optimizer, from the adapters file (cs336sys.yours.adapters.ENTRIES) or a
one-off target, put together as ddp_setup.build puts ours.

    replicas  yours             get_ddp(module); ddp_on_after_backward(model, optimizer)
              yours-individual  get_ddp_individual_parameters(module); its on_after_backward
              yours-bucketed    get_ddp_bucketed(module, bucket_size_mb); its on_after_backward,
                                and ddp_bucketed_on_train_batch_start(model, optimizer)
              one-off NAME      Class(module) with finish_gradient_synchronization()
    sharded   yours-fsdp        get_fsdp(module, compute_dtype); fsdp_on_after_backward;
                                fsdp_gather_full_params(model) for the check
              one-off NAME      Class(module, compute_dtype=...) with
                                finish_gradient_synchronization() and full_state_dict()
    optimizer yours             get_sharded_optimizer(params, AdamW, lr=..., weight_decay=...)
              one-off NAME      Class(params, AdamW, lr=..., weight_decay=...)

A one-off `--impl NAME=package.module:Class` is sharded (an FSDP) when NAME has `fsdp` in it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cs336sys import yours
from cs336sys.experiments.checks import both
from cs336sys.experiments.training_check import few
from cs336sys.measure.check import Verdict
from cs336sys.sweep.points import SpecError, unknown
from cs336sys.yours.implementations import call_adapter, load_target, named_impls


def kind_of(impl: str) -> str | None:
    """'ddp' or 'fsdp' for the user's implementation `impl`, None for ours."""
    if not yours.is_yours(impl):
        return None
    if impl in yours.entries("fsdp") or (yours.target("fsdp", impl) is not None):
        return "fsdp"
    return "ddp"


def course_tests(impl: str, sharding: str | None) -> tuple[str, ...]:
    """The course's tests that judge the user's code in a point: test_ddp.py their DDP
    (2025's individual-parameters one test_ddp_individual_parameters.py), test_fsdp.py
    their FSDP, test_sharded_optimizer.py their sharded optimizer."""
    kind = kind_of(impl)
    ddp = ("test_ddp_individual_parameters.py" if impl == "yours-individual" else "test_ddp.py",)
    tests = {"ddp": ddp, "fsdp": ("test_fsdp.py",)}.get(kind or "", ())
    return tests + (("test_sharded_optimizer.py",) if sharding and yours.is_yours(sharding) else ())


def one_off_kind(name: str) -> str:
    """The kind a one-off `--impl NAME=...` is registered as."""
    return "fsdp" if "fsdp" in name else "ddp"


def built(got: Any, entry: Any, wanted: str) -> Any:
    """`got`, what `entry`'s adapters getter returned, if it is an object that trains: a
    class (the getter returned it uncalled), None (no return) or anything else is a
    TypeError saying which, where torch's own errors read `parameters() missing 1 required
    positional argument: 'self'` or `'NoneType' object has no attribute 'parameters'`."""
    if isinstance(got, type):
        what = f"the class {got.__name__}, not an object made from it"
    elif got is None:
        what = "None: does it return what it builds?"
    elif callable(getattr(got, "parameters", None)) or callable(getattr(got, "step", None)):
        return got
    else:
        what = f"a {type(got).__name__}"
    raise TypeError(f"{entry.getter} gave {what}; expected {wanted}")


def replica(impl: str, model: Any, bucket_mb: float | None) -> tuple[Any, Callable, Callable, Callable | None]:
    """(wrapper, finish(optimizer), start(optimizer) or None) for the user's replica `impl`."""
    where = yours.target("ddp", impl)
    if where is not None:
        wrapper = load_target(where)(model)
        return wrapper, lambda opt: wrapper.finish_gradient_synchronization(), None
    entry = yours.entries("ddp")[impl]
    args = (model, bucket_mb) if impl == "yours-bucketed" else (model,)
    wrapper = built(call_adapter(entry, 0, *args), entry, "the module wrapped in your DDP")

    def finish(opt: Any) -> None:
        call_adapter(entry, 1, wrapper, opt)

    start = None
    if len(entry.functions) > 2:
        def start(opt: Any) -> None:
            call_adapter(entry, 2, wrapper, opt)

    return wrapper, finish, start


def sharded(impl: str, model: Any, compute_dtype: Any) -> tuple[Any, Callable, Callable]:
    """(wrapper, finish(optimizer), full_params()) for the user's FSDP `impl`."""
    where = yours.target("fsdp", impl)
    if where is not None:
        wrapper = load_target(where)(model, compute_dtype=compute_dtype)
        return (wrapper, lambda opt: wrapper.finish_gradient_synchronization(),
                wrapper.full_state_dict)
    entry = yours.entries("fsdp")[impl]
    wrapper = built(call_adapter(entry, 0, model, compute_dtype), entry,
                    "the module wrapped in your FSDP")
    return (wrapper, lambda opt: call_adapter(entry, 1, wrapper, opt),
            lambda: call_adapter(entry, 2, wrapper))


def optimizer(name: str, params: list, optimizer_cls: type, **kwargs: Any) -> Any:
    """The user's sharded optimizer `name` over `params`."""
    where = yours.target("optimizer", name)
    if where is not None:
        return load_target(where)(params, optimizer_cls, **kwargs)
    entry = yours.entries("optimizer")["yours"]
    return built(call_adapter(entry, 0, params, optimizer_cls, **kwargs), entry,
                 "your sharded optimizer")


def user_impls(given: list[str], ours: list[str], option: str = "--impl") -> list[str]:
    """The --impl list with the user's implementations: a one-off `NAME=package.module:Class`
    is an FSDP when NAME has `fsdp` in it, else a DDP wrapper; `ours` are the built-in
    implementations' names; `option` is the one a refusal names."""
    try:
        yours.one_target_each(given, option)
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    known = [*ours, *(n for kind in ("ddp", "fsdp") for n in yours.names(kind) if n not in ours)]
    out: list[str] = []
    for value in given:
        name, sep, _ = value.partition("=")
        if not sep and name.strip() not in known:  # every name, an FSDP's too, and the form
            raise unknown(option, name.strip(), known,
                          rule=f"one of {', '.join(known)}, or NAME=package.module:Class")
        kind = one_off_kind(name) if sep else "fsdp" if name in yours.names("fsdp") else "ddp"
        out += [n for n in named_impls([value], kind, option, ours) if n not in out]
    return out


def uses_user_code(spec: Any) -> bool:
    """The point runs the user's wrapper or sharded optimizer (checked against one process)."""
    return yours.is_yours(spec.impl) or yours.is_yours(spec.shard_optimizer)


def not_implemented(spec: Any) -> str | None:
    """Why the point cannot run yet: an adapters function it needs still raises
    NotImplementedError (read from the file, the same on every rank); else None."""
    adapters = yours.active()
    if adapters is None:
        return None
    wanted = []
    if yours.target("ddp", spec.impl) is None and yours.target("fsdp", spec.impl) is None:
        wanted += [e for e in (yours.entries("ddp").get(spec.impl), yours.entries("fsdp").get(spec.impl)) if e]
    if yours.is_yours(spec.shard_optimizer) and yours.target("optimizer", spec.shard_optimizer) is None:
        wanted.append(yours.entries("optimizer")["yours"])
    for entry in wanted:
        if adapters.unfinished(entry):
            return f"{entry.functions[0]} is not implemented in {adapters.shown}"
    return None


def bucket_count(module: Any) -> int | None:
    """How many gradient buckets a bucketed DDP holds: ours keeps them in a list `buckets`;
    a user's may keep a count there instead, or anything else."""
    found = getattr(module, "buckets", None)
    if isinstance(found, bool):
        return None
    if isinstance(found, int):
        return found or None
    try:
        return len(found) or None
    except TypeError:
        return None


# what the course's DDP test, run on the toy models, saw of a DDP that waits for nothing
UNWAITED = ("its finish_gradient_synchronization returned while its all-reduces were still "
            "running (the gradients changed after it returned: a handle not waited for?)")


def with_causes(checked: Any, changed: str | None, shard_optimizer: str, setup: Any) -> Any:
    """A check of the user's code; a failed one with the likely causes found after it: what
    their FSDP's gather changed (`changed`, fsdp_course_check.gather_changes). An all-reduce not
    waited for, which explains every other difference, is said first (its gradients read as
    never broadcast weights). The parameters their sharded optimizer's zero_grad() leaves a
    gradient on (`zero_grad_leaves`) are a note, passed or not: the course's test passes such
    an optimizer, and the step cleared the model's gradients after it (Step.clear_grads)."""
    if checked is None:
        return checked
    if not checked.passed and UNWAITED in (checked.why or ""):
        rest = checked.why.removeprefix("wrong: ").replace(f"; {UNWAITED}", "")
        checked = Verdict(False, checked.metrics, f"wrong: {UNWAITED}; {rest}")
    if not checked.passed and changed:
        checked = both(checked, Verdict(False, {}, f"wrong: {changed}"))
    left = zero_grad_leaves(setup.optimizer, setup.module) \
        if yours.is_yours(shard_optimizer) else None
    if left:
        detail = "; ".join(filter(None, (checked.metrics.get("check_detail"), f"note: {left}")))
        checked = Verdict(checked.passed, {**checked.metrics, "check_detail": detail}, checked.why)
    return checked


def zero_grad_leaves(optimizer: Any, module: Any) -> str | None:
    """The parameters the user's sharded optimizer's zero_grad() leaves a gradient on, each
    given a gradient of ones first, in words (None: it clears them all). Without DDP, as
    the course's test_sharded_optimizer.py trains, a gradient left on a parameter another
    rank steps does nothing; under DDP the next backward adds to it and the all-reduce
    spreads it (a zero_grad of the rank's own shard alone read `worst 0.047` and no cause)."""
    import torch

    held = [(n, p) for n, p in module.named_parameters() if p.requires_grad]
    with torch.no_grad():
        for _, p in held:
            p.grad = torch.ones_like(p)
    try:
        optimizer.zero_grad()
    except Exception:  # its own fault, said by the check already
        return None
    left = [n for n, p in held if p.grad is not None and bool(p.grad.any())]
    if not left:
        return None
    return (f"your sharded optimizer's zero_grad() leaves the gradients of {len(left)} of "
            f"{len(held)} parameters ({few(left, 2)}), those another rank steps, it seems: "
            f"in a DDP loop that clears gradients with it alone, the next backward adds to "
            f"them and the all-reduce spreads them (this step cleared the model's gradients "
            f"too; the course's test_sharded_optimizer.py trains without DDP and passes it)")
