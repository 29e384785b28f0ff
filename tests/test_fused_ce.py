"""Fused LM head + cross-entropy against the materialised baseline and float64.

The baseline is what the training step computes (cs336sys/experiments/training_step.py):
F.cross_entropy((h @ W^T).float(), targets), the matmul under autocast when there is one.
The float64 reference is the same formula in float64, with no autocast: the exact answer
both are compared to. The Triton kernel runs in the interpreter on CPU (conftest sets
TRITON_INTERPRET=1 when there is no CUDA).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cs336sys.measure.live_tensors import LiveTensorTracker
from cs336sys.measure.memory import saved_tensor_bytes
from cs336sys.models import ModelConfig, TransformerLM
from cs336sys.models.fused_ce import default_chunk_rows, linear_cross_entropy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
BF16 = torch.bfloat16


def _triton_available() -> bool:
    try:
        from cs336sys.models import fused_ce_triton

        fused_ce_triton.check_available(DEVICE)
    except (ImportError, RuntimeError):
        return False
    return True


needs_triton = pytest.mark.skipif(
    not _triton_available(), reason="Triton kernels need CUDA or TRITON_INTERPRET=1"
)


def make_inputs(shape, c=24, v=157, seed=0, ignored=0, dtype=torch.float32):
    """h (*shape, c), weight (v, c) leaves; targets (*shape) with `ignored` rows at -100."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(*shape, c, generator=g).to(DEVICE, dtype).requires_grad_()
    # a weight scale that gives logits of a few units, as a trained LM head does
    w = (torch.randn(v, c, generator=g) / c**0.5 * 3).to(DEVICE, dtype).requires_grad_()
    t = torch.randint(v, shape, generator=g)
    t.view(-1)[torch.randperm(t.numel(), generator=g)[:ignored]] = -100
    return h, w, t.to(DEVICE)


def baseline(h, w, t, reduction="mean", amp=None):
    """The training step's loss: logits materialised (under autocast when amp), then fp32 CE."""
    with torch.autocast(h.device.type, dtype=amp or BF16, enabled=amp is not None):
        logits = h @ w.T  # (..., V)
    return F.cross_entropy(logits.flatten(0, -2).float(), t.flatten(), reduction=reduction)


def float64_reference(h, w, t, reduction="mean"):
    logits = h.double() @ w.double().T  # (..., V), float64 throughout
    return F.cross_entropy(logits.flatten(0, -2), t.flatten(), reduction=reduction)


def loss_and_grads(fn, h, w, t, **kwargs):
    loss = fn(h, w, t, **kwargs)
    gh, gw = torch.autograd.grad(loss, (h, w))
    return loss.detach(), gh, gw


def fused(h, w, t, amp=None, **kwargs):
    with torch.autocast(h.device.type, dtype=amp or BF16, enabled=amp is not None):
        return linear_cross_entropy(h, w, t, **kwargs)


