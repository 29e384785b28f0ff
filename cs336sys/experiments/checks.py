"""The checks that come before the user's code is timed, beside ours (docs/yours.md).

- A user's model (`--model`): its loss is finite, and where its architecture is ours (its
  state_dict loads into cs336sys's TransformerLM as it is), ours computes the same loss
  with the same weights. A user's attention kernel in our model (`--attention yours-...`):
  the same loss as naive attention with the same weights. Checked on a copy of at most two
  layers of the same shape, before the model that is timed is built, so that a large model
  never exists twice.
- A user's AdamW (`--optimizer yours=...`): OPTIMIZER_STEPS steps on one float64 tensor
  with the same gradients as torch.optim.AdamW built with the user's own hyperparameters; the
  parameters must move alike within OPTIMIZER_RTOL of the largest move. AdamW variants that
  place eps or the weight decay otherwise (the course's algorithm among them) differ by far
  less; a missing bias correction, sign or weight decay by far more.
- A user's DDP, FSDP or sharded optimizer: experiments/training_check.py.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cs336sys import yours
from cs336sys.attention import registry
from cs336sys.attention.diagnosis import (
    CHECK_TOLERANCE,
    NOT_JUDGED,
    SAVES_L,
    diagnose,
    untested_dims,
)
from cs336sys.experiments.adamw_mistakes import named_mistake
from cs336sys.experiments.training_check import few
from cs336sys.experiments.training_step import (
    BETAS,
    EPS,
    LR,
    WEIGHT_DECAY,
    adamw_kwargs,
    cross_entropy,
    make_batch,
    make_model,
    make_optimizer,
)
from cs336sys.measure.check import Verdict
from cs336sys.sweep.declaration import metric_table
from cs336sys.sweep.result import Result, Unfinished, first_line, is_oom
from cs336sys.yours.implementations import sources

# fp32 losses of the same weights computed by two implementations of the same math: the sums
# run in another order, nothing more (measured: |Δ| about 1e-6 on a loss of 5.5).
LOSS_RTOL = 1e-4
# ... and their logits, elementwise against the largest: the course's attention tests allow
# 1e-2, which a kernel's TF32 products (about 1e-3) stay well inside.
LOGITS_TOL = 1e-2
CHECK_LAYERS = 2  # the copy that is checked: at most this many layers
CHECK_TOKENS = 128  # ... and this many tokens per sequence


def model_check(config: Any, device: str, seed: int, batch: int) -> Verdict:
    """The user's code in a model step against cs336sys's, see the module docstring: their
    model (config.model), or their attention kernel in ours (config.attention), whose loss
    must be naive attention's with the same weights."""
    import torch

    small = dataclasses.replace(
        config, num_layers=min(config.num_layers, CHECK_LAYERS),
        context_length=min(config.context_length, CHECK_TOKENS), checkpoint="none",
    )
    x, y = make_batch(seed, min(batch, 2), small.context_length, small.vocab_size)
    x, y = x.to(device), y.to(device)
    # the check's own copy, in eval mode: a dropout of theirs would draw other masks than
    # ours (none), and the timed model still trains
    theirs = make_model(small, device, seed)
    theirs.eval()  # not its return value: a model's own train() may return nothing
    if config.model is None:  # their attention in our model: naive attention's loss
        ours = make_model(dataclasses.replace(small, attention="naive"), device, seed)
        mine, reference = theirs(x), ours(x)
        verdict = _same_output(mine.detach(), reference.detach(), y,
                               f"{config.attention} in cs336sys's model, naive attention in its "
                               "place")
        computes = None if verdict.passed else _attention_computes(config.attention, device)
        if computes is not None:
            verdict = dataclasses.replace(verdict, why=f"wrong: {config.attention} computes "
                                          f"{computes}; {verdict.why.removeprefix('wrong: ')}")
        if verdict.passed:
            verdict = _same_gradients(theirs, mine, ours, reference, y, config.attention, verdict)
        return verdict
    with torch.no_grad():
        logits = theirs(x)
        loss = float(cross_entropy(logits, y, vocab=small.vocab_size))
    metrics: dict[str, Any] = {"check_loss": loss}
    if not math.isfinite(loss):
        return Verdict(False, {**metrics, "check": "fail"},
                       f"wrong: the loss of {config.model} is {loss}")
    ours = make_model(dataclasses.replace(small, model=None, attention="naive"), device, seed)
    why = _loaded(ours, theirs)
    if why is not None:
        detail = (f"architecture differs from cs336sys's TransformerLM ({why[:200]}): only "
                  f"a finite loss is checked")
        return Verdict(True, {**metrics, "check": "pass", "check_detail": detail})
    with torch.no_grad():
        reference = ours(x)
    return _same_output(logits, reference, y, "the same weights in cs336sys's TransformerLM")


