"""Attention on CUDA (marked gpu: skipped without CUDA, run on a lent GPU)."""

import sqlite3

import pytest
import torch
from typer.testing import CliRunner

from cs336sys.cli import app
from tests.attention_ref import assert_close, make_inputs, reference, torch_error

pytestmark = pytest.mark.gpu
runner = CliRunner()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", [(2, 300, 64), (1, 4, 1000, 128), (2, 2, 257, 80)])
def test_flash_kernels_on_cuda_match_float64(dtype, causal, shape):
    from cs336sys.attention import FlashAttention2Torch, FlashAttention2Triton

    q, k, v, do = make_inputs(shape, shape, dtype, device="cuda")
    ref = reference(q.cpu(), k.cpu(), v.cpu(), do.cpu(), causal)
    ref = {n: t.cuda() for n, t in ref.items()}
    err = None if dtype == torch.float32 else torch_error(q, k, v, do, causal, ref)
    for fn in (FlashAttention2Torch, FlashAttention2Triton):
        qq, kk, vv = (t.clone().requires_grad_() for t in (q, k, v))
        o = fn.apply(qq, kk, vv, causal)
        o.backward(do)
        got = {"o": o, "dq": qq.grad, "dk": kk.grad, "dv": vv.grad}
        assert_close(got, ref, dtype, err)


def test_leaderboard_preset_runs_with_do_bench(tmp_path):
    db = tmp_path / "r.db"
    result = runner.invoke(
        app,
        [
            "attention",
            "--preset",
            "leaderboard",
            "--impl",
            "triton,sdpa",
            "--sdpa-backend",
            "flash",
            "--db",
            str(db),
        ],
    )
    assert result.exit_code == 0, result.output
    conn = sqlite3.connect(db)
    got = conn.execute(
        "SELECT impl, status, timer, interpreted, sdpa_backend_used, max_err_grad, "
        "e2e_ms FROM attention_runs ORDER BY created"
    ).fetchall()
    assert [(g[0], g[1], g[2], g[3]) for g in got] == [
        ("triton", "ok", "do-bench", 0),
        ("sdpa", "ok", "do-bench", 0),
    ]
    assert got[1][4] == "flash"
    assert all(g[5] < 0.05 and g[6] > 0 for g in got)
