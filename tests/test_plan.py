"""`cs336sys plan`: the ring collectives and the closed forms against hand-worked
numbers, the whole-model accounting against its own closed forms and exact parameter
counts, --measured's choice of rows, the plan beside ddp runs, and bad input."""

import json
import math
import re
import subprocess
import sys

import pytest

from cs336sys.experiments import plan as exp
from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.experiments.plan_model import ACCOUNTING
from cs336sys.measure.device import peak_tflops
from cs336sys.models.config import from_preset, param_count
from cs336sys.parallel import plan_math as pm
from cs336sys.store.db import Store, point_key
from tests.conftest import invoke, query

# -- the ring collectives, by hand --------------------------------------------------------------

S, W = 8e9, 1e11  # an 8 GB buffer at 100 GB/s egress


def test_ring_collectives_hand_worked():
    # 4 devices: each sends 3 shards of 2 GB = 6 GB at 100 GB/s = 0.06 s
    assert pm.all_gather_s(S, 4, W) == pytest.approx(0.06)
    assert pm.reduce_scatter_s(S, 4, W) == pytest.approx(0.06)
    # all-reduce = reduce-scatter + all-gather: 12 GB sent, 0.12 s; written as its two
    # steps (the handout's construction) exactly the same
    assert pm.all_reduce_s(S, 4, W) == pytest.approx(0.12)
    assert pm.all_reduce_two_step_s(S, 4, W) == pytest.approx(0.12)
    # the handout's alternate ring: 3 steps, each sending a whole 8 GB input: 0.24 s
    assert pm.all_reduce_alternate_ring_s(S, 4, W) == pytest.approx(0.24)
    # through one root: it receives 3 x 8 GB and sends 3 x 8 GB: 48 GB, 0.48 s
    assert pm.all_reduce_naive_s(S, 4, W) == pytest.approx(0.48)
    # binary tree, unpipelined: log2(4) = 2 levels up and 2 down of 8 GB: 0.32 s
    assert pm.all_reduce_tree_s(S, 4, W) == pytest.approx(0.32)
    # at 5 devices, ceil(log2 5) = 3 levels each way: 0.48 s
    assert pm.all_reduce_tree_s(S, 5, W) == pytest.approx(0.48)
    for f in (pm.all_gather_s, pm.reduce_scatter_s, pm.all_reduce_s, pm.all_reduce_two_step_s,
              pm.all_reduce_alternate_ring_s, pm.all_reduce_naive_s, pm.all_reduce_tree_s):
        assert f(S, 1, W) == 0  # alone, nothing moves


def test_alternate_ring_by_simulation():
    """The handout's alternate ring, step by step: every device ends with the full sum, and
    each of the N-1 steps sends one whole input per device, (N-1) S / W in all."""
    n, size = 5, 1.0
    xs = [[float(10 ** i + j) for j in range(3)] for i in range(n)]
    y = [list(x) for x in xs]
    sent = 0.0
    for t in range(1, n):
        for i in range(n):
            # device i receives x((i - t) mod N) from its left and adds it
            y[i] = [a + b for a, b in zip(y[i], xs[(i - t) % n], strict=True)]
        sent += size  # each device sent one whole input this step
    total = [sum(col) for col in zip(*xs, strict=True)]
    assert all(row == total for row in y)
    assert pm.all_reduce_alternate_ring_s(size, n, 1.0) == sent


# -- the single-FFN derivation, by hand --------------------------------------------------------

# B = 4096 tokens, D = 1024, F = 4096, C = 1e15 FLOP/s, W = 1e11 B/s: C/W = 10,000 FLOPs a byte.
# The 2026 handout's FFN: W1, W2 (D x F) and W3 (F x D), three matrices.
B, D, F, C = 4096, 1024, 4096, 1e15


def test_ffn_dp_hand_worked():
    # N = 4: forward 6BDF/(NC) = 103,079,215,104 / 4e15 = 2.5769803776e-5 s, backward twice
    fwd, bwd = pm.ffn_compute_s(B, D, F, 4, C)
    assert fwd == pytest.approx(2.5769803776e-5) and bwd == pytest.approx(5.1539607552e-5)
    # backward all-reduces 3DF bf16 = 25,165,824 bytes: 2 * 3/4 * 25,165,824 / 1e11
    assert pm.ffn_comm_s("dp", B, D, F, 4, W) == pytest.approx((0.0, 3.7748736e-4))
    # comm-bound: B/N = 1024 < (N-1)/N * C/W = 7,500; the largest N is 1 + BW/C = 1.4096
    assert pm.ffn_n_max("dp", B, F, C, W) == pytest.approx(1.4096)
    # with 2^24 tokens, 1 + 2^24 * 1e-4 = 1678.7216: N = 1678 hides, 1679 does not
    big = 2**24
    assert pm.ffn_n_max("dp", big, F, C, W) == pytest.approx(1678.7216)
    for n, hides in ((1678, True), (1679, False)):
        _, b = pm.ffn_compute_s(big, D, F, n, C)
        assert (pm.ffn_comm_s("dp", big, D, F, n, W)[1] <= b) is hides
    # the 2025 handout's two-matrix FFN: 4BDF forward, the same bound
    assert pm.ffn_compute_s(B, D, F, 4, C, m=2)[0] == pytest.approx(1.7179869184e-5)
    assert pm.ffn_n_max("dp", B, F, C, W, m=2) == pytest.approx(1.4096)


def test_ffn_fsdp_hand_worked():
    # N = 4: forward all-gathers the weights, 3/4 * 25,165,824 / 1e11 = 1.8874368e-4 s;
    # backward all-gathers them again and reduce-scatters the gradients, twice that
    assert pm.ffn_comm_s("fsdp", B, D, F, 4, W) == pytest.approx((1.8874368e-4, 3.7748736e-4))
    assert pm.ffn_n_max("fsdp", B, F, C, W) == pm.ffn_n_max("dp", B, F, C, W)


def test_ffn_tp_hand_worked():
    # N = 4: one all-reduce of the B x D activations in bf16, 8,388,608 bytes, each way:
    # 2 * 3/4 * 8,388,608 / 1e11 = 1.2582912e-4 s
    assert pm.ffn_comm_s("tp", B, D, F, 4, W) == pytest.approx((1.2582912e-4, 1.2582912e-4))
    # forward binds: 1 + 3 F W / (2C) = 1 + 0.6144; backward 1 + 3 F W / C = 2.2288; B cancels
    assert pm.ffn_n_max("tp", B, F, C, W) == pytest.approx(1.6144)
    assert pm.ffn_n_max("tp", 100 * B, F, C, W) == pytest.approx(1.6144)
    assert pm.ffn_n_max_backward("tp", B, F, C, W) == pytest.approx(2.2288)
    # the two-matrix FFN of 2025: 1 + F W / C
    assert pm.ffn_n_max("tp", B, F, C, W, m=2) == pytest.approx(1.4096)
    # the bound is where the forward stops hiding, for a wide F
    wide = 2**20  # 1 + 3 * 2^20 * 1e-4 / 2 = 158.2864
    for n, hides in ((158, True), (159, False)):
        fwd, _ = pm.ffn_compute_s(B, D, wide, n, C)
        assert (pm.ffn_comm_s("tp", B, D, wide, n, W)[0] <= fwd) is hides


