"""One training step (experiments/training_step.py) for every experiment that runs the model: model,
profile, memory and ddp (at world size 1) compute the same loss for the same spec and seed,
and the loss is taken on float32 logits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from cs336sys.experiments import ddp, memory, model, profile, run_sweep
from cs336sys.experiments.training_step import cross_entropy, make_batch, make_model, make_step
from cs336sys.models.config import from_preset

SHAPE = dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256)
WARMUP, STEPS = 1, 2


def _loss(experiment, specs) -> dict:
    (point,) = run_sweep(experiment, specs)
    assert point.result.status == "ok", point.result.error
    return point.result.metrics


@pytest.mark.slow  # ddp spawns a rank
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_model_profile_memory_and_ddp_compute_the_same_loss(precision):
    common = dict(size=["tiny"], seq=[32], batch=[2], mode=["train"],
                  precision=[precision], warmup=WARMUP, iters=STEPS, device="cpu", seed=3,
                  **SHAPE)
    timed = model.run(model.specs(**common)[0])
    profiled = _loss(profile.EXPERIMENT, profile.specs("model", model.specs(**common), top=2))
    measured = _loss(memory.EXPERIMENT, memory.specs(**common))
    dist = _loss(ddp.EXPERIMENT, ddp.specs(
        impl=["naive"], size="tiny", seq=32, batch=2, world_size=[1],
        precision=[precision], warmup=WARMUP, iters=STEPS, device="cpu", seed=3, **SHAPE))

    first = timed.metrics["loss_first"]
    # the same first step: same weights, same tokens, same loss convention
    assert profiled["loss_first"] == pytest.approx(first, rel=1e-6)
    assert measured["loss_first"] == pytest.approx(first, rel=1e-6)
    assert dist["loss_first"] == pytest.approx(first, rel=1e-6)
    # and the same training: ddp's warm-up, measured and timed steps are model's steps
    ours = timed.samples["loss"]
    assert len(ours) == WARMUP + STEPS and dist["loss_last"] == pytest.approx(
        _loss(model.EXPERIMENT, model.specs(**{**common, "iters": STEPS + 1}))["loss_last"],
        rel=1e-5)
    assert profiled["loss_last"] == pytest.approx(ours[-1], rel=1e-5)


def test_the_loss_is_cross_entropy_of_float32_logits():
    torch.manual_seed(0)
    logits = torch.randn(2, 5, 11).bfloat16()  # (B, T, V)
    y = torch.randint(0, 11, (2, 5))
    got = cross_entropy(logits, y)
    assert got.dtype == torch.float32
    want = F.cross_entropy(logits.double().flatten(0, 1), y.flatten())  # float64 reference
    assert got.item() == pytest.approx(want.item(), rel=1e-6)
    # a 16-bit cross-entropy differs: that is what the cast is for
    assert abs(F.cross_entropy(logits.flatten(0, 1), y.flatten()).item() - want.item()) > 1e-4


def test_a_step_times_every_phase_and_the_data_does_not_depend_on_the_device():
    x1, y1 = make_batch(7, 2, 16, 100)
    x2, y2 = make_batch(7, 2, 16, 100)
    assert torch.equal(x1, x2) and torch.equal(y1, y2) and not torch.equal(x1, y1)
    cfg = from_preset("tiny", context_length=16, **{**SHAPE, "vocab_size": 100})
    step = make_step(make_model(cfg, "cpu", 0), vocab_size=100, batch=2, seq=16,
                     mode="train", precision="fp32", optimizer="adamw", compile=False,
                     device="cpu", seed=7)
    seen = []
    times = step(phase=lambda name: _record(seen, name))
    assert seen == ["forward", "backward", "optimizer"]
    assert set(times) == {"fwd_ms", "bwd_ms", "opt_ms", "step_ms", "fwd_host_ms", "bwd_host_ms",
                          "opt_host_ms"}
    assert times["step_ms"] >= times["fwd_ms"] + times["bwd_ms"] + times["opt_ms"]
    # the host time is the part of the phase until its calls returned, before the sync
    assert all(0 < times[f"{p}_host_ms"] <= times[f"{p}_ms"] for p in ("fwd", "bwd", "opt"))
    assert step.logits_dtype == "float32" and step.last_loss.requires_grad is False
    assert all(p.grad is None for p in step.model.parameters())  # zero_grad(set_to_none)


def _record(seen, name):
    import contextlib

    seen.append(name)
    return contextlib.nullcontext()
