"""FlashAttention-2 Triton kernels against the float64 reference in tests/attention_ref.py.

Without CUDA the kernels run in Triton's interpreter (conftest sets TRITON_INTERPRET=1 before
any kernel module is imported), which uses 16 x 16 tiles; the shapes below are chosen so that
sequences span several tiles, end mid-tile, and exercise both the unmasked and the masked
stage of every key loop. On a CUDA host the same tests run the compiled, autotuned kernels.
"""

from __future__ import annotations

import os
import threading

import pytest
import torch

pytest.importorskip("triton")

from cs336sys.attention import flash_triton, registry
from cs336sys.attention.flash_triton import (
    FlashAttention2Triton,
    check_available,
    flash_attention_triton,
)
from tests.attention_ref import assert_close, make_inputs, reference, torch_error

DEVICE = "cpu" if flash_triton.INTERPRETED else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)


def run_flash(shape_q, shape_kv, dtype, is_causal, seed=0, q_scale=1.0):
    """(got, ref, torch_err): O, L, dQ, dK, dV of the kernels and of the float64 reference."""
    q, k, v, do = make_inputs(shape_q, shape_kv, dtype, seed=seed, device=DEVICE)
    if q_scale != 1.0:
        q = (q.float() * q_scale).to(dtype)
    ref = reference(q, k, v, do, is_causal)
    err = torch_error(q, k, v, do, is_causal, ref) if dtype != torch.float32 else None

    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o = FlashAttention2Triton.apply(qg, kg, vg, is_causal)
    lse = o.grad_fn.saved_tensors[4]
    o.backward(do)
    got = {"o": o, "lse": lse, "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}

    for name, like in (("o", q), ("dq", q), ("dk", k), ("dv", v)):
        assert got[name].shape == like.shape and got[name].dtype == dtype, name
    assert lse.shape == q.shape[:-1] and lse.dtype == torch.float32
    ref = {n: t.to(DEVICE) for n, t in ref.items()}
    return got, ref, err


# (shape of q, shape of k and v): 3-D (B, T, D) and 4-D (B, H, T, D); lengths that end mid-tile
# or on a tile boundary, T_q > T_k, T_q < T_k, a single query, head dims 16 to 80.
SHAPES = [
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), id="4d-37-d32"),
    pytest.param((2, 64, 16), (2, 64, 16), id="3d-64-d16"),
    pytest.param((1, 2, 50, 48), (1, 2, 21, 48), id="4d-more-queries-d48"),
    pytest.param((2, 21, 80), (2, 50, 80), id="3d-fewer-queries-d80"),
    pytest.param((1, 2, 1, 16), (1, 2, 33, 16), id="4d-one-query"),
]


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape_q, shape_kv", SHAPES)
@pytest.mark.slow
def test_float32_matches_reference(shape_q, shape_kv, is_causal):
    got, ref, _ = run_flash(shape_q, shape_kv, torch.float32, is_causal)
    assert_close(got, ref, torch.float32)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "shape_q, shape_kv, is_causal",
    [
        pytest.param((2, 2, 37, 32), (2, 2, 37, 32), True, id="4d-causal"),
        pytest.param((2, 37, 48), (2, 37, 48), False, id="3d-full-d48"),
        pytest.param((1, 2, 50, 32), (1, 2, 21, 32), True, id="more-queries-causal"),
        pytest.param((1, 2, 21, 16), (1, 2, 50, 16), False, id="fewer-queries-full"),
    ],
)
@pytest.mark.slow
def test_low_precision_within_pytorch_error(shape_q, shape_kv, is_causal, dtype):
    # Tolerance: twice PyTorch's own error in that dtype (plus 1e-3 of the magnitude).
    got, ref, err = run_flash(shape_q, shape_kv, dtype, is_causal, seed=1)
    assert_close(got, ref, dtype, err)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_head_dim_128(dtype, is_causal):
    got, ref, err = run_flash((1, 2, 40, 128), (1, 2, 40, 128), dtype, is_causal, seed=2)
    assert_close(got, ref, dtype, err)