def test_ffn_fsdp_tp_hand_worked():
    # X = 2, Y = 2: FSDP gathers half the weights over 2: 1/2 * 12,582,912 / 1e11 = 6.291456e-5;
    # TP all-reduces B/X = 2048 tokens' outputs over 2: 2 * 1/2 * 4,194,304 / 1e11 = 4.194304e-5
    fwd, bwd = pm.ffn_comm_s("fsdp-tp", B, D, F, 4, W, x=2, y=2)
    assert fwd == pytest.approx(1.048576e-4) and bwd == pytest.approx(1.6777216e-4)
    # overlapped, the longer of the two
    fwd, _ = pm.ffn_comm_s("fsdp-tp", B, D, F, 4, W, x=2, y=2, overlap=True)
    assert fwd == pytest.approx(6.291456e-5)
    # the closed forms: overlapped (1 + BW/C)(1 + 3FW/(2C)) = 1.4096 * 1.6144
    assert pm.ffn_n_max("fsdp-tp", B, F, C, W, overlap=True) == pytest.approx(2.27565824)
    # sharing the links: (X-1)/B + (Y-1) 2/(3F) <= W/C, the best split
    assert pm.ffn_n_max("fsdp-tp", B, F, C, W) == pytest.approx(
        pm.best_split_n_max(1 / B, 2 / (3 * F), W / C))


@pytest.mark.parametrize("overlap", [True, False])
def test_fsdp_tp_bound_against_a_scan_of_splits(overlap):
    """N max of FSDP+TP against every real split X * Y = N: at 0.99 N max some split hides
    the forward's communication, at 1.02 N max none does."""
    b, d, f, c, w = 2**16, 4096, 2**14, 1e15, 1e11
    bound = pm.ffn_n_max("fsdp-tp", b, f, c, w, overlap=overlap)

    def hides(n):
        for i in range(4001):
            x = n ** (i / 4000)  # X from 1 to n, Y = n / X
            comm, _ = pm.ffn_comm_s("fsdp-tp", b, d, f, n, w, x=x, y=n / x, overlap=overlap)
            if comm <= pm.ffn_compute_s(b, d, f, n, c)[0] * (1 + 1e-9):
                return True
        return False

    assert hides(bound * 0.99) and not hides(bound * 1.02)


def test_best_split_against_brute_force():
    """The largest N = X*Y with (X-1)a + (Y-1)k <= budget, against a scan over real X."""
    # the last: the interior optimum would need Y < 1, so the best is a pure split
    for a, k, budget in ((1 / 4096, 1 / 11008, 4e-4), (1e-3, 1e-6, 1e-3), (1e-6, 1e-3, 1e-3),
                         (4.16e-5, 3.13e-3, 5.75e-4)):
        bound = pm.best_split_n_max(a, k, budget)

        def feasible(n, a=a, k=k, budget=budget):
            xs = [1 + i * (n - 1) / 20000 for i in range(20001)]  # X from 1 to n
            return min((x - 1) * a + (n / x - 1) * k for x in xs) <= budget * (1 + 1e-9)

        assert feasible(bound * 0.999) and not feasible(bound * 1.01)


# -- the whole model ---------------------------------------------------------------------------


def _spec(strategy, n, size="tiny", hardware="h100", seq=128, batch=None, **dims):
    return exp.specs(size=size, seq=seq, tokens=batch or 24 * seq, strategy=[strategy],
                     n=[str(n)], hardware=[hardware], **dims)[0]


def test_tensors_sum_to_the_exact_parameter_count():
    for size in ("tiny", "8b"):
        cfg = from_preset(size)
        assert sum(ACCOUNTING["transformer"].tensors(cfg)) == param_count(cfg)
    # embedding and head 2 x 151,936 x 4096 = 1,244,659,712; 34 layers of 4 x 4096^2 +
    # 3 x 4096 x 11,008 + 2 x 4096 = 202,383,360; the final norm 4096
    assert param_count(from_preset("8b")) == 1_244_659_712 + 34 * 202_383_360 + 4096


def test_whole_model_dp_hand_worked():
    """DP on 2 H100s: compute is the FLOPs over N C, the all-reduce moves 2 bytes a parameter."""
    spec = _spec("dp", 2)
    m = exp.run(spec).metrics
    cfg = spec.config()
    # forward matmul FLOPs of 24 sequences of 128 tokens (tiny: D 512, F 1344, 4 layers,
    # 16 heads of 32, V 10,000), per token 4 x (8 x 512^2 + 6 x 512 x 1344) + 2 x 512 x 10,000
    # = 35,143,680, x 3072 tokens = 107,961,384,960; attention 4 layers x 24 x 16 heads x
    # 2 x (2 x 128^2 x 32) = 3,221,225,472
    fwd = 107_961_384_960 + 3_221_225_472
    assert m["flops_per_step"] == 3 * fwd
    assert m["compute_fwd_ms"] == pytest.approx(fwd / (2 * 989.4e12) * 1e3)
    p = param_count(cfg)
    assert m["allreduce_ms"] == pytest.approx(2 * (1 / 2) * 2 * p / 450e9 * 1e3)
    assert m["comm_fwd_ms"] == 0 and m["allgather_ms"] == 0
    assert m["comm_bytes"] == 2 * p
    # what a device sends: half of 2 S over 2 ranks (the ring); FSDP's two all-gathers and
    # its reduce-scatter send half of 3 S, 1.5x DP (its S is 3x DP's)
    assert m["sent_bytes"] == 2 * p
    fsdp = exp.run(_spec("fsdp", 2)).metrics
    assert fsdp["comm_bytes"] == 2 * fsdp["sent_bytes"]
    assert fsdp["sent_bytes"] == pytest.approx(1.5 * m["sent_bytes"], rel=1e-3)  # (padding)
    # memory: 2 + 2 + 12 bytes a parameter, whole on each device
    assert (m["mem_params_bytes"], m["mem_grads_bytes"], m["mem_opt_state_bytes"]) == (2 * p, 2 * p, 12 * p)
    # activations of the 12 sequences one device sees: 128 x 12 tokens x
    # (4 layers x (16 x 512 + 8 x 1344 + 4 x 16) + 4 x 512 + 6 x 10000)
    per_token = 4 * (16 * 512 + 8 * 1344 + 4 * 16) + 4 * 512 + 6 * 10_000
    assert m["mem_act_bytes"] == 12 * 128 * per_token
    # checkpointed: 2D a token a layer kept, one layer recomputed
    assert m["mem_act_ckpt_bytes"] == 12 * 128 * (4 * 2 * 512 + 16 * 512 + 8 * 1344 + 4 * 16 + 4 * 512 + 6 * 10_000)


