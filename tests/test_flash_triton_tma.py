"""The kernels' descriptor (TMA) build (constexpr TMA) against the float64 reference.

flash_triton.FORCE_TMA makes every launch plan whose layout allows it run it; without CUDA
that is Triton's interpreter (3.9, and 3.6 with PYTHONPATH at its wheel), where a descriptor
load pads out-of-bounds rows and head-dim columns with zeros and a store drops them, as TMA
does. Each test also checks which kernels its plans chose, so that a silent fall-back to the
pointer kernels cannot pass for the TMA path. On a CUDA host (tests/test_gpu_attention.py
has the H100 check) the same tests run the compiled kernels.
"""

from __future__ import annotations

import contextvars
import threading

import pytest
import torch

pytest.importorskip("triton")

from cs336sys.attention import flash_triton, flash_triton_tma
from tests.attention_ref import assert_close, make_inputs, reference, torch_error

DEVICE = "cpu" if flash_triton.INTERPRETED else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)
F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture
def force_tma(monkeypatch):
    monkeypatch.setattr(flash_triton, "FORCE_TMA", True)
    monkeypatch.setattr(flash_triton, "_PLANS", {})


def variants():
    return [plan.variant for plan in flash_triton._PLANS.values()]


def check(q, k, v, do, dtype, is_causal):
    """O, dQ, dK, dV (and L) of the kernels within today's tolerances of float64."""
    ref = {n: t.to(DEVICE) for n, t in reference(q, k, v, do, is_causal).items()}
    err = torch_error(q, k, v, do, is_causal, ref) if dtype != F32 else None
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))  # same memory, same layout
    o = flash_triton.FlashAttention2Triton.apply(qg, kg, vg, is_causal)
    lse = o.grad_fn.saved_tensors[4]
    o.backward(do)
    got = {"o": o, "lse": lse, "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    for name, like in (("o", q), ("dq", q), ("dk", k), ("dv", v)):
        assert got[name].shape == like.shape and got[name].dtype == dtype, name
    assert_close(got, ref, dtype, err)


# Lengths that end mid-tile or on a tile boundary, T_q != T_k both ways, one query; head dims
# 16 to 128, powers of two and padded ones (48, 80, 96: zero columns from the descriptor).
CASES = [
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), F32, True, id="fp32-37-d32-causal"),
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), F32, False, id="fp32-37-d32-full"),
    pytest.param((1, 2, 50, 48), (1, 2, 21, 48), F32, True, id="fp32-more-queries-d48"),
    pytest.param((2, 21, 80), (2, 50, 80), F32, False, id="fp32-3d-fewer-queries-d80"),
    pytest.param((1, 2, 1, 16), (1, 2, 33, 16), F32, True, id="fp32-one-query-d16"),
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), BF16, True, id="bf16-37-d32-causal"),
    pytest.param((2, 37, 48), (2, 37, 48), BF16, False, id="bf16-3d-d48-full"),
    pytest.param((1, 2, 50, 32), (1, 2, 21, 32), F16, True, id="fp16-more-queries-causal"),
    pytest.param((1, 2, 21, 16), (1, 2, 50, 16), F16, False, id="fp16-fewer-queries-full"),
    pytest.param((1, 1, 40, 128), (1, 1, 40, 128), BF16, True, id="bf16-d128-causal"),
    pytest.param((1, 1, 40, 128), (1, 1, 40, 128), F32, False, id="fp32-d128-full"),
    pytest.param((1, 1, 33, 96), (1, 1, 33, 96), F16, True, id="fp16-d96-causal"),
]