def rel_err(x, ref) -> float:
    """max |x - ref| / max |ref|, in float64."""
    x, ref = x.double(), ref.double()
    return ((x - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()


# --- float32: tight against float64 and the baseline -------------------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize(
    "shape, chunk_rows",
    [((37,), 8), ((37,), 1), ((37,), 37), ((37,), 1000), ((3, 13), 5), ((2, 4, 6), None)],
    ids=["2d-chunk8", "2d-chunk1", "2d-one-chunk", "2d-chunk>N", "3d-chunk5", "4d-default"],
)
def test_float32_matches_float64_and_baseline(shape, chunk_rows, reduction):
    h, w, t = make_inputs(shape)
    loss, gh, gw = loss_and_grads(fused, h, w, t, reduction=reduction, chunk_rows=chunk_rows)
    ref_loss, ref_gh, ref_gw = loss_and_grads(float64_reference, h, w, t, reduction=reduction)
    base_loss, base_gh, base_gw = loss_and_grads(baseline, h, w, t, reduction=reduction)

    assert loss.dtype == torch.float32 and loss.shape == ()
    assert gh.shape == h.shape and gh.dtype == h.dtype and gw.dtype == w.dtype
    assert rel_err(loss, ref_loss) < 1e-5
    assert rel_err(gh, ref_gh) < 1e-5
    assert rel_err(gw, ref_gw) < 1e-5
    torch.testing.assert_close(loss, base_loss, rtol=1e-5, atol=0)
    assert rel_err(gh, base_gh) < 1e-5 and rel_err(gw, base_gw) < 1e-5


def test_float64_inputs_pass_gradcheck():
    """Backward against finite differences of the forward, in float64 (no autocast; the
    softmax is in float64 too: "at least float32")."""
    h, w, t = make_inputs((7,), c=5, v=11, dtype=torch.float64, ignored=1)
    loss = linear_cross_entropy(h, w, t, chunk_rows=3)
    assert loss.dtype == torch.float64
    torch.testing.assert_close(loss, float64_reference(h, w, t), rtol=1e-12, atol=0)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, t, chunk_rows=3), (h, w)
    )
    assert torch.autograd.gradcheck(
        lambda h, w: linear_cross_entropy(h, w, t, chunk_rows=2, reduction="sum"), (h, w)
    )


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_ignore_index_as_torch(reduction):
    h, w, t = make_inputs((41,), ignored=9)
    loss, gh, gw = loss_and_grads(fused, h, w, t, reduction=reduction, chunk_rows=6)
    ref_loss, ref_gh, ref_gw = loss_and_grads(float64_reference, h, w, t, reduction=reduction)
    assert rel_err(loss, ref_loss) < 1e-5 and rel_err(gw, ref_gw) < 1e-5
    assert rel_err(gh, ref_gh) < 1e-5
    assert gh[t == -100].abs().max() == 0  # ignored rows get no gradient


def test_upstream_gradient_scales_the_kept_gradients():
    h, w, t = make_inputs((19,))
    h2, w2 = (x.detach().clone().requires_grad_() for x in (h, w))
    (3.5 * linear_cross_entropy(h, w, t, chunk_rows=4)).backward()
    linear_cross_entropy(h2, w2, t, chunk_rows=4).backward()
    torch.testing.assert_close(h.grad, 3.5 * h2.grad, rtol=1e-6, atol=0)
    torch.testing.assert_close(w.grad, 3.5 * w2.grad, rtol=1e-6, atol=0)


def test_frozen_weight_and_no_grad():
    h, w, t = make_inputs((23,))
    w.requires_grad_(False)
    loss = linear_cross_entropy(h, w, t, chunk_rows=4)
    (gh,) = torch.autograd.grad(loss, (h,))
    assert rel_err(gh, torch.autograd.grad(baseline(h, w, t), (h,))[0]) < 1e-5
    with torch.no_grad():
        loss = linear_cross_entropy(h, w, t, chunk_rows=4)
    assert not loss.requires_grad
    torch.testing.assert_close(loss, baseline(h, w, t).detach(), rtol=1e-5, atol=0)


