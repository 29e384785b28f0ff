"""Attention on CUDA (marked gpu: skipped without CUDA, run on a lent GPU).

Fast on purpose: every gpu test together should take under two minutes of an H100. Autotuning
compiles and times every fitting tile candidate for every new shape (320 s for the earlier
version of this file), and flash-torch's compiled backward compiles per shape. Here the
Triton kernels run pinned tiles (flash_triton.pinned_tiles) and flash-torch's backward runs
eagerly (the same function, uncompiled); one test keeps each of autotuning and the compiled
backward. The cases cover every dtype, causal and not, odd lengths and head dims 16 to 128
pairwise rather than as a full product.
"""

import pytest
import torch
from typer.testing import CliRunner

from cs336sys.cli import app
from tests.attention_ref import assert_close, make_inputs, reference, torch_error
from tests.conftest import view_rows

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fast_kernels")]
runner = CliRunner()
rows = view_rows("attention_runs")

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
CASES = [  # (shape, dtype, causal): each dtype, both maskings, d 16, 64, 80, 128, odd lengths
    ((2, 300, 64), F32, True),
    ((2, 300, 64), BF16, False),
    ((1, 4, 1000, 128), F16, True),
    ((1, 4, 1000, 128), BF16, True),
    ((2, 2, 257, 80), F32, False),
    ((2, 2, 257, 80), F16, False),
    ((1, 2, 129, 16), BF16, True),
    ((1, 2, 129, 16), F32, True),
]


@pytest.fixture
def fast_kernels(monkeypatch):
    from cs336sys.attention import flash_triton

    monkeypatch.setenv("CS336SYS_FLASH_TORCH_COMPILE", "0")
    with flash_triton.pinned_tiles():
        yield