def test_whole_model_tp_and_fsdp_hand_worked():
    spec = _spec("tp", 4)
    m = exp.run(spec).metrics
    # per phase 2 x 4 layers + 1 all-reduces of all 3072 tokens x 512 x 2 bytes over 4 devices
    one = 2 * (3 / 4) * 3072 * 512 * 2 / 450e9
    assert m["comm_fwd_ms"] == pytest.approx(9 * one * 1e3) and m["comm_bwd_ms"] == pytest.approx(9 * one * 1e3)
    assert m["tokens_per_device"] == 3072  # every device sees the whole batch
    m = exp.run(_spec("fsdp", 4)).metrics
    p = param_count(from_preset("tiny"))
    gather = (3 / 4) * 2 * p / 450e9 * 1e3
    assert (m["comm_fwd_ms"], m["comm_bwd_ms"]) == (pytest.approx(gather), pytest.approx(2 * gather))
    assert m["allgather_ms"] == pytest.approx(2 * gather) and m["reducescatter_ms"] == pytest.approx(gather)


@pytest.mark.parametrize("strategy", exp.STRATEGIES)
def test_alone_nothing_is_communicated(strategy):
    m = exp.run(_spec(strategy, 1)).metrics
    assert m["comm_ms"] == m["allgather_ms"] == m["reducescatter_ms"] == m["allreduce_ms"] == 0
    assert m["step_ms"] == pytest.approx(m["compute_ms"]) and m["hides"]


def test_fsdp_parameters_are_dp_over_n_plus_padding():
    """Per device, FSDP holds exactly (DP's parameters + padding) / N: every tensor padded to a
    multiple of N elements. N = 3 leaves remainders (512 x 10000 = 5,120,000 = 1 mod 3)."""
    dp = exp.run(_spec("dp", 3)).metrics
    fsdp = exp.run(_spec("fsdp", 3)).metrics
    cfg = from_preset("tiny")
    padding = sum(-k % 3 for k in ACCOUNTING["transformer"].tensors(cfg))
    assert padding > 0
    assert 3 * fsdp["mem_params_bytes"] == dp["mem_params_bytes"] + 2 * padding
    assert 3 * fsdp["mem_opt_state_bytes"] == dp["mem_opt_state_bytes"] + 12 * padding


@pytest.mark.parametrize("strategy", ["dp", "fsdp", "tp"])
def test_n_max_is_where_the_step_stops_hiding(strategy):
    """The whole-model closed form against the phase-by-phase evaluation on either side."""
    spec = _spec(strategy, 1, size="8b", seq=4096, batch=4096 * 256, hardware="b200")
    limit = math.floor(exp.n_max(spec))
    for n, hides in ((limit, True), (limit + 1, False)):
        point = exp.PlanSpec(**{**spec.settings(), "n": n})
        x, y = (1, n) if strategy == "tp" else (n, 1)
        assert exp.evaluate(point, x, y)["hides"] is hides


@pytest.mark.parametrize("size, hardware, seq, batch", [("8b", "b200", 4096, 4096 * 256),
                                                         ("xl", "h100", 512, 256 * 512)])
def test_fsdp_tp_n_max_is_each_axis_hiding_alone(size, hardware, seq, batch):
    """Overlapped, as a point's phases are: the largest N is FSDP's largest degree times
    TP's, and the split at their floors hides while one more on either axis does not (N max
    added the axes, and read 3,143 of the xxl where 4,096 devices hid)."""
    def spec(strategy):
        return _spec(strategy, 1, size=size, seq=seq, batch=batch, hardware=hardware)

    x_max, y_max = exp.n_max(spec("fsdp")), exp.n_max(spec("tp"))
    assert exp.n_max(spec("fsdp-tp")) == pytest.approx(x_max * y_max)
    x, y = math.floor(x_max), math.floor(y_max)
    for split, hides in (((x, y), True), ((x + 1, y), False), ((x, y + 1), False)):
        point = exp.PlanSpec(**{**spec("fsdp-tp").settings(), "n": split[0] * split[1]})
        assert exp.evaluate(point, *split)["hides"] is hides, split


@pytest.mark.parametrize("strategy", ["dp", "tp", "fsdp-tp"])
def test_n_max_whole_is_the_largest_degree_the_plan_can_run_that_hides(strategy):
    """N max takes each axis's degree as a real number (the handout's fsdp_tp_calcs (c)):
    the xl's fsdp-tp read 353 while its own 64x4 and 64x8 rows said `hides: no`, and tp's 5
    was refused as a degree ("5 does not divide 32"). N max, whole is the largest degree
    with a split the plan runs that hides: every runnable degree above it, up to twice N
    max, does not hide in any split."""
    spec = _spec(strategy, 1, size="xl", seq=512, batch=256 * 512)
    m = exp.run(spec).metrics
    whole, (x, y) = m["n_max_whole"], map(int, m["n_max_whole_split"].split("x"))
    assert x * y == whole < m["n_max"]
    assert exp.evaluate(exp.PlanSpec(**{**spec.settings(), "n": whole}), x, y)["hides"]
    runnable = 0
    for n in range(whole + 1, 2 * m["n_max"] + 1):
        point = exp.PlanSpec(**{**spec.settings(), "n": n})
        options = {"dp": [(n, 1)] if 256 % n == 0 else [], "tp": [(1, n)] if 32 % n == 0 else []
                   }.get(strategy, exp.splits(n, 32, 256))
        runnable += len(options)
        assert not any(exp.evaluate(point, *split)["hides"] for split in options), n
    assert runnable  # degrees above it that the plan can run, none hiding
    assert {"dp": 32, "tp": 4, "fsdp-tp": 128}[strategy] == whole  # by hand: bounds 61.6, 5.7


def test_the_ffn_closed_form_takes_the_mesh_axes_as_the_whole_model_does():
    """The xxl is 126 copies of its two-matrix FFN, so with --mesh-axes 2,1 the FFN's
    overlapped bound is the whole model's: it left M_X out and read 301 beside 581."""
    spec = exp.specs(size="xxl", seq=512, tokens=64 * 512, strategy=["fsdp-tp"], n=["64"],
                     hardware=["tpu-v5p"], split="16x4", mesh_axes="2,1")[0]
    m = exp.run(spec).metrics
    assert m["n_max_ffn"] == m["n_max"] == 581
    b, f, c, w = 64 * 512, 53248, 4.6e14, 1.8e11
    assert pm.ffn_n_max("fsdp-tp", b, f, c, w, m=2, overlap=True, mesh=(2, 1)) == \
        pytest.approx((1 + 2 * b * w / c) * (1 + f * w / c))


def test_fsdp_tp_overlaps_the_two_axes_collectives_as_the_handout_assumes():
    """fsdp_tp_calcs (b): "the collectives along the FSDP axis can be overlapped with the
    collectives along the TP axis", the time "a max between two quantities": a point's
    phase took their sum, and called compute-bound points communication-bound."""
    for split in ((16, 4), (32, 4), (8, 8)):
        spec = _spec("fsdp-tp", split[0] * split[1], size="xl", seq=512, batch=256 * 512)
        m = exp.evaluate(spec, *split)
        fsdp_f, tp = m["allgather_ms"] / 2, m["allreduce_ms"] / 2  # per phase
        assert m["comm_fwd_ms"] == pytest.approx(max(fsdp_f, tp))
        assert m["comm_fwd_ms"] < fsdp_f + tp
        assert m["comm_bwd_ms"] == pytest.approx(max(fsdp_f + m["reducescatter_ms"], tp))
        assert m["hides"] == (m["comm_fwd_ms"] <= m["compute_fwd_ms"]
                              and m["comm_bwd_ms"] <= m["compute_bwd_ms"])
    # the hunt's point, 32 x 4 of the xl: 4.54 ms of TP against 7.17 of compute hides
    m = exp.evaluate(_spec("fsdp-tp", 128, size="xl", seq=512, batch=256 * 512), 32, 4)
    assert m["hides"] and m["comm_fwd_ms"] == pytest.approx(m["allreduce_ms"] / 2)