# --- bfloat16: within bf16 error of float64, as the baseline is ----------------------------------


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("shape, chunk_rows", [((45,), 8), ((3, 11), 7)], ids=["2d", "3d"])
def test_bf16_autocast_matches_baseline(shape, chunk_rows, reduction):
    """Under autocast both do the matmuls in bf16: the loss and grad_h agree with the baseline
    to float32 rounding (same bf16 logits), grad_W to bf16 rounding (fp32 accumulation of
    per-chunk bf16 products against one bf16 product); both are as close to float64."""
    h, w, t = make_inputs(shape, c=32, v=301)
    kw = {"reduction": reduction}
    loss, gh, gw = loss_and_grads(fused, h, w, t, amp=BF16, chunk_rows=chunk_rows, **kw)
    base_loss, base_gh, base_gw = loss_and_grads(baseline, h, w, t, amp=BF16, **kw)
    ref_loss, ref_gh, ref_gw = loss_and_grads(float64_reference, h, w, t, **kw)

    assert loss.dtype == torch.float32 and gh.dtype == torch.float32 and gw.dtype == torch.float32
    assert rel_err(loss, base_loss) < 1e-5
    assert rel_err(gh, base_gh) < 2**-8
    assert rel_err(gw, base_gw) < 2**-7
    # the matmuls did run in bf16: float32 would be 100x closer to float64
    assert rel_err(loss, ref_loss) > 1e-5
    for ours, base, ref in (
        (loss, base_loss, ref_loss),
        (gh, base_gh, ref_gh),
        (gw, base_gw, ref_gw),
    ):
        assert rel_err(ours, ref) < 2 * rel_err(base, ref) + 2**-9


def test_addmm_sum_needs_cuda():
    """grad_w_sum="addmm" (cuBLAS adds the 16-bit product into the float32 accumulator) has
    CUDA kernels only: on a CPU it is refused in words, not failed inside the pass."""
    h, w, t = (x.cpu() for x in make_inputs((9,), c=8, v=31))
    with pytest.raises(ValueError, match="grad_w_sum='addmm' needs CUDA"):
        linear_cross_entropy(h, w, t, grad_w_sum="addmm")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_addmm_sum_matches_float64_at_least_as_well_as_add(reduction):
    """Summed by the GEMM in float32, grad_W skips the per-chunk rounding of its product to
    bf16: as close to float64 as "add" or closer, with the same loss and grad_h. Where this
    torch's addmm cannot add into a float32 input, the sum is refused in words instead."""
    from cs336sys.models.fused_ce import _addmm_adds_into_float32

    h, w, t = make_inputs((3, 41), c=64, v=997)
    kw = {"reduction": reduction, "chunk_rows": 16}
    if not _addmm_adds_into_float32(h.device):
        with pytest.raises(ValueError, match="cannot add into the float32 accumulator"):
            loss_and_grads(fused, h, w, t, amp=BF16, grad_w_sum="addmm", **kw)
        return
    loss, gh, gw = loss_and_grads(fused, h, w, t, amp=BF16, grad_w_sum="addmm", **kw)
    add_loss, add_gh, add_gw = loss_and_grads(fused, h, w, t, amp=BF16, **kw)
    ref_loss, ref_gh, ref_gw = loss_and_grads(float64_reference, h, w, t, reduction=reduction)
    assert gw.dtype == torch.float32
    torch.testing.assert_close(loss, add_loss, rtol=0, atol=0)
    torch.testing.assert_close(gh, add_gh, rtol=0, atol=0)
    assert rel_err(gw, ref_gw) <= 1.01 * rel_err(add_gw, ref_gw) + 1e-7
    assert rel_err(gw, ref_gw) < 2**-7


def test_bf16_weights_without_autocast():
    """A model cast to bf16: the matmuls in bf16, gradients returned in bf16."""
    h, w, t = make_inputs((29,), c=32, v=301, dtype=BF16)
    loss, gh, gw = loss_and_grads(fused, h, w, t, chunk_rows=6)
    ref_loss, ref_gh, ref_gw = loss_and_grads(float64_reference, h, w, t)
    assert gh.dtype == BF16 and gw.dtype == BF16 and loss.dtype == torch.float32
    assert rel_err(loss, ref_loss) < 2**-8
    assert rel_err(gh, ref_gh) < 2**-6 and rel_err(gw, ref_gw) < 2**-6


# --- memory: the logits are never all there ---------------------------------------------------------


