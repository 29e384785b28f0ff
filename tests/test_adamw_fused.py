"""The fused AdamWs (models/adamw_fused.py) against our reference AdamW, torch's, and the
update of Loshchilov & Hutter (2019, Algorithm 2) in float64, over several steps.

Without CUDA the Triton kernel runs in Triton's interpreter (conftest sets TRITON_INTERPRET=1
before any kernel module is imported); on a CUDA host the same tests run the compiled one.
Shapes include odd sizes that end mid-block, one that spans two blocks, a single element, a
zero-size tensor and a parameter that never gets a gradient (skipped: no state, untouched).
"""

from __future__ import annotations

import copy

import pytest
import torch

from cs336sys.models.adamw import AdamW
from cs336sys.models.adamw_fused import AdamWForeach, AdamWTriton
from tests.conftest import MICRO, invoke, query

triton = pytest.importorskip("triton")
from cs336sys.models import adamw_kernels  # noqa: E402

DEVICE = "cpu" if adamw_kernels.INTERPRETED else "cuda"
if DEVICE == "cuda" and not torch.cuda.is_available():  # pragma: no cover
    pytest.skip("Triton kernels need CUDA or TRITON_INTERPRET=1", allow_module_level=True)

BLOCK, CHUNK = adamw_kernels.BLOCK, adamw_kernels.CHUNK
# first group: 3 tensors; the multi-tensor kernel's full chunks (unmasked) and last chunks
SHAPES = [(1,), (37,), (2, CHUNK), (5, 300), (BLOCK + 1,), (3, 4, 5), (0, 4), (CHUNK + BLOCK + 5,)]
STEPS = 5
LR, BETAS, EPS = 1e-2, (0.9, 0.95), 1e-8
# The second group decays nothing, has its own lr and a beta1 below 0.5, so torch's lerp takes
# its other form (end - (end - self) * (1 - weight)) and the kernel must follow.
GROUP2 = {"lr": 3e-3, "weight_decay": 0.0, "betas": (0.3, 0.99)}

OURS = {
    "adamw-foreach": AdamWForeach,
    "adamw-triton": AdamWTriton,
    "adamw-triton-per-tensor": lambda groups, **kw: AdamWTriton(groups, multi_tensor=False, **kw),
}
TORCHS = {
    "torch-foreach": lambda groups, **kw: torch.optim.AdamW(groups, foreach=True, **kw),
    "torch-fused": lambda groups, **kw: torch.optim.AdamW(groups, fused=True, **kw),
}


def initial(dtype):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(s, generator=g).to(dtype) for s in SHAPES]


def gradients(dtype):
    """Per step, a gradient per shape (scaled per step so that m and v do not settle)."""
    g = torch.Generator().manual_seed(1)
    return [[(torch.randn(s, generator=g) * 0.5**t).to(dtype) for s in SHAPES]
            for t in range(STEPS)]


def groups_of(params, frozen):
    return [
        {"params": params[:3] + [frozen], "weight_decay": 0.1},
        {"params": params[3:], **GROUP2},
    ]


def train(factory, dtype, steps=STEPS, resume_from=None):
    """The parameters, the parameter without a gradient and the optimizer after `steps`
    steps of `factory` (from `resume_from`, a reference optimizer's state, when given)."""
    params = [torch.nn.Parameter(t.to(DEVICE)) for t in initial(dtype)]
    frozen = torch.nn.Parameter(torch.ones(7, dtype=dtype, device=DEVICE))
    opt = factory(groups_of(params, frozen), lr=LR, betas=BETAS, eps=EPS)
    first = 0
    if resume_from is not None:
        done, saved_params, state = resume_from
        with torch.no_grad():
            for p, saved in zip(params, saved_params, strict=True):
                p.copy_(saved)
        opt.load_state_dict(copy.deepcopy(state))
        first = done
    for grads in gradients(dtype)[first:steps]:
        for p, g in zip(params, grads, strict=True):
            p.grad = g.to(DEVICE)
        opt.step()
    return params, frozen, opt


def bf16_ulps(got, want):
    """|got - want| in units of the bfloat16 ulp at |want| (at least the smallest normal's)."""
    want = want.float()
    exponent = torch.floor(torch.log2(want.abs().clamp_min(2.0**-126)))
    return (got.float() - want).abs() / 2.0 ** (exponent - 7)