def test_the_8b_on_two_b200():
    """The plan's headline case: on 2 x B200 every strategy hides its
    communication; DP's 16 bytes a parameter (121 GiB) leave room for 2 sequences of 4096."""
    for strategy in exp.STRATEGIES:
        m = exp.run(_spec(strategy, 2, size="8b", seq=4096, batch=4096 * 256, hardware="b200")).metrics
        assert m["hides"]
    m = exp.run(_spec("dp", 2, size="8b", seq=4096, batch=4096 * 256, hardware="b200")).metrics
    assert 16 * 8_125_698_048 == m["mem_params_bytes"] + m["mem_grads_bytes"] + m["mem_opt_state_bytes"]
    assert m["fit_seqs"] == 2
    # C is the 2026 handout's B200 bf16 figure, 2,500 TFLOPS: DP hides up to N = 1 + B W /
    # (C e) x (forward FLOPs per token / P), 402.6 (2,250 TFLOPS gave 447)
    assert math.floor(exp.n_max(_spec("dp", 2, size="8b", seq=4096, batch=4096 * 256,
                                      hardware="b200"))) == 402


def test_mfu_on_a_b200_is_against_the_handouts_peaks():
    assert peak_tflops("NVIDIA B200", "bf16") == 2500 and peak_tflops("NVIDIA B200", "fp32") == 80


# -- the command ---------------------------------------------------------------------------------

CPU, H100 = "cpu", "NVIDIA H100 80GB HBM3"


def _store(path, model=(), comm=(), ddp=()):
    """A store with invocations on two GPUs and the given (gpu, status, settings, metrics) runs."""
    store = Store(path, EXPERIMENTS)
    for gpu in (CPU, H100):
        store.db["invocations"].insert({
            "id": f"inv-{gpu}", "command": "fixture", "argv": "[]", "started": "2026-01-05",
            "finished": "2026-01-05", "exit_status": 0, "host": "lab", "gpu": gpu,
            "gpu_count": 0 if gpu == CPU else 1, "gpu_memory_gb": None if gpu == CPU else 79.19,
        })
    ids = []
    for exp_name, runs in (("model", model), ("comm", comm), ("ddp", ddp)):
        for i, (gpu, status, settings, metrics) in enumerate(runs):
            rid = f"{exp_name}-{gpu}-{i}"
            store.db["runs"].insert({
                "id": rid, "invocation_id": f"inv-{gpu}", "experiment": exp_name, "status": status,
                "settings": json.dumps(settings), "metrics": json.dumps(metrics),
                "created": f"2026-01-05 10:00:0{i}.000000", "point_key": point_key(exp_name, settings),
            })
            ids.append(rid)
    store.close()
    return ids


MODEL = [
    (CPU, "ok", {"precision": "fp32"}, {"tflops": 0.5}),
    (CPU, "ok", {"precision": "bf16"}, {"tflops": 0.2}),
    (CPU, "error", {"precision": "fp32"}, {"tflops": 9.0}),  # not ok: never used
    (H100, "ok", {"precision": "bf16"}, {"tflops": 700.0}),
]
COMM = [
    (CPU, "ok", {"op": "all-reduce"}, {"busbw_gbps": 3.0, "wrong": 0}),
    (CPU, "ok", {"op": "all-gather"}, {"busbw_gbps": 4.0, "wrong": 0}),
    (CPU, "ok", {"op": "reduce-scatter"}, {"busbw_gbps": 8.0, "wrong": 5}),  # wrong results
    (H100, "ok", {"op": "all-reduce"}, {"busbw_gbps": 360.0, "wrong": 0}),
    # not a ring collective: its busbw is not the W of (N-1)/N S/W, passed over while any is
    (CPU, "ok", {"op": "broadcast"}, {"busbw_gbps": 6.0, "wrong": 0}),
]


def _plans(db):
    return [{**r, "_s": json.loads(r["settings"]), "_m": json.loads(r["metrics"])}
            for r in query(db, "SELECT * FROM runs WHERE experiment = 'plan' ORDER BY created")]


def test_measured_picks_this_gpus_best_rows(db_path):
    ids = _store(db_path, MODEL, COMM)
    r = invoke("plan", "--size", "tiny", "--seq", 128, "--batch", 8, "--strategy", "dp",
               "--n", "1,2", "--measured", "--gpu", CPU, "--db", db_path)
    assert r.exit_code == 0, r.output
    plans = _plans(db_path)
    assert len(plans) == 2
    s = plans[0]["_s"]
    # the fastest ok model row (fp32 at 0.5 TFLOP/s), the fastest correct ring collective
    # (all-gather, 4 GB/s; the broadcast's 6 GB/s is not the formulas' W)
    assert (s["flops"], s["egress"], s["hardware"], s["device_name"]) == (0.5e12, 4e9, "measured", CPU)
    # and names them (run ids cut to 8 characters), with the precision and op that single
    # them out: the fp32 model row, the all-gather row
    assert s["source"] == (f"measured: model run {ids[0][:8]} (fp32, 0.5 TFLOP/s), "
                           f"comm run {ids[len(MODEL) + 1][:8]} (all-gather, busbw 4 GB/s)")
    r = invoke("plan", "--size", "tiny", "--seq", 128, "--batch", 8, "--strategy", "dp",
               "--n", 2, "--measured", "--gpu", H100, "--db", db_path)
    s = _plans(db_path)[-1]["_s"]
    assert (s["flops"], s["egress"], s["memory_bytes"]) == (700e12, 360e9, int(79.19 * 2**30))


def test_measured_without_rows_says_what_to_run(db_path):
    r = invoke("plan", "--measured", "--gpu", CPU, "--db", db_path)
    assert r.exit_code == 2 and "cs336sys model" in r.stderr and not db_path.exists()
    _store(db_path, model=MODEL[3:], comm=COMM[3:4])  # rows of the H100 only
    r = invoke("plan", "--measured", "--gpu", CPU, "--db", db_path)
    assert r.exit_code == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "cs336sys model" in r.stderr and H100 in r.stderr
    _store(db_path.with_name("b.db"), model=MODEL[:2], comm=COMM[3:4])
    r = invoke("plan", "--measured", "--gpu", CPU, "--db", db_path.with_name("b.db"))
    assert r.exit_code == 2 and "cs336sys comm" in r.stderr
    # the GPUs named are those with the comm rows it lacks, not itself (it has model rows)
    assert f"(it has rows of: {H100}; --gpu picks one)" in r.stderr
    # comm rows of one rank (busbw 0: no link crossed) were called "no ok comm rows"
    one_rank = (CPU, "ok", {"op": "all-reduce", "world_size": 1}, {"busbw_gbps": 0.0})
    _store(db_path.with_name("c.db"), model=MODEL[:2], comm=[one_rank])
    r = invoke("plan", "--measured", "--gpu", CPU, "--db", db_path.with_name("c.db"))
    assert r.exit_code == 2 and "no ok comm rows for cpu with a bus bandwidth (its comm rows " \
        "of one rank cross no link: give --world-size 2 or more)" in r.stderr, r.stderr
    assert _plans(db_path) == []