def test_keeps_only_the_gradients_and_never_holds_all_logits():
    n, c, v, chunk = 512, 16, 2048, 64
    h, w, t = make_inputs((n,), c=c, v=v)
    logits_bytes = n * v * 4

    _, saved = saved_tensor_bytes(lambda: linear_cross_entropy(h, w, t, chunk_rows=chunk))
    assert saved == n * c * 4 + v * c * 4  # grad_h and grad_W, nothing of size N x V

    def peak(fn) -> int:
        with LiveTensorTracker() as tracker:
            fn(h, w, t).backward()
        h.grad = w.grad = None
        return tracker.peak

    fused_peak = peak(lambda *a: linear_cross_entropy(*a, chunk_rows=chunk))
    base_peak = peak(baseline)
    grads = 2 * (n * c * 4 + v * c * 4)  # kept gradients, and .grad
    assert base_peak > 2 * logits_bytes  # logits and their gradient
    assert fused_peak < grads + 3 * chunk * v * 4  # a chunk's logits, softmax, dlogits


def test_default_chunk_rows():
    # vocab 151936, d 4096, batch 2 x 32768: fp32 chunk logits <= 512 MiB (883 rows) -> 512
    assert default_chunk_rows(65536, 151936, 4096) == 512
    # N C / V = 66 rows would be as many logits as h has elements; at least 256 rows
    assert default_chunk_rows(4096, 32000, 512) == 256
    # many rows per vocab entry: N C / V = 2048 rows, within 512 MiB
    assert default_chunk_rows(65536, 1024, 32) == 2048
    # a vocab of 2^21: 512 MiB of fp32 logits is 64 rows, below 256
    assert default_chunk_rows(10**5, 2**21, 64) == 64
    assert default_chunk_rows(100, 1000, 8) == 100  # fewer rows than a chunk: one chunk


# --- through a TransformerLM's head ----------------------------------------------------------------


def _hidden(model, ids):
    """The final norm's output (B, T, C): the model's forward without the LM head."""
    x = model.token_embeddings(ids)
    positions = torch.arange(ids.shape[1], device=ids.device)
    for layer in model.layers:
        x = layer(x, positions)
    return model.ln_final(x)


@pytest.mark.parametrize("amp", [None, BF16], ids=["fp32", "bf16"])
def test_training_step_gradients_through_a_transformer(amp):
    config = ModelConfig(d_model=32, d_ff=64, num_layers=2, num_heads=4, vocab_size=211,
                         context_length=16)
    torch.manual_seed(0)
    model = TransformerLM(config).to(DEVICE)
    ids = torch.randint(211, (3, 16), device=DEVICE)
    targets = torch.randint(211, (3, 16), device=DEVICE)

    with torch.autocast(DEVICE.split(":")[0], dtype=BF16, enabled=amp is not None):
        base = F.cross_entropy(model(ids).flatten(0, 1).float(), targets.flatten(), reduction="sum")
    base.backward()
    base_grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)

    with torch.autocast(DEVICE.split(":")[0], dtype=BF16, enabled=amp is not None):
        loss = linear_cross_entropy(_hidden(model, ids), model.lm_head.weight, targets,
                                    reduction="sum", chunk_rows=10)
    loss.backward()

    tol = 1e-5 if amp is None else 2**-7
    assert rel_err(loss, base.detach()) < (1e-6 if amp is None else 1e-5)
    for name, p in model.named_parameters():
        assert rel_err(p.grad, base_grads[name]) < tol, name


# --- bad input -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "change, match",
    [
        ({"reduction": "none"}, "reduction"),
        ({"impl": "cuda"}, "impl"),
        ({"chunk_rows": 0}, "chunk_rows"),
        ({"grad_w_sum": "fma"}, "grad_w_sum"),
        ({"t": torch.zeros(5, dtype=torch.long)}, "targets must have"),
        ({"t": torch.zeros(7)}, "integer"),
        ({"w": torch.zeros(10, 3)}, "weight must be"),
        ({"h": torch.zeros(4)}, "at least 2 dims"),
    ],
)
def test_bad_input_raises(change, match):
    h, w, t = make_inputs((7,), c=4, v=10)
    args = {"h": h, "w": w, "t": t, **{k: v for k, v in change.items() if k in "hwt"}}
    kwargs = {k: v for k, v in change.items() if k not in "hwt"}
    with pytest.raises(ValueError, match=match):
        linear_cross_entropy(args["h"], args["w"], args["t"], **kwargs)


