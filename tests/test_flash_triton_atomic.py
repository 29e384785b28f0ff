"""The opt-in atomic-dQ backward (CS336SYS_TRITON_ATOMIC_DQ=1) against float64.

The dK/dV kernel adds each query tile's share of dQ into a float32 buffer with atomics, so
dQ is a sum in no fixed order: these tests hold it to the same tolerances as the default,
atomic-free backward, for every dtype, both maskings, padded head dims, odd lengths, unequal
tiles, the model's strided views, and with the descriptor (TMA) loads. On CPU through Triton's
interpreter (pointer atomics run there); on a CUDA host the same tests run compiled.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cs336sys.attention import flash_triton
from tests.attention_ref import assert_close, make_inputs, reference, torch_error
from tests.test_flash_triton import DEVICE, run_flash

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16


@pytest.fixture
def atomic_dq(monkeypatch):
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    monkeypatch.setattr(flash_triton, "ATOMIC_DQ", True)
    yield
    backward = [p for p in flash_triton._PLANS.values() if len(p.launches) == 2]
    assert backward and all(p.atomic_dq for p in backward)  # the atomic plans really ran


@pytest.fixture
def reduce_dq(atomic_dq, monkeypatch):
    """dQ added by TMA reductions: the descriptor build everywhere (FORCE_TMA), the
    interpreter running each tile's `atomic_add` (measure/triton_support.py)."""
    monkeypatch.setattr(flash_triton, "REDUCE_DQ", True)
    monkeypatch.setattr(flash_triton, "FORCE_TMA", True)
    yield
    backward = [p for p in flash_triton._PLANS.values() if len(p.launches) == 2]
    assert all(p.reduce_dq and p.variant == "tma" for p in backward)


CASES = [  # (q shape, k/v shape, dtype, causal)
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), F32, True, id="fp32-causal"),
    pytest.param((2, 64, 16), (2, 64, 16), F32, False, id="fp32-3d-full"),
    pytest.param((1, 2, 50, 48), (1, 2, 21, 48), F32, True, id="fp32-more-queries"),
    pytest.param((2, 21, 80), (2, 50, 80), F32, False, id="fp32-fewer-queries-d80"),
    pytest.param((1, 2, 1, 16), (1, 2, 33, 16), F32, True, id="fp32-one-query"),
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), BF16, True, id="bf16-causal"),
    pytest.param((2, 37, 48), (2, 37, 48), F16, False, id="fp16-full-d48"),
    pytest.param((1, 2, 40, 128), (1, 2, 40, 128), BF16, True, id="bf16-d128"),
]


@pytest.mark.parametrize("shape_q, shape_kv, dtype, is_causal", CASES)
@pytest.mark.slow
def test_atomic_dq_matches_float64(atomic_dq, shape_q, shape_kv, dtype, is_causal):
    got, ref, err = run_flash(shape_q, shape_kv, dtype, is_causal, seed=4)
    assert_close(got, ref, dtype, err)


@pytest.mark.parametrize("shape_q, shape_kv, dtype, is_causal", [
    pytest.param((2, 2, 37, 32), (2, 2, 37, 32), F32, True, id="fp32-causal-tail"),
    pytest.param((2, 21, 80), (2, 50, 80), F32, False, id="fp32-fewer-queries-d80"),
    pytest.param((1, 2, 40, 128), (1, 2, 40, 128), BF16, True, id="bf16-d128"),
])
def test_dq_by_tma_reductions_matches_float64(reduce_dq, shape_q, shape_kv, dtype, is_causal):
    """Each query tile's share of dQ added as one tile through the descriptor, which drops
    the rows past the sequence and the columns past a head dim of 80 (BLOCK_D 128)."""
    got, ref, err = run_flash(shape_q, shape_kv, dtype, is_causal, seed=4)
    assert_close(got, ref, dtype, err)


@pytest.mark.skipif(DEVICE == "cuda", reason="the autotuner picks the tiles on CUDA")
@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)], ids=lambda t: f"{t[0]}x{t[1]}")
@pytest.mark.parametrize("n_queries, n_keys", [(45, 45), (70, 29), (29, 70)])
def test_atomic_dq_with_unequal_tiles(atomic_dq, monkeypatch, tiles, n_queries, n_keys):
    monkeypatch.setattr(flash_triton, "INTERPRETER_TILES", tiles)
    got, ref, _ = run_flash((1, 2, n_queries, 16), (1, 2, n_keys, 16), F32, True, seed=5)
    assert_close(got, ref, F32)


@pytest.mark.slow  # three interpreted forward and backward calls each
@pytest.mark.parametrize("tma, reduce", [(False, False), (True, False), (True, True)],
                         ids=["pointer", "tma", "tma-reduce"])
