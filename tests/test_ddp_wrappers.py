"""The DDP wrappers and torch's DDP against single-process training (CPU, Gloo, 2 ranks).

One launch runs every case (model x implementation x bucket size, 3 rounds from fresh
seeds) on both ranks and returns the states; the tests compare them with a single-process
reference: a copy of rank 0's initial model trained with plain SGD on the whole global batch.
Each rank trains on an equal contiguous slice with a mean loss, so the averaged gradient is
the global batch's gradient and the parameters must agree to float64 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from cs336sys.parallel import launch
from cs336sys.parallel.ddp import DDPBucketed, NaiveDDP, make_ddp
from tests import ddp_workers as w

pytestmark = pytest.mark.slow

CASES = [
    pytest.param(name, impl, bucket_mb, n, id=f"{name}-{w.case_id(impl, n)}")
    for name in w.MODELS
    for impl, bucket_mb, n in w.cases(name)
]
HOOKED = [c for c in CASES if c.values[1] in ("overlap", "bucketed")]


@pytest.fixture(scope="module")
def runs():
    return launch(w.run_all, w.WORLD_SIZE)


def results(runs, name, impl, n):
    """[(rank 0's result, rank 1's result)] for each round of one case."""
    case = w.case_id(impl, n)
    per_rank = [[r for r in rank["train"][name] if r["case"] == case] for rank in runs]
    assert len(per_rank[0]) == w.ROUNDS
    return list(zip(*per_rank, strict=True))


def reference(name: str, initial: dict, round_: int) -> dict:
    """Single-process SGD on the global batch, from rank 0's initial state."""
    # One thread: on these tiny tensors more threads only add OpenMP hand-offs, which take
    # ~1 s per call once other processes keep the cores busy (measured: 2 ms vs 1.3 s).
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _reference(name, initial, round_)
    finally:
        torch.set_num_threads(threads)


def _reference(name: str, initial: dict, round_: int) -> dict:
    model = w.MODELS[name]().double()
    model.load_state_dict({k: torch.from_numpy(v) for k, v in initial.items()})
    opt = torch.optim.SGD(model.parameters(), lr=w.LR)
    for step in range(w.STEPS):
        x, y = w.global_batch(name, round_, step)
        if name == "branchy":  # the branch taken differs per rank: mean of the ranks' losses
            b = w.LOCAL_BATCH
            loss = (
                sum(
                    w.local_loss(
                        name, model, x[r * b : (r + 1) * b], y[r * b : (r + 1) * b], w.uses_extra(r)
                    )
                    for r in range(w.WORLD_SIZE)
                )
                / w.WORLD_SIZE
            )
        else:
            loss = w.local_loss(name, model, x, y, True)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {k: v.detach().numpy() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("name, impl, bucket_mb, n", CASES)
def test_ranks_start_apart_and_agree_after_construction(runs, name, impl, bucket_mb, n):
    for r0, r1 in results(runs, name, impl, n):
        assert any(not np.array_equal(r0["initial"][k], r1["initial"][k]) for k in r0["initial"])
        for r in (r0, r1):  # every parameter (frozen too) and buffer is rank 0's
            assert r["constructed"].keys() == r0["initial"].keys()
            for k, v in r0["initial"].items():
                assert np.array_equal(r["constructed"][k], v), k


@pytest.mark.parametrize("name, impl, bucket_mb, n", CASES)
def test_matches_single_process_training(runs, name, impl, bucket_mb, n):
    for r0, r1 in results(runs, name, impl, n):
        ref = reference(name, r0["initial"], r0["round"])
        for r in (r0, r1):
            for k, v in ref.items():
                np.testing.assert_allclose(r["final"][k], v, rtol=1e-10, atol=1e-12, err_msg=k)
                assert np.array_equal(r["final"][k], r0["final"][k]), f"ranks differ on {k}"
        assert not np.allclose(
            r0["final"]["mix.weight" if name == "tied" else "fc2.weight"],
            r0["initial"]["mix.weight" if name == "tied" else "fc2.weight"],
        )
        if name == "frozen":
            assert np.array_equal(r0["final"]["scale"], r0["initial"]["scale"])


@pytest.mark.parametrize("name, impl, bucket_mb, n", CASES)
def test_each_trainable_parameter_reduced_once_per_step(runs, name, impl, bucket_mb, n):
    model = w.MODELS[name]().double()
    unique = w.trainable_bytes(model)
    if name == "tied":  # the tied weight: two names, one Parameter
        assert len(list(model.named_parameters(remove_duplicate=False))) == len(unique) + 1
    expected_calls = {"naive": len(unique), "flat": 1, "overlap": len(unique), "bucketed": n}
    for r0, r1 in results(runs, name, impl, n):
        for r in (r0, r1):
            # Frozen parameters are not sent; tied ones once; unused ones as zeros.
            assert r["bytes"] == [sum(unique)] * w.STEPS
            if impl == "torch":
                assert all(c >= 1 for c in r["calls"])
            else:
                assert r["calls"] == [expected_calls[impl]] * w.STEPS


@pytest.mark.parametrize("name, impl, bucket_mb, n", HOOKED)
def test_bucket_layout(runs, name, impl, bucket_mb, n):
    names = [k for k, p in w.MODELS[name]().named_parameters() if p.requires_grad]
    buckets = results(runs, name, impl, n)[0][0]["buckets"]
    assert len(buckets) == n
    assert [k for b in buckets for k in b] == names[::-1]  # reverse registration order
    if n == 2:
        assert buckets[1] == [names[0]]


@pytest.mark.parametrize(
    "name, impl, bucket_mb, n", [c for c in HOOKED if c.values[0] != "branchy"]
)
def test_hooks_launch_all_reduces_during_backward(runs, name, impl, bucket_mb, n):
    for r0, r1 in results(runs, name, impl, n):
        for r in (r0, r1):
            # Every bucket was launched by a hook before finish, and finish waited for all.
            assert r["inflight_after_backward"] == [n] * w.STEPS
            assert r["inflight_after_finish"] == 0
            if n > 1:  # some all-reduce was in flight while a gradient was still to come
                assert max(r["seen_in_backward"]) >= 1


def test_launch_order_is_the_same_on_every_rank(runs):
    """`extra` is used on rank 0 only: rank 1 holds back its bucket and all later ones until
    finish, so both ranks issue the all-reduces in one order (and training still agrees)."""
    r0, r1 = results(runs, "branchy", "overlap", len(w.trainable_bytes(w.BranchyToy())))[0]
    n = len(r0["buckets"])
    assert r0["inflight_after_backward"] == [n - 1] * w.STEPS  # all but `never`
    first_extra = next(i for i, b in enumerate(r0["buckets"]) if b[0].startswith("extra"))
    assert r1["inflight_after_backward"] == [first_extra] * w.STEPS


@pytest.mark.parametrize("impl", ["overlap", "bucketed"])
def test_second_backward_before_finish_raises(runs, impl):
    for rank in runs:
        message, recovered = rank["second_backward"][impl]
        assert message is not None and "twice" in message
        assert recovered


def test_make_ddp_rejects_bad_arguments():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="one of"):
        make_ddp("fsdp", model)
    with pytest.raises(ValueError, match="no bucket size"):
        make_ddp("naive", model, bucket_size_mb=1.0)
    with pytest.raises(ValueError, match="positive"):
        make_ddp("bucketed", model, bucket_size_mb=0)
    with pytest.raises(ValueError, match="positive"):
        DDPBucketed(model, bucket_size_mb=-1)


