"""The checks that come before the user's code is timed, beside ours (docs/yours.md).

- A user's model (`--model`): its loss is finite, and where its architecture is ours (its
  state_dict loads into cs336sys's TransformerLM as it is), ours computes the same loss
  with the same weights. A user's attention kernel in our model (`--attention yours-...`):
  the same loss as naive attention with the same weights. Checked on a copy of at most two
  layers of the same shape, before the model that is timed is built, so that a large model
  never exists twice.
- A user's DDP, FSDP or sharded optimizer: after the timed steps, the parameters equal those
  of single-process training on the same data (the whole global batch, the same steps, the
  plain optimizer), as the course's tests check; FSDP's through fsdp_gather_full_params.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from cs336sys.measure.check import Verdict

# fp32 losses of the same weights computed by two implementations of the same math: the sums
# run in another order, nothing more (measured: |Δ| about 1e-6 on a loss of 5.5).
LOSS_RTOL = 1e-4
CHECK_LAYERS = 2  # the copy that is checked: at most this many layers
CHECK_TOKENS = 128  # ... and this many tokens per sequence


def model_check(config: Any, device: str, seed: int, batch_size: int) -> Verdict:
    """The user's code in a model step against cs336sys's, see the module docstring: their
    model (config.model), or their attention kernel in ours (config.attention), whose loss
    must be naive attention's with the same weights."""
    import torch

    from cs336sys.experiments.training_step import cross_entropy, make_batch, make_model

    small = dataclasses.replace(
        config, num_layers=min(config.num_layers, CHECK_LAYERS),
        context_length=min(config.context_length, CHECK_TOKENS), checkpoint="none",
    )
    x, y = make_batch(seed, min(batch_size, 2), small.context_length, small.vocab_size)
    x, y = x.to(device), y.to(device)
    theirs = make_model(small, device, seed)
    if config.model is None:  # their attention in our model: naive attention's loss
        ours = make_model(dataclasses.replace(small, attention="naive"), device, seed)
        with torch.no_grad():
            loss, reference = float(cross_entropy(theirs(x), y)), float(cross_entropy(ours(x), y))
        return _same_loss(loss, reference, f"naive attention in place of {config.attention}")
    with torch.no_grad():
        loss = float(cross_entropy(theirs(x), y))
    metrics: dict[str, Any] = {"check_loss": loss}
    if not math.isfinite(loss):
        return Verdict(False, {**metrics, "check": "fail"},
                       f"wrong: the loss of {config.model} is {loss}")
    ours = make_model(dataclasses.replace(small, model=None, attention="naive"), device, seed)
    try:
        ours.load_state_dict(theirs.state_dict(), strict=True)
    except (RuntimeError, ValueError) as exc:
        why = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        detail = (f"architecture differs from cs336sys's TransformerLM ({why[:200]}): only "
                  f"a finite loss is checked")
        return Verdict(True, {**metrics, "check": "pass", "check_detail": detail})
    with torch.no_grad():
        reference = float(cross_entropy(ours(x), y))
    return _same_loss(loss, reference, "the same weights in cs336sys's TransformerLM")


def _same_loss(loss: float, reference: float, what: str) -> Verdict:
    """The user's loss against the reference loss, within LOSS_RTOL."""
    diff = abs(loss - reference)
    detail = (f"{what}: loss {loss:.6f} against {reference:.6f} (|Δ| {diff:.1e}, allowed "
              f"{LOSS_RTOL:g}·|loss|)")
    passed = math.isfinite(loss) and diff <= LOSS_RTOL * max(1.0, abs(reference))
    metrics = {"check_loss": loss, "check_loss_ours": reference,
               "check": "pass" if passed else "fail", "check_detail": detail}
    return Verdict(passed, metrics, None if passed else f"wrong: {detail}")


# Training the same steps as one process: each parameter tensor's distance from the reference
# against how far the reference moved it, |p - p_ref| / |p_ref - p_0| (L2 norms). Measured
# (benchmarks/check_tolerances.py: a 2-layer d64 model, 2 Gloo ranks, 8 AdamW steps): 1.9e-5
# for each of our DDP variants in fp32, 2.4e-2 under bf16 autocast (rounding of half-batch
# activations); a DDP that does not average gradients is at 1.0.
TRAINING_TOLERANCE = {"fp32": 1e-3, "bf16": 0.1, "fp16": 0.1}


def training_reference(config: Any, device: str, seed: int, x: Any, y: Any, precision: str,
                       steps: int) -> tuple[dict, dict]:
    """(initial, final) parameters, on the CPU, of `steps` steps of single-process training
    on the whole batch (x, y): the model with rank 0's weights, the same AdamW, autocast in
    `precision` as the replicas train."""
    import torch

    from cs336sys.experiments.ddp_setup import LR, WEIGHT_DECAY
    from cs336sys.experiments.training_step import cross_entropy, make_model
    from cs336sys.measure.dtypes import autocast_dtype
    from cs336sys.models.adamw import AdamW

    model = make_model(config, device, seed)
    initial = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    opt = AdamW(model.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    low = autocast_dtype(precision)
    x, y = x.to(device), y.to(device)
    for _ in range(steps):
        with torch.autocast(torch.device(device).type, dtype=low, enabled=low is not None):
            loss = cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    final = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    del model, opt
    return initial, final


def training_check(full: dict, initial: dict, final: dict, precision: str) -> Verdict:
    """The user's parameters after training (`full`, by the unwrapped model's names) against
    the single-process reference's (see TRAINING_TOLERANCE)."""
    tol = TRAINING_TOLERANCE[precision]
    worst, where, problems = 0.0, None, []
    for name, ref in final.items():
        mine = full.get(name)
        if mine is None or tuple(mine.shape) != tuple(ref.shape):
            problems.append(f"{name} is {'missing' if mine is None else tuple(mine.shape)}")
            continue
        diff = float((mine.detach().float().cpu() - ref.float()).norm())
        moved = float((ref.float() - initial[name].float()).norm())
        ratio = diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf"))
        if not ratio <= worst:  # NaN too
            worst, where = ratio, name
    metrics: dict[str, Any] = {"check_worst": worst}
    detail = (f"per parameter |p - p_ref| / |p_ref - p_0| against single-process training, at "
              f"most {tol:g}: worst {worst:.2g} ({where})")
    passed = not problems and worst <= tol
    metrics.update(check="pass" if passed else "fail", check_detail=detail)
    why = None
    if not passed:
        why = "wrong: " + ("; ".join(problems[:3]) if problems else detail)
    return Verdict(passed, metrics, why)
