"""`cs336sys ddp`: every variant trains the same model on two Gloo ranks, the ranks end with
identical weights, the communication counters match the model, and bad input is refused."""

import json

import pytest
from typer.testing import CliRunner

from cs336sys.cli import app
from cs336sys.models.config import ModelConfig
from cs336sys.models.transformer import TransformerLM
from tests.conftest import view_rows

runner = CliRunner()
rows = view_rows('ddp_runs')
MICRO = ["--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers", "2",
         "--num-heads", "4", "--vocab-size", "256", "--seq", "32",
         "--batch", "4", "--warmup", "1", "--iters", "3"]



@pytest.fixture(scope="module")
def swept(tmp_path_factory):
    db = tmp_path_factory.mktemp("ddp") / "results.db"
    result = runner.invoke(
        app, ["ddp", "--db", str(db), *MICRO, "--bucket-mb", "0.001,1000", "--world-size", "2"]
    )
    return db, result


@pytest.mark.slow
def test_every_variant_runs_and_ranks_agree(swept):
    db, result = swept
    assert result.exit_code == 0, result.output
    got = rows(db)
    assert [(r["impl"], r["bucket_mb"]) for r in got] == [
        ("naive", None), ("flat", None), ("overlap", None), ("bucketed", 0.001),
        ("bucketed", 1000.0), ("torch", 25.0),
    ]
    for r in got:
        assert r["status"] == "ok" and r["world_size"] == 2 and r["backend"] == "gloo"
        # our AdamW is unset, as in the points stored before --optimizer: the same points
        assert r["optimizer"] is None
        assert r["param_max_diff"] == 0.0  # every rank holds the same weights after training
        assert r["comm_fraction"] < 1 and r["step_ms_mean"] > 0
        if r["impl"] not in ("torch", "torch-fsdp"):  # measured directly, never below 0
            assert r["comm_fraction"] >= 0 and r["comm_ms_mean"] >= 0
        else:  # a difference of two backwards, not clipped: noise may take it below 0
            assert -r["bwd_ms_mean"] < r["comm_ms_mean"] < r["bwd_ms_mean"]
        # each rank's own mean lies under the mean of the per-step slowest rank
        assert r["step_ms_rank_min"] <= r["step_ms_rank_mean"] <= r["step_ms_rank_max"]
        assert r["step_ms_rank_max"] <= r["step_ms_mean"] + 1e-12 * abs(r["step_ms_mean"])
        # communication is the least rank's each step: a rank that reached the collective
        # first also waited there for the other's backward (torch's, a difference of two
        # backwards, may be below 0: the rounding margin is of its size, not its sign)
        least = r["comm_ms_rank_min"]
        assert r["comm_ms_mean"] <= least + 1e-12 * abs(least)
        assert r["comm_ms_rank_min"] <= r["comm_ms_rank_max"]
        # the all-reduces alone: inside the blocking wrappers' synchronisation, so at most
        # its time (flat's comm ms holds its copies too); the hooked ones' overlap backward
        if r["impl"] in ("naive", "flat"):
            assert 0 < r["allreduce_ms_mean"] <= r["comm_ms_mean"] * (1 + 1e-12)
        elif r["impl"] in ("overlap", "bucketed"):
            assert 0 < r["allreduce_ms_mean"] < r["step_ms_mean"]
        else:
            assert r["allreduce_ms_mean"] is None  # torch times no collective of its own
    assert "vs torch" in result.stdout and "all-reduce ms" in result.stdout


@pytest.mark.slow
def test_communication_counters_match_the_model(swept):
    db, _ = swept
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
                      context_length=32)
    model = TransformerLM(cfg)
    params = [p for p in model.parameters() if p.requires_grad]
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    buffer_bytes = sum(b.numel() * b.element_size() for b in model.buffers())
    by_impl = {(r["impl"], r["bucket_mb"]): r for r in rows(db)}
    for (impl, _), r in by_impl.items():
        assert r["allreduce_bytes"] == grad_bytes  # every gradient, once per step
        # torch DDP also broadcasts rank 0's buffers (the RoPE tables) before every forward,
        # with a few bytes of its own bookkeeping
        if impl == "torch":
            assert buffer_bytes <= r["broadcast_bytes"] <= buffer_bytes + 256
        else:
            assert r["broadcast_bytes"] == 0
        assert r["allgather_bytes"] == r["reducescatter_bytes"] == 0
        assert r["comm_bytes"] == r["allreduce_bytes"] + r["broadcast_bytes"]
        # what each of the two ranks sends: half of 2 S for an all-reduce (the ring), half of
        # S for a broadcast
        assert r["sent_bytes"] == r["allreduce_bytes"] + r["broadcast_bytes"] / 2
        assert r["params"] == sum(p.numel() for p in params)
    assert by_impl["naive", None]["allreduce_calls"] == len(params)
    assert by_impl["overlap", None]["allreduce_calls"] == len(params)
    assert by_impl["flat", None]["allreduce_calls"] == 1
    assert by_impl["bucketed", 1000.0]["allreduce_calls"] == 1  # one bucket holds everything
    assert by_impl["bucketed", 1000.0]["buckets"] == 1
    assert by_impl["bucketed", 0.001]["allreduce_calls"] == len(params)  # 1 KiB: one each
    assert by_impl["torch", 25.0]["allreduce_calls"] >= 1


