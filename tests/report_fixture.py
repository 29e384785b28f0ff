"""A fixed results store for report tests: every experiment, every status, fixed ids/times.

Ids, timestamps and provenance are constants, so the markdown rendered from it is byte-for-
byte reproducible (tests/golden/report.md). Two commits on the same GPU let --compare find
a real change (model fp32 step +20%, ranges disjoint) beside noise (bf16 +2%, overlapping).
"""

from __future__ import annotations

import json
from pathlib import Path

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.store.db import Store, point_key

H100 = "NVIDIA H100 80GB HBM3"
COMMIT_A = "aaaa1111aaaa1111aaaa1111aaaa1111aaaa1111"
COMMIT_B = "bbbb2222bbbb2222bbbb2222bbbb2222bbbb2222"
HOSTILE = "<script>alert(1)</script>"
QUOTED = "it's \"quoted\"; DROP TABLE runs; --"

_INVOCATIONS = [
    ("inv-a", COMMIT_A, 0, H100, 1, "2026-01-05 10:00:00.000000"),
    ("inv-b", COMMIT_B, 1, H100, 1, "2026-01-06 10:00:00.000000"),
    ("inv-c", COMMIT_A, 0, "cpu", 0, "2026-01-06 12:00:00.000000"),
]


def _stats(prefix: str, mean: float, spread: float, sep: str = "_ms_") -> dict[str, float]:
    return {
        f"{prefix}{sep}mean": mean,
        f"{prefix}{sep}std": spread / 2,
        f"{prefix}{sep}min": mean - spread,
        f"{prefix}{sep}median": mean,
        f"{prefix}{sep}max": mean + spread,
    }


def _model(store, run, inv, t, precision, step, compile_=False, status="ok", size="small"):
    s = {"size": size, "seq": 128, "batch": 4, "mode": "train",
         "precision": precision, "compile": compile_, "attention": "naive", "optimizer": "adamw",
         "checkpoint": "none", "warmup": 2, "iters": 3, "device": "cuda", "seed": 0}
    if status != "ok":
        return run(inv, "model", status, t, s, {}, error=f"{status} at {size}")
    m = {**_stats("fwd", step * 0.3, step * 0.01), **_stats("bwd", step * 0.6, step * 0.01),
         **_stats("opt", step * 0.1, step * 0.005), **_stats("step", step, step * 0.02),
         "tokens_per_step": 512, "tokens_per_s": 512 / step * 1e3, "tflops": 1e-3 * 512 / step,
         "mfu": 0.001 * 512 / step / 989 if precision == "bf16" else None}
    smp = {"step_ms": [step * 0.99, step, step * 1.01], "warmup": {"step_ms": [step * 5, step]}}
    return run(inv, "model", "ok", t, s, m, samples=smp)


