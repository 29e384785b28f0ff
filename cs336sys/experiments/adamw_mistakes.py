"""What a wrong AdamW did, in words: the float64 update of AdamW (Loshchilov & Hutter 2019,
Algorithm 2) with one common mistake at a time, in torch's order and in the course's; the
first whose move the user's optimizer matches, within the check's tolerance, names the
cause.

    torch:  p <- p (1 - lr wd);  m <- b1 m + (1 - b1) g;  v <- b2 v + (1 - b2) g^2
            p <- p - lr (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
    course: m, v as above;  lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)
            p <- p - lr_t m / (sqrt(v) + eps);  p <- p - lr wd p

Right, the two move within the tolerance of each other; one mistake made in the course's
form (dividing by v, not its square root, where eps meets the uncorrected v) moves
otherwise than the same mistake in torch's, so each is tried in both."""

from __future__ import annotations

from typing import Any

# (the words, the mistake as keyword switches of `_moved`)
MISTAKES: tuple[tuple[str, dict[str, bool]], ...] = (
    ("it moves as torch.optim.Adam with weight_decay does: the decay added to the gradient "
     "(L2), not subtracted from the parameters apart as AdamW does", {"l2": True}),
    ("it moves as AdamW with no bias correction does (m and v not divided by 1 - beta^t)",
     {"correct_m": False, "correct_v": False}),
    ("it moves as AdamW whose first moment alone is bias-corrected does (v not divided by "
     "1 - beta2^t)", {"correct_v": False}),
    ("it moves as AdamW whose second moment alone is bias-corrected does (m not divided by "
     "1 - beta1^t)", {"correct_m": False}),
    ("it moves as AdamW with no weight decay does", {"decay": False}),
    ("it moves as AdamW whose weight decay is not scaled by the learning rate does (p -= wd p, "
     "not lr wd p)", {"decay_times_lr": False}),
    ("it moves as AdamW with beta1 and beta2 swapped does", {"swap_betas": True}),
    ("it moves as AdamW dividing by v, not by its square root, does", {"sqrt_v": False}),
    ("it moves as AdamW adding the update instead of subtracting it does", {"sign": -1.0}),
)


def named_mistake(start: Any, grads: list[Any], moved: Any, hyper: dict[str, Any],
                  rtol: float) -> str | None:
    """The words of the first of MISTAKES whose float64 move from `start` under `grads`
    matches `moved` within `rtol` of the correct move's largest element; None where none
    does."""
    scale = float(_moved(start, grads, hyper).abs().max())
    for words, mistake in MISTAKES:
        for course in (False, True):
            wrong = _moved(start, grads, hyper, course=course, **mistake)
            if float((moved - wrong).abs().max()) <= rtol * scale:
                return words
    return None


def _moved(start: Any, grads: list[Any], hyper: dict[str, Any], *, course: bool = False,
           l2: bool = False, correct_m: bool = True, correct_v: bool = True,
           decay: bool = True, decay_times_lr: bool = True, swap_betas: bool = False,
           sqrt_v: bool = True, sign: float = 1.0) -> Any:
    """How far AdamW, in torch's form or the `course`'s, with the mistakes switched on, moves
    `start` in len(grads) steps."""
    import torch

    lr, eps, wd = hyper["lr"], hyper["eps"], hyper["weight_decay"]
    b1, b2 = reversed(hyper["betas"]) if swap_betas else hyper["betas"]
    shrink = lr * wd if decay_times_lr else wd  # the decoupled decay's factor
    p = start.clone()
    m, v = torch.zeros_like(p), torch.zeros_like(p)
    for t, g in enumerate(grads, start=1):
        if l2:  # Adam's weight_decay: into the gradient
            g = g + wd * p
        elif decay and not course:
            p = p - shrink * p
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        c1 = (1 - b1**t) if correct_m else 1.0
        c2 = (1 - b2**t) if correct_v else 1.0
        if course:  # the corrections folded into the step size, eps on the uncorrected v
            step = lr * c2**0.5 / c1 * m / ((v.sqrt() if sqrt_v else v) + eps)
        else:
            step = lr * (m / c1) / (((v / c2).sqrt() if sqrt_v else v / c2) + eps)
        p = p - sign * step
        if course and decay and not l2:
            p = p - shrink * p
    return p - start
