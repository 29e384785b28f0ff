"""naive_attention and sdpa_attention against an independent float64 reference."""

from __future__ import annotations

import math

import pytest
import torch

from cs336sys.attention import registry
from cs336sys.attention.reference import naive_attention, sdpa_attention


def reference_attention(q, k, v, is_causal):
    """Attention written out per query row in float64, with the causal mask as a loop."""
    q, k, v = q.double(), k.double(), v.double()
    n_queries, n_keys, d = q.shape[-2], k.shape[-2], q.shape[-1]
    rows = []
    for i in range(n_queries):
        scores = torch.einsum("...d,...kd->...k", q[..., i, :], k) / math.sqrt(d)  # (..., T_k)
        if is_causal:
            # Top-left alignment: query i sees keys 0..i, whatever n_keys is.
            visible = torch.tensor([j <= i for j in range(n_keys)])
            scores = scores.masked_fill(~visible, float("-inf"))
        weights = scores.exp() / scores.exp().sum(dim=-1, keepdim=True)
        rows.append(torch.einsum("...k,...kd->...d", weights, v))
    return torch.stack(rows, dim=-2)  # (..., T_q, D)


def make_qkv(n_queries, n_keys, dtype=torch.float32, seed=0, batch=(2, 3), d=16):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(*batch, n_queries, d, generator=g, dtype=dtype)
    k = torch.randn(*batch, n_keys, d, generator=g, dtype=dtype)
    v = torch.randn(*batch, n_keys, d, generator=g, dtype=dtype)
    return q, k, v


CASES = [
    pytest.param(12, 12, True, id="causal-square"),
    pytest.param(12, 12, False, id="full-square"),
    pytest.param(5, 11, False, id="full-fewer-queries"),
    pytest.param(11, 5, False, id="full-more-queries"),
    pytest.param(5, 11, True, id="causal-fewer-queries"),
    pytest.param(11, 5, True, id="causal-more-queries"),
]


@pytest.mark.parametrize("fn", [naive_attention, sdpa_attention], ids=["naive", "sdpa"])
@pytest.mark.parametrize("n_queries, n_keys, is_causal", CASES)
def test_forward_matches_float64_reference(fn, n_queries, n_keys, is_causal):
    q, k, v = make_qkv(n_queries, n_keys)
    out = fn(q, k, v, is_causal=is_causal)
    assert out.shape == (2, 3, n_queries, 16) and out.dtype == torch.float32
    torch.testing.assert_close(
        out.double(), reference_attention(q, k, v, is_causal), rtol=1e-5, atol=1e-5
    )


def test_causal_mask_is_not_a_no_op():
    # Guards the reference itself: with the mask on, the first query sees key 0 only.
    q, k, v = make_qkv(6, 6, dtype=torch.float64)
    causal = naive_attention(q, k, v, is_causal=True)
    torch.testing.assert_close(causal[..., 0, :], v[..., 0, :])
    assert not torch.allclose(causal, naive_attention(q, k, v, is_causal=False))


@pytest.mark.parametrize("n_queries, n_keys, is_causal", CASES)
def test_naive_gradients_match_float64_reference(n_queries, n_keys, is_causal):
    q, k, v = make_qkv(n_queries, n_keys, seed=1)
    upstream = torch.randn(2, 3, n_queries, 16, generator=torch.Generator().manual_seed(2))

    inputs32 = [t.clone().requires_grad_() for t in (q, k, v)]
    (naive_attention(*inputs32, is_causal=is_causal) * upstream).sum().backward()

    inputs64 = [t.double().requires_grad_() for t in (q, k, v)]
    (reference_attention(*inputs64, is_causal) * upstream.double()).sum().backward()

    for name, got, want in zip("qkv", inputs32, inputs64, strict=True):
        torch.testing.assert_close(
            got.grad.double(), want.grad, rtol=1e-4, atol=1e-5, msg=f"grad of {name}"
        )


@pytest.mark.parametrize("is_causal", [True, False])
def test_naive_gradcheck(is_causal):
    q, k, v = make_qkv(4, 6 if not is_causal else 4, dtype=torch.float64, batch=(1,), d=4)
    inputs = tuple(t.requires_grad_() for t in (q, k, v))
    assert torch.autograd.gradcheck(lambda *x: naive_attention(*x, is_causal=is_causal), inputs)


def test_registry_resolves_names_and_rejects_unknown():
    assert registry.names()[:2] == ["naive", "sdpa"]
    assert registry.get("naive") is naive_attention
    assert registry.get("sdpa") is sdpa_attention
    with pytest.raises(ValueError, match=r"unknown attention 'nope'; choose from naive, sdpa"):
        registry.get("nope")
    with pytest.raises(ValueError, match="already registered"):
        registry.register("naive", "cs336sys.attention.reference:sdpa_attention")
    with pytest.raises(ValueError, match="module:function"):
        registry.register("broken", "no_colon_here")