@pytest.mark.slow
def test_same_seed_same_first_loss_for_every_variant(swept):
    """All variants start from rank 0's weights and see the same batch: same first loss."""
    db, _ = swept
    losses = {r["loss_first"] for r in rows(db)}
    assert max(losses) - min(losses) < 1e-5


@pytest.mark.parametrize(
    "args, message",
    [
        (["--batch", "5"], "does not split evenly over 2 ranks"),
        (["--impl", "zero"], "--impl"),
        (["--impl", "fsdp2"], "--impl"),
        (["--bucket-mb", "0"], "--bucket-mb must be a positive number of MB, got 0"),
        (["--bucket-mb", "nan"], "--bucket-mb must be a positive number of MB, got nan"),
        (["--bucket-mb", "inf"], "--bucket-mb must be a positive number of MB, got inf"),
        (["--impl", "naive,flat", "--bucket-mb", "5"],
         "--bucket-mb is a setting of the bucketed DDPs, which --impl naive,flat leaves out"),
        (["--bucket-mb", "big"], "not a number"),
        # measured plain FSDPs, said nothing of the sharding asked for
        (["--impl", "fsdp", "--shard-optimizer"], "--shard-optimizer shards a replica's "
         "optimizer state; the FSDPs of --impl fsdp shard theirs"),
        (["--impl", "torch-fsdp", "--zero"], "--zero shards a replica's optimizer state"),
        (["--size", "huge"], "--size"),
        (["--precision", "fp8"], "--precision"),
        (["--iters", "0"], "--iters"),
        (["--backend", "nccl", "--device", "cpu"], "nccl needs CUDA"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(db_path, args, message):
    result = runner.invoke(app, ["ddp", "--db", str(db_path), *MICRO, *args])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not db_path.exists()


def test_torch_default_bucket_is_what_torch_uses():
    import torch.nn.parallel.distributed as torch_ddp

    from cs336sys.experiments.ddp import TORCH_BUCKET_MB

    # bucket_cap_mb=None means this module constant in the installed torch
    assert getattr(torch_ddp, "_DEFAULT_BUCKET_CAP_MB", 25) == TORCH_BUCKET_MB


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    db = tmp_path_factory.mktemp("sharded") / "results.db"
    result = runner.invoke(app, ["ddp", "--db", str(db), *MICRO, "--impl",
                                 "naive,torch,fsdp,torch-fsdp", "--shard-optimizer", "--zero"])
    return db, result


@pytest.mark.slow
def test_sharded_variants_run_and_store_their_memory(sharded):
    db, result = sharded
    assert result.exit_code == 0, result.output
    got = {(r["impl"], r["shard_optimizer"]): r for r in rows(db)}
    assert list(got) == [("naive", "none"), ("naive", "ours"), ("naive", "zero"),
                         ("torch", "none"), ("torch", "ours"), ("torch", "zero"),
                         ("fsdp", None), ("torch-fsdp", None)]
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
                      context_length=32)
    model = TransformerLM(cfg)
    n = sum(p.numel() for p in model.parameters())
    n_1d = sum(p.numel() for p in model.parameters() if p.dim() == 1)
    sharded_2d = [p.numel() for p in model.parameters() if p.dim() >= 2]
    for (impl, sharding), r in got.items():
        assert r["status"] == "ok" and r["world_size"] == 2
        parts = [r[f"mem_before_opt_{k}_bytes"] for k in ("params", "grads", "opt_state")]
        assert r["mem_before_opt_bytes"] >= sum(parts) > 0  # the live total holds the parts
        assert r["mem_peak_bytes"] >= r["mem_before_opt_bytes"]
        # the peak up to each moment: at least what is live then, never falling in the step,
        # and after the optimizer step the step's peak
        for moment in ("init", "before_opt", "after_opt"):
            assert r[f"mem_{moment}_peak_bytes"] >= r[f"mem_{moment}_bytes"] > 0
        assert r["mem_before_opt_peak_bytes"] <= r["mem_after_opt_peak_bytes"]
        assert r["mem_after_opt_peak_bytes"] <= r["mem_peak_bytes"]
        assert r["mem_init_opt_state_bytes"] == 0 and r["mem_init_grads_bytes"] == 0
        # every rank's memory by moment: rank 0's is the row's; the halves of a sharded
        # AdamW state add up to the whole (8 bytes per parameter)
        per_rank = json.loads(r["mem_per_rank"])
        assert len(per_rank) == 2
        assert per_rank[0]["before_opt_params"] == r["mem_before_opt_params_bytes"]
        if sharding in ("ours", "zero"):
            assert sum(m["after_opt_opt_state"] for m in per_rank) == 8 * n
        if impl in ("naive", "torch"):  # replicas: whole parameters and gradients
            assert r["mem_before_opt_params_bytes"] == r["mem_before_opt_grads_bytes"] == 4 * n
            assert r["param_max_diff"] == 0.0
        if sharding == "none":
            assert r["mem_after_opt_opt_state_bytes"] == 8 * n == r["expected_opt_state_bytes"]
        if sharding in ("ours", "zero"):
            # about half the AdamW state, within the largest parameter of the balance
            state = r["mem_after_opt_opt_state_bytes"]
            assert abs(state - 4 * n) <= 8 * max(p.numel() for p in model.parameters())
            assert r["broadcast_bytes"] >= 4 * n  # every updated parameter from its owner
        if impl == "fsdp":
            padded = sum(-(-k // 2) for k in sharded_2d)  # each slice: ceil(numel / 2)
            assert r["mem_before_opt_params_bytes"] == 4 * (padded + n_1d)
            assert r["mem_before_opt_grads_bytes"] == 4 * (padded + n_1d)
            assert r["mem_after_opt_opt_state_bytes"] == 8 * (padded + n_1d)
            assert r["expected_params_bytes"] == pytest.approx(4 * (n - n_1d) / 2 + 4 * n_1d)
            assert r["reducescatter_bytes"] == 4 * 2 * padded  # every padded gradient, once
            # every weight in forward, and again in backward but the embedding (whose
            # backward needs none) and the LM head (the root, kept from forward)
            once = sum(-(-m.weight.numel() // 2) for m in (model.token_embeddings, model.lm_head))
            assert r["allgather_bytes"] == 4 * 2 * (2 * padded - once)
            assert r["comm_ms_mean"] > 0  # all-gathers and reduce-scatters in flight
            assert r["allreduce_bytes"] == 4 * n_1d  # the replicated gradients
            assert r["param_max_diff"] == 0.0  # replicated parameters agree
        if impl == "torch-fsdp":
            assert r["mem_before_opt_params_bytes"] == pytest.approx(2 * n, rel=0.02)
            assert r["allgather_bytes"] > 0 and r["reducescatter_bytes"] > 0
            # FSDP2 gathers what ours gathers (no padding at these even sizes) and the norm
            # gains, which ours keeps replicated: the blocks' twice, the final one once
            norms = sum(b.ln1.weight.numel() + b.ln2.weight.numel() for b in model.layers)
            ours = got["fsdp", None]["allgather_bytes"]
            assert r["allgather_bytes"] == ours + 4 * (2 * norms + model.ln_final.weight.numel())
            assert r["param_max_diff"] is None
    losses = {round(r["loss_first"], 4) for r in got.values()}  # one model, one batch
    assert len(losses) == 1, losses
    assert "+sharded opt" in result.stdout and "+ZeRO" in result.stdout


def test_rank0s_share_is_uneven_where_the_ranks_hold_one_copy_and_not_sharded_where_more():
    """Known byte counts per rank (rank 0 first) of a 100-byte model, AdamW's state 200."""
    from cs336sys.experiments.ddp_setup import shares, shares_cell

    def point(params, opt, impl="naive", sharding="yours"):
        out = shares(impl, sharding, params, opt, 100)
        return out, shares_cell({"impl": impl, "shard_optimizer": sharding, **out})

    even, cell = point([100, 100], [100, 100])  # one copy, halved
    assert (even["opt_state_rank0_share"], even["not_sharded"], even["uneven"]) == (0.5, None, None)
    assert cell == "opt 50%"
    robin, cell = point([100, 100], [190, 10])  # one copy, rank 0 has 95 %
    assert robin["not_sharded"] is None and cell == "opt 95% UNEVEN"
    assert robin["uneven"] == ("rank 0 holds optimizer state 95% of the whole, more than 1/2 + "
                               "10%; the other ranks the rest")
    whole, cell = point([100, 100], [200, 200], impl="fsdp", sharding=None)  # nothing sharded
    assert whole["uneven"] is None and cell == "params 100%, opt 100% NOT SHARDED"
    assert whole["not_sharded"].endswith("the ranks hold 2.0 copies of the parameters, 2.0 "
                                         "copies of the optimizer state")
    # a user's FSDP that shards none of cs336sys's model's layers (it wraps the course's
    # cs336_basics classes): said why, and where it would shard; on their model, not said
    from cs336sys.experiments.ddp_setup import NOT_OUR_LAYERS

    theirs = shares("yours-fsdp", None, [100, 100], [200, 200], 100)
    assert theirs["not_sharded"].endswith("copies of the optimizer state" + NOT_OUR_LAYERS)
    assert "--model cs336_basics" in NOT_OUR_LAYERS
    on_theirs = shares("yours-fsdp", None, [100, 100], [200, 200], 100, model="cs336_basics")
    assert on_theirs["not_sharded"] == whole["not_sharded"]
    half = shares("yours-fsdp", None, [50, 50], [100, 100], 100)  # it shards
    assert half["not_sharded"] is None
    unsharded, cell = point([100, 100], [200, 200], sharding="none")  # not meant to shard
    assert (unsharded["not_sharded"], unsharded["uneven"], cell) == (None, None, None)