def assert_same_update(got, want, dtype):
    """fp32: parameters and moments within 1e-6. 16-bit: moments (float32) within 1e-6 and
    parameters within one ulp of their dtype, equal but for a few: the float32 update before
    the one rounding may differ in its last bit (other op order, FMA), which moves the result
    only when it sits next to a rounding boundary."""
    (params, frozen, opt), (ref_params, _, ref_opt) = got, want
    for i, (p, r) in enumerate(zip(params, ref_params, strict=True)):
        state, ref_state = opt.state[p], ref_opt.state[r]
        assert int(state["step"]) == ref_state["step"] == STEPS
        for key in ("exp_avg", "exp_avg_sq"):
            assert state[key].dtype == ref_state[key].dtype, key
            torch.testing.assert_close(state[key], ref_state[key], atol=1e-6, rtol=0, msg=key)
        if dtype == torch.float32:
            torch.testing.assert_close(p, r, atol=1e-6, rtol=0, msg=f"param {SHAPES[i]}")
        elif p.numel():
            ulps = ulp_distance(p, r, dtype)
            assert ulps.max() <= 1, SHAPES[i]
            assert (ulps > 0).float().mean() <= 0.01, SHAPES[i]
    assert frozen.grad is None and frozen not in opt.state
    assert torch.equal(frozen, torch.ones_like(frozen))


def ulp_distance(got, want, dtype):
    if dtype == torch.bfloat16:
        return bf16_ulps(got, want)
    # float16: 10 stored bits, exponent floor 2^-14
    exponent = torch.floor(torch.log2(want.float().abs().clamp_min(2.0**-14)))
    return (got.float() - want.float()).abs() / 2.0 ** (exponent - 10)


@pytest.mark.parametrize("name", [*OURS, *TORCHS])
def test_fp32_matches_the_reference(name):
    factory = OURS.get(name) or TORCHS[name]
    want = train(AdamW, torch.float32)
    assert_same_update(train(factory, torch.float32), want, torch.float32)
    # and it moved: the comparison is not of two untouched tensors
    moved = [(p.detach().cpu() - p0).abs().max() for p, p0 in zip(want[0], initial(torch.float32), strict=True)
             if p.numel()]
    assert min(moved) > 1e-3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("name", OURS)
@pytest.mark.slow
def test_16_bit_params_with_fp32_state_match_the_reference(name, dtype):
    want = train(AdamW, dtype)
    got = train(OURS[name], dtype)
    assert all(got[2].state[p]["exp_avg"].dtype == torch.float32 for p in got[0])
    assert all(p.dtype == dtype for p in got[0])
    assert_same_update(got, want, dtype)


def loshchilov_hutter(dtype, group_of_shape):
    """AdamW in float64 from its definition (Algorithm 2, with eta_t = 1, alpha = lr and the
    decay lr * wd as torch scales it): bias-corrected m_hat and v_hat, eps added to
    sqrt(v_hat). A 16-bit parameter is rounded to its dtype after each step, as stored."""
    params = [p.double() for p in initial(dtype)]
    m = [torch.zeros_like(p) for p in params]
    v = [torch.zeros_like(p) for p in params]
    for t, grads in enumerate(gradients(dtype), start=1):
        for i, g in enumerate(grads):
            lr, wd, (beta1, beta2) = group_of_shape[i]
            g = g.double()
            m[i] = beta1 * m[i] + (1 - beta1) * g
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
            m_hat, v_hat = m[i] / (1 - beta1**t), v[i] / (1 - beta2**t)
            params[i] = params[i] - lr * wd * params[i] - lr * m_hat / (v_hat.sqrt() + EPS)
            params[i] = params[i].to(dtype).double()
    return params, m, v


# torch keeps a bf16 parameter's state in bf16, another update: compared in fp32 only
FLOAT64_CASES = [(name, torch.float32) for name in ["adamw", *OURS, *TORCHS]] + [
    (name, torch.bfloat16) for name in ["adamw", *OURS]
]