def test_model_views_reuse_the_atomic_plan(atomic_dq, monkeypatch, tma, reduce):
    """(B, H, T, D) views of (B, T, H, D) memory, three calls: one plan each way, reused, and
    dQ (a float32 buffer cast back) comes out in q's memory order. With the descriptor loads
    (FORCE_TMA) the atomics stay pointer ones unless REDUCE_DQ: then a descriptor over the
    float32 buffer's strided rows takes the tiles."""
    monkeypatch.setattr(flash_triton, "FORCE_TMA", tma)
    monkeypatch.setattr(flash_triton, "REDUCE_DQ", reduce)
    q, k, v, do = make_inputs((2, 40, 2, 32), (2, 40, 2, 32), BF16, seed=6, device=DEVICE)
    q, k, v, do = (t.transpose(1, 2) for t in (q, k, v, do))
    ref = {n: t.to(DEVICE) for n, t in reference(q, k, v, do, True).items()}
    err = torch_error(q, k, v, do, True, ref)
    for _ in range(3):
        qg, kg, vg = (t.detach().clone().requires_grad_() for t in (q, k, v))
        o = flash_triton.FlashAttention2Triton.apply(qg, kg, vg, True)
        o.backward(do)
        assert qg.grad.stride() == q.stride()
        assert_close({"o": o, "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}, ref, BF16, err)
    plans = list(flash_triton._PLANS.values())
    variant = "tma" if tma else "pointer"
    assert [(p.hits, p.views, p.variant) for p in plans] == [(2, False, variant)] * 2
    assert [(p.atomic_dq, p.reduce_dq) for p in plans] == [(False, False), (True, reduce)]


def test_the_default_backward_is_atomic_free_and_deterministic(monkeypatch):
    """Unless opted in: two runs give bit-identical dQ, and the plan is the dQ-kernel one."""
    monkeypatch.setattr(flash_triton, "_PLANS", {})
    assert flash_triton.ATOMIC_DQ is False
    grads = []
    for _ in range(2):
        q, k, v, do = make_inputs((1, 2, 45, 32), (1, 2, 45, 32), F32, seed=7, device=DEVICE)
        q.requires_grad_()
        flash_triton.FlashAttention2Triton.apply(q, k, v, True).backward(do)
        grads.append(q.grad)
    assert torch.equal(*grads)
    assert not any(p.atomic_dq for p in flash_triton._PLANS.values())


@pytest.mark.slow
def test_attention_rows_name_the_opt_in_asked_for_and_the_kernels_that_ran(monkeypatch, tmp_path):
    """`cs336sys attention --impl triton` stores the requested opt-in as a setting (so that
    --resume tells it from a default point) and the kernels that ran as triton_kernels."""
    from cs336sys.attention import opt_in
    from tests.conftest import invoke, query

    db = tmp_path / "r.db"
    # one timed call per pass: what is checked comes from the checked pass before them
    argv = ["attention", "--impl", "triton", "--seq", "40", "--d-head", "16", "--batch", "1",
            "--heads", "2", "--warmup", "0", "--iters", "1", "--device", DEVICE, "--db", db,
            "--resume"]
    assert invoke(*argv).exit_code == 0
    monkeypatch.setattr(opt_in, "ATOMIC_DQ", True)  # the point's setting; opted_in does the rest
    result = invoke(*argv)
    assert result.exit_code == 0, result.output
    assert "triton[pointer+atomic-dq]" in result.output
    rows = query(db, "SELECT triton_opt_in, triton_kernels, status, max_err_grad "
                     "FROM attention_runs ORDER BY created")
    assert [(r["triton_opt_in"], r["triton_kernels"], r["status"]) for r in rows] == [
        ("default", "pointer", "ok"), ("atomic-dq", "pointer+atomic-dq", "ok")]
    assert rows[1]["max_err_grad"] < 1e-4
    assert invoke(*argv).exit_code == 0  # resumed: both points are stored ok already
    assert len(query(db, "SELECT 1 FROM attention_runs")) == 2


@pytest.mark.slow
def test_one_attention_run_sweeps_the_opt_ins_side_by_side(tmp_path):
    """--triton-opt-in takes a list: a point each, in one invocation, each recording what it
    asked for and what ran (`tma` falls back to the pointer kernels for fp32 and off Hopper), and the
    process's own switches are as before afterwards. A bad value is one line, exit 2."""
    from tests.conftest import invoke, query

    db = tmp_path / "r.db"
    argv = ["attention", "--impl", "triton,naive", "--seq", "40", "--d-head", "16", "--batch",
            "1", "--heads", "2", "--warmup", "0", "--iters", "1", "--device", DEVICE, "--db", db]
    result = invoke(*argv, "--triton-opt-in", "default,atomic-dq,tma+atomic-dq,reduce-dq",
                    "--wide")
    assert result.exit_code == 0, result.output
    got = query(db, "SELECT impl, triton_opt_in, triton_kernels, status, max_err_grad "
                    "FROM attention_runs ORDER BY created")
    assert [(r["impl"], r["triton_opt_in"], r["triton_kernels"], r["status"]) for r in got] == [
        ("triton", "default", "pointer", "ok"),
        ("triton", "atomic-dq", "pointer+atomic-dq", "ok"),
        ("triton", "tma+atomic-dq", "pointer+atomic-dq", "ok"),  # fp32 never takes TMA
        ("triton", "reduce-dq", "pointer+atomic-dq", "ok"),  # ... nor its reductions
        ("naive", None, None, "ok"),
    ]
    assert all(r["max_err_grad"] < 1e-4 for r in got)
    triton_lines = [line for line in result.output.splitlines() if line.startswith("triton")]
    assert len(triton_lines) == 4 and all("×" in line for line in triton_lines)  # vs naive
    # each opt-in against the default triton point of the same run, with its interval
    assert "vs default" in result.output
    against = [line for line in result.output.splitlines()
               if line.startswith("triton[") and line.count("×") == 2]
    assert len(against) == 3, result.output
    from cs336sys.attention import opt_in

    assert (flash_triton.TMA, flash_triton.ATOMIC_DQ, flash_triton.REDUCE_DQ) == (
        opt_in.TMA, opt_in.ATOMIC_DQ, opt_in.REDUCE_DQ)
    bad = invoke(*argv, "--triton-opt-in", "fast")
    assert bad.exit_code == 2 and len(bad.stderr.strip().splitlines()) == 1
    assert "--triton-opt-in: unknown value 'fast'" in bad.stderr
    assert len(query(db, "SELECT 1 FROM attention_runs")) == 5