@pytest.mark.parametrize("d", [16, 24, 48, 80, 96, 112, 128])
def test_forward_head_dims(d):
    # Powers of two and padded head dims (BLOCK_D = next power of two, masked), forward only.
    q, k, v, _ = make_inputs((1, 2, 20, d), (1, 2, 20, d), torch.float16, seed=d, device=DEVICE)
    o = flash_attention_triton(q, k, v, is_causal=True)
    ref = reference(q, k, v, torch.zeros_like(q), True)["o"].to(DEVICE)
    err = (o.double() - ref).abs().max().item()
    assert err < 2e-3, err  # fp16 rounding of O (|O| < 2) plus the fp16 product P~ V


@pytest.mark.skipif(DEVICE == "cuda", reason="the autotuner picks the tiles on CUDA")
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32), (64, 16)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("n_queries, n_keys", [(45, 45), (70, 29), (29, 70)])
def test_unequal_tiles(monkeypatch, tiles, n_queries, n_keys):
    # The GPU configs use Q_TILE != K_TILE; the causal ranges (which key tiles are skipped,
    # masked or fully visible) must hold for those too, not only for the interpreter's 16 x 16.
    monkeypatch.setattr(flash_triton, "INTERPRETER_TILES", tiles)
    shape_q, shape_kv = (1, 2, n_queries, 16), (1, 2, n_keys, 16)
    got, ref, _ = run_flash(shape_q, shape_kv, torch.float32, True, seed=3)
    assert_close(got, ref, torch.float32)


@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_heavy_first_reorders_the_tiles_not_the_results(monkeypatch, is_causal):
    """The opt-in HEAVY_FIRST launches the causal query tiles in reverse: each program still
    computes its own tile alone, so O, L and the (atomic-free) gradients are bit-for-bit the
    default's; a full mask keeps the default order (its plans say so)."""
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    runs = []
    for heavy in (False, True):
        monkeypatch.setattr(flash_triton, "HEAVY_FIRST", heavy)
        got, ref, _ = run_flash((1, 2, 45, 16), (1, 2, 45, 16), torch.float32, is_causal, seed=9)
        assert_close(got, ref, torch.float32)
        runs.append(got)
        assert flash_triton._LAST["fwd"].heavy_first == (heavy and is_causal)
        assert ("heavy-first" in flash_triton.kernels_ran(True)) == (heavy and is_causal)
    for name in runs[0]:
        assert torch.equal(runs[0][name], runs[1][name]), name


@pytest.mark.parametrize("q_scale", [1.0, 8.0], ids=["stale-max", "moving-max"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
def test_lazy_rescale_matches_float64(monkeypatch, is_causal, q_scale):
    """The opt-in LAZY_RESCALE keeps a stale running max until some row's grows by more than
    2^8: with scores of a few units it is set by the first key tile and never moved, with
    peaked rows (scores of order +-30) it moves; O and L match float64 either way, and the
    backward (which reads L) too."""
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "LAZY_RESCALE", True)
    got, ref, _ = run_flash((1, 2, 45, 32), (1, 2, 45, 32), torch.float32, is_causal, seed=11,
                            q_scale=q_scale)
    assert_close(got, ref, torch.float32)
    assert flash_triton._LAST["fwd"].lazy_rescale
    assert "lazy-rescale" in flash_triton.kernels_ran(True)


@pytest.mark.parametrize("tma", [True, False], ids=["tma", "pointer"])
@pytest.mark.parametrize("is_causal", [True, False], ids=["causal", "full"])
@pytest.mark.parametrize("n", [44, 45])
def test_warp_specialize_runs_one_masked_loop_where_tma_runs(monkeypatch, is_causal, tma, n):
    """The opt-in WARP_SPECIALIZE walks every key tile of the forward, and every query tile of
    the dK/dV kernel, in one masked loop (the only one Triton's Hopper pass splits into warp
    groups): O, L and the gradients match float64 over a sequence tail and the diagonal. Only
    the TMA build takes it: with the pointer loads the plans are the default's and say so.
    The dK/dV kernel reads its rows of L and D by TMA then, so it splits only where a row is
    16-byte aligned (n % 4 == 0); else the backward is the default one, and the label too."""
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "WARP_SPECIALIZE", True)
    monkeypatch.setattr(flash_triton, "FORCE_TMA", tma)
    monkeypatch.setattr(flash_triton, "INTERPRETER_TILES", (16, 32))  # 2 key tiles, tail masked
    got, ref, _ = run_flash((1, 2, n, 32), (1, 2, n, 32), torch.float32, is_causal, seed=13,
                            q_scale=8.0)
    assert_close(got, ref, torch.float32)
    assert flash_triton._LAST["fwd"].warp_specialize == tma
    assert flash_triton._LAST["bwd"].warp_specialize == (tma and n % 4 == 0)
    assert ("warp-specialize" in flash_triton.kernels_ran(True)) == (tma and n % 4 == 0)