def build(path: Path) -> Path:
    """Write the fixture store at `path` (which must not exist yet)."""
    store = Store(path, EXPERIMENTS)
    for inv_id, commit, dirty, gpu, count, started in _INVOCATIONS:
        store.db["invocations"].insert({
            "id": inv_id, "command": "fixture", "argv": "[]", "started": started,
            "finished": started, "exit_status": 0, "host": "lab", "device": "cuda",
            "gpu": gpu, "gpu_count": count, "torch_version": "2.11.0", "triton_version": "3.6.0",
            "python_version": "3.12.3", "cs336sys_version": "0.1.0", "cuda_version": "12.8",
            "git_commit": commit, "git_dirty": dirty,
        })
    n = [0]

    def run(inv, exp, status, t, settings, metrics, samples=None, error=None):
        n[0] += 1
        rid = f"run-{n[0]:04d}"
        store.db["runs"].insert({
            "id": rid, "invocation_id": inv, "experiment": exp, "status": status,
            "error": error, "settings": json.dumps(settings), "metrics": json.dumps(metrics),
            "samples": None if samples is None else json.dumps(samples),
            "started": t, "created": t, "duration_s": 1.0, "point_key": point_key(exp, settings),
        })
        return rid

    ta, tb = "2026-01-05 10:0{}:00.000000", "2026-01-06 10:0{}:00.000000"
    _model(store, run, "inv-a", ta.format(1), "fp32", 100.0)
    _model(store, run, "inv-a", ta.format(2), "bf16", 50.0)
    _model(store, run, "inv-a", ta.format(3), "bf16", 40.0, compile_=True)
    _model(store, run, "inv-a", ta.format(4), "fp32", 0, status="oom", size="xl")
    _model(store, run, "inv-b", tb.format(1), "fp32", 120.0)  # a real change: +20%, disjoint
    _model(store, run, "inv-b", tb.format(2), "bf16", 51.0)  # noise: +2%, ranges overlap
    _model(store, run, "inv-b", tb.format(3), "fp32", 0, status="error", size="large")
    _model(store, run, "inv-b", tb.format(4), "fp32", 0, status="skipped", size="2.7B")

    tc = "2026-01-06 12:{:02d}:00.000000"
    k = iter(range(60))
    for impl in ("naive", "flash-triton"):
        for seq in (128, 1024, 16384):
            s = {"impl": impl, "seq": seq, "d_head": 64, "heads": 16, "batch": 1,
                 "precision": "bf16", "causal": True, "pass": "fwd+bwd", "device": "cuda"}
            if impl == "naive" and seq == 16384:
                run("inv-c", "attention", "oom", tc.format(next(k)), s, {}, error="OutOfMemoryError")
                continue
            f = (seq / 128) ** (2 if impl == "naive" else 1.5) * 0.05
            m = {"fwd_ms_mean": f, "fwd_ms_std": f / 50, "bwd_ms_mean": 2 * f,
                 "bwd_ms_std": f / 25, "e2e_ms_mean": 3 * f, "e2e_ms_std": f / 20, "e2e_ms_min": 2.9 * f,
                 "e2e_ms_max": 3.1 * f,
                 "mem_before_bwd_bytes": seq * seq * 16 * 2 * (4 if impl == "naive" else 0) + seq * 64 * 16 * 2 * 4}
            run("inv-c", "attention", "ok", tc.format(next(k)), s, m)
    for ckpt, factor in (("none", 1.0), ("sqrt", 0.5)):
        for ctx in (128, 256):
            s = {"size": "small", "seq": ctx, "batch": 4, "mode": "train",
                 "precision": "fp32", "checkpoint": ckpt, "device": "cuda"}
            peak = (500 + ctx * 4 * factor) * 2**20
            m = {"peak_bytes": peak, "fwd_peak_bytes": peak * 0.9, "bwd_peak_bytes": peak,
                 "opt_peak_bytes": peak * 0.8, "act_bytes_analytic": ctx * 4 * 2**20,
                 **_stats("step", 100 / factor**0.5, 1)}
            run("inv-c", "memory", "ok", tc.format(next(k)), s, m)
    run("inv-c", "memory-residuals", "ok", tc.format(next(k)),
        {"size": "small", "seq": 128, "compile": False, "device": "cuda"},
        {"saved_bytes": 3 * 2**20, "analytic_bytes": 3 * 2**20, "top1_op": "mm"})
    for size in (1024, 2**20, 100 * 2**20):
        s = {"op": "all-reduce", "backend": "gloo", "device": "cpu", "world_size": 2,
             "bytes": size, "precision": "fp32"}
        t = 0.05 + size / 1e9 * 1e3
        m = {"time_ms_mean": t, "time_ms_min": t * 0.9, "time_ms_max": t * 1.1,
             "algbw_gbps": size / t / 1e6, "busbw_gbps": size / t / 1e6, "wrong": 0}
        run("inv-c", "comm", "ok", tc.format(next(k)), s, m)
    for impl, bucket in (("naive", None), ("bucketed", 1.0), ("bucketed", 10.0), ("bucketed", 25.0)):
        s = {"impl": impl, "bucket_mb": bucket, "world_size": 2, "backend": "gloo",
             "size": "tiny", "device": "cpu"}
        step = 50 + (bucket or 40)
        m = {**_stats("step", step, 1), **_stats("comm", step * 0.2, 0.5),
             "comm_fraction": 0.2, "tokens_per_s": 1000 / step}
        run("inv-c", "ddp", "ok", tc.format(next(k)), s, m)
    # the sharded family: per-rank memory, measured next to the expectation
    P = 2**20  # parameters of a made-up model, all fp32: 4 MiB of weights
    for impl, sharding, shard in (("torch", "none", 1), ("torch", "ours", 1), ("fsdp", None, 2)):
        s = {"impl": impl, "bucket_mb": 25.0 if impl == "torch" else None,
             "shard_optimizer": sharding, "world_size": 2, "backend": "gloo", "size": "tiny",
             "device": "cpu"}
        state = 8 * P / (2 if sharding == "ours" or impl == "fsdp" else 1)
        m = {**_stats("step", 120, 1), **_stats("comm", 12, 0.5), "comm_fraction": 0.1,
             "comm_bytes": 4 * P * (3 if impl == "fsdp" else 1), "tokens_per_s": 8.0,
             "mem_before_opt_params_bytes": 4 * P / shard, "expected_params_bytes": 4 * P / shard,
             "mem_before_opt_grads_bytes": 4 * P / shard, "expected_grads_bytes": 4 * P / shard,
             "mem_after_opt_opt_state_bytes": state, "expected_opt_state_bytes": state,
             "mem_before_opt_bytes": 16 * P / shard + state, "mem_peak_bytes": 30 * P}
        run("inv-c", "ddp", "ok", tc.format(next(k)), s, m)
    for variant in (HOSTILE, QUOTED):
        run("inv-c", "precision", "ok", tc.format(next(k)),
            {"kind": "accumulate", "variant": variant, "accumulator_dtype": "float16",
             "value_dtype": "float16", "additions": 1000, "device": "cpu"},
            {"result": 9.953, "target": 10.0, "abs_error": 0.047})
    rid = run("inv-c", "profile", "ok", tc.format(next(k)),
              {"target": "model", "profiler": "torch", "size": "small", "mode": "train",
               "precision": "bf16", "device": "cuda"},
              {"time_basis": "cuda", "fwd_ms_mean": 3.0, "bwd_ms_mean": 6.0, "opt_ms_mean": 1.0, "step_ms_mean": 10.0})
    store.add_kernel_stats(rid, [
        {"phase": "forward", "rank": 1, "name": "sm90_xmma_gemm_bf16", "calls": 30,
         "total_ms": 6.0, "mean_ms": 0.2, "share": 0.6, "time_basis": "cuda"},
        {"phase": "forward", "rank": 2, "name": "softmax_kernel", "calls": 10, "total_ms": 2.0,
         "mean_ms": 0.2, "share": 0.2, "time_basis": "cuda"},
        {"phase": "backward", "rank": 1, "name": "sm90_xmma_gemm_bf16", "calls": 60,
         "total_ms": 15.0, "mean_ms": 0.25, "share": 0.75, "time_basis": "cuda"},
    ])
    _issue14(run, tc, k)
    store.close()
    return path