# --- Triton --------------------------------------------------------------------------------------------


def _softmax_ce_reference(logits, targets, scale):
    """float64: loss per row, and (softmax - onehot) * scale, zero on ignored rows."""
    x = logits.double()
    valid = targets != -100
    safe = torch.where(valid, targets, 0)
    loss = torch.logsumexp(x, 1) - x.gather(1, safe[:, None]).squeeze(1)
    grad = torch.softmax(x, 1) - F.one_hot(safe, x.shape[1])
    return torch.where(valid, loss, 0), grad * scale * valid[:, None]


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("block_v", [64, None], ids=["many-slices", "default"])
def test_triton_kernel_against_float64(dtype, block_v):
    from cs336sys.models.fused_ce_triton import softmax_cross_entropy_

    g = torch.Generator().manual_seed(1)
    logits = (torch.randn(9, 300, generator=g) * 4).to(DEVICE, dtype)  # 300: masked tail
    targets = torch.randint(300, (9,), generator=g).to(DEVICE)
    targets[4] = -100
    scale = torch.tensor(0.125, device=DEVICE)
    ref_loss, ref_grad = _softmax_ce_reference(logits, targets, 0.125)

    kept = logits.clone()
    loss = softmax_cross_entropy_(kept, targets, scale, write_grad=False, block_v=block_v)
    assert torch.equal(kept, logits)  # untouched without write_grad
    row_loss = softmax_cross_entropy_(logits, targets, scale, block_v=block_v)
    assert torch.equal(loss, row_loss) and row_loss.dtype == torch.float32

    torch.testing.assert_close(row_loss.double(), ref_loss, rtol=1e-6, atol=1e-6)
    if dtype == torch.float32:
        torch.testing.assert_close(logits.double(), ref_grad, rtol=1e-5, atol=1e-8)
    else:  # one rounding to bf16, to nearest: at most half an ulp, 2^-8 relative (bf16 has
        # an 8-bit significand); a truncating cast would reach 2^-7
        err = (logits.double() - ref_grad).abs() / ref_grad.abs().clamp_min(1e-30)
        assert err[ref_grad != 0].max() <= 2**-8
        assert logits[4].abs().max() == 0


@needs_triton
@pytest.mark.parametrize("amp", [None, BF16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_triton_impl_matches_torch_impl_and_baseline(amp, reduction):
    h, w, t = make_inputs((3, 7), c=32, v=301, ignored=2)
    kw = {"reduction": reduction, "chunk_rows": 8, "amp": amp}
    loss, gh, gw = loss_and_grads(fused, h, w, t, impl="triton", **kw)
    t_loss, t_gh, t_gw = loss_and_grads(fused, h, w, t, impl="torch", **kw)
    b_loss, b_gh, b_gw = loss_and_grads(baseline, h, w, t, reduction=reduction, amp=amp)
    if amp is None:
        assert (
            rel_err(loss, b_loss) < 1e-5 and rel_err(gh, b_gh) < 1e-5 and rel_err(gw, b_gw) < 1e-5
        )
    else:
        # the same bf16 logits and the same dlogits up to one bf16 rounding of float32 values
        assert rel_err(loss, t_loss) < 1e-5 and rel_err(loss, b_loss) < 1e-5
        assert rel_err(gh, t_gh) < 2**-8 and rel_err(gw, t_gw) < 2**-8
        assert rel_err(gh, b_gh) < 2**-8 and rel_err(gw, b_gw) < 2**-7