def test_warp_specialize_leaves_the_atomic_dq_backward_whole(monkeypatch):
    """The atomic dQ's loop does not split (Triton 3.6's pass fails on it): with both asked
    for, the forward splits and the backward is the atomic one, as the label says."""
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "FORCE_TMA", True)
    with flash_triton.opted_in("warp-specialize+reduce-dq"):
        got, ref, _ = run_flash((1, 2, 40, 16), (1, 2, 40, 16), torch.float32, True, seed=5)
    assert_close(got, ref, torch.float32)
    fwd, bwd = flash_triton._LAST["fwd"], flash_triton._LAST["bwd"]
    assert fwd.warp_specialize and not bwd.warp_specialize and bwd.reduce_dq
    assert flash_triton.kernels_ran(True) == "tma+warp-specialize+reduce-dq"


def test_large_scores_rescale_online_softmax():
    # Peaked rows (scores of order +-30): the running max changes between key tiles, so the
    # rescaling by exp(m_old - m_new) must be right, and exp must not overflow.
    got, ref, _ = run_flash((1, 2, 45, 32), (1, 2, 45, 32), torch.float32, True, q_scale=8.0)
    assert_close(got, ref, torch.float32)


def test_non_contiguous_inputs():
    # The model hands over (B, H, T, D) views of a (B, T, H, D) projection.
    q, k, v, do = make_inputs((2, 19, 2, 16), (2, 35, 2, 16), torch.float32, device=DEVICE)
    q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    assert not q.is_contiguous()
    ref = reference(q, k, v, do, False)
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    assert not qg.is_contiguous()
    o = flash_attention_triton(qg, kg, vg)
    o.backward(do)
    got = {"o": o, "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    assert_close(got, {n: t.to(DEVICE) for n, t in ref.items()}, torch.float32)


# --------------------------------------------------------------------------------------------
# The autograd contract: what forward saves for backward


@pytest.mark.parametrize(
    "shape_q, shape_kv", [((2, 20, 16), (2, 24, 16)), ((2, 3, 20, 16), (2, 3, 24, 16))]
)
def test_saves_exactly_q_k_v_o_and_logsumexp(shape_q, shape_kv):
    q, k, v, _ = make_inputs(shape_q, shape_kv, torch.float32, device=DEVICE)
    q, k, v = (t.requires_grad_() for t in (q, k, v))

    packed = []

    def pack(t):
        packed.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        o = FlashAttention2Triton.apply(q, k, v, True)

    # Exactly (Q, K, V, O, L), the caller's own tensors first: O(T d) memory, no P.
    assert len(packed) == 5
    assert packed[0] is q and packed[1] is k and packed[2] is v and packed[3] is o
    lse = packed[4]
    assert lse.shape == shape_q[:-1] and lse.dtype == torch.float32  # (B, [H,] T_q)
    ref = reference(q, k, v, torch.zeros_like(q), True)["lse"].to(DEVICE)
    assert (lse.double() - ref).abs().max().item() < 1e-5

    assert [t.shape for t in o.grad_fn.saved_tensors] == [t.shape for t in packed]


def test_backward_returns_no_gradient_for_is_causal():
    q, k, v, do = make_inputs((1, 17, 16), (1, 17, 16), torch.float32, device=DEVICE)
    q.requires_grad_()
    o = FlashAttention2Triton.apply(q, k, v, True)
    grads = o.grad_fn.apply(do)
    assert len(grads) == 4 and grads[3] is None
    assert grads[0].shape == q.shape


def test_apply_signature_and_output_is_not_a_view():
    q, k, v, _ = make_inputs((1, 2, 17, 16), (1, 2, 17, 16), torch.float32, device=DEVICE)
    q.requires_grad_()
    full = FlashAttention2Triton.apply(q, k, v)  # is_causal defaults to False
    torch.testing.assert_close(full, flash_attention_triton(q, k, v, is_causal=False))
    causal = FlashAttention2Triton.apply(q, k, v, is_causal=True)
    assert not torch.allclose(causal, full)
    causal += 1  # an output the caller owns, so in-place updates are allowed


# --------------------------------------------------------------------------------------------
# Availability and input checks


def test_cpu_tensors_without_interpreter_raise_clear_error(monkeypatch):
    monkeypatch.setattr(flash_triton, "INTERPRETED", False)
    with pytest.raises(RuntimeError, match="needs CUDA, or TRITON_INTERPRET=1"):
        check_available(torch.device("cpu"))
    q = torch.randn(1, 16, 16)
    with pytest.raises(RuntimeError, match="needs CUDA, or TRITON_INTERPRET=1"):
        flash_attention_triton(q, q, q)


def test_cuda_tensors_with_interpreter_raise(monkeypatch):
    monkeypatch.setattr(flash_triton, "INTERPRETED", True)
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        check_available("cuda")
    check_available("cpu")  # the interpreter runs CPU tensors


@pytest.mark.parametrize(
    "q_shape, kv_shape, kv_dtype, message",
    [
        ((1, 16, 8), (1, 16, 8), torch.float32, "head dim"),
        ((1, 16, 160), (1, 16, 160), torch.float32, "head dim"),
        ((1, 16, 16), (1, 16, 16), torch.float16, "dtype"),
        ((1, 16, 16), (2, 16, 16), torch.float32, "leading dims"),
        ((1, 16, 16), (1, 16, 32), torch.float32, "head dim"),
    ],
)
def test_rejects_bad_inputs(q_shape, kv_shape, kv_dtype, message):
    q = torch.randn(q_shape, device=DEVICE)
    kv = torch.randn(kv_shape, device=DEVICE).to(kv_dtype)
    with pytest.raises(ValueError, match=message):
        flash_attention_triton(q, kv, kv)


def test_registered_as_triton():
    assert registry.get("triton") is flash_attention_triton


def test_pinned_tiles_are_the_first_candidate_that_fits_the_call():
    """What the GPU tests run instead of autotuning (flash_triton.pinned_tiles)."""

    from cs336sys.attention.flash_triton_tuning import call_args

    def pinned(name, dtype, d, n):
        return flash_triton.pinned_config(name, call_args(d, n, dtype.itemsize))

    wide = pinned("fwd", torch.bfloat16, 64, 16384)
    assert (wide.kwargs, wide.num_warps) == ({"Q_TILE": 128, "K_TILE": 128}, 8)
    assert wide in flash_triton.FWD_CONFIGS
    short = pinned("fwd", torch.bfloat16, 64, 40)  # no tile longer than the sequence
    assert max(short.kwargs.values()) <= 64 and short in flash_triton.FWD_CONFIGS
    assert pinned("dq", torch.float32, 128, 4096) in flash_triton.FP32_CONFIGS
    assert flash_triton._AUTOTUNE.get() is True
    with flash_triton.pinned_tiles():
        assert flash_triton._AUTOTUNE.get() is False
        # Seen in other threads too: on CUDA autograd runs backward in a device thread.
        seen = []
        worker = threading.Thread(target=lambda: seen.append(flash_triton._AUTOTUNE.get()))
        worker.start()
        worker.join()
        assert seen == [False]
    assert flash_triton._AUTOTUNE.get() is True


# --------------------------------------------------------------------------------------------
# Launch plans: one plan per call signature, reused without re-checking or copying


def grads_of(q, k, v, do, is_causal):
    """O, dQ, dK, dV of the kernels, on leaf copies of q, k, v (clone keeps their strides)."""
    qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
    assert [t.stride() for t in (qg, kg, vg)] == [t.stride() for t in (q, k, v)]
    o = flash_attention_triton(qg, kg, vg, is_causal)
    o.backward(do)
    return {"o": o.detach(), "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}


def check_against_reference(q, k, v, do, is_causal, dtype=torch.float32):
    ref = {n: t.to(DEVICE) for n, t in reference(q, k, v, do, is_causal).items()}
    err = torch_error(q, k, v, do, is_causal, ref) if dtype != torch.float32 else None
    assert_close(grads_of(q, k, v, do, is_causal), ref, dtype, err)


def plans(kind):
    return [p for key, p in flash_triton._PLANS.items() if key[0] == kind]


def test_second_call_with_the_same_signature_reuses_the_plan(monkeypatch):
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    for seed in range(3):  # new values, same shapes, strides and dtype: one plan each way
        q, k, v, do = make_inputs((1, 2, 37, 32), (1, 2, 37, 32), torch.float32, seed=seed,
                                  device=DEVICE)
        check_against_reference(q, k, v, do, True)
    (fwd,), (bwd,) = plans("fwd"), plans("bwd")
    assert (fwd.hits, bwd.hits) == (2, 2)
    assert not fwd.views and not bwd.views


def test_a_new_shape_dtype_mask_or_layout_gets_its_own_plan(monkeypatch):
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    base = ((1, 2, 21, 16), (1, 2, 21, 16), torch.float32, True)
    variants = [
        base,
        ((1, 2, 29, 16), (1, 2, 29, 16), torch.float32, True),  # shape
        ((1, 2, 21, 16), (1, 2, 21, 16), torch.float16, True),  # dtype
        ((1, 2, 21, 16), (1, 2, 21, 16), torch.float32, False),  # mask
    ]
    for n, (shape_q, shape_kv, dtype, causal) in enumerate(variants, start=1):
        q, k, v, do = make_inputs(shape_q, shape_kv, dtype, seed=n, device=DEVICE)
        check_against_reference(q, k, v, do, causal, dtype)
        assert len(plans("fwd")) == len(plans("bwd")) == n
    # strides: the same values, with k and v as (B, H, T, D) views of (B, T, H, D)
    q, k, v, do = make_inputs(*base[:3], seed=1, device=DEVICE)
    k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (k, v))
    check_against_reference(q, k, v, do, True)
    assert len(plans("fwd")) == len(variants) + 1
    assert all(p.hits == 0 for p in flash_triton._PLANS.values())


class RecordingKernel:
    """A kernel wrapper that records the tensors each launch receives, then runs it."""

    def __init__(self, kernel):
        self.kernel, self.arg_names, self.seen = kernel, kernel.arg_names, []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.seen.append([(a.data_ptr(), a.stride()) for a in args if torch.is_tensor(a)])
            return self.kernel[grid](*args, **kwargs)

        return launch


@pytest.mark.slow
def test_strided_views_reach_the_kernels_without_a_copy(monkeypatch):
    # The model's inputs: (B, H, T, D) views of (B, T, H, D) projections, for two calls.
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    spies = {n: RecordingKernel(flash_triton._KERNELS[n]) for n in ("fwd", "dkdv", "dq")}
    for name, spy in spies.items():
        monkeypatch.setitem(flash_triton._KERNELS, name, spy)
    # On CUDA the autotuner would launch its own wrapped kernels, past the spies.
    with flash_triton.pinned_tiles():
        for seed in range(2):
            q, k, v, do = make_inputs((2, 19, 2, 16), (2, 35, 2, 16), torch.float32, seed=seed,
                                      device=DEVICE)
            q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
            assert not q.is_contiguous()
            check_against_reference(q, k, v, do, True)
            o = flash_attention_triton(q, k, v, True)
            assert o.stride() == q.stride()  # O in the callers' memory order: its transpose is free
            q_ptr, q_stride = spies["fwd"].seen[-1][0]
            assert q_ptr == q.data_ptr() and q_stride == q.stride()  # the caller's tensor itself
    assert [len(s.seen) for s in spies.values()] == [4, 2, 2]
    # every tensor the backward kernels read kept its (B, T, H, D) layout: no copies
    assert all(stride[1] == 16 for seen in spies["dq"].seen for _, stride in seen[:4])
    fwd_and_bwd = [(p.hits, p.views) for p in flash_triton._PLANS.values()]
    assert fwd_and_bwd == [(3, False), (1, False)]  # 4 forward calls, 2 backward, one layout


@pytest.mark.parametrize(
    "layout", ["5d", "head-dim-strided", "3d"], ids=["5d", "head-dim-strided", "3d"]
)
def test_inputs_that_need_a_view_or_a_copy(monkeypatch, layout):
    # Leading dims flattened (5-D), a head dim that is not unit-stride (copied), 3-D inputs;
    # each called twice, so that both the first (planning) call and a reuse are checked.
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    shape = {"5d": (2, 1, 2, 23, 16), "head-dim-strided": (1, 2, 23, 16), "3d": (2, 23, 16)}
    for seed in range(2):
        q, k, v, do = make_inputs(shape[layout], shape[layout], torch.float32, seed=seed,
                                  device=DEVICE)
        if layout == "head-dim-strided":
            q = q.transpose(-1, -2).contiguous().transpose(-1, -2)
            assert q.stride(-1) != 1
        check_against_reference(q, k, v, do, True)
    assert all(p.hits == 1 for p in flash_triton._PLANS.values())
    assert all(p.views == (layout != "3d") for p in flash_triton._PLANS.values())


def test_direct_launch_passes_every_argument_in_signature_order(monkeypatch):
    # On CUDA a reused plan runs the compiled kernel handle with all arguments positional,
    # constexprs included (flash_triton._Launch). Here a stand-in "handle" runs the
    # interpreted kernel with exactly those positional arguments; O must still be right.
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    q, k, v, do = make_inputs((1, 2, 37, 32), (1, 2, 45, 32), torch.float32, device=DEVICE)
    flash_attention_triton(q, k, v, True)
    (plan,) = plans("fwd")
    first = plan.launches[0]
    ran = []

    class Handle:  # what CompiledKernel[grid] returns: a runner taking all args positionally
        def __getitem__(self, grid):
            assert grid == first.grid

            def runner(*args):
                ran.append(len(args))
                first.kernel[grid](*args)

            return runner

    direct = flash_triton._Launch(first.kernel, first.grid, first.args, first.meta, None, Handle())
    monkeypatch.setattr(plan, "launches", (direct,))
    o = flash_attention_triton(q, k, v, True)
    assert ran == [len(first.kernel.arg_names)]
    ref = reference(q, k, v, do, True)["o"].to(DEVICE)
    assert (o.double() - ref).abs().max().item() < 1e-5


@pytest.mark.skipif(DEVICE == "cuda", reason="a patch of Triton's interpreter")
@pytest.mark.slow
def test_interpreter_patch_changes_no_result(monkeypatch):
    """tests/conftest.py spares the interpreter a swap of triton.language at every helper call
    and its int32 overflow checks (INTERPRETER_PATCHED): the kernels give the same bits,
    forward and backward, without either."""
    from triton.runtime import interpreter

    from tests.conftest import INTERPRETER_OPTIONS, INTERPRETER_PATCHED, OVERFLOW_CHECKS_ENV

    assert INTERPRETER_PATCHED  # the patch applies to this Triton
    # and so does the option, unless asked to keep the checks
    assert (INTERPRETER_OPTIONS is None) == (os.environ.get(OVERFLOW_CHECKS_ENV) == "1")
    shapes = ((1, 2, 37, 32), (1, 2, 45, 32), torch.float32, True)
    patched, _, _ = run_flash(*shapes, seed=8)
    monkeypatch.setattr(interpreter, "_patch_lang", interpreter._patch_lang.original)
    monkeypatch.setattr(interpreter.GridExecutor, "__call__",
                        interpreter.GridExecutor.__call__.original)
    if INTERPRETER_OPTIONS is not None:
        builder = interpreter.interpreter_builder
        assert not builder.options.sanitize_overflow and INTERPRETER_OPTIONS.sanitize_overflow
        monkeypatch.setattr(builder, "options", INTERPRETER_OPTIONS)
    plain, _, _ = run_flash(*shapes, seed=8)
    assert patched.keys() == plain.keys()
    for name in plain:
        assert torch.equal(patched[name], plain[name]), name