@pytest.mark.parametrize("args, says", [
    (["--hardware", "tpu9"], "--hardware"),
    (["--strategy", "tp", "--n", 3], "does not divide"),  # 32 heads
    (["--strategy", "dp", "--n", 3], "does not divide"),  # 256 sequences
    (["--tokens", 1000, "--seq", 300], "whole number"),
    (["--batch", 4, "--tokens", 1024], "give one of them"),
    (["--flops", "1e15"], "go together"),
    (["--flops", "-1", "--bandwidth", "1e11"], "positive number"),
    (["--batch", 0], "positive"),
    (["--seq", -4], "positive"),
    (["--n", 0], "positive"),
    (["--n", 10**12], "fits none of the strategies"),  # its fsdp-tp splits took minutes
    (["--d-model", 0], "positive"),
    (["--size", "huge"], "--size: unknown size"),
    (["--size", "xxxl"], "(did you mean 'xxl'?); choose from tiny, small, medium, large, xl, "
                         "2.7B, 10B, 8b, xxl"),
    # the xxl has neither: each was stored as a setting and changed nothing
    (["--size", "xxl", "--num-heads", 7], "--num-heads: the 2025 handout's xxl is blocks"),
    (["--size", "xxl", "--vocab-size", 5], "--vocab-size: the 2025 handout's xxl is blocks"),
    # an option that shapes another, given without it, was ignored (80 GiB judged the fit)
    (["--memory-gib", 10], "--memory-gib is the memory of a device given by hand"),
    (["--memory-gib", 80, "--hardware", "b200"], "--memory-gib is the memory"),  # its default
    (["--gpu", "cpu"], "--gpu picks the stored GPU whose runs --measured reads"),
    (["--strategy", "dp", "--split", "2x2"], "--split is a setting of fsdp-tp, which --strategy "
                                             "dp leaves out"),
    (["--strategy", "tp", "--mesh-axes", "2,1"], "--mesh-axes is a setting of fsdp-tp"),
    # figures whose plan overflowed (a traceback) or hung walking every degree
    (["--flops", "1e12", "--bandwidth", "1e9", "--memory-gib", "1e300"],
     "--memory-gib must be between"),
    (["--flops", "1e12", "--bandwidth", "1e9", "--memory-gib", "1e-12"],
     "--memory-gib must be between"),
    (["--flops", "1e-300", "--bandwidth", "1e300", "--strategy", "dp", "--n", 2],
     "--flops must be between 1 and 1e30"),
    (["--batch", 10**12, "--seq", 10**6], "too large for a plan (at most 2^40)"),
    (["--strategy", "fsdp-tp", "--n", 4, "--mesh-axes", "1e300,1"], "each above 0 and at most 64"),
])
def test_bad_input_exits_2_with_one_line(db_path, args, says):
    r = invoke("plan", *args, "--db", db_path)
    assert r.exit_code == 2, r.output
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not db_path.exists()


