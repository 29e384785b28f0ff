"""The model benchmark on CUDA (marked gpu: skipped without CUDA, run on a lent GPU)."""

import pytest
from typer.testing import CliRunner

from cs336sys.cli import app
from tests.conftest import view_rows

pytestmark = pytest.mark.gpu
runner = CliRunner()


_rows = view_rows("model_runs")


def test_cuda_point_records_gpu_mfu_and_memory(tmp_path):
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        [
            "model",
            "--size",
            "small",
            "--seq",
            "256",
            "--mode",
            "train",
            "--precision",
            "fp32,bf16",
            "--device",
            "cuda",
            "--warmup",
            "2",
            "--iters",
            "3",
            "--db",
            str(db),
        ],
    )
    assert result.exit_code == 0, result.output
    rows = _rows(db)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    import torch

    for r in rows:
        assert r["gpu"] == torch.cuda.get_device_name(0) and r["device"] == "cuda:0"
        assert r["peak_allocated_mb"] > 0 and r["peak_reserved_mb"] >= r["peak_allocated_mb"]
        if r["peak_tflops"] is not None:  # a GPU in the peak table
            assert 0 < r["mfu"] < 1
    assert [r["logits_dtype"] for r in rows] == ["float32", "bfloat16"]


def test_real_oom_is_a_row_and_the_sweep_goes_on(tmp_path):
    # 10B in fp32 with AdamW needs ~16 bytes per parameter, ~160 GB: more than any single GPU.
    # --force: the estimate would store it as skipped before it ever ran (seen on an H200).
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        [
            "model",
            "--size",
            "10B,tiny",
            "--seq",
            "128",
            "--mode",
            "train",
            "--device",
            "cuda",
            "--warmup",
            "1",
            "--iters",
            "2",
            "--force",
            "--db",
            str(db),
        ],
    )
    assert result.exit_code == 0, result.output
    assert [(r["size"], r["status"]) for r in _rows(db)] == [("10B", "oom"), ("tiny", "ok")]


def test_small_bf16_train_is_launch_bound_and_2_7b_fp32_is_not(tmp_path):
    """On an H100 small's bf16 step takes 13-18 ms of wall time for about 6 ms of kernels:
    the host launches slower than the GPU runs. 2.7B in fp32 keeps the GPU busy."""
    db = tmp_path / "r.db"
    for size, precision in (("small", "bf16"), ("2.7B", "fp32")):
        result = runner.invoke(app, ["model", "--size", size, "--precision", precision,
                                     "--mode", "train", "--batch", "4", "--seq",
                                     "512", "--device", "cuda", "--warmup", "3", "--iters", "5",
                                     "--db", str(db)])
        assert result.exit_code == 0, result.output
    small, big = _rows(db)
    assert small["launch_bound"] == 1 and small["launch_bound_phases"]
    assert big["launch_bound"] == 0 and big["launch_bound_phases"] == ""
    assert 0 < big["fwd_host_ms_mean"] < big["fwd_ms_mean"]
