"""What a wrong attention kernel computes instead: its output checked against the likely
alternatives, so that a failed check (point_check.py) says what the code does, not only
that it differs.

    non-causal     the causal mask is missing (is_causal ignored)
    causal         a causal mask that was not asked for
    no scale       scores not divided by √d
    scale 1/d      scores divided by d instead of √d

The user's FlashAttention is also checked where the course's forward test reads it: the
logsumexp L its forward saves for backward, the one saved tensor of shape (batch, queries),
against the float64 logsumexp of the scaled scores (saved_lse.py).

The handout lets the PyTorch FlashAttention ignore is_causal ("You can ignore the is_causal
flag for this task"), so for `yours-torch` the non-causal match is a pass, judged against
non-causal attention, with its times kept apart from causal points (`not_compared`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cs336sys.measure.check import Verdict, check
from cs336sys.sweep.result import first_line, hint, is_oom

# The check of every point, elementwise as torch.allclose: |x - ref| <= atol + rtol·|ref|,
# against a float64 reference from the same (rounded) inputs. fp32: the course's tests'
# tolerance, 1e-2, loose enough for TF32 matmuls (Triton's tl.dot default); fp16 the same.
# bf16 has 3 mantissa bits fewer than fp16 (8x its rounding error): 5e-2. Measured on CPU
# (benchmarks/check_tolerances.py: B1 H4 T256-1024 d64, causal), the largest
# |x - ref| - 0.01·|ref| of naive, sdpa and flash-torch is about 1e-2 in bf16 and 6e-4 in fp16
# (fp32: under 1e-6). A wrong kernel (no scale, a shifted mask, a stale max) is off by 0.1-1.
CHECK_TOLERANCE = {"fp32": (1e-2, 1e-2), "fp16": (1e-2, 1e-2), "bf16": (5e-2, 5e-2)}
GRADS = ("dQ", "dK", "dV")

# The implementation that may ignore is_causal: the course's PyTorch FlashAttention.
MAY_IGNORE_CAUSAL = ("yours-torch",)
IGNORES_CAUSAL = ("ignores is_causal, as the handout allows for the PyTorch implementation: "
                  "checked against non-causal attention, and its times, of non-causal work, "
                  "are not compared with causal points; --no-causal measures it")


def reason(why: str) -> str:
    """A failure's reason without its status (`wrong: O off by ...` -> `O off by ...`)."""
    return why.removeprefix("wrong: ")