def check_both(shape, dtype, causal, impls=None):
    """FlashAttention2Torch and FlashAttention2Triton against float64: O, dQ, dK, dV."""
    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton

    q, k, v, do = make_inputs(shape, shape, dtype, device="cuda")
    ref = reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal)
    ref = {n: t.cuda() for n, t in ref.items()}
    err = None if dtype == torch.float32 else torch_error(q, k, v, do, causal, ref)
    for fn in impls or (FlashAttention2Torch, FlashAttention2Triton):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn.apply(qq, kk, vv, causal)
        o.backward(do)
        got = {"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}
        assert_close(got, ref, dtype, err)


@pytest.mark.parametrize("shape, dtype, causal", CASES)
def test_flash_kernels_on_cuda_match_float64(shape, dtype, causal):
    check_both(shape, dtype, causal)


def test_autotuned_triton_kernels_match_float64():
    """Autotuning on: a short sequence, so the pruner keeps few candidates to compile."""
    from cs336sys.attention import FlashAttention2Triton, flash_triton

    with flash_triton.pinned_tiles(False):
        check_both((1, 2, 63, 64), BF16, True, impls=(FlashAttention2Triton,))


def as_layout(t, layout):
    """A copy of t, 'contiguous', 'misaligned' (2 bytes past a 16-byte boundary, which Triton
    specializes pointers on) or 'transposed' (the model's (B, H, T, D) views of (B, T, H, D));
    a leaf that can require grad."""
    if layout == "misaligned":
        base = torch.zeros(t.numel() + 1, dtype=t.dtype, device=t.device)
        out = base[1:].view(t.shape)
    elif layout == "transposed":
        out = torch.empty_like(t.transpose(1, 2), memory_format=torch.contiguous_format)
        out = out.transpose(1, 2)  # (B, T, H, D) memory, seen as (B, H, T, D)
    else:
        out = torch.empty_like(t, memory_format=torch.contiguous_format)
    return out.copy_(t)


@pytest.mark.parametrize("layout", ["contiguous", "misaligned", "transposed"])
def test_reused_launch_plans_run_the_compiled_kernel_handle(monkeypatch, layout):
    """The first call of a signature plans and compiles, later ones launch the
    compiled kernel handle directly; each layout gets its own plan and stays exact."""
    from cs336sys.attention import flash_triton

    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "DIRECT_LAUNCH", True)  # the default; the env can unset it
    shape, dtype, causal = (1, 2, 257, 64), BF16, True
    q, k, v, do = make_inputs(shape, shape, dtype, device="cuda")
    ref = reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal)
    ref = {n: t.cuda() for n, t in ref.items()}
    err = torch_error(q, k, v, do, causal, ref)
    for _ in range(3):
        qq, kk, vv = (as_layout(t, layout).requires_grad_() for t in (q, k, v))
        assert (qq.data_ptr() % 16 != 0) == (layout == "misaligned")
        assert qq.is_contiguous() == (layout != "transposed")
        o = flash_triton.FlashAttention2Triton.apply(qq, kk, vv, causal)
        o.backward(as_layout(do, layout))
        assert_close({"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}, ref, dtype, err)
    plans = list(flash_triton._PLANS.values())
    assert [(p.hits, p.views) for p in plans] == [(2, False), (2, False)]  # forward, backward
    assert all(launch.run is not None for p in plans for launch in p.launches)


TMA_CASES = [  # the descriptor kernels: each dtype, both maskings, padded head dims, odd lengths
    ((1, 4, 1000, 128), BF16, True),
    ((1, 4, 1000, 64), F16, False),
    ((2, 2, 257, 80), BF16, False),
    ((1, 2, 129, 16), F16, True),
    ((2, 300, 64), F32, True),
]


@pytest.mark.parametrize("shape, dtype, causal", TMA_CASES)
def test_tma_kernels_on_hopper_match_float64(monkeypatch, shape, dtype, causal):
    """The kernels' TMA build, forced (it is opt-in), on an H100."""
    from cs336sys.attention import FlashAttention2Triton, flash_triton

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA descriptors need compute capability 9 (Hopper) or newer")
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "FORCE_TMA", True)
    check_both(shape, dtype, causal, impls=(FlashAttention2Triton,))
    assert [p.variant for p in flash_triton._PLANS.values()] == ["tma", "tma"]


def test_opted_in_tma_kernels_run_the_leaderboard_layout_and_reuse_plans(monkeypatch):
    """CS336SYS_TRITON_TMA=1 on Hopper picks them for bf16 (not fp32), also for the model's
    (B, H, T, D) views, with plans reused and launched as compiled handles."""
    from cs336sys.attention import flash_triton

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA descriptors need compute capability 9 (Hopper) or newer")
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "TMA", True)
    monkeypatch.setattr(flash_triton, "DIRECT_LAUNCH", True)
    shape, causal = (1, 4, 513, 64), True
    q, k, v, do = make_inputs(shape, shape, BF16, device="cuda")
    ref = {n: t.cuda() for n, t in reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal).items()}
    err = torch_error(q, k, v, do, causal, ref)
    for _ in range(3):
        qq, kk, vv = (as_layout(t, "transposed").requires_grad_() for t in (q, k, v))
        o = flash_triton.FlashAttention2Triton.apply(qq, kk, vv, causal)
        o.backward(as_layout(do, "transposed"))
        assert_close({"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}, ref, BF16, err)
    plans = list(flash_triton._PLANS.values())
    assert [(p.variant, p.hits, p.views) for p in plans] == [("tma", 2, False)] * 2
    flash_triton.flash_attention_triton(q.float(), k.float(), v.float(), causal)
    assert list(flash_triton._PLANS.values())[-1].variant == "pointer"


ATOMIC_CASES = [  # the opt-in atomic-dQ backward: each dtype, both maskings, d 64, 80, 128
    ((1, 4, 1000, 64), BF16, True),
    ((1, 4, 1000, 128), F16, False),
    ((2, 2, 257, 80), BF16, True),
    ((2, 300, 64), F32, True),
]


@pytest.mark.parametrize("tma, reduce", [(False, False), (True, False), (True, True)],
                         ids=["pointer", "tma", "tma-reduce"])
@pytest.mark.parametrize("shape, dtype, causal", ATOMIC_CASES)
def test_atomic_dq_on_cuda_matches_float64(monkeypatch, shape, dtype, causal, tma, reduce):
    """dQ added into float32 in the dK/dV kernel (opt-in): with atomics, or a TMA reduction
    of each tile (REDUCE_DQ)."""
    from cs336sys.attention import FlashAttention2Triton, flash_triton

    if tma and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("TMA descriptors need compute capability 9 (Hopper) or newer")
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "ATOMIC_DQ", True)
    monkeypatch.setattr(flash_triton, "REDUCE_DQ", reduce)
    monkeypatch.setattr(flash_triton, "FORCE_TMA", tma)
    check_both(shape, dtype, causal, impls=(FlashAttention2Triton,))
    assert [(p.atomic_dq, p.reduce_dq) for p in flash_triton._PLANS.values()] == [
        (False, False), (True, reduce)]


@pytest.mark.parametrize("shape, dtype, causal, q_scale, heavy, loop", [
    ((1, 4, 1000, 128), BF16, True, 1.0, True, "lazy-rescale"),
    ((1, 4, 1000, 128), BF16, True, 1.0, True, "warp-specialize"),
    ((2, 300, 64), F32, True, 8.0, True, "lazy-rescale"),  # peaked rows: the lazy max moves
    ((2, 4, 300, 64), BF16, True, 8.0, False, "warp-specialize"),
    ((2, 2, 257, 80), F16, False, 1.0, True, "warp-specialize"),
])
def test_forward_opt_ins_on_cuda_match_float64(monkeypatch, shape, dtype, causal, q_scale,
                                                heavy, loop):
    """The forward opt-ins compiled: causal tiles launched longest first (also the dQ
    kernel's), the running max moved only past 2^8 (one scalar branch per key tile), and the
    one masked loop split into warp groups (16-bit, TMA; the dK/dV kernel's too)."""
    from cs336sys.attention import FlashAttention2Triton, flash_triton

    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "HEAVY_FIRST", heavy)
    monkeypatch.setattr(flash_triton, "LAZY_RESCALE", loop == "lazy-rescale")
    monkeypatch.setattr(flash_triton, "WARP_SPECIALIZE", loop == "warp-specialize")
    q, k, v, do = make_inputs(shape, shape, dtype, device="cuda")
    q = (q.float() * q_scale).to(dtype)
    ref = {n: t.cuda() for n, t in reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal).items()}
    err = None if dtype == torch.float32 else torch_error(q, k, v, do, causal, ref)
    qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
    o = FlashAttention2Triton.apply(qq, kk, vv, causal)
    o.backward(do)
    assert_close({"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}, ref, dtype, err)
    fwd, bwd = flash_triton._LAST["fwd"], flash_triton._LAST["bwd"]
    assert (fwd.heavy_first, fwd.lazy_rescale, fwd.warp_specialize) == (
        heavy and causal, loop == "lazy-rescale", loop == "warp-specialize")
    # the dK/dV kernel's loop, which reads L and D by TMA: 16-byte rows
    assert bwd.warp_specialize == (loop == "warp-specialize" and shape[-2] % 4 == 0)


@pytest.mark.parametrize("reduce", [False, True], ids=["atomics", "tma-reduce"])
def test_autotuned_atomic_dq_starts_every_trial_from_zero(monkeypatch, reduce):
    """The autotuner runs each candidate on the same buffers: the float32 dQ they add into
    must be zeroed before every trial and before the real run (reset_to_zero), or dQ comes
    out as the sum of the trials. A short sequence keeps the candidates few."""
    from cs336sys.attention import FlashAttention2Triton, flash_triton

    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "ATOMIC_DQ", True)
    monkeypatch.setattr(flash_triton, "REDUCE_DQ", reduce)
    with flash_triton.pinned_tiles(False):
        check_both((1, 2, 63, 64), BF16, True, impls=(FlashAttention2Triton,))


def test_compiled_flash_torch_backward_matches_float64(monkeypatch):
    from cs336sys.attention import FlashAttention2Torch

    monkeypatch.setenv("CS336SYS_FLASH_TORCH_COMPILE", "1")
    check_both((1, 2, 257, 64), BF16, True, impls=(FlashAttention2Torch,))


def test_leaderboard_preset_runs_with_do_bench_and_sdpa_backends_by_name(tmp_path):
    db = tmp_path / "r.db"
    for impl, backend in (("triton,sdpa", "flash"), ("sdpa", "cudnn")):
        result = runner.invoke(app, ["attention", "--preset", "leaderboard", "--impl", impl,
                                     "--sdpa-backend", backend, "--min-time", "0.2",
                                     "--db", str(db)])
        assert result.exit_code == 0, result.output
    got = [(r["impl"], r["status"], r["timer"], r["interpreted"], r["sdpa_backend_used"])
           for r in rows(db)]
    assert got == [
        ("triton", "ok", "do-bench", 0, None),
        ("sdpa", "ok", "do-bench", 0, "flash"),
        ("sdpa", "ok", "do-bench", 0, "cudnn"),
    ]
    assert all(r["max_err_grad"] < 0.05 and r["e2e_ms_mean"] > 0 for r in rows(db))
    for r in rows(db):  # do_bench asked again until --iters samples and --min-time seconds
        for phase in ("fwd", "bwd", "e2e"):
            n, mean = r[f"{phase}_ms_n"], r[f"{phase}_ms_mean"]
            assert n >= r["iters"] and n * mean >= 0.2e3 * 0.999, (phase, n, mean)
        assert r["host_us"] > 0


@pytest.mark.parametrize("order", ["naive,triton", "triton,naive"])
def test_memory_counts_the_points_own_tensors_whichever_ran_before(tmp_path, order):
    """Before backward a Triton point holds Q, K, V, dO, O and the fp32 logsumexp, exactly,
    first in a sweep or after naive's matmuls (whose cuBLAS workspace, 32 MiB on an H100,
    stays); its peak is one pass's, without do_bench's 256 MB L2-flush buffer."""
    db = tmp_path / "r.db"
    b, t, d = 2, 1024, 64
    result = runner.invoke(app, ["attention", "--impl", order, "--seq", str(t), "--d-head",
                                 str(d), "--batch", str(b), "--precision", "bf16", "--timer",
                                 "do-bench", "--iters", "5", "--db", str(db)])
    assert result.exit_code == 0, result.output
    triton = next(r for r in rows(db) if r["impl"] == "triton")
    assert triton["mem_before_bwd_bytes"] == 5 * b * t * d * 2 + b * t * 4
    assert triton["peak_bytes"] < 256e6 / 4