@pytest.mark.parametrize(("name", "dtype"), FLOAT64_CASES, ids=lambda x: str(x).split(".")[-1])
@pytest.mark.slow
def test_every_version_matches_float64_math(name, dtype):
    factory = {"adamw": AdamW, **OURS}.get(name) or TORCHS[name]
    params, _, opt = train(factory, dtype)
    first = (LR, 0.1, BETAS)
    second = (GROUP2["lr"], GROUP2["weight_decay"], GROUP2["betas"])
    ref_params, ref_m, ref_v = loshchilov_hutter(dtype, [first] * 3 + [second] * (len(SHAPES) - 3))
    for i, p in enumerate(params):
        if not p.numel():
            continue
        state = opt.state[p]
        # float32 moments and an fp32 update carry a few float32 roundings per step
        for got, want in ((state["exp_avg"], ref_m[i]), (state["exp_avg_sq"], ref_v[i])):
            torch.testing.assert_close(got.double().cpu(), want, atol=1e-6, rtol=1e-6)
        if dtype == torch.float32:
            torch.testing.assert_close(p.double().cpu(), ref_params[i], atol=1e-6, rtol=1e-6)
        else:
            ulps = bf16_ulps(p.detach().cpu(), ref_params[i])
            assert ulps.max() <= 1 and (ulps > 0).float().mean() <= 0.01, SHAPES[i]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["adamw", *OURS])
def test_resumes_from_the_references_state_dict(name, dtype):
    """Three reference steps, its state_dict, two more steps in `name`: the same as five
    reference steps. A 16-bit parameter's moments stay float32 through the round trip
    (torch's load_state_dict would cast them to the parameter's dtype)."""
    params, _, ref = train(AdamW, dtype, steps=3)
    saved = (3, [p.detach().clone() for p in params], ref.state_dict())
    got = train({"adamw": AdamW, **OURS}[name], dtype, resume_from=saved)
    assert all(got[2].state[p]["exp_avg_sq"].dtype == torch.float32 for p in got[0])
    assert_same_update(got, train(AdamW, dtype), dtype)


def test_triton_refuses_what_it_cannot_run():
    with pytest.raises(ValueError, match="float32, bfloat16 or float16"):
        p = torch.nn.Parameter(torch.ones(3, dtype=torch.float64, device=DEVICE))
        p.grad = torch.ones_like(p)
        AdamWTriton([p]).step()
    with pytest.raises(ValueError, match="contiguous"):
        p = torch.nn.Parameter(torch.ones(4, 3, device=DEVICE).t())
        p.grad = torch.ones_like(p)
        AdamWTriton([p]).step()
    other = "cuda" if adamw_kernels.INTERPRETED else "cpu"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        adamw_kernels.check_available(other)


def test_the_optimizer_option_builds_each_version_and_refuses_triton_without_its_runtime(
    monkeypatch,
):
    from cs336sys.experiments import model
    from cs336sys.experiments.training_step import OPTIMIZERS, make_optimizer
    from cs336sys.sweep.points import SpecError

    p = [torch.nn.Parameter(torch.ones(3, device=DEVICE))]
    made = {name: make_optimizer(name, p) for name in OPTIMIZERS}
    assert type(made["adamw-foreach"]) is AdamWForeach
    assert type(made["adamw-triton"]) is AdamWTriton
    assert made["torch-adamw-fused"].defaults["fused"] is True
    assert made["torch-adamw"].defaults["fused"] is None

    if DEVICE == "cpu":
        monkeypatch.delenv("TRITON_INTERPRET")
        with pytest.raises(SpecError, match="--optimizer adamw-triton needs CUDA"):
            model.specs(optimizer=["adamw,adamw-triton"], device="cpu")
        # beside a train mode: the train points need Triton
        with pytest.raises(SpecError, match="--optimizer adamw-triton needs CUDA"):
            model.specs(optimizer=["adamw-triton"], mode=["forward", "train"], device="cpu")
        # forward alone has no optimizer step: the option would be ignored, so it is refused
        with pytest.raises(SpecError, match="--optimizer is the training step's"):
            model.specs(optimizer=["adamw-triton"], mode=["forward"], device="cpu")
    with pytest.raises(SpecError, match="--optimizer"):
        model.specs(optimizer=["adamw-fast"], device="cpu")


