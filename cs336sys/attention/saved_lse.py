"""The logsumexp L a user's FlashAttention forward saves for backward, checked where the
course's forward test reads it: the one saved tensor of shape (batch, queries), within 1e-2
of the float64 logsumexp of the scaled scores, in the inputs' dtype (with O)."""

from __future__ import annotations

from typing import Any

from cs336sys.attention.diagnosis import MAY_IGNORE_CAUSAL, SAVES_L, Alternative, reason
from cs336sys.measure.check import Verdict, check

# The nodes of the view that shapes a flattened (B·H, T, D) output back to (B, H, T, D)
# (yours/implementations.attention_function): L is saved by the user's Function under it.
_RESHAPES = ("ViewBackward", "UnsafeViewBackward", "ReshapeAliasBackward")


def saved_logsumexps(out: Any, q: Any) -> list[Any] | None:
    """The tensors the output's autograd.Function saved for backward with L's shape,
    q.shape[:-1], as the course's forward test finds them, or (batch·heads, queries) under
    the view that shaped a flattened output back, read as L's shape (None where its node
    saves none that can be read: a built-in op's node, no graph)."""
    import math

    shape = tuple(q.shape[:-1])
    flat = (math.prod(shape[:-1]), shape[-1])
    node = getattr(out, "grad_fn", None)
    while node is not None and type(node).__name__.startswith(_RESHAPES) and node.next_functions:
        node = node.next_functions[0][0]
    try:
        saved = node.saved_tensors
    except (AttributeError, RuntimeError):
        return None
    if any(t is None for t in saved):  # the course's test reads every one's .shape
        return [None]  # lse_checked says so
    return [t.reshape(shape) for t in saved if tuple(t.shape) in (shape, flat)]


def forward_logsumexps(spec: Any, out: Any, fn: Any, q: Any, k: Any, v: Any
                       ) -> list[Any] | None:
    """The L to check of a point of the user's FlashAttention (saved_logsumexps), read
    before the backward frees it; None where none is checked (compiled: the graph's node
    saves what inductor chose). A forward-only point's inputs need no gradient, so nothing
    was saved: its forward runs once more with inputs that do, as the course's forward test
    runs it (a kernel whose backward is not written yet is measured so, and its L counts)."""
    if spec.impl not in SAVES_L or spec.compile or not spec.check_round:
        return None
    if getattr(out, "grad_fn", None) is not None:
        return saved_logsumexps(out, q)
    import torch

    q2, k2, v2 = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.enable_grad():
        return saved_logsumexps(fn(q2, k2, v2, is_causal=spec.causal), q2)


def _one_of_the_course(saved: list[Any]) -> list[Any]:
    """Where batch (times heads) equals the queries and the keys, a (queries, keys) mask
    saved beside L has L's shape too, where at the course's sizes (batch 4, 128 queries) it
    does not: the masks (boolean, or of 0, 1 and ±inf alone) are not L. Two that are neither
    (L and the running max m) stay two, as the course counts them."""
    import torch

    def mask(t: Any) -> bool:
        if t.dtype == torch.bool:
            return True
        return t.is_floating_point() and bool(((t == 0) | (t == 1) | t.isinf()).all())

    rest = [t for t in saved if not mask(t)]
    return rest if len(rest) == 1 else saved


def lse_checked(impl: str, causal: bool, saved: list[Any], q: Any, k: Any,
                tolerance: tuple[float, float], computed: Alternative | None = None) -> Verdict:
    """The verdict of the L a FlashAttention forward saved (`saved_logsumexps`): one tensor,
    the natural-log logsumexp of the scaled scores (either mask's for an implementation that
    may ignore is_causal), or what it is instead, in words. An L that is the logsumexp of
    what its O was found to compute instead (`computed`: another mask, another scale) is
    that O's mistake, said already: not one of L's ("L is not m + log l" read as L's own)."""
    import math

    from cs336sys.attention.reference import logsumexp_reference

    shape = tuple(q.shape[:-1])
    if None in saved:
        return Verdict(False, why="wrong: its forward saves None among its tensors for backward "
                       "(ctx.save_for_backward): the course's forward test reads the shape of "
                       "each saved tensor, and fails on it with AttributeError")
    if len(saved) > 1 and math.prod(shape[:-1]) == shape[-1] == k.shape[-2]:
        saved = _one_of_the_course(saved)
    if len(saved) != 1:
        found = f"{len(saved)} tensors" if saved else "no tensor"
        return Verdict(False, why=f"wrong: its forward saves {found} of L's shape {shape} for "
                       "backward; the course's forward test takes L, the logsumexp, as the one "
                       "saved tensor of that shape (ctx.save_for_backward)")
    (got,) = saved
    ref = logsumexp_reference(q, k, causal)
    # either mask's L for an implementation that may ignore is_causal
    if check({"L": got}, {"L": ref}, *tolerance).passed or (
            causal and impl in MAY_IGNORE_CAUSAL
            and check({"L": got}, {"L": logsumexp_reference(q, k, False)}, *tolerance).passed):
        return Verdict(True)
    if computed is not None:  # first: an unscaled O's unscaled L is O's mistake, not L's
        alt = logsumexp_reference(q, k, computed.causal, scale=computed.scale,
                                  diagonal=computed.diagonal, tile=computed.tile,
                                  inverted=computed.inverted)
        # (a query that sees no key: -inf)
        seen = slice(None, -1) if computed.inverted else slice(max(0, -computed.diagonal), None)
        if check({"L": got[..., seen]}, {"L": alt[..., seen]}, *tolerance).passed:
            return Verdict(True)
    instead = (("in base 2 (m log2 e + log2 l); the course compares the natural log",
                ref / math.log(2)),
               ("the logsumexp of scores without the 1/√d scale",
                logsumexp_reference(q, k, causal, scale=1.0)))
    for words, alt in instead:
        if check({"L": got}, {"L": alt}, *tolerance).passed:
            return Verdict(False, why=f"wrong: L, the logsumexp its forward saves, is {words}")
    off = reason(check({"L": got}, {"L": ref}, *tolerance).why)
    return Verdict(False, why=f"wrong: L, the logsumexp its forward saves for backward, is not "
                   f"m + log l of the scaled scores: {off}")


def dtypes_checked(out: Any, lse: list[Any], q: Any) -> Verdict:
    """O (and the saved L) in the inputs' dtype: the course's forward test compares them
    with torch.testing.assert_close, which checks the dtype too (float32 inputs there), so
    an O returned in float64 fails it, whatever its values."""
    off = [f"{name} is {str(t.dtype).removeprefix('torch.')}"
           for name, t in (("O", out), *(("L", t) for t in lse)) if t.dtype != q.dtype]
    if not off:
        return Verdict(True)
    return Verdict(False, why=f"wrong: {' and '.join(off)} for "
                   f"{str(q.dtype).removeprefix('torch.')} inputs: the course's forward test "
                   f"compares them with torch.testing.assert_close, which checks the dtype")
