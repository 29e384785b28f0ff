"""FlashAttention-2 autograd.Functions as students write them, right and wrong (copied into a
course-layout repository as cs336_systems/gallery_attention.py by
tests/test_gallery_attention.py). The PyTorch ones compute with whole score matrices: what
is judged is what they compute, not how they tile it."""

import math
import warnings

import torch


def scores(q, k, is_causal, scale=None, late=0):
    """s·QKᵀ (s = 1/√d unless given), masked above the diagonal when `is_causal` (`late`
    keys above it: a mask off by one)."""
    s = q @ k.transpose(-1, -2) * (scale or 1 / math.sqrt(q.shape[-1]))
    if is_causal:
        above = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool,
                           device=q.device).triu(1 + late)
        s = s.masked_fill(above, float("-inf"))
    return s


def backward(q, k, v, o, lse, do, is_causal, scale=None, late=0):
    """dQ, dK, dV recomputing P from the saved logsumexp (Dao 2023, the backward pass)."""
    qf, kf, vf, of, dof = (t.float() for t in (q, k, v, o, do))
    s = scale or 1 / math.sqrt(q.shape[-1])
    p = torch.exp(scores(qf, kf, is_causal, scale, late) - lse[..., None])
    dv = p.transpose(-1, -2) @ dof
    ds = p * (dof @ vf.transpose(-1, -2) - (of * dof).sum(-1, keepdim=True))
    return (ds @ kf * s).to(q.dtype), (ds.transpose(-1, -2) @ qf * s).to(k.dtype), dv.to(v.dtype)


def _function(mask: bool, scale: float | None, late: int = 0, backward_mask: bool = True):
    """An autograd.Function computing softmax(s·QKᵀ)V, masked causally when asked and
    `mask` (False: is_causal ignored), the mask `late` keys late; `backward_mask` False:
    the backward recomputes P unmasked (ctx.is_causal never set, the handout's warning)."""

    class Attention(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, is_causal=False):
            s = scores(q.float(), k.float(), is_causal and mask, scale, late)
            lse = torch.logsumexp(s, dim=-1)
            o = (torch.exp(s - lse[..., None]) @ v.float()).to(q.dtype)
            ctx.save_for_backward(q, k, v, o, lse)
            ctx.is_causal = is_causal and mask and backward_mask
            return o

        @staticmethod
        def backward(ctx, do):
            return *backward(*ctx.saved_tensors, do, ctx.is_causal, scale, late), None

    return Attention


Right = _function(mask=True, scale=None)
IgnoresCausal = _function(mask=False, scale=None)  # right for the PyTorch part, per the handout
NoScale = _function(mask=True, scale=1.0)  # wrong: scores never divided by sqrt(d)
OneKeyLate = _function(mask=True, scale=None, late=1)  # wrong: `triu(2)` for `triu(1)`
OneKeyEarly = _function(mask=True, scale=None, late=-1)  # wrong: `triu(0)`, its own key hidden
BackwardUnmasked = _function(mask=True, scale=None, backward_mask=False)  # wrong, causal
with warnings.catch_warnings():  # torch deprecates instances; the course's tests still pass one
    warnings.simplefilter("ignore", DeprecationWarning)
    AnInstance = Right()  # right: the getter returns an instance; .apply works on it as well


def ReturnsL(q, k, v, is_causal=False):  # wrong: O and its logsumexp, where O alone is due
    o = Right.apply(q, k, v, is_causal)
    return o, o.float().sum(-1)


def ReturnsNothing(q, k, v, is_causal=False):  # wrong: the `return` forgotten
    Right.apply(q, k, v, is_causal)
