"""ShardedOptimizer and FSDP against single-process training (CPU, Gloo, 2 ranks).

One launch runs every case, 3 rounds each from fresh seeds (tests/sharding_workers.py); the
tests compare what the ranks return with references trained here in one process on the
whole batch, from the same initial weights.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cs336sys.parallel import launch
from cs336sys.parallel.fsdp import FSDP
from cs336sys.parallel.sharded_optimizer import ShardedOptimizer
from tests import sharding_workers as w

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs():
    return launch(w.run_all, w.WORLD_SIZE)


def _one_thread(fn):
    # Tiny tensors: more threads only add OpenMP hand-offs (see test_ddp_wrappers.py).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)


# -- ShardedOptimizer ------------------------------------------------------------------------


def sharded_reference(kind: str, initial: dict, round_: int) -> tuple[dict, list]:
    """The unsharded optimizer, same groups, same unfreezing, whole batch."""
    model = w.OptToy().double()
    model.load_state_dict({k: torch.from_numpy(v).double() for k, v in initial.items()})
    groups, cls, defaults = w.opt_groups(model, kind)
    opt = cls(groups, **defaults)
    losses = []
    for step in range(w.OPT_STEPS):
        if step == w.UNFREEZE_AT:
            model.late.requires_grad_(True)
            opt.add_param_group({"params": model.late.parameters(), **w.LATE_GROUP})
        x, y = w.opt_batch(round_, step)
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    return {k: v.detach().float().numpy() for k, v in model.state_dict().items()}, losses


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_sharded_optimizer_matches_the_unsharded_one(runs, kind):
    for round_ in range(w.ROUNDS):
        r0, r1 = (rank["sharded"][kind][round_] for rank in runs)
        ref, ref_losses = _one_thread(
            lambda r0=r0, round_=round_: sharded_reference(kind, r0["initial"], round_)
        )
        for r in (r0, r1):
            assert r["is_optimizer"] and r["grads_cleared"]
            np.testing.assert_allclose(r["losses"], ref_losses, rtol=1e-6)
            for k, v in ref.items():
                np.testing.assert_allclose(r["final"][k], v, rtol=1e-6, atol=1e-7, err_msg=k)
                assert np.array_equal(r["final"][k], r0["final"][k]), f"ranks differ on {k}"
        # the layer unfrozen mid-training was trained from then on
        assert not np.allclose(r0["final"]["late.weight"], r0["initial"]["late.weight"])


@pytest.mark.parametrize("kind", ["adamw", "sgd"])
def test_each_rank_holds_state_only_for_its_shard(runs, kind):
    names = [n for n, _ in w.OptToy().named_parameters()]
    sizes = dict((n, p.numel()) for n, p in w.OptToy().named_parameters())
    per_state = 2 if kind == "adamw" else 1  # AdamW: two moments; SGD: the momentum buffer
    for round_ in range(w.ROUNDS):
        r0, r1 = (rank["sharded"][kind][round_] for rank in runs)
        # every parameter has exactly one owner, and its state lives there only
        assert sorted(r0["owned"] + r1["owned"]) == sorted(names)
        assert not set(r0["owned"]) & set(r1["owned"])
        for r in (r0, r1):
            assert r["state_params"] == r["owned"]
            assert r["state_elements"] == per_state * sum(sizes[n] for n in r["owned"])
        # balanced by elements: each rank within the largest parameter of half
        total = sum(sizes.values())
        for r in (r0, r1):
            assert abs(sum(sizes[n] for n in r["owned"]) - total / 2) <= max(sizes.values())


def test_sharded_optimizer_takes_parameters_of_two_dtypes(runs):
    r0, r1 = (rank["mixed_dtypes"] for rank in runs)
    assert ["torch.float32", "torch.float64"] in (r0["owned_dtypes"], r1["owned_dtypes"])
    model = w.MixedToy()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in r0["initial"].items()})
    opt = torch.optim.AdamW(model.parameters(), lr=0.01, weight_decay=0.1)
    for step in range(3):
        x, y = w.opt_batch(0, step)
        opt.zero_grad(set_to_none=True)
        torch.nn.functional.mse_loss(model(x), y.float()).backward()
        opt.step()
    for k, v in model.state_dict().items():
        for r in (r0, r1):
            np.testing.assert_allclose(r["final"][k], v.detach().float().numpy(), rtol=1e-6,
                                       atol=1e-7, err_msg=k)


def test_sharded_optimizer_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        ShardedOptimizer([torch.nn.Parameter(torch.zeros(2))], torch.optim.SGD, lr=0.1)


# -- FSDP ------------------------------------------------------------------------------------


def fsdp_reference(case: str, initial: dict, round_: int) -> dict:
    """One process, whole batch; with a compute dtype, the parameters of the modules FSDP
    shards (embedding, linear layers, head: weights and biases) cast to it for the forward,
    the norms' left fp32 (the course's test_fsdp.py's mixed precision), while the fp32
    parameters are what the optimizer steps."""
    tied, frozen, dtype, kind = w.FSDP_CASES[case]
    model = w.TinyLM(tied, frozen)
    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    opt = w.make_optimizer(kind, model.parameters())

    def forward(tokens):
        if dtype is None:
            return model(tokens)
        sharded = [name for name, m in model.named_modules()
                   if any(p.dim() >= 2 for p in m.parameters(recurse=False))]
        cast = {f"{name}.{attr}": p.to(dtype) for name in sharded
                for attr, p in model.get_submodule(name).named_parameters(recurse=False)}
        return torch.func.functional_call(model, cast, (tokens,))

    for step in range(w.FSDP_STEPS):
        x, y = w.lm_batch(round_, step)
        torch.nn.functional.cross_entropy(forward(x).float().flatten(0, 1), y.flatten()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("case", list(w.FSDP_CASES))
def test_fsdp_matches_single_process_training(runs, case):
    tied, frozen, dtype, _ = w.FSDP_CASES[case]
    # fp32: the same sums in another order; fp16: the bound for the same casting
    tol = 1e-4 if dtype is not None else 1e-6
    for round_ in range(w.ROUNDS):
        r0, r1 = (rank["fsdp"][case][round_] for rank in runs)
        ref = _one_thread(lambda r0=r0, round_=round_: fsdp_reference(case, r0["initial"], round_))
        assert r0["final"].keys() == ref.keys()  # names of the unwrapped model, tied included
        for r in (r0, r1):
            assert r["initial"].keys() == ref.keys()
            for k, v in r0["initial"].items():  # every rank sharded rank 0's weights
                assert np.array_equal(r["initial"][k], v), k
            for k, v in ref.items():
                np.testing.assert_allclose(r["final"][k], v, rtol=tol, atol=tol, err_msg=k)
        assert not np.allclose(r0["final"]["fc1.weight"], r0["initial"]["fc1.weight"])
        if tied:
            assert np.array_equal(r0["final"]["head.weight"], r0["final"]["emb.weight"])
        if dtype is not None:  # the handout's FSDP: norms unsharded, in fp32
            assert r0["seen"] == {"norm": "torch.float32", "bias": str(dtype)}
        if frozen:
            assert r0["frozen_left"] and r1["frozen_left"]
            assert np.array_equal(r0["final"]["proj.weight"], r0["initial"]["proj.weight"])


@pytest.mark.parametrize("case", list(w.FSDP_CASES))
def test_fsdp_gradients_after_synchronization(runs, case):
    for round_ in range(w.ROUNDS):
        r0, r1 = (rank["fsdp"][case][round_] for rank in runs)
        for r in (r0, r1):
            # every slice's gradient has the slice's shape and is fp32, whatever computed it
            assert r["grads"]["sharded"]
            for grad_shape, shape, dtype in r["grads"]["sharded"]:
                assert grad_shape == shape and dtype == "torch.float32"
        # replicated parameters (norms, biases) got the same averaged gradient on each rank
        assert r0["grads"]["replicated"].keys() == r1["grads"]["replicated"].keys()
        assert {"fc1.bias", "norm.weight", "ln_f.bias"} <= set(r0["grads"]["replicated"])
        for k, v in r0["grads"]["replicated"].items():
            assert np.array_equal(v, r1["grads"]["replicated"][k]), k


def test_fsdp_per_rank_parameters_are_about_half(runs):
    for case in ("fp32-adamw", "tied", "frozen"):
        for rank in runs:
            r = rank["fsdp"][case][0]
            # the slices (with their padding) plus the small replicated vectors
            assert r["param_bytes"] < 0.6 * r["full_param_bytes"], case
            assert r["param_bytes"] >= 0.5 * r["full_param_bytes"] * 0.9, case


def test_fsdp_prefetches_at_most_two_units_ahead(runs):
    for rank in runs:
        g = rank["gathers"]
        # six layers: while layer i computes, layers i+1 and i+2 are being gathered
        assert g["ahead"] == [2, 2, 2, 2, 1, 0]


def test_fsdp_forward_keeps_only_the_roots_full_weight_for_backward(runs):
    for rank in runs:
        g = rank["gathers"]
        # What a forward leaves alive is activations (a few hundred bytes per layer) and the
        # root's full weight -- the last layer's, which backward needs first -- not the
        # other five 64 KiB full weights autograd would otherwise save.
        assert g["weight_bytes"] <= g["kept"] < g["weight_bytes"] * 5 / 4, g["kept"]
        assert g["grads_ok"]
        # after the step: the gradients of the slices, and no full weight (the root's too)
        assert g["grad_bytes"] <= g["left"] < g["grad_bytes"] + g["weight_bytes"] / 4, g["left"]


def test_fsdp_all_gathers_in_forward_and_again_in_backward(runs):
    r = runs[0]["fsdp"]["fp32-adamw"][0]
    # 5 sharded weights; forward gathers each (emb, fc1, fc2, proj, head); backward gathers
    # again those a backward needs but the root's (the head's, kept from forward) and the
    # embedding's (whose backward needs none): per step 5 + 3, 5 reduce-scatters, one
    # all-reduce of the replicated gradients
    assert r["calls"] == {
        "all_gather": 8 * w.FSDP_STEPS,
        "reduce_scatter": 5 * w.FSDP_STEPS,
        "all_reduce": w.FSDP_STEPS,
    }


@pytest.mark.parametrize("case", list(w.FSDP_CASES))
def test_fsdp_gathers_the_root_once_a_step(runs, case):
    tied, frozen, dtype, _ = w.FSDP_CASES[case]
    model = w.TinyLM(tied, frozen)

    def padded(module):  # bytes of a weight gathered whole: padded to 2 slices
        return -(-module.weight.numel() // 2) * 2 * (2 if dtype is not None else 4)

    # forward: every unit (a tied head gathers the embedding's slices again); backward:
    # fc1, fc2 and proj again (proj only when it is sharded, that is trained), the head
    # (the root) and the embedding not
    forward = [model.emb, model.fc1, model.fc2, model.head] + [model.proj] * (not frozen)
    backward = [model.fc1, model.fc2] + [model.proj] * (not frozen)
    for rank in runs:
        for r in rank["fsdp"][case]:
            assert r["gathered_bytes"] == sum(map(padded, forward + backward))


def test_fsdp_prefetches_two_units_ahead_in_backward(runs):
    for rank in runs:
        g = rank["backward_gathers"]
        assert g["forward"] == 6  # one gather per layer
        # Gathers issued in backward before each layer's backward, last layer first. The
        # last layer is the root (kept from forward): its backward starts the gathers of
        # layers 4 and 3; layer 4's that of 2, and so on; nothing is gathered twice.
        # Gathered on demand instead, it would read [0, 0, 1, 2, 3, 4].
        assert g["before_layer"] == [0, 2, 3, 4, 5, 5]
        assert g["total"] == 6 + 5


def test_fsdp_comm_ms_covers_gathers_in_forward_and_backward(runs):
    for rank, r in enumerate(runs):
        c = r["comm_time"]
        for step in c["steps"]:
            assert 0 < step["comm_ms"] <= step["step_ms"]
            if rank == 0:
                # waited `delay` for rank 1 once in forward and once in backward, while its
                # finish_gradient_synchronization (all that comm_ms timed before) did not
                assert step["comm_ms"] >= 2 * c["delay_ms"] * 0.9, step
                assert step["finish_ms"] < c["delay_ms"] / 2, step


def test_fsdp_refuses_a_weight_read_outside_its_modules_forward(runs):
    """A tied head written `x @ self.emb.weight.T` read FSDP's meta placeholder, for which
    torch 2.13 on a CPU computes uninitialised memory: the loss was ln(vocabulary), the
    gradients changed from run to run, and nothing said so."""
    for rank in runs:
        assert rank["read_outside"].startswith("FSDP: a sharded weight was used outside its "
                                               "own module's forward"), rank["read_outside"]


def test_fsdp_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        FSDP(torch.nn.Linear(2, 2))


def test_fsdp_trains_alike_inside_a_compiled_forward(runs):
    """The compile switch on our FSDP (step --world-size 2 --ddp fsdp --switches compile):
    with the model's forward compiled, the units' gathers, the saved-weight tokens and the
    reduce-scatters still work, and training gives the eager losses."""
    for rank in runs:
        got = rank["compiled"]
        np.testing.assert_allclose(got["compiled"], got["eager"], rtol=1e-6)
        assert got["eager"][0] != got["eager"][-1]  # it trained
        assert got["graphs"] > 0  # something was compiled


def test_a_sharded_step_hands_the_closure_and_keywords_to_the_wrapped_optimizer():
    """The handout's `step(self, closure, **kwargs)` calls the wrapped optimizer's step with
    both: LBFGS, which must have its closure, failed (`missing 1 required positional
    argument: 'closure'`), and a keyword was a TypeError. An optimizer whose step takes no
    closure still has it called once."""
    import torch.distributed as dist

    class NoClosure(torch.optim.SGD):
        def step(self):  # a student's, closure-less
            return super().step()

    class Keyword(torch.optim.SGD):
        def step(self, closure=None, *, scale=1.0):  # a step of scale·lr
            for group in self.param_groups:
                group["lr"] *= scale
            loss = super().step(closure)
            for group in self.param_groups:
                group["lr"] /= scale
            return loss

    def trained(make, steps=3, **kwargs):
        torch.manual_seed(0)
        w = torch.nn.Parameter(torch.randn(4))
        opt = make([w])
        calls = []

        def closure():
            calls.append(1)
            opt.zero_grad()
            loss = ((w - 1.0) ** 2).sum()
            loss.backward()
            return loss

        losses = [float(opt.step(closure, **kwargs)) for _ in range(steps)]
        return w.detach().clone(), losses, len(calls)

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        for cls, kwargs in ((torch.optim.LBFGS, {"lr": 0.5, "max_iter": 4}),
                            (NoClosure, {"lr": 0.1}), (Keyword, {"lr": 0.1})):
            more = {"scale": 0.5} if cls is Keyword else {}
            sharded = trained(lambda ps, cls=cls, kw=kwargs: ShardedOptimizer(ps, cls, **kw),
                              **more)
            plain = torch.optim.SGD if cls is NoClosure else cls  # (called with a closure)
            alone = trained(lambda ps, cls=plain, kw=kwargs: cls(ps, **kw), **more)
            assert torch.equal(sharded[0], alone[0]) and sharded[1:] == alone[1:], cls
        assert trained(lambda ps: ShardedOptimizer(ps, torch.optim.LBFGS, max_iter=4))[2] > 3
    finally:
        dist.destroy_process_group()


def test_a_bucketed_ddp_of_no_bucket_size_is_one_bucket():
    """The course's 2025 adapter: "If None, use a single bucket of unbounded size";
    DDPBucketed(module, None) raised `'>' not supported between NoneType and int`."""
    import torch.distributed as dist

    from cs336sys.parallel import DDPBucketed

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 64))
        assert len(DDPBucketed(model, None)._buckets) == 1
        assert len(DDPBucketed(model, 0.01)._buckets) == 4  # 16 KiB weights alone
        with pytest.raises(ValueError, match="bucket size must be positive, got 0 MB"):
            DDPBucketed(model, 0)
    finally:
        dist.destroy_process_group()
