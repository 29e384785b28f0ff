"""FlashAttention-2 in PyTorch against the float64 reference, and its saved-tensor contract."""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from cs336sys.attention import FlashAttention2Torch, flash_torch
from cs336sys.attention.reference import naive_attention
from tests.attention_ref import assert_close, make_inputs, reference, torch_error


@pytest.fixture(autouse=True)
def eager_backward(monkeypatch):
    """Eager backward for every test, so that each new shape does not trigger a compile."""
    monkeypatch.setenv(flash_torch.COMPILE_ENV, "0")


def run_flash(q, k, v, do, is_causal):
    """O, L, dQ, dK, dV of FlashAttention2Torch, L read from what the Function saved."""
    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    o = FlashAttention2Torch.apply(q, k, v, is_causal)
    lse = o.grad_fn.saved_tensors[4]  # read before backward frees the saved tensors
    o.backward(do)
    return {"o": o, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def check_against_reference(shape_q, shape_kv, dtype, is_causal, seed=0):
    q, k, v, do = make_inputs(shape_q, shape_kv, dtype, seed)
    got = run_flash(q, k, v, do, is_causal)
    ref = reference(q, k, v, do, is_causal)
    for name in ("o", "dq", "dk", "dv"):  # outputs and grads come back in the input dtype
        assert got[name].dtype == dtype, name
    assert got["lse"].dtype == torch.float32
    assert got["lse"].shape == shape_q[:-1]
    err = None if dtype == torch.float32 else torch_error(q, k, v, do, is_causal, ref)
    assert_close(got, ref, dtype, err)


# ---------------------------------------------------------------------------- correctness

# 129 and 200 are not multiples of the 64-row tile, so the last tile is a short tail
# (129: a one-row tail whose diagonal key tile starts exactly at its only query).
SHAPES = {
    "3d": ((2, 129, 32), (2, 129, 32)),
    "4d": ((2, 3, 200, 32), (2, 3, 200, 32)),
    "fewer-queries": ((1, 2, 70, 32), (1, 2, 150, 32)),
    "more-queries": ((1, 2, 150, 32), (1, 2, 70, 32)),
    "short": ((3, 20, 16), (3, 20, 16)),  # one 32-row tile, clamped from 64
}


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_float32_matches_reference(shape, is_causal):
    check_against_reference(*shape, torch.float32, is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [16, 48, 80, 128])
def test_head_dims(head_dim, is_causal):
    check_against_reference((1, 2, 100, head_dim), (1, 2, 100, head_dim), torch.float32, is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_low_precision_within_torch_error(dtype, shape, is_causal):
    check_against_reference(*shape, dtype, is_causal)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_small_tiles_many_tails(is_causal):
    """Tiles of 16 and 32 rows over odd lengths: many tiles, ragged in both directions."""
    q, k, v, _ = make_inputs((2, 2, 37, 16), (2, 2, 53, 16), torch.float32, seed=3)
    o, lse = flash_torch.flash_forward(q, k, v, is_causal, q_tile=16, k_tile=32)
    ref = reference(q, k, v, torch.zeros_like(q), is_causal)
    assert_close({"o": o, "lse": lse}, ref, torch.float32)


def test_tile_size_clamped_to_sequence():
    assert flash_torch._tile_size(64, 20) == 32  # 20 rounded up to 16
    assert flash_torch._tile_size(64, 64) == 64
    assert flash_torch._tile_size(64, 1000) == 64
    with pytest.raises(ValueError, match="at least 16"):
        flash_torch._tile_size(8, 100)


class CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.bmm.default, torch.ops.aten.mm.default):
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("n_queries", "n_keys", "tile_pairs"),
    [(256, 256, 10), (256, 64, 4), (64, 256, 1)],  # causal: tiles on or below the diagonal
)
def test_causal_skips_masked_tiles(n_queries, n_keys, tile_pairs):
    q, k, v, _ = make_inputs((1, n_queries, 16), (1, n_keys, 16), torch.float32)
    with CountMatmuls() as full:
        flash_torch.flash_forward(q, k, v, is_causal=False)
    with CountMatmuls() as causal:
        flash_torch.flash_forward(q, k, v, is_causal=True)
    n_tiles = (n_queries // 64) * (n_keys // 64)
    assert full.n == 2 * n_tiles  # S = Q K^T and P~ V per tile pair
    assert causal.n == 2 * tile_pairs


def test_public_function_and_lazy_export():
    from cs336sys.attention import get

    assert get("flash-torch") is flash_torch.flash_attention_torch
    q, k, v, _ = make_inputs((1, 2, 40, 16), (1, 2, 40, 16), torch.float32)
    torch.testing.assert_close(
        flash_torch.flash_attention_torch(q, k, v, is_causal=True),
        FlashAttention2Torch.apply(q, k, v, True),
    )


# ------------------------------------------------------------------------ saved tensors


def test_saves_exactly_q_k_v_o_and_lse():
    q, k, v, _ = make_inputs((2, 100, 32), (2, 100, 32), torch.float32)
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    o = FlashAttention2Torch.apply(q, k, v, True)
    saved = o.grad_fn.saved_tensors
    assert len(saved) == 5
    for got, want in zip(saved[:4], (q, k, v, o), strict=True):
        assert got.data_ptr() == want.data_ptr() and got.shape == want.shape
    assert saved[0] is q and saved[1] is k and saved[2] is v  # the caller's tensors
    lse = saved[4]
    assert lse.shape == (2, 100) and lse.dtype == torch.float32
    torch.testing.assert_close(lse.double(), reference(q, k, v, torch.zeros_like(q), True)["lse"])


def test_lse_shape_4d():
    q, k, v, _ = make_inputs((2, 3, 50, 16), (2, 3, 70, 16), torch.float32)
    o = FlashAttention2Torch.apply(q.requires_grad_(), k, v, False)
    assert o.grad_fn.saved_tensors[4].shape == (2, 3, 50)


def saved_for_backward(fn, q, k, v):
    """(number of tensors, bytes) that autograd saves while computing fn(q, k, v)."""
    sizes = []

    def pack(t):
        sizes.append(t.numel() * t.element_size())
        return t

    q, k, v = (t.detach().clone().requires_grad_() for t in (q, k, v))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        fn(q, k, v, True)
    return len(sizes), sum(sizes)


def test_saved_tensor_hooks_see_five_tensors():
    q, k, v, _ = make_inputs((2, 100, 32), (2, 100, 32), torch.float32)
    n, nbytes = saved_for_backward(FlashAttention2Torch.apply, q, k, v)
    assert n == 5
    assert nbytes == 4 * (4 * 2 * 100 * 32 + 2 * 100)  # Q, K, V, O and L, all float32


def test_saved_memory_linear_in_sequence_length():
    def ratio(fn):
        short = saved_for_backward(fn, *make_inputs((1, 256, 16), (1, 256, 16), torch.float32)[:3])
        long = saved_for_backward(fn, *make_inputs((1, 1024, 16), (1, 1024, 16), torch.float32)[:3])
        return long[1] / short[1]

    assert ratio(FlashAttention2Torch.apply) == pytest.approx(4.0, rel=0.01)
    assert ratio(naive_attention) > 12  # the (T, T) probabilities dominate: ~16x


# ---------------------------------------------------------------------- compile policy


def test_compile_policy(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.setenv(flash_torch.COMPILE_ENV, "1")
    assert flash_torch._should_compile(cpu)
    monkeypatch.setenv(flash_torch.COMPILE_ENV, "0")
    assert not flash_torch._should_compile(cpu)
    monkeypatch.delenv(flash_torch.COMPILE_ENV)
    monkeypatch.setattr(flash_torch.shutil, "which", lambda name: None)
    assert not flash_torch._should_compile(cpu)  # no C++ compiler: inductor cannot build
    monkeypatch.setattr(flash_torch.shutil, "which", lambda name: f"/usr/bin/{name}")
    assert flash_torch._should_compile(cpu)
    monkeypatch.setenv(flash_torch.COMPILE_ENV, "yes")
    with pytest.raises(ValueError, match="must be 0, 1 or unset"):
        flash_torch._should_compile(cpu)


def test_eager_backward_does_not_compile(monkeypatch):
    def fail():
        raise AssertionError("compiled backward used with CS336SYS_FLASH_TORCH_COMPILE=0")

    monkeypatch.setattr(flash_torch, "_compiled_backward", fail)
    q, k, v, do = make_inputs((1, 40, 16), (1, 40, 16), torch.float32)
    run_flash(q, k, v, do, is_causal=True)


@pytest.mark.slow
def test_compiled_backward_matches_eager(monkeypatch):
    monkeypatch.setenv(flash_torch.COMPILE_ENV, "1")
    calls = []
    real = flash_torch._compiled_backward

    def spy():
        calls.append(1)
        return real()

    monkeypatch.setattr(flash_torch, "_compiled_backward", spy)
    q, k, v, do = make_inputs((2, 2, 100, 32), (2, 2, 100, 32), torch.float32, seed=5)
    got = run_flash(q, k, v, do, is_causal=True)
    assert calls, "the compiled backward was not used"

    o, lse = flash_torch.flash_forward(q, k, v, True)
    eager = flash_torch.flash_backward(q, k, v, o, lse, do, True)
    for name, want in zip(("dq", "dk", "dv"), eager, strict=True):
        torch.testing.assert_close(got[name], want, rtol=1e-5, atol=1e-5, msg=name)