def test_whole_degrees_of_a_large_batch_by_its_divisors(db_path):
    """A billion sequences: N max, whole, is the largest divisor of them under the bound
    (every integer up to the bound was walked: 22 s), as a walk of them finds it."""
    from cs336sys.experiments.plan_degrees import divisors, whole_split

    k = 2**5 * 3**3 * 5**2 * 7  # 151,200
    assert divisors(k) == tuple(d for d in range(1, k + 1) if k % d == 0)
    assert whole_split(1e3 + 0.5, 1, 32, k) == (max(d for d in divisors(k) if d <= 1e3), 1)
    assert whole_split(float("inf"), 3.5, 12, 10) == (10, 3)
    r = invoke("plan", "--batch", 10**9, "--seq", 512, "--n", 2, "--strategy", "dp",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    (row,) = query(db_path, "SELECT * FROM plan_runs")
    bound = row["n_max"]
    assert row["n_max_whole"] == max(d for d in divisors(10**9) if d <= bound)


def test_a_degree_one_strategy_cannot_take_is_skipped_with_the_reason(db_path):
    r = invoke("plan", "--strategy", "tp,fsdp", "--n", 64, "--hardware", "b200", "--db", db_path)
    assert r.exit_code == 0, r.output
    by = {p["_s"]["strategy"]: p for p in _plans(db_path)}
    assert by["tp"]["status"] == "skipped" and "32 heads" in by["tp"]["error"]
    assert by["fsdp"]["status"] == "ok"


def test_plan_meets_measurement(db_path):
    """A ddp run of the same model, batch tokens and world size on the plan's GPU is set
    beside the planned dp point, with measured / planned ratios."""
    tiny = {"d_model": 512, "d_ff": 1344, "num_layers": 4, "num_heads": 16, "vocab_size": 10_000}
    ddp = {**tiny, "impl": "flat", "shard_optimizer": "none", "world_size": 2,
           "seq": 128, "batch": 8, "precision": "fp32"}
    runs = [
        (CPU, "ok", ddp, {"step_ms_mean": 900.0, "comm_ms_mean": 30.0, "comm_bytes": 1e8,
                          "sent_bytes": 1e8}),
        (CPU, "ok", {**ddp, "world_size": 4}, {"step_ms_mean": 1.0, "comm_ms_mean": 1.0}),
        (H100, "ok", ddp, {"step_ms_mean": 2.0, "comm_ms_mean": 1.0}),  # another GPU
    ]
    _store(db_path, MODEL, COMM, runs)
    r = invoke("plan", "--size", "tiny", "--seq", 128, "--batch", 8, "--strategy", "dp,tp",
               "--n", 2, "--measured", "--gpu", CPU, "--db", db_path)
    assert r.exit_code == 0, r.output
    by = {p["_s"]["strategy"]: p["_m"] for p in _plans(db_path)}
    m = by["dp"]
    assert m["measured_run_id"] == "ddp-cpu-0" and m["measured_impl"] == "flat fp32"
    assert m["measured_step_ratio"] == pytest.approx(900.0 / m["step_ms"])
    assert m["measured_comm_ratio"] == pytest.approx(30.0 / m["comm_ms"])
    assert m["measured_sent_bytes"] == 1e8 and m["sent_bytes"] == m["comm_bytes"]  # 2 ranks
    assert "measured_run_id" not in by["tp"]  # no ddp run is TP
    assert "Plan meets measurement" in r.stdout


def test_an_overlapping_ddps_exposed_comm_is_no_ratio_to_the_plans_whole():
    """A bucketed run's comm ms is what the step still waited for: over the plan's whole
    all-reduce it read as half the time planned. Its bucket is named; the ratio is given
    only where the run's comm is all of it (naive, flat, fsdp)."""
    from cs336sys.experiments.plan_measured import beside

    plan = {"step_ms": 100.0, "comm_ms": 60.0}
    run = {"id": "r", "impl": "bucketed", "bucket_mb": 10.0, "precision": "fp32",
           "step_ms": 90.0, "comm_ms": 30.0, "comm_bytes": 1e8}
    got = beside(plan, run)
    assert got["measured_impl"] == "bucketed 10MiB fp32" and got["measured_comm_ratio"] is None
    assert got["measured_step_ratio"] == pytest.approx(0.9)
    assert beside(plan, {**run, "impl": "flat", "bucket_mb": None})["measured_comm_ratio"] == 0.5


def test_plan_imports_no_torch(tmp_path):
    """The command answers at once: torch (seconds to import) is never loaded."""
    code = ("import sys; from typer.testing import CliRunner; from cs336sys.cli import app; "
            f"r = CliRunner().invoke(app, ['plan', '--size', '8b', '--hardware', 'h100,b200', "
            f"'--n', '2,4,8,16,64', '--db', {str(tmp_path / 'p.db')!r}]); "
            "assert r.exit_code == 0, r.output; assert 'torch' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_report_has_the_plan_section(db_path, tmp_path):
    r = invoke("plan", "--hardware", "h100,b200", "--n", "2,4,8,16", "--db", db_path)
    assert r.exit_code == 0, r.output
    out = tmp_path / "rep"
    r = invoke("report", "--db", db_path, "--out", out)
    assert r.exit_code == 0, r.output
    md = (out / "report.md").read_text()
    assert "Plan: parallelism" in md and "When communication stops hiding" in md
    assert "Step time against degree" in md


def test_the_printout_fits_the_terminal_each_part_led_by_what_tells_rows_apart(db_path,
                                                                              monkeypatch):
    """plan printed every table in one piece, 200 columns wide on an 80-column terminal, and
    its shared settings twice (in the title and on the line under it). Cut, each part of
    the all-reduce table is led by GPU, model and N: three rows of one GPU read alike
    under GPU alone. --wide keeps one piece, as on the measuring commands."""
    monkeypatch.setenv("COLUMNS", "80")
    args = ["plan", "--strategy", "dp,tp", "--n", "2,4"]
    r = invoke(*args, "--hardware", "h100,b200", "--db", db_path)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    assert r.stdout.count("hardware=") == 0  # two GPUs: a column, not a shared setting
    heads = [lines[i] for i in range(len(lines) - 1) if lines[i + 1].startswith("---")]
    by_algorithm = [h for h in heads if h.startswith("GPU ")]
    assert len(by_algorithm) > 1
    assert all(h.split()[:3] == ["GPU", "model", "N"] for h in by_algorithm)
    planned = [h for h in heads if h.startswith("hardware ")]  # the time and memory tables
    assert len(planned) > 2 and all(len(h) <= 80 for h in planned)
    assert all(h.split()[:3] == ["hardware", "strategy", "N"] for h in planned)
    one = invoke(*args, "--hardware", "h100", "--db", db_path)
    assert one.stdout.count("hardware=H100 SXM 80GB") == 2  # time and memory, once each
    wide = invoke(*args, "--hardware", "h100,b200", "--wide", "--db", db_path)
    assert wide.exit_code == 0, wide.output
    (time_head,) = [x for x in wide.stdout.splitlines() if "compute ms" in x]
    assert "all-reduce ms" in time_head and "N max (FFN)" in time_head


# -- the 2025 handout's XXL and the Scaling Book's mesh ---------------------------------------


def test_mesh_batch_by_hand():
    """communication_accounting (c): TPU v5p, C = 4.6e14, W_ici = 1.8e11, X = 16 FSDP over
    M_X = 2 axes, Y = 4 TP over M_Y = 1: compute-bound iff B/N > (C/W) / (Y M_X) =
    2555.6 / 8 = 319.4 tokens a device (20,444 over 64); TP hides, F/Y = 13,312 > 2555.6."""
    per_device, tp = pm.mesh_batch_per_device(53248, 4, 4.6e14, 1.8e11, 2, 1)
    assert per_device == pytest.approx(4.6e14 / 1.8e11 / 8) and tp
    # the defining inequality, at the threshold: T_FSDP = T_math
    b, d, f, y = per_device * 64, 16384, 53248, 4  # X = 16, N = 64
    assert 4 * d * f / (y * 1.8e11 * 2) == pytest.approx(4 * b * d * f / (64 * 4.6e14))
    assert not pm.mesh_batch_per_device(53248, 32, 4.6e14, 1.8e11, 2, 1)[1]  # F/Y = 1664


def _value(expr: str, **letters: float) -> float:
    """A closed form as the table writes it ("2(N-1)/N * 6DF/(Y W)"), evaluated."""
    python = re.sub(r"(?<=[0-9A-Z)])\s*(?=[A-Z(])", "*", expr)  # implicit products
    return eval(python, {"max": max}, letters)


@pytest.mark.parametrize("m", [3, 2])
@pytest.mark.parametrize("strategy", pm.STRATEGIES)
def test_closed_forms_are_the_ffn_accounting(strategy, m):
    """Each expression of the closed-form table at B, D, F, N (X x Y) equals the single-FFN
    accounting that `ffn_compute_s` and `ffn_comm_s` compute."""
    b, d, f, c, w, x, y = 4096.0, 1024.0, 2816.0, 1e15, 4e11, 4, 2
    n = x * y
    fwd, bwd, comm_f, comm_b = pm.closed_forms(strategy, m)
    letters = dict(B=b, D=d, F=f, N=n, W=w, X=x, Y=y)
    flops = [t * c for t in pm.ffn_compute_s(b, d, f, n, c, m=m)]
    assert [_value(fwd, **letters), _value(bwd, **letters)] == pytest.approx(flops)
    comm = pm.ffn_comm_s(strategy, b, d, f, n, w, x=x, y=y, m=m, overlap=True)
    assert [_value(comm_f, **letters), _value(comm_b, **letters)] == pytest.approx(comm)


def test_closed_forms_table_and_tp_backward(db_path):
    r = invoke("plan", "--size", "xl", "--strategy", "dp,tp", "--n", "2,4", "--wide",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    assert "One FFN layer in closed form" in r.stdout and "12BDF/N" in r.stdout
    assert "dx = all-reduce({dx1(i) W1(i)^T + dx2(i) W2(i)^T})" in r.stdout


def test_mesh_tp_hides_counts_the_ffn_matrices(db_path):
    """SwiGLU (m = 3): T_TP = 4BD/(X W M_Y) against T_math = 6BDF/(N C) hides iff
    3F/(2Y) > (C/W)/M_Y. The 8B on a B200 split 16x4 (F/Y = 2752, 3F/(2Y) = 4128, C/W
    between them) hides, as the step table's own comparison says; the two-matrix F/Y > C/W
    read `no` there."""
    alpha = 3000.0
    assert not pm.mesh_batch_per_device(9000, 4, alpha * 1e11, 1e11, 1, 1)[1]  # m = 2: 2250
    assert pm.mesh_batch_per_device(9000, 4, alpha * 1e11, 1e11, 1, 1, m=3)[1]  # 3375
    r = invoke("plan", "--size", "8b", "--hardware", "b200", "--strategy", "fsdp-tp", "--n",
               "64", "--split", "16x4", "--mesh-axes", "1,1", "--db", db_path)
    assert r.exit_code == 0, r.output
    (row,) = query(db_path, "SELECT * FROM plan_runs WHERE status = 'ok'")
    alpha = row["flops"] / row["egress"]
    assert 3 * row["d_ff"] / (2 * 4) > alpha > row["d_ff"] / 4  # the case the m decides
    assert row["mesh_tp_hides"] == 1 and row["hides"] == 1


def test_fsdp_degree_that_fits_answers_communication_accounting_b(db_path):
    """2025 communication_accounting (b): per device 16P/N + A/(2N) + A/2 under 95 GB. At
    one sequence of 512 tokens N >= 38.9; at 64 of them the whole half of the activations
    (287.5 GB) exceeds 95 GB alone: no N fits, and at most 95e9 / (a/2) tokens do."""
    for batch in ("1", "64"):
        r = invoke("plan", "--size", "xxl", "--hardware", "tpu-v5p", "--strategy", "fsdp",
                   "--n", "1", "--batch", batch, "--seq", "512", "--db", db_path)
        assert r.exit_code == 0, r.output
    got = {row["batch_tokens"]: row for row in query(db_path, "SELECT * FROM plan_runs")}
    params, a = 126 * 2 * 16384 * 53248, 126 * 2 * (16384 + 53248)  # a: bytes a token keeps
    threshold = (16 * params + 512 * a / 2) / (95e9 - 512 * a / 2)
    assert threshold == pytest.approx(38.91, abs=0.01)
    assert got[512]["fsdp_fit_n"] == math.ceil(threshold) == 39
    assert got[32768]["fsdp_fit_n"] is None
    for row in got.values():
        assert row["fsdp_fit_tokens_max"] == math.floor(95e9 / (a / 2)) == 10827
    assert "N_FSDP to fit" in r.stdout and "none (B <= 10,827)" in r.stdout
    # the transformer (every activation sharded): the degree the memory table's own fits
    # agrees with, and no batch limit
    r = invoke("plan", "--size", "xl", "--hardware", "h100", "--strategy", "fsdp", "--n",
               "1,2,4,8", "--batch", "64", "--seq", "2048", "--db", db_path)
    assert r.exit_code == 0, r.output
    rows = query(db_path, "SELECT * FROM plan_runs WHERE size = 'xl' ORDER BY n")
    (n_fit,) = {row["fsdp_fit_n"] for row in rows}
    assert n_fit is not None and all(row["fsdp_fit_tokens_max"] is None for row in rows)
    assert [row["fits"] for row in rows] == [int(row["n"] >= n_fit) for row in rows]
    # a device the two gathered units alone fill: no degree and no batch fits (it stored the
    # point, then its table's cell raised, and every later report of the store too)
    r = invoke("plan", "--size", "small", "--strategy", "fsdp", "--n", "2", "--flops", "1e14",
               "--bandwidth", "1e11", "--memory-gib", "0.03", "--wide", "--db", db_path)
    assert r.exit_code == 0, r.output
    (row,) = query(db_path, "SELECT * FROM plan_runs WHERE size = 'small'")
    assert row["mem_gathered_bytes"] > 0.03 * 2**30
    assert (row["fsdp_fit_n"], row["fsdp_fit_tokens_max"]) == (None, 0)
    assert "none (no batch)" in r.stdout


def test_xxl_is_two_matrix_blocks_with_fp32_state(db_path):
    r = invoke("plan", "--size", "xxl", "--hardware", "tpu-v5p", "--strategy", "fsdp,fsdp-tp",
               "--n", "16,64", "--split", "16x4", "--mesh-axes", "2,1", "--batch", "64",
               "--seq", "512", "--db", db_path)
    assert r.exit_code == 0, r.output
    got = {(row["strategy"], row["n"]): row for row in query(
        db_path, "SELECT * FROM plan_runs WHERE status = 'ok'")}
    fsdp = got["fsdp", 16]
    params = 126 * 2 * 16384 * 53248  # 219,848,638,464
    assert fsdp["params"] == params
    # fp32 master weights, gradients (4 + 4) and AdamW's two moments (8), over 16 devices
    assert (fsdp["mem_params_bytes"], fsdp["mem_grads_bytes"], fsdp["mem_opt_state_bytes"]) == (
        4 * params // 16, 4 * params // 16, 8 * params // 16)
    # forward 2 FLOPs per parameter and token, backward twice that: 6 x 32,768 tokens x P
    assert fsdp["flops_per_step"] == 6 * 64 * 512 * params
    # bf16 activations: W1's and W2's inputs, 2 (D + F) bytes a token and block; under FSDP
    # the handout's (b): half of the whole batch's sharded over the 16, half whole on each
    tokens = 64 * 512
    assert fsdp["mem_act_bytes"] == (tokens / 2 / 16 + tokens / 2) * 126 * 2 * (16384 + 53248)
    # its (b) counts the state and the activations, no gathered weights, against "95GB"
    assert fsdp["mem_gathered_bytes"] == 0 and fsdp["memory_bytes"] == 95 * 10**9
    assert fsdp["mem_total_bytes"] == 16 * params / 16 + fsdp["mem_act_bytes"]
    mesh = got["fsdp-tp", 64]
    assert (mesh["fsdp_degree"], mesh["tp_degree"]) == (16, 4)
    assert mesh["mesh_batch_per_device_min"] == pytest.approx(4.6e14 / 1.8e11 / 8)
    assert mesh["mesh_batch_min"] == pytest.approx(64 * 4.6e14 / 1.8e11 / 8)
    assert mesh["mesh_tp_hides"] == 1
    assert "Scaling Book" in r.stdout and "xxl (16384×126, 219.8B)" in r.stdout
    # the step table counts the mesh too: the FSDP collectives over M_X = 2 axes take half
    # the time (it said communication-bound where the mesh table, at 32,768 tokens above
    # 20,444, says compute-bound), TP's over M_Y = 1 as they were
    r = invoke("plan", "--size", "xxl", "--hardware", "tpu-v5p", "--strategy", "fsdp-tp", "--n",
               "64", "--split", "16x4", "--batch", "64", "--seq", "512", "--label", "flat",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    (flat,) = query(db_path, "SELECT * FROM plan_runs r JOIN invocations i ON i.id = "
                    "r.invocation_id WHERE i.label = 'flat'")
    assert mesh["allgather_ms"] == pytest.approx(flat["allgather_ms"] / 2)
    assert mesh["allreduce_ms"] == pytest.approx(flat["allreduce_ms"])
    assert 64 * 512 > mesh["mesh_batch_min"] and mesh["hides"] == 1 and flat["hides"] == 0
    assert mesh["n_max"] > flat["n_max"]  # the largest N moves with the mesh too
    skipped = query(db_path, "SELECT error FROM runs WHERE status = 'skipped'")
    assert skipped == [{"error": "skipped: fsdp-tp --split 16x4 is 64 devices, not 16"}]


@pytest.mark.parametrize("args, says", [
    (["--split", "16by4"], "--split"),
    (["--mesh-axes", "2"], "--mesh-axes"),
    (["--mesh-axes", "2,-1"], "--mesh-axes"),
])
def test_bad_split_and_mesh_exit_2(db_path, args, says):
    r = invoke("plan", "--strategy", "fsdp-tp", "--n", "4", *args, "--db", db_path)
    assert r.exit_code == 2 and says in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_the_xxl_on_one_h100_says_how_many_h100s_worth_it_is(db_path):
    """2025 communication_accounting (a): "How many H100 80GB GPUs worth of memory is this?"
    16 bytes a parameter of 126 x 2 x 16384 x 53248 and L (2D + 2F) bf16 bytes a token of
    64 x 512 tokens, over 80 GiB: 47.6."""
    params = 126 * 2 * 16384 * 53248
    total = 16 * params + 126 * (2 * 16384 + 2 * 53248) * 64 * 512
    r = invoke("plan", "--size", "xxl", "--hardware", "h100", "--strategy", "fsdp", "--n", 1,
               "--batch", 64, "--seq", 512, "--handout", "2025", "--db", db_path)
    assert r.exit_code == 0, r.output
    lines = r.stdout.splitlines()
    at = next(i for i, line in enumerate(lines) if "GPUs' worth" in line)
    worth = lines[at + 2]  # the values under the header and its rule
    column = lines[at].index("GPUs' worth")
    assert worth[column:].split()[0] == f"{total / (80 * 2**30):.1f}"  # 47.6
    assert "80.0" in worth.split()  # the GPU's memory, GiB
    # the reading of "80GB" is said, and the other one's answer follows from it: 51.2
    note = " ".join(" ".join(lines[at:]).split())
    assert "an H100's 80GB is 80 GiB" in note and "the GPUs' worth is 7.4 % more" in note, note
    assert round(total / 80e9, 1) == round(47.64 * 2**30 / 1e9, 1) == 51.2


def test_fsdp_tp_closed_forms_say_which_assumption_each_n_max_takes():
    """Each fsdp-tp cell says the assumption its N max takes, the FFN's shared-links bound
    beside it. The whole model's overlaps its axes as the FFN's does (the product of the
    two degrees' bounds), and was still labelled "(shared links)" once it did."""
    from cs336sys.experiments.plan_section import inequalities

    row = {"status": "ok", "inequality": "...", "n_max": 108.4, "n_max_ffn": 484,
           "n_max_ffn_shared": 140, "_settings": {
               "strategy": "fsdp-tp", "device_name": "H100", "size": "xl",
               "batch_tokens": 131072, "d_model": 2560, "num_layers": 32}}
    (cells,) = inequalities([row]).rows
    assert cells[-2:] == ["108 (overlapped)", "484 (overlapped; 140 shared links)"]
    fsdp = {**row, "_settings": {**row["_settings"], "strategy": "fsdp"}}
    assert inequalities([fsdp]).rows[0][-2:] == ["108", "484"]


def test_the_phases_table_gives_each_phases_flops_and_communication(db_path):
    """Section 8 asks forward and backward apart, FLOPs and communication: the plan stored
    them and showed compute for the whole step and each collective summed over it."""
    r = invoke("plan", "--size", "xl", "--strategy", "fsdp", "--n", "2", "--batch", "256",
               "--seq", "512", "--db", db_path)
    assert r.exit_code == 0, r.output
    import sqlite3

    from cs336sys.experiments.plan_section import phases
    from cs336sys.report.select import Selection, load

    conn = sqlite3.connect(db_path)
    conn.row_factory = sqlite3.Row
    from cs336sys.experiments.catalog import EXPERIMENTS

    (row,) = load(conn, Selection(), EXPERIMENTS)["plan"]
    (cells,) = phases([row]).rows
    # B = 131,072 tokens of xl: forward 2·B·T·(...) FLOPs over 2 devices; the fsdp all-gather
    # of bf16 weights, (N-1)/N · 2P / W, forward; and the reduce-scatter beside it backward
    fwd = 2724931263528960 / 3 / 2
    assert cells[:3] == ["fsdp", "2", "2x1"]
    assert float(cells[3]) == pytest.approx(fwd, rel=1e-3)
    assert float(cells[7]) == pytest.approx(2 * fwd, rel=1e-3)
    gather_ms = 0.5 * 2 * 3406809600 / 450e9 * 1e3
    assert float(cells[5]) == pytest.approx(gather_ms, rel=1e-2)
    assert float(cells[9]) == pytest.approx(2 * gather_ms, rel=1e-2)
    assert cells[6] == cells[10] == "yes"


def test_the_tp_closed_form_names_the_models_own_matrix_count(db_path):
    """The TP condition read `m = 3 matrices (m = 2)` for the 2025 handout's xxl, whose FFN
    has two matrices: the 3 was SwiGLU's, written into the formula."""
    for size in ("xxl", "8b"):
        r = invoke("plan", "--size", size, "--hardware", "tpu-v5p", "--strategy", "tp", "--n", 4,
                   "--db", db_path)
        assert r.exit_code == 0, r.output
    said = [json.loads(row["metrics"])["inequality"]
            for row in query(db_path, "SELECT metrics FROM runs ORDER BY created")]
    assert [s.endswith(f"(m = {m})") for s, m in zip(said, (2, 3), strict=True)] == [True, True]
    assert not any("m = 3 matrices" in s for s in said), said


def test_the_step_plot_names_every_strategy_and_no_minor_tick_across_decades(monkeypatch):
    """The legend took the first panel's strategies alone (a TPU panel of fsdp left dp and tp
    of the next panels unnamed), and across decades every minor tick was labelled, 900, 800
    and 700 printed over one another."""
    from matplotlib.figure import Figure

    from cs336sys.experiments.plan_section import StepPlot

    drawn, save = [], Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: drawn.append(fig) or save(fig, *a, **k))
    StepPlot((("TPU", (("fsdp", ((1, 90000.0, False), (16, 7000.0, True)), 13.0),)),
              ("H100", (("dp", ((1, 350.0, False), (8, 45.0, False)), 5.0),
                        ("tp", ((1, 350.0, False), (8, 50.0, True)), 5.0)))), "plan").draw()
    (fig,) = drawn
    assert [t.get_text() for t in fig.legends[0].texts][:3] == ["fsdp", "dp", "tp"]
    assert [t.get_text() for t in fig.axes[0].yaxis.get_minorticklabels() if t.get_text()] == []
    assert [t.get_text() for t in fig.axes[0].yaxis.get_majorticklabels() if t.get_text()]


def test_every_plan_table_names_its_model_by_its_shape(db_path):
    """The two handouts' xl differ (2025: 1600×48; 2026: 2560×32): the time and memory
    tables said only the hardware, strategy and N, and the size appeared first in the closed
    forms' table."""
    r = invoke("plan", "--size", "xl", "--handout", "2025", "--strategy", "dp", "--n", 2,
               "--db", db_path)
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    for title in ("Step time and communication per device", "Memory per device (GiB)"):
        at = text.index(title)
        assert "model=xl (1600×48, 2.0B)" in text[at:at + 200], text[at:at + 200]
