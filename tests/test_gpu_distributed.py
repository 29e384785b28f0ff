"""comm and ddp on NCCL (marked gpu; they also need at least two GPUs, one per rank)."""

import pytest
import torch
from typer.testing import CliRunner

from cs336sys.cli import app
from tests.conftest import view_rows

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="NCCL needs one GPU per rank: at least 2 GPUs",
    ),
]
runner = CliRunner()


def _rows(db, view):
    return view_rows(view)(db)


def test_comm_sweep_on_nccl_is_exact(tmp_path):
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        ["comm", "--db", str(db), "--op", "all-reduce,all-gather,reduce-scatter,broadcast",
         "--bytes", "1MB,100MB", "--precision", "fp32,bf16", "--world-size", "2", "--iters", "10"],
    )
    assert result.exit_code == 0, result.output
    got = _rows(db, "comm_runs")
    assert len(got) == 16
    for r in got:
        assert r["backend"] == "nccl" and r["status"] == "ok" and r["wrong"] == 0
        assert r["busbw_gbps"] > 0


def test_ddp_sweep_on_nccl_keeps_ranks_identical(tmp_path):
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        ["ddp", "--db", str(db), "--size", "small", "--seq", "256",
         "--batch", "8", "--world-size", "2", "--bucket-mb", "10,100", "--warmup", "2",
         "--iters", "5"],
    )
    assert result.exit_code == 0, result.output
    got = _rows(db, "ddp_runs")
    assert {r["impl"] for r in got} == {"naive", "flat", "overlap", "bucketed", "torch"}
    for r in got:
        assert r["backend"] == "nccl" and r["status"] == "ok"
        assert r["param_max_diff"] == 0.0
        assert 0 <= r["comm_fraction"] < 1


def test_sharded_sweep_on_nccl_divides_the_memory(tmp_path):
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        ["ddp", "--db", str(db), "--size", "small", "--seq", "256",
         "--batch", "8", "--world-size", "2", "--impl", "torch,fsdp,torch-fsdp",
         "--shard-optimizer", "--zero", "--precision", "fp32,bf16", "--warmup", "2",
         "--iters", "5"],
    )
    assert result.exit_code == 0, result.output
    got = {(r["impl"], r["shard_optimizer"], r["precision"]): r for r in _rows(db, "ddp_runs")}
    assert len(got) == 10
    for (impl, _, _), r in got.items():
        assert r["backend"] == "nccl" and r["status"] == "ok"
        assert r["mem_before_opt_params_bytes"] == pytest.approx(r["expected_params_bytes"], rel=0.01)
        assert r["mem_after_opt_opt_state_bytes"] == pytest.approx(
            r["expected_opt_state_bytes"], rel=0.02
        )
        if impl != "torch-fsdp":
            assert r["param_max_diff"] == 0.0
    for precision in ("fp32", "bf16"):
        full = got["torch", "none", precision]["mem_after_opt_opt_state_bytes"]
        assert got["torch", "ours", precision]["mem_after_opt_opt_state_bytes"] <= 0.6 * full