def test_needs_a_process_group():
    with pytest.raises(RuntimeError, match="process group"):
        NaiveDDP(torch.nn.Linear(2, 2))


@pytest.mark.parametrize("impl", ["naive", "flat", "overlap", "bucketed"])
def test_allreduce_ms_is_each_all_reduce_from_launch_to_completion(runs, impl):
    """allreduce_ms, the collectives alone (flat's comm_ms was mostly its copies into and
    out of one buffer): rank 0, whose all-reduces wait for rank 1's backward, a second
    late, has one in flight that long; rank 1, which arrives last, has it in flight
    briefly; each within the time from backward to the end of the synchronisation; and
    the next step, with no rank late, is measured afresh."""
    (late0, next0), (late1, next1) = (rank["in_flight"][impl] for rank in runs)
    late_ms = w.LATE_S * 1e3
    assert 0.8 * late_ms <= late0[0] <= late0[1], late0
    assert 0 < late1[0] <= min(late1[1], 0.5 * late_ms), late1
    assert 0 < next0[0] <= min(next0[1], 0.5 * late_ms), next0


def test_what_a_rank_sends_compares_ddp_a_sharded_optimizer_and_zero():
    """comm MiB/step sums nccl-tests' S, so the course's sharded optimizer (all-reduce plus
    broadcast) read 2x DDP; per rank it sends 1.5x, and ZeRO's reduce-scatter plus
    all-gather as much as DDP (Rajbhandari et al. 2020, §7)."""
    from cs336sys.parallel.comm_counter import CommCounter

    def counted(**sizes):
        comm = CommCounter.__new__(CommCounter)  # the counts alone: no dispatch mode entered
        comm.bytes = {k: sizes.get(k, 0) for k in ("all_reduce", "broadcast", "all_gather",
                                                   "reduce_scatter")}
        comm.calls = dict.fromkeys(comm.bytes, 1)
        return comm

    psi, n = 1000.0, 4
    ddp = counted(all_reduce=psi).sent(n)
    assert ddp == 2 * (n - 1) / n * psi
    assert counted(all_reduce=psi, broadcast=psi).sent(n) == 1.5 * ddp
    assert counted(reduce_scatter=psi, all_gather=psi).sent(n) == ddp
    figures = counted(all_reduce=psi, broadcast=psi).figures(n)
    assert figures["comm_bytes"] == 2 * psi and figures["sent_bytes"] == 1.5 * ddp
    assert figures["allreduce_bytes"] == figures["broadcast_bytes"] == psi