@pytest.mark.slow
def test_a_model_sweep_runs_each_optimizer(db_path):
    # MICRO runs on the CPU: the Triton kernel there only where it is interpreted
    triton_too = ",adamw-triton" if adamw_kernels.INTERPRETED else ""
    names = f"adamw,adamw-foreach{triton_too},torch-adamw-fused"
    result = invoke("model", *MICRO, "--seq", "16", "--optimizer", names, "--db", db_path)
    assert result.exit_code == 0, result.output
    got = query(db_path, "SELECT optimizer, opt_ms_mean, loss_first, loss_last FROM model_runs")
    assert [r["optimizer"] for r in got] == names.split(",")
    assert all(r["opt_ms_mean"] > 0 for r in got)
    # the same weights, data and update: the same losses, step after step
    for r in got[1:]:
        assert r["loss_first"] == got[0]["loss_first"]
        assert r["loss_last"] == pytest.approx(got[0]["loss_last"], rel=1e-5)


@pytest.mark.parametrize("name", ["adamw-foreach", "adamw-triton"])
def test_a_group_mixing_dtypes_and_a_misaligned_view(name):
    """One group holding fp32 and bf16 parameters (a launch per dtype) and a parameter that is
    a view 4 bytes into its storage (not 16-byte aligned: the one-tensor kernel takes it)."""

    def make():
        g = torch.Generator().manual_seed(2)
        storage = torch.randn(BLOCK + 4, generator=g).to(DEVICE)
        tensors = [torch.randn(300, generator=g), torch.randn(CHUNK + 7, generator=g).bfloat16(),
                   storage[1:], torch.randn(5, 7, generator=g).bfloat16()]
        params = [torch.nn.Parameter(t.to(DEVICE)) for t in tensors]  # the view stays a view
        assert params[2].data_ptr() % 16 == 4
        return params

    results = []
    for factory in (AdamW, OURS[name]):
        params = make()
        opt = factory(params, lr=LR, weight_decay=0.1)
        g = torch.Generator().manual_seed(3)
        for _ in range(3):
            for p in params:
                p.grad = torch.randn(p.shape, generator=g).to(p.dtype).to(DEVICE)
            opt.step()
        results.append((params, opt))
    (got, opt), (want, ref) = results[1], results[0]
    for p, r in zip(got, want, strict=True):
        for key in ("exp_avg", "exp_avg_sq"):
            torch.testing.assert_close(opt.state[p][key], ref.state[r][key], atol=1e-6, rtol=0)
        if p.dtype == torch.float32:
            torch.testing.assert_close(p, r, atol=1e-6, rtol=0)
        else:
            assert bf16_ulps(p.detach(), r.detach()).max() <= 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", ["adamw-foreach", "adamw-triton", "adamw-triton-per-tensor"])
def test_dtensor_parameters_as_torch_fsdp_shards_them(name, dtype):
    """`step --ddp torch-fsdp` (FSDP2) hands the optimizer DTensors: the foreach version's
    _foreach_copy_ of bf16 weights had no sharding rule (every point an error) and the
    Triton kernel read the wrapper's address (a segfault under the interpreter). Each
    rank's shard is updated as a plain tensor, exactly as the same plain parameters."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    dist.init_process_group("gloo" if DEVICE == "cpu" else "nccl", store=dist.HashStore(),
                            rank=0, world_size=1)
    try:
        mesh = init_device_mesh(DEVICE, (1,))
        gen = torch.Generator().manual_seed(0)
        start = [torch.randn(shape, generator=gen).to(dtype) for shape in ((6, 5), (37,))]
        plain = [torch.nn.Parameter(t.clone().to(DEVICE)) for t in start]
        sharded = [torch.nn.Parameter(distribute_tensor(t.clone().to(DEVICE), mesh, [Shard(0)]))
                   for t in start]
        opts = [OURS[name](ps, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.1)
                for ps in (plain, sharded)]
        for _ in range(3):
            grads = [torch.randn(t.shape, generator=gen).to(dtype) for t in start]
            for p, q, g in zip(plain, sharded, grads, strict=True):
                p.grad = g.clone().to(DEVICE)
                q.grad = distribute_tensor(g.clone().to(DEVICE), mesh, [Shard(0)])
            for opt in opts:
                opt.step()
        for p, q, t in zip(plain, sharded, start, strict=True):
            assert not torch.equal(p.detach().cpu(), t)  # moved
            assert torch.equal(q.detach().full_tensor().cpu(), p.detach().cpu())
    finally:
        dist.destroy_process_group()