# Each parameter's gradient through the user's kernel against naive attention's, relative
# L2: a kernel's TF32 products stay near 1e-3; a wrong D or dS is off by about 1.
GRADS_RTOL = 1e-2


def _same_gradients(theirs: Any, mine: Any, ours: Any, reference: Any, y: Any, name: str,
                    verdict: Verdict) -> Verdict:
    """`verdict` (the same loss) with the gradients of the user's kernel in our model against
    naive attention's: a backward that is wrong while its forward is right (a wrong D) kept
    the loss, and the training step was timed ok. A backward that raises is left to the
    timed step, which runs it (a forward-only point has none)."""
    try:
        cross_entropy(mine, y).backward()
    except Exception:  # its own error, where a point runs the backward
        return verdict
    cross_entropy(reference, y).backward()
    ref = dict(ours.named_parameters())
    off = {}
    for n, p in theirs.named_parameters():
        want = ref[n].grad
        if p.grad is None or want is None:
            continue
        scale = float(want.norm()) or 1.0
        off[n] = float((p.grad - want).norm()) / scale
    bad = [n for n, e in off.items() if not e <= GRADS_RTOL]  # NaN too
    if not bad:
        return verdict
    worst = max(bad, key=lambda n: off[n] if off[n] == off[n] else float("inf"))
    why = (f"wrong: {name}'s backward: the gradients of {len(bad)} of {len(off)} parameters "
           f"differ from naive attention's with the same weights, the loss the same (worst "
           f"{worst}: relative error {off[worst]:.2g}, allowed {GRADS_RTOL:g}; {few(bad)})")
    return Verdict(False, {**verdict.metrics, "check": "fail",
                           "check_detail": why.removeprefix("wrong: ")}, why)


def _attention_computes(name: str, device: str) -> str | None:
    """What the user's kernel `name` computes in place of causal attention, in words, on a
    small head (attention/diagnosis.py's alternatives: the mask missing, no scale, ...):
    where the model's loss differs, its cause. None where it matches none, or raises."""
    import torch

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=g).to(device) for _ in range(3))  # (B, H, T, D)
    try:
        with torch.no_grad():
            out = registry.get(name)(q, k, v, is_causal=True)
    except Exception:  # its error is the point's, when the timed model runs it
        return None
    found = diagnose({"O": out}, q, k, v, None, True, CHECK_TOLERANCE["fp32"])
    if found is None:
        return None
    alt, _ = found
    allowed = (" (the handout lets the PyTorch FlashAttention ignore it in its tests; a "
               "language model needs the mask)" if not alt.causal else "")
    return alt.name + allowed


def _loaded(ours: Any, theirs: Any) -> str | None:
    """Load the user's weights into ours; None when every parameter found its place, else
    why not, in one line. Buffers are no weights: a RoPE table registered persistent (the
    default of register_buffer) is in their state_dict and not ours, and cost the model its
    loss comparison."""
    state = theirs.state_dict()
    ours_keys = set(ours.state_dict())
    # every name of a buffer, as state_dict() has it: one RoPE table shared by every block
    # is under each block's name there, and named_buffers() gives it once
    buffers = {name for name, _ in theirs.named_buffers(remove_duplicate=False)}
    ours_buffers = {name for name, _ in ours.named_buffers(remove_duplicate=False)}
    try:
        found = ours.load_state_dict(
            {k: v for k, v in state.items() if k in ours_keys or k not in buffers}, strict=False)
    except (RuntimeError, ValueError) as exc:  # a shape that differs: torch says which
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        return (lines[1] if len(lines) > 1 else lines[0]) if lines else type(exc).__name__
    missing = [k for k in found.missing_keys if k not in ours_buffers]
    if missing or found.unexpected_keys:
        return "; ".join(f"{what}: {few(keys)}" for what, keys in
                         (("theirs lacks", missing), ("ours lacks", found.unexpected_keys)) if keys)
    return None


