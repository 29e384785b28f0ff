"""The attention benchmark: chunked reference, the CLI sweep, OOM handling, bad input."""

import json
from dataclasses import replace

import pytest
import torch

from cs336sys.attention.reference import attention_reference
from cs336sys.experiments import attention as attention_exp
from tests.attention_ref import make_inputs, reference
from tests.conftest import invoke, view_rows

rows = view_rows('attention_runs')
SMALL = ["--d-head", "16", "--batch", "2", "--warmup", "1", "--iters", "3", "--device", "cpu"]




@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("tq,tk", [(37, 37), (20, 33), (33, 20)])
def test_chunked_reference_matches_float64_autograd(causal, tq, tk):
    q, k, v, do = make_inputs((2, 3, tq, 16), (2, 3, tk, 16), torch.float32)
    ref = reference(q, k, v, do, causal)
    # max_elements forces chunks of a few queries, so the chunk seams are exercised.
    o, (dq, dk, dv) = attention_reference(q, k, v, causal, do=do, max_elements=6 * tk * 5)
    for got, name in ((o, "o"), (dq, "dq"), (dk, "dk"), (dv, "dv")):
        assert (got.double() - ref[name]).abs().max().item() < 1e-5, name
    o_only, grads = attention_reference(q, k, v, causal)
    assert grads is None and torch.allclose(o_only, o, atol=1e-6, rtol=0)


def test_sweep_writes_the_expected_rows_and_derived_figures(db_path, monkeypatch):
    # flash-torch's backward eagerly: compiled, each length is a compile (C++ built by
    # inductor: most of this test's time). tests/test_flash_torch.py checks the compiled one.
    from cs336sys.attention import flash_torch

    monkeypatch.setenv(flash_torch.COMPILE_ENV, "0")
    result = invoke(
        "attention", *SMALL, "--impl", "naive,sdpa,flash-torch", "--seq", "32,128", "--db", db_path
    )
    assert result.exit_code == 0, result.output
    got = rows(db_path)
    assert [(r["impl"], r["seq"]) for r in got] == [
        ("naive", 32),
        ("naive", 128),
        ("sdpa", 32),
        ("sdpa", 128),
        ("flash-torch", 32),
        ("flash-torch", 128),
    ]
    for r in got:
        assert (
            r["status"] == "ok" and r["pass"] == "both" and r["causal"] == 1 and r["heads"] is None
        )
        assert (r["d_head"], r["batch"], r["precision"], r["timer"], r["interpreted"]) == (
            16,
            2,
            "fp32",
            "loop",
            0,
        )
        assert r["fwd_ms_mean"] > 0 and r["bwd_ms_mean"] > 0 and r["e2e_ms_mean"] > 0
        assert r["max_err"] < 1e-5 and r["max_err_grad"] < 1e-4
        # FLOPs: 4·B·T²·d, halved for causal; backward 2.5x; TFLOP/s from the median.
        assert r["flops_fwd"] == 4 * 2 * r["seq"] ** 2 * 16 / 2
        assert r["flops_e2e"] == 3.5 * r["flops_fwd"]
        assert r["tflops_e2e"] == pytest.approx(r["flops_e2e"] / (r["e2e_ms_median"] / 1e3) / 1e12)
        assert r["mem_before_bwd_bytes"] == r["saved_bytes"] > 0  # CPU: saved-tensor bytes
        assert r["peak_bytes"] is None  # CUDA only
        assert r["sdpa_backend"] == ("auto" if r["impl"] == "sdpa" else None)
    # 3-D inputs: CPU SDPA's flash kernel wants 4-D, so the dispatcher fell back to math.
    assert {r["sdpa_backend_used"] for r in got if r["impl"] == "sdpa"} == {"math"}
    samples = json.loads(rows(db_path, "SELECT samples FROM runs LIMIT 1")[0]["samples"])
    assert [len(samples[k]) for k in ("fwd_ms", "bwd_ms", "e2e_ms")] == [3, 3, 3]
    for r in got:  # the count taken, and the host's time per end-to-end call
        assert (r["e2e_ms_n"], r["fwd_ms_n"]) == (3, 3) and r["e2e_ms_drift"] is None
        assert r["host_us"] == pytest.approx(1e3 * r["e2e_host_ms_mean"]) and r["host_us"] > 0
    # 4x the sequence: naive keeps the (T, T) matrix for backward (~T²), flash-torch O(T).
    saved = {(r["impl"], r["seq"]): r["saved_bytes"] for r in got}
    assert saved[("naive", 128)] / saved[("naive", 32)] > 8
    assert saved[("flash-torch", 128)] / saved[("flash-torch", 32)] == pytest.approx(4, rel=0.05)
    assert "vs naive" in result.stdout