def got_and_want(out: Any, grads: tuple | None, ref_o: Any, ref_grads: tuple | None
              ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(got, want): O, and dQ, dK, dV where the backward ran, beside their references."""
    got = {"O": out, **dict(zip(GRADS, grads or (), strict=False))}
    return got, {"O": ref_o, **dict(zip(GRADS, ref_grads or (), strict=False))}


# The implementations whose L is checked: the user's FlashAttention autograd.Functions, as
# the course's forward test checks them (its L: the output's grad_fn.saved_tensors of shape
# (batch, queries), exactly one, within 1e-2 of the logsumexp).
SAVES_L = ("yours-torch", "yours-triton")
NOT_JUDGED = ("not judged: the handout tests your FlashAttention only with dimensions that are "
              "powers of 2 and at least 16, so it need not handle {}")


def untested(spec: Any) -> str:
    """`seq 48 and d 24`: the point's dims the handout never tests the user's FlashAttention
    with ("you don't need to worry about out-of-bounds accesses"); '' for ours, or none."""
    return untested_dims(spec) if spec.impl in SAVES_L else ""


def untested_dims(spec: Any) -> str:
    """The point's dims that are no power of 2 of at least 16, whatever implements it."""
    return " and ".join(f"{name} {n}" for name, n in (("seq", spec.seq), ("d", spec.d_head))
                        if n < 16 or n & (n - 1))


@dataclass(frozen=True)
class Alternative:
    name: str  # what the kernel computes, in words
    causal: bool
    scale: float | None  # None: 1/√d
    diagonal: int = 0  # causal: query i sees keys j <= i + diagonal
    tile: int = 0  # causal: query i sees the keys of its own `tile`-key tile and before
    inverted: bool = False  # causal: query i sees the keys j > i only (the last none)


# The tile sizes a kernel that masks whole tiles is tried at (its query and key tiles alike)
TILES = (16, 32, 64, 128)


def alternatives(causal: bool, d: int, n: int = 0) -> list[Alternative]:
    """The likely mistakes for a point with this mask, head dim and sequence length `n`,
    most likely first."""
    flipped = (Alternative("non-causal attention: the causal mask is missing (is_causal "
                           "ignored)", False, None) if causal else
               Alternative("causal attention: a causal mask that was not asked for", True, None))
    late = ([Alternative("causal attention with the mask one key late: each query also sees "
                         "the next key (j <= i + 1)", True, None, 1),
             Alternative("causal attention with the mask one key early: each query misses "
                         "its own key (j < i; the first query sees none)", True, None, -1),
             *(Alternative(f"causal attention masked by whole tiles of {t} keys: the tile on "
                           "the diagonal is not masked inside (each query also sees the later "
                           "keys of its own tile)", True, None, 0, t) for t in TILES if t < n),
             Alternative("causal attention with the mask inverted: each query sees only the "
                         "later keys (j > i; the last query none), as masked_fill(mask, -inf) "
                         "does with a mask that is True where a key may be seen", True, None,
                         inverted=True)]
            if causal else [])
    return [flipped,
            Alternative("attention without the 1/√d scale", causal, 1.0),
            Alternative(f"attention scaled by 1/d (1/{d}) instead of 1/√d", causal, 1.0 / d),
            *late]


def diagnose(got: Mapping[str, Any], q: Any, k: Any, v: Any, dout: Any | None, causal: bool,
             tolerance: tuple[float, float]) -> tuple[Alternative, Verdict] | None:
    """The first alternative whose output O matches `got["O"]`, with the verdict of all of
    `got` (O, and dQ, dK, dV when given) against it; None when none matches."""
    import torch

    from cs336sys.attention.reference import attention_reference

    for alt in alternatives(causal, q.shape[-1], k.shape[-2]):
        o, grads = attention_reference(q, k, v, alt.causal, do=dout, dtype=torch.float64,
                                       scale=alt.scale, diagonal=alt.diagonal, tile=alt.tile,
                                       inverted=alt.inverted)
        # a mask early leaves the first queries no key (inverted, the last): their rows are
        # whatever the kernel made of nothing (NaN, or the mean of V under a -1e6 fill)
        seen = slice(None, -1) if alt.inverted else slice(max(0, -alt.diagonal), None)
        if not check({"O": got["O"][..., seen, :]}, {"O": o[..., seen, :]}, *tolerance).passed:
            continue
        _, want = got_and_want(None, None, o, grads)
        if alt.diagonal < 0 or alt.inverted:  # O alone: a row that sees no key makes dK NaN
            got, want = {"O": got["O"][..., seen, :]}, {"O": o[..., seen, :]}
        return alt, check({n: got[n] for n in want}, want, *tolerance,
                          against=f"a float64 reference of {alt.name.split(':')[0]}")
    return None


def judged(impl: str, causal: bool, verdict: Verdict, found: tuple[Alternative, Verdict] | None
           ) -> tuple[Verdict, dict[str, Any]]:
    """The point's verdict once the alternatives are known, and the metrics that say so:
    `check_detail` naming what the kernel computes, and for a PyTorch FlashAttention of the
    user's that ignores is_causal, a pass against non-causal attention with `not_compared`."""
    if verdict.passed or found is None:
        return verdict, {}
    alt, against = found
    if causal and not alt.causal and alt.scale is None and impl in MAY_IGNORE_CAUSAL \
            and against.passed:
        return (Verdict(True, {**against.metrics, "check_detail": IGNORES_CAUSAL}),
                {"not_compared": IGNORES_CAUSAL, "computed_causal": False})
    detail = f"it computes {alt.name}"
    if not against.passed:
        detail += " in the forward (its gradients match neither)"
    why = f"wrong: {detail}; {reason(verdict.why)}" if verdict.why else detail
    return Verdict(False, {**verdict.metrics, "check_detail": detail}, why), {}


# The course's tests run the PyTorch FlashAttention non-causal only: a `yours-torch` that is
# off at a causal point but right non-causal passes them, and passes here, with this said.
CHECKED_AS_THE_COURSE = (
    "checked non-causal, as the course's tests check the PyTorch FlashAttention (the handout "
    "lets it ignore is_causal), where it is right; its times are not compared with causal "
    "points; --no-causal measures it")


def backward_diagnosed(causal: bool, got: Mapping[str, Any], q: Any, k: Any, v: Any, dout: Any,
                       want: Mapping[str, Any], verdict: Verdict,
                       tolerance: tuple[float, float]) -> Verdict:
    """The verdict of a kernel whose O is right and a gradient is not, with what its
    backward computes instead where that is known: non-causal attention's gradients, or a
    gradient off by a constant factor of the head dim (a scale left out or applied twice)."""
    import math

    import torch

    from cs336sys.attention.reference import attention_reference

    detail = None
    # a backward without the mask: non-causal attention's, or (the handout's warning: "save
    # the mask flag for backward using ctx.is_causal") P = exp(S - L) unmasked with the
    # causal forward's L
    for unmasked in ((False, True) if causal else ()):
        _, grads = attention_reference(q, k, v, unmasked, do=dout, dtype=torch.float64,
                                       backward_unmasked=unmasked)
        if check({n: got[n] for n in GRADS}, dict(zip(GRADS, grads, strict=True)),
                 *tolerance).passed:
            detail = ("its backward computes the gradients of non-causal attention: it ignores "
                      "is_causal where its forward does not" if not unmasked else
                      "its backward recomputes P = exp(S - L) without the causal mask, with "
                      "the causal forward's L: is_causal is not kept for the backward "
                      "(ctx.is_causal)")
            break
    d = q.shape[-1]
    factors = ((math.sqrt(d), "√d"), (1 / math.sqrt(d), "1/√d"), (d, "d"), (1 / d, "1/d"))
    scaled: dict[str, list[str]] = {}  # by factor, the gradients that are that many times off
    for name in GRADS if detail is None else ():
        for factor, words in factors:
            if check({name: got[name]}, {name: want[name] * factor}, *tolerance).passed:
                scaled.setdefault(words, []).append(name)
                break
    if scaled:
        words, names = max(scaled.items(), key=lambda kv: len(kv[1]))
        detail = (f"its {' and '.join(names)} {'is' if len(names) == 1 else 'are'} {words} "
                  f"times the right one{'s' * (len(names) > 1)}: a 1/√d scale in its backward "
                  "is left out or applied twice")
    if detail is None and all(got[n] is not None for n in GRADS):  # a missing one: said
        detail = _which_gradients(
            [n for n in GRADS if not check({n: got[n]}, {n: want[n]}, *tolerance).passed])
    if detail is None:
        return verdict
    why = f"wrong: {detail}; {reason(verdict.why)}"
    return Verdict(False, {**verdict.metrics, "check_detail": detail}, why)


# Where the FlashAttention-2 backward (Dao 2023, Algorithm 2) goes wrong, from which of its
# gradients are off: dV = Pᵀ dO; dS = P ∘ (dP − D), D = rowsum(dO ∘ O); dQ = dS K, dK = dSᵀ Q.
_SHARED_BY = {
    ("dQ", "dK"): "its dV is right and its dQ and dK are not: what they share is off, "
                  "dS = P ∘ (dP − D) with dP = dO Vᵀ and D = rowsum(dO ∘ O)",
    ("dQ",): "its dQ alone is off: dQ = dS K / √d (its accumulation over the key tiles?)",
    ("dK",): "its dK alone is off: dK = dSᵀ Q / √d",
    ("dV",): "its dV alone is off: dV = Pᵀ dO, with P recomputed as exp(S − L)",
}


def _which_gradients(off: list[str]) -> str | None:
    """What the gradients that are off (`off`, of dQ, dK, dV) point at in the backward."""
    return _SHARED_BY.get(tuple(off))


def cannot_run(spec: Any, exc: BaseException, non_causal: Any, eager: Any = None,
               interpreted: bool = False, raiser: str = "") -> str | None:
    """Why a point whose first forward raised `exc` is skipped, not an error, or None: an
    SDPA backend that cannot take these inputs (flash with 3-D inputs on a CPU), a fact of
    the backend; the user's PyTorch FlashAttention refusing is_causal=True, which the
    handout lets it ignore and the course's tests never pass it (its error is the reason),
    where `non_causal()`, the same forward with is_causal=False, runs; or, for a Triton
    kernel of the user's `interpreted` in Triton's CPU interpreter, torch.compile failing
    where `eager()`, the forward uncompiled, runs: Dynamo traces the interpreter's Python
    (its uint64 pointer arithmetic), not a kernel, and the student's launch line was
    blamed. (Ours is a custom op, which Dynamo does not trace into.) `raiser` follows the
    implementation's name in the reason (`'s backward`, where the backward raised)."""
    message = first_line(exc)
    if spec.compile and interpreted and spec.impl != "triton" and not is_oom(exc):
        try:
            eager()
        except Exception:  # it fails uncompiled too: a fault, the point's error
            return None
        return ("torch.compile cannot trace a Triton kernel that Triton's CPU interpreter "
                f"runs (TRITON_INTERPRET=1): it failed inside the interpreter "
                f"({type(exc).__name__}), while the same call without --compile runs; "
                "compiling a Triton kernel needs a GPU")
    if spec.impl == "sdpa" and isinstance(exc, RuntimeError) and (
            "No available kernel" in message or "No viable backend" in message):
        return f"sdpa backend {spec.sdpa_backend!r} cannot run these inputs: {message}"
    if untested(spec) and not is_oom(exc):  # raising there is as good as any answer
        return (NOT_JUDGED.format(untested(spec)) + f"; {spec.impl}{raiser} raised "
                f"{type(exc).__name__}: {message}")
    # (unwritten, NotImplementedError either way, fails non_causal too: skipped as such)
    if spec.causal and spec.impl in MAY_IGNORE_CAUSAL and not is_oom(exc):
        try:
            non_causal()
        except Exception:  # it fails either way: a fault, the point's error
            return None
        return (f"{spec.impl}{raiser} raised at is_causal=True ({type(exc).__name__}: "
                f"{message}): the handout lets the PyTorch FlashAttention ignore is_causal, "
                "and the course's tests run it non-causal; --no-causal measures it")
    return None


def backward_cannot_run(spec: Any, exc: BaseException, fn: Any, q: Any, k: Any, v: Any,
                        dout: Any) -> str | None:
    """Why a point whose checked backward raised `exc` is skipped, or None (its error):
    the user's PyTorch FlashAttention whose backward refuses is_causal=True where its
    forward and backward run without it, as the course's tests run them (it was stored as
    an error, and `handout run` exited 1 on code the course passes). A backward not written
    at all is left to say `--pass forward` times the forward alone."""
    def non_causal() -> None:
        leaves = [t.detach().requires_grad_() for t in (q, k, v)]
        fn(*leaves, is_causal=False).backward(dout)

    why = cannot_run(spec, exc, non_causal, raiser="'s backward")
    if why is not None:
        return why
    if isinstance(exc, NotImplementedError) and spec.passes == "both":
        hint(exc, "raised in the backward: --pass forward times the forward alone")
    return None


def status_of(spec: Any, interpreted: bool, verdict: Verdict) -> tuple[str, str | None]:
    """The point's status and its reason: ok or wrong by `verdict`, except two failures
    that say nothing of the user's kernel, which are skipped: at a seq or head dim the
    handout never tests it with (not a power of 2 of at least 16: "you don't need to worry
    about out-of-bounds accesses"), and a bf16 Triton kernel's in Triton's CPU interpreter,
    whose tl.dot on bfloat16 returns garbage (Triton 3.6 and 3.9: a 16 x 16 product off by
    2e10; ours upcasts there, flash_triton_kernels.py)."""
    if verdict.passed:
        return "ok", None
    if untested(spec):  # the handout: "you don't need to worry about" them
        return "skipped", NOT_JUDGED.format(untested(spec)) + "; it read " + reason(
            verdict.why)
    if interpreted and spec.precision == "bf16" and spec.impl != "triton":  # the user's
        return "skipped", ("not judged: Triton's CPU interpreter computes tl.dot on bfloat16 "
                           "inputs wrongly, so a bf16 Triton kernel cannot be checked here "
                           "(fp16 or fp32 checks it on a CPU; bf16 needs a GPU); it read "
                           + reason(verdict.why))
    return "wrong", verdict.why