# What before_timing's checks store, declared once for every experiment that runs them.
CHECK_METRICS = metric_table("""
    check               -  the user's code (model, attention kernel, AdamW, DDP or FSDP): pass,
                             or fail (the point is `wrong`; experiments/checks.py)
    check_detail        -  what the check compared (the same loss as cs336sys's model, or naive
                             attention, with the same weights; or a finite loss only)
    check_loss          -  the user's loss in the check (two layers at most)
    check_loss_ours     -  the reference's loss with the same weights
    check_optimizer_err -  the user's AdamW against torch's: its move's largest difference over
                             the largest move, 3 steps
    code                -  the user's code measured: its files and their sha256 (JSON)
""")

OPTIMIZER_STEPS = 3
OPTIMIZER_RTOL = 1e-3


def optimizer_check(name: str) -> Verdict:
    """The user's AdamW `name` against torch.optim.AdamW (module docstring)."""
    import torch

    g = torch.Generator().manual_seed(0)
    start = torch.randn(64, 32, generator=g, dtype=torch.float64)
    # gradients of magnitude 0.1 to 1.1: where |g| is near eps, AdamW variants that place eps
    # otherwise (the course's, torch's) differ in the step, and only there
    grads = [torch.randn(64, 32, generator=g, dtype=torch.float64).sign()
             * (0.1 + torch.rand(64, 32, generator=g, dtype=torch.float64))
             for _ in range(OPTIMIZER_STEPS)]
    theirs = torch.nn.Parameter(start.clone())
    optimizer = make_optimizer(name, [theirs])
    hyper, unread = their_hyperparameters(optimizer)
    reference = torch.nn.Parameter(start.clone())
    torch_adamw = torch.optim.AdamW([reference], **hyper)
    for grad in grads:
        for p, opt in ((theirs, optimizer), (reference, torch_adamw)):
            p.grad = grad.clone()
            opt.step()
    moved, expected = theirs.detach() - start, reference.detach() - start
    err = float((moved - expected).abs().max() / expected.abs().max())
    passed = math.isfinite(err) and err <= OPTIMIZER_RTOL
    metrics = {"check_optimizer_err": err, "check": "pass" if passed else "fail",
               "check_detail": f"its AdamW against torch.optim.AdamW after {OPTIMIZER_STEPS} "
                               f"steps: {err:.2g} of the largest move apart (allowed "
                               f"{OPTIMIZER_RTOL:g})"}
    if passed:
        return Verdict(True, metrics)
    said = ", ".join(f"{k} {v}" for k, v in hyper.items())
    cause = named_mistake(start, grads, moved, hyper, OPTIMIZER_RTOL) if math.isfinite(err) else None
    return Verdict(False, metrics, f"wrong: {name} moves the parameters {err:.3g} of the largest "
                   f"move away from torch.optim.AdamW's after {OPTIMIZER_STEPS} steps with its "
                   f"hyperparameters ({said}; at most {OPTIMIZER_RTOL:g})"
                   + (f"; its {' and '.join(unread)} could not be read from its param_groups "
                      f"or constructor, so torch's defaults stood in" if unread else "")
                   + (f"; {cause}" if cause else ""))


# Where an AdamW keeps its hyperparameters, as students name them: torch's `betas` tuple or
# two numbers (assignment 1 names them beta1 and beta2).
_BETAS = (("betas",), ("beta1", "beta2"), ("b1", "b2"), ("beta_1", "beta_2"))
_EPS = (("eps",), ("epsilon",))
# Where none is found: torch's defaults at cs336sys's lr and weight decay.
_STAND_INS = {"lr": LR, "betas": BETAS, "eps": EPS, "weight_decay": WEIGHT_DECAY}