def test_4d_inputs_and_sdpa_backends(db_path):
    result = invoke(
        "attention",
        *SMALL,
        "--impl",
        "sdpa",
        "--heads",
        "2",
        "--seq",
        "32",
        "--pass",
        "forward",
        "--db",
        db_path,
    )
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path)
    assert r["heads"] == 2 and r["sdpa_backend_used"] == "flash" and r["bwd_ms_mean"] is None
    assert r["flops_fwd"] == 4 * 2 * 2 * 32 * 32 * 16 / 2
    # A backend that cannot take the inputs is stored as skipped, with the reason.
    result = invoke(
        "attention",
        *SMALL,
        "--impl",
        "sdpa",
        "--sdpa-backend",
        "efficient",
        "--seq",
        "32",
        "--db",
        db_path,
    )
    assert result.exit_code == 0, result.output
    last = rows(db_path)[-1]
    assert last["status"] == "skipped" and "efficient" in last["error"]


def test_sdpa_cudnn_is_a_backend_and_a_skipped_row_where_it_cannot_run(db_path):
    result = invoke("attention", *SMALL, "--impl", "sdpa", "--sdpa-backend", "cudnn", "--seq",
                    "32", "--db", db_path)
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path)
    assert (r["sdpa_backend"], r["status"]) == ("cudnn", "skipped")  # no cuDNN on a CPU
    assert "sdpa backend 'cudnn' cannot run these inputs" in r["error"]


def test_oom_then_longer_sequences_are_skipped(db_path, monkeypatch):
    real_run = attention_exp.run

    def run(spec):
        if spec.seq >= 64:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        return real_run(spec)

    monkeypatch.setattr(attention_exp, "EXPERIMENT", replace(attention_exp.EXPERIMENT, run=run))
    args = ["attention", *SMALL, "--impl", "naive", "--seq", "128,32,64,256", "--pass", "forward"]
    assert invoke(*args, "--db", db_path).exit_code == 0
    got = [(r["seq"], r["status"]) for r in rows(db_path)]
    assert got == [(32, "ok"), (64, "oom"), (128, "skipped"), (256, "skipped")]
    assert "ran out of memory" in rows(db_path)[2]["error"]
    assert invoke(*args, "--no-skip-after-oom", "--db", db_path).exit_code == 0
    assert [r["status"] for r in rows(db_path)][4:] == ["ok", "oom", "oom", "oom"]


def test_preset_fills_in_and_explicit_options_win(db_path):
    result = invoke(
        "attention",
        "--preset",
        "leaderboard",
        "--impl",
        "naive",
        "--seq",
        "32",
        "--iters",
        "2",
        "--warmup",
        "0",
        "--device",
        "cpu",
        "--db",
        db_path,
    )
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path)
    assert (r["impl"], r["seq"], r["batch"], r["heads"], r["d_head"]) == ("naive", 32, 1, 16, 64)
    assert (r["precision"], r["causal"], r["pass"], r["timer"], r["iters"]) == (
        "bf16",
        1,
        "both",
        "loop",
        2,
    )


def test_the_pytorch_attention_preset_runs_without_a_mask_as_the_handout_does():
    """Random Q, K, V, as pytorch_attention asks: the preset ran causal, so a T x T mask and
    a masked copy of the scores sat in the memory measured against the accounting's three
    T x T matrices. --causal still wins."""
    from cs336sys.experiments import attention

    (spec,) = attention.specs(preset="pytorch-attention", impl=["naive"], seq=[64], d_head=[16],
                              device="cpu")
    assert (spec.causal, spec.batch, spec.heads, spec.iters) == (False, 8, None, 100)
    (spec,) = attention.specs(preset="pytorch-attention", impl=["naive"], seq=[64], d_head=[16],
                              causal=True,
                              device="cpu")
    assert spec.causal is True