# The value a float32 running sum of 0.01 gives after 1000 additions: the report shows it
# to the last digit, never rounded to 10.
F32_SUM = 10.000133514404297
OPT_PEAK = 1100 * 2**20  # the optimizer step's peak: the same with or without checkpointing


def _issue14(run, tc, k) -> None:
    """Rows for what each section must show: Triton points timed under
    TRITON_INTERPRET=1 beside native CPU naive ones at the same shapes; a checkpointing group
    whose step peak the optimizer sets (checkpointing lowers only the activation peaks); a
    float32 sum with all its digits."""
    for impl in ("naive", "triton"):
        for seq in (128, 256):
            s = {"impl": impl, "seq": seq, "d_head": 32, "heads": 4, "batch": 1,
                 "precision": "fp32", "causal": True, "pass": "fwd+bwd", "device": "cpu"}
            f = (seq / 128) ** 2 * (0.2 if impl == "naive" else 10.0)
            m = {"fwd_ms_mean": f, "fwd_ms_std": f / 50, "bwd_ms_mean": 2 * f, "bwd_ms_std": f / 25,
                 "e2e_ms_mean": 3 * f, "e2e_ms_std": f / 20, "e2e_ms_median": 3 * f,
                 "tflops_e2e": 1e-3 / f, "max_err": 1e-6 if impl == "naive" else 7e-7,
                 "mem_before_bwd_bytes": seq * seq * 4 * 4 * 4, "interpreted": impl == "triton"}
            run("inv-c", "attention", "ok", tc.format(next(k)), s, m)
    for ckpt, act in (("none", 1.0), ("every:1", 0.4), ("sqrt", 0.5)):
        s = {"size": "medium", "seq": 128, "batch": 4, "mode": "train",
             "precision": "fp32", "checkpoint": ckpt, "device": "cuda"}
        fwd, bwd = (600 + 400 * act) * 2**20, (700 + 380 * act) * 2**20
        m = {"peak_bytes": max(fwd, bwd, OPT_PEAK), "fwd_peak_bytes": fwd, "bwd_peak_bytes": bwd,
             "opt_peak_bytes": OPT_PEAK, "saved_bytes": 300 * act * 2**20,
             "optim_bytes": 400 * 2**20, **_stats("step", 200 * (2 - act), 2)}
        run("inv-c", "memory", "ok", tc.format(next(k)), s, m)
    run("inv-c", "precision", "ok", tc.format(next(k)),
        {"kind": "accumulate", "variant": "float32 sum", "accumulator_dtype": "float32",
         "value_dtype": "float32", "additions": 1000, "device": "cpu"},
        {"result": F32_SUM, "target": 10.0, "error_vs_target": F32_SUM - 10.0,
         "addend": 0.009999999776482582})