def their_hyperparameters(optimizer: Any) -> tuple[dict[str, Any], list[str]]:
    """The user's AdamW's lr, betas, eps and weight decay as torch.optim.AdamW takes them,
    read from its first param group, else from what make_optimizer built it with, else from
    its constructor's defaults; and the names of those found in none (torch's default stands
    in)."""
    import inspect

    group = optimizer.param_groups[0]
    # make_optimizer passes lr and weight_decay (betas, eps where taken): a group that keeps
    # them under other names (`alpha`, `lam`) still steps with those, not the defaults
    built = adamw_kwargs(type(optimizer))
    try:
        defaults = {k: p.default for k, p in inspect.signature(type(optimizer)).parameters.items()
                    if p.default is not inspect.Parameter.empty}
    except (TypeError, ValueError):
        defaults = {}

    def read(*spellings: tuple[str, ...]) -> Any:
        """The first spelling the group (else the build, the constructor) has: one value,
        or a tuple."""
        for where in (group, built, defaults):
            for names in spellings:
                if all(n in where for n in names):
                    values = tuple(where[n] for n in names)
                    return values if len(values) > 1 else values[0]
        return None

    found = {"lr": read(("lr",)), "betas": read(*_BETAS), "eps": read(*_EPS),
             "weight_decay": read(("weight_decay",))}
    unread = [k for k, v in found.items() if v is None]
    return {k: _STAND_INS[k] if v is None else v for k, v in found.items()}, unread


def before_timing(config: Any, optimizer: str | None, device: str, seed: int,
                  batch: int, first_round: bool = True) -> Verdict | None:
    """Every check of the user's code in a training step, run before the model that is
    measured exists: their model or attention kernel (model_check, on `device`), their AdamW
    (optimizer_check, on the CPU); None where the step runs only cs336sys's code. A later
    round of a point (not `first_round`) times what its first checked: a passed verdict,
    under which `judged` still requires finite losses."""
    model = config.model is not None or yours.is_yours(config.attention)
    if not first_round:
        return Verdict(True, {}) if model or yours.is_yours(optimizer) else None
    checked = _judged_where_tested(config, device, seed, batch) if model else None
    if yours.is_yours(optimizer):
        checked = both(checked, optimizer_check(optimizer))
    return checked


def _judged_where_tested(config: Any, device: str, seed: int, batch: int) -> Verdict:
    """model_check, but the user's FlashAttention at a seq or head dim the handout never
    tests it with (attention/diagnosis.py: "you don't need to worry about out-of-bounds
    accesses") is not judged there: raising or wrong, the point is skipped, as `attention`
    skips it (a kernel that asserts whole tiles was an error in `model`, `memory` and
    `profile model`). The kernel runs alone first, forward and backward on one sequence of
    one head at the point's own seq and head dim: the check's model runs at most
    CHECK_TOKENS, and its naive reference at the whole seq held the T x T scores the kernel
    never does (a point that fits stored as out of memory)."""
    from types import SimpleNamespace

    dims = untested_dims(SimpleNamespace(seq=config.context_length, d_head=config.d_head)) \
        if config.attention in SAVES_L else ""
    if not dims:
        return model_check(config, device, seed, batch)
    try:
        _kernel_runs(config, device, seed)
        verdict = model_check(config, device, seed, batch)
    except Exception as exc:
        if is_oom(exc):
            raise
        raise Unfinished(NOT_JUDGED.format(dims) + f"; {config.attention} raised "
                         f"{type(exc).__name__}: {first_line(exc)}") from exc
    if not verdict.passed:
        raise Unfinished(NOT_JUDGED.format(dims) + "; it read "
                         + (verdict.why or "").removeprefix("wrong: "))
    return verdict