def test_the_presets_time_as_their_handout_problems_do(monkeypatch):
    """pytorch_attention: "Time 100 forward passes" of your (naive) attention; the preset ran
    every implementation, in 3 rounds of 34 calls on CUDA, and more for --min-time.
    flash_benchmarking: "using triton.testing.do_bench"; the preset timed with the loop."""
    from cs336sys.experiments import attention

    monkeypatch.setattr(attention.points, "device_choice", lambda device: "cuda")
    specs = attention.specs(preset="pytorch-attention", seq=[64], d_head=[16])
    assert [(s.impl, s.iters, s.rounds, s.min_time) for s in specs] == [("naive", 100, 1, 0.0)]
    (spec,) = attention.specs(preset="pytorch-attention", seq=[64], d_head=[16], rounds=4,
                              min_time=2.0)  # given: theirs
    assert (spec.rounds, spec.min_time) == (4, 2.0)
    # torch_compile (a) runs at pytorch_attention's sizes, compiled against eager: in
    # interleaved rounds, which the preset's one round would leave with no verdict
    from cs336sys.handout import problems

    (compile_a,) = [r.args(True) for p in problems("2026") if p.name == "torch_compile"
                    for r in p.runs if "naive,compiled" in " ".join(r.args(True) or [])]
    rounds = int(compile_a[compile_a.index("--rounds") + 1])
    (spec, _) = attention.specs(preset="pytorch-attention", impl=["naive", "compiled"],
                                seq=[64], d_head=[16], rounds=rounds)
    assert spec.rounds == 3
    monkeypatch.setattr(attention.points, "check_triton", lambda *args: None)
    flash = attention.specs(preset="flash-benchmarking", seq=[128], d_head=[16])
    assert {s.timer for s in flash} == {"do-bench"} and {s.impl for s in flash} == {
        "naive", "triton"}


BAD = [
    (["--impl", "magic"], "unknown value 'magic'"),
    (["--preset", "fastest"], "--preset"),
    (["--pass", "sideways"], "--pass"),
    (["--precision", "fp8"], "--precision"),
    (["--timer", "do-bench"], "needs CUDA"),
    (["--timer", "stopwatch"], "--timer"),
    (["--sdpa-backend", "fastest"], "--sdpa-backend"),
    (["--impl", "flash-torch", "--d-head", "8"], "head dims 16 to 128"),
    (["--iters", "0"], "--iters must be positive"),
    (["--seq", "-4"], "must be positive"),
    (["--heads", "0"], "--heads must be positive"),
    # a setting of an implementation the list leaves out would be ignored
    (["--impl", "naive", "--sdpa-backend", "cudnn"],
     "--sdpa-backend is a setting of sdpa, which --attention naive leaves out"),
    (["--impl", "naive,sdpa", "--triton-opt-in", "tma"],
     "--triton-opt-in is a setting of triton, which --attention naive,sdpa leaves out"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_exits_2_and_writes_nothing(db_path, args, message):
    result = invoke("attention", "--seq", "32", "--device", "cpu", *args, "--db", db_path)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().startswith("Error:") and message in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not db_path.exists()


def test_triton_without_cuda_or_interpreter_is_a_clear_error(db_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = invoke("attention", "--impl", "triton", "--seq", "32", "--db", db_path)
    assert result.exit_code == 2 and "TRITON_INTERPRET=1" in result.stderr
    assert not db_path.exists()


@pytest.mark.slow  # interpreted
def test_triton_rows_are_marked_interpreted(db_path):
    if torch.cuda.is_available():
        pytest.skip("this machine runs Triton on the GPU")
    # One timed call per pass: the checked pass before them gives the errors (interpreted, each
    # call takes a second).
    one = ["--d-head", "16", "--batch", "2", "--warmup", "0", "--iters", "1", "--device", "cpu"]
    result = invoke("attention", *one, "--impl", "triton", "--seq", "40", "--db", db_path)
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path)
    assert r["status"] == "ok" and r["interpreted"] == 1
    assert r["max_err"] < 1e-5 and r["max_err_grad"] < 1e-4