@pytest.mark.parametrize("shape_q, shape_kv, dtype, is_causal", CASES)
def test_tma_kernels_match_float64(force_tma, shape_q, shape_kv, dtype, is_causal):
    q, k, v, do = make_inputs(shape_q, shape_kv, dtype, seed=1, device=DEVICE)
    check(q, k, v, do, dtype, is_causal)
    assert variants() == ["tma", "tma"]  # forward and backward plans


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [F32, BF16], ids=["fp32", "bf16"])
def test_tma_kernels_at_a_length_of_257(force_tma, dtype):
    # Many tiles: 17 query and key tiles, the last holding one row.
    q, k, v, do = make_inputs((1, 1, 257, 16), (1, 1, 257, 16), dtype, seed=4, device=DEVICE)
    check(q, k, v, do, dtype, True)
    assert variants() == ["tma", "tma"]


@pytest.mark.skipif(DEVICE == "cuda", reason="the autotuner picks the tiles on CUDA")
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("n_queries, n_keys", [(45, 45), (70, 29), (29, 70)])
def test_tma_kernels_with_unequal_tiles(force_tma, monkeypatch, tiles, n_queries, n_keys):
    # The causal ranges (skipped, masked, fully visible tiles) with Q_TILE != K_TILE.
    monkeypatch.setattr(flash_triton, "INTERPRETER_TILES", tiles)
    q, k, v, do = make_inputs((1, 2, n_queries, 16), (1, 2, n_keys, 16), F32, seed=3,
                              device=DEVICE)
    check(q, k, v, do, F32, True)
    assert variants() == ["tma", "tma"]


def test_the_tma_forward_alone_tries_256_query_tiles_where_they_fit():
    """A candidate for the descriptor build only (flash_triton_tuning.FWD_TMA_CONFIGS): kept
    for bf16 at d 64 and a long sequence, pruned at d 128 (its registers) and at a sequence
    shorter than the tile; the pointer forward never sees it, and pinned tiles stay the
    first fit."""
    from cs336sys.attention.flash_triton_tuning import call_args, kept_configs

    def kept(name, d, n):  # bf16, head dim d, n queries and keys
        return {(c.kwargs["Q_TILE"], c.kwargs["K_TILE"], c.num_warps, c.num_stages)
                for c in kept_configs(name, call_args(d, n))}

    wide = {(256, 64, 8, 2), (256, 64, 8, 3)}
    assert wide <= kept("fwd_tma", 64, 16384)
    assert not wide & kept("fwd", 64, 16384)
    assert not wide & kept("fwd_tma", 128, 16384)
    assert not wide & kept("fwd_tma", 64, 128)
    pinned = flash_triton.pinned_config
    assert pinned("fwd_tma", call_args(64, 16384)) == pinned("fwd", call_args(64, 16384))


def test_model_layout_reaches_the_tma_kernels_and_plans_are_reused(force_tma):
    # (B, H, T, D) views of (B, T, H, D): row stride H*D, aligned, so no copy and TMA.
    for seed in range(2):
        q, k, v, do = make_inputs((2, 19, 2, 32), (2, 35, 2, 32), BF16, seed=seed,
                                  device=DEVICE)
        q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
        check(q, k, v, do, BF16, True)
    assert [(p.variant, p.hits, p.views) for p in flash_triton._PLANS.values()] == [
        ("tma", 1, False),
        ("tma", 1, False),
    ]


def misaligned(t):
    """A copy of t whose data starts 2 elements past a 16-byte boundary."""
    base = torch.zeros(t.numel() + 2, dtype=t.dtype, device=t.device)
    return base[2:].view(t.shape).copy_(t)


@pytest.mark.parametrize("layout", ["misaligned", "row-stride-40-bytes"])
def test_layouts_tma_cannot_take_run_the_pointer_kernels(force_tma, layout):
    shape = (1, 2, 29, 20) if layout == "row-stride-40-bytes" else (1, 2, 29, 32)
    q, k, v, do = make_inputs(shape, shape, F16, seed=5, device=DEVICE)
    if layout == "misaligned":
        k = misaligned(k)
        assert k.data_ptr() % 16 != 0
    check(q, k, v, do, F16, True)
    assert variants() == ["pointer", "pointer"]


