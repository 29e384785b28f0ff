"""The check of an attention point: O and the gradients against float64, what a failing
kernel computes instead (diagnosis.py), and the L the user's FlashAttention saves
(saved_lse.py)."""

from __future__ import annotations

from typing import Any

from cs336sys.attention.diagnosis import (
    CHECK_TOLERANCE,
    CHECKED_AS_THE_COURSE,
    MAY_IGNORE_CAUSAL,
    SAVES_L,
    Alternative,
    backward_diagnosed,
    diagnose,
    got_and_want,
    judged,
    reason,
)
from cs336sys.attention.saved_lse import dtypes_checked, lse_checked, saved_logsumexps
from cs336sys.measure.check import Verdict, check


def as_the_course_checks(fn: Any, q: Any, k: Any, v: Any, dout: Any | None, verdict: Verdict,
                         tolerance: tuple[float, float]
                         ) -> tuple[Verdict, dict[str, Any], list[Any] | None]:
    """A `yours-torch` that failed at a causal point, run again non-causal on the same inputs
    and checked as the course's tests check it: a pass (saying what was off at the causal
    point) with its times kept apart from causal points, or `verdict` with what is off
    non-causal too; and the L that run saved (saved_logsumexps), which the course checks."""
    import torch

    from cs336sys.attention.reference import attention_reference

    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        out = fn(q2, k2, v2, is_causal=False)
    lse = saved_logsumexps(out, q2)  # before the backward frees what the forward saved
    if dout is not None:
        out.backward(dout)
    got, want = got_and_want(out, (q2.grad, k2.grad, v2.grad) if dout is not None else None,
                          *attention_reference(q, k, v, False, do=dout, dtype=torch.float64))
    course = check(got, want, *tolerance, against="a float64 reference of non-causal attention")
    off = verdict.metrics.get("check_detail") or reason(verdict.why)
    if not course.passed:
        why = f"{verdict.why}; non-causal too, as the course's tests run it: {reason(course.why)}"
        return Verdict(False, verdict.metrics, why), {}, lse
    detail = f"at this causal point {off}; {CHECKED_AS_THE_COURSE}"
    return (Verdict(True, {**course.metrics, "check_detail": detail}),
            {"not_compared": CHECKED_AS_THE_COURSE}, lse)


def checked(spec: Any, out: Any, q: Any, k: Any, v: Any, dout: Any | None,
            metrics: dict[str, Any], lse: list[Any] | None = None, fn: Any = None) -> Verdict:
    """The verdict of an attention point (experiments/attention.AttentionSpec): O, and the
    gradients q, k, v hold when `dout` is given, against a float64 reference, with what a
    failing kernel computes instead (`judged`), and the saved L (`lse`, saved_logsumexps) of
    the user's FlashAttention; `fn`, the implementation, checks a failing `yours-torch` as
    the course does (`as_the_course_checks`); its figures go into `metrics`. A later round of an
    interleaved point is not checked again: its first round's verdict stands (a passing
    Verdict here, no metrics)."""
    import torch

    from cs336sys.attention.reference import attention_reference

    if not spec.check_round:
        return Verdict(True)
    ref_o, ref_grads = attention_reference(q, k, v, spec.causal, do=dout, dtype=torch.float64)
    got, want = got_and_want(out, (q.grad, k.grad, v.grad) if dout is not None else None, ref_o,
                          ref_grads)
    tolerance = CHECK_TOLERANCE[spec.precision]
    verdict = check(got, want, *tolerance)
    instead: Alternative | None = None  # what a failing O computes instead, where found
    if not verdict.passed and dout is not None and check({"O": out}, {"O": ref_o},
                                                         *tolerance).passed:
        verdict = backward_diagnosed(spec.causal, got, q, k, v, dout, want, verdict, tolerance)
    elif not verdict.passed:
        found = diagnose(got, q, k, v, dout, spec.causal, tolerance)
        verdict, computed = judged(spec.impl, spec.causal, verdict, found)
        metrics.update(computed)
        instead = found[0] if found is not None and not verdict.passed else None
    causal_l = spec.causal
    as_the_course = spec.causal and spec.impl in MAY_IGNORE_CAUSAL and fn is not None
    if not verdict.passed and as_the_course:
        verdict, computed, rerun_l = as_the_course_checks(fn, q, k, v, dout, verdict, tolerance)
        metrics.update(computed)
        if verdict.passed and lse is not None:  # the course checks the L of that run
            lse, causal_l = rerun_l or [], False
    if lse is not None and spec.impl in SAVES_L:
        l_checked = lse_checked(spec.impl, causal_l, lse, q, k, tolerance, instead)
        if not l_checked.passed and verdict.passed and causal_l and as_the_course:
            # O right, L off at this causal point alone: the course reads a non-causal L
            course, computed, rerun_l = as_the_course_checks(fn, q, k, v, dout, l_checked,
                                                             tolerance)
            rerun = lse_checked(spec.impl, False, rerun_l or [], q, k, tolerance)
            if course.passed and rerun.passed:
                verdict, l_checked = course, rerun
                metrics.update(computed)
        verdict = _also(verdict, l_checked)
    if spec.impl in SAVES_L and spec.precision == "fp32":
        one = lse if lse and len(lse) == 1 and lse[0] is not None else []
        verdict = _also(verdict, dtypes_checked(out, one, q))
    metrics.update(verdict.metrics)
    return verdict


def _also(verdict: Verdict, other: Verdict) -> Verdict:
    """`verdict` failed where `other` fails, its reason said in the detail too (O's alone
    read as a pass there)."""
    if other.passed:
        return verdict
    why = other.why if verdict.passed else f"{verdict.why}; {reason(other.why)}"
    # a failure nothing explained said only L's reason in its detail: the figures come first
    said = [] if verdict.passed else [verdict.metrics.get("check_detail")
                                      or reason(verdict.why or "")]
    detail = "; ".join(d for d in [*said, reason(other.why)] if d)
    return Verdict(False, {**verdict.metrics, "check": "fail", "check_detail": detail}, why)