def _kernel_runs(config: Any, device: str, seed: int) -> None:
    """The user's attention kernel, forward and backward, on (1, 1, seq, d_head): what
    raises at the point's shape raises here (a backward's too, which the check's gradient
    comparison reads as no verdict)."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    q, k, v = (torch.randn(1, 1, config.context_length, config.d_head, generator=gen,
                           device=device, requires_grad=True) for _ in range(3))
    registry.get(config.attention)(q, k, v, is_causal=True).sum().backward()


def both(first: Verdict | None, second: Verdict | None) -> Verdict | None:
    """Two checks of one point as one verdict: passed when both did, the reasons of each that
    failed (the first's first: one may explain the other), the metrics of both ("check" pass
    only when both pass; `check_detail` of both, joined, a failing one's first: the model's
    check and the training check each say what they compared)."""
    if first is None or second is None:
        return second or first
    passed = first.passed and second.passed
    metrics = {**second.metrics, **first.metrics, "check": "pass" if passed else "fail"}
    # a failing check's words first: a writeup cuts the detail short, and a wrong DDP's
    # cell read the passing model check's comparison
    ordered = sorted((first, second), key=lambda v: v.passed)
    details = [v.metrics["check_detail"] for v in ordered if v.metrics.get("check_detail")]
    if details:
        metrics["check_detail"] = "; ".join(dict.fromkeys(details))
    whys = [v.why.removeprefix("wrong: ") for v in (first, second) if not v.passed and v.why]
    why = "wrong: " + "; ".join(dict.fromkeys(whys)) if whys else None
    return Verdict(passed, metrics, why)


def user_code(config: Any, *objects: Any) -> dict[str, str]:
    """`code`: the files of the user's code a training step ran, each with its sha256 (the
    adapters file in use too): their attention kernel in our model, and the classes of each
    of `objects` (the model, the AdamW, a DDP wrapper, the model it wraps), their bases
    too (FSDP2 makes a model's class a subclass of its own; cs336sys's and torch's files
    are left out)."""
    kernel = [registry.get(config.attention)] if yours.is_yours(config.attention) else []
    return sources(*kernel, *(c for o in objects if o is not None for c in type(o).__mro__
                              if c is not object))


def finite_losses(losses: Any) -> Verdict:
    """The losses of every step a point ran (warm-up included) finite: a NaN in training is
    the user's model or kernel failing there, after the check's one forward passed."""
    bad = next((i for i, v in enumerate(losses) if not math.isfinite(float(v))), None)
    if bad is None:
        return Verdict(True, {})
    return Verdict(False, {"check": "fail"},
                   f"wrong: a non-finite loss ({float(losses[bad])}) at step {bad + 1} of the "
                   f"{len(losses)} it ran, warm-up included")


def judged(checked: Verdict | None, metrics: dict[str, Any], losses: Any = (),
           theirs: bool = False, **result: Any) -> Result:
    """A measured point's Result once its checks are done: ok, or `wrong` with the failed
    check's reason; the checks' metrics join the measured ones. Where the user's code ran
    (`checked` is not None, or `theirs`: code of theirs no check here covers, an FSDP in the
    step) and passed, its `losses`, every step's, must be finite too."""
    if checked is None and theirs:  # no check claimed: a pass adds no metric
        checked = finite_losses(losses)
    elif checked is not None and checked.passed:  # a failed check's loss may be NaN
        checked = both(checked, finite_losses(losses))  # already: its cause is said
    if checked is not None:
        metrics.update(checked.metrics)
    passed = checked is None or checked.passed
    return Result("ok" if passed else "wrong", metrics=metrics,
                  error=None if passed else checked.why, **result)


def _same_output(logits: Any, reference_logits: Any, y: Any, what: str) -> Verdict:
    """The user's loss against the reference loss, within LOSS_RTOL, and their logits against
    the reference's, within LOGITS_TOL: a loss near ln V hides a RoPE rotating the wrong
    pairs in a narrow model (|Δ loss| 5.5e-4 at d 64, its logits 0.26 off)."""
    loss, reference = float(cross_entropy(logits, y)), float(cross_entropy(reference_logits, y))
    diff = abs(loss - reference)
    off = float((logits.float() - reference_logits.float()).abs().max())
    scale = max(1.0, float(reference_logits.float().abs().max()))
    detail = (f"{what}: loss {loss:.6f} against {reference:.6f} (|Δ| {diff:.1e}, allowed "
              f"{LOSS_RTOL:g}·|loss|), logits at most {off:.1e} apart (allowed "
              f"{LOGITS_TOL:g}·{scale:.3g})")
    passed = math.isfinite(loss) and diff <= LOSS_RTOL * max(1.0, abs(reference)) \
        and off <= LOGITS_TOL * scale
    metrics = {"check_loss": loss, "check_loss_ours": reference,
               "check": "pass" if passed else "fail", "check_detail": detail}
    return Verdict(passed, metrics, None if passed else f"wrong: {detail}")