def test_tma_layout_rules():
    ok = flash_triton_tma.tma_layout_ok
    x = torch.empty(2, 3, 64, 32, dtype=F16)
    assert ok(x) and ok(x.transpose(1, 2).contiguous().transpose(1, 2))
    assert not ok(torch.empty(2, 3, 64, 20, dtype=F16))  # rows of 40 bytes
    assert ok(torch.empty(2, 3, 64, 20, dtype=F32))  # rows of 80 bytes
    assert not ok(x.transpose(-1, -2))  # head dim not unit-stride
    assert not ok(misaligned(x))
    assert ok(x[:, :, 1:])  # starts one row (64 bytes) in: still aligned
    assert not ok(x[..., 4:])  # starts 8 bytes in
    # a size-one batch or head adds no offset, so its stride does not matter
    assert ok(torch.empty(1, 64, 1, 32, dtype=F16).as_strided((1, 1, 64, 32), (7, 3, 32, 1)))


def test_without_force_tma_is_used_only_on_hopper_when_opted_in(monkeypatch):
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "TMA", True)  # CS336SYS_TRITON_TMA=1
    q, k, v, do = make_inputs((1, 2, 21, 32), (1, 2, 21, 32), BF16, device=DEVICE)
    check(q, k, v, do, BF16, True)
    on_hopper = DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9
    assert variants() == ["tma" if on_hopper else "pointer"] * 2
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    check(q.float(), k.float(), v.float(), do.float(), F32, True)
    assert variants() == ["pointer", "pointer"]  # float32 keeps the pointer kernels


def test_tma_kernels_take_the_pointer_kernels_arguments():
    # The launch plans pass the same arguments to either build (one kernel, TMA a constexpr).
    for name in ("fwd", "dkdv", "dq"):
        tma = flash_triton._KERNELS[name + "_tma"]
        assert tma.arg_names == flash_triton._KERNELS[name].arg_names, name


def test_ensure_allocator_sets_one_per_thread_and_keeps_the_callers():
    from triton.runtime import _allocation

    def allocator_after_ensure():
        flash_triton_tma.ensure_allocator()
        return _allocation._allocator.get()

    # A fresh thread starts from Triton's null allocator (ContextVar default), as autograd's
    # backward thread does on CUDA: ensure_allocator must set ours there.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(allocator_after_ensure()))
    thread.start()
    thread.join()
    assert seen == [flash_triton_tma._scratch]

    def mine(size, alignment, stream):  # pragma: no cover (never called here)
        raise AssertionError

    def with_callers_allocator():
        _allocation._allocator.set(mine)
        return allocator_after_ensure()

    assert contextvars.copy_context().run(with_callers_allocator) is mine


@pytest.mark.parametrize("missing, choice, ran", [
    ("HAS_DESCRIPTORS", "reduce-dq", "pointer+atomic-dq"),
    ("HAS_DESCRIPTOR_REDUCTIONS", "reduce-dq", "tma+atomic-dq"),
    ("HAS_WARP_SPECIALIZE", "heavy-first+warp-specialize", "tma+heavy-first"),
])
def test_a_path_this_triton_cannot_build_falls_back_and_says_so(monkeypatch, force_tma,
                                                                missing, choice, ran):
    """A Triton without in-kernel descriptors (before they were public), without their
    atomic_add, or whose tl.range has no warp_specialize runs what it can build, as where the
    GPU lacks a path, and the label names what ran instead of a compile error."""
    from cs336sys.measure import triton_support

    monkeypatch.setattr(triton_support, missing, False)
    q, k, v, do = make_inputs((1, 2, 40, 16), (1, 2, 40, 16), F32, seed=3, device=DEVICE)
    with flash_triton.opted_in(choice):
        check(q, k, v, do, F32, True)
    assert flash_triton.kernels_ran(True) == ran
