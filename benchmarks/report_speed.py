"""CPU benchmark (docs/report.md): `cs336sys report --since 30d` over 10,000 stored runs in < 5 s.

Builds a store of 10,000 runs spread over the last 30 days, shaped like real use: 500
invocations on 2 GPUs at 10 commits, every experiment, a few hundred distinct points each
re-measured many times (model rows carry raw samples, profile rows kernel_stats, a few rows
are oom/error/skipped). Then times the whole command as a user runs it (a fresh Python
process: import, query, plots, both formats), best and median of --repeat runs.

    python benchmarks/report_speed.py [--runs 10000] [--repeat 3] [--keep DIR]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

from cs336sys.experiments.catalog import EXPERIMENTS

GOAL_S = 5.0
FMT = "%Y-%m-%d %H:%M:%S.%f"


def _stats(p: str, mean: float, sep: str = "_ms_") -> dict[str, float]:
    return {f"{p}{sep}mean": mean, f"{p}{sep}std": mean * 0.01, f"{p}{sep}min": mean * 0.98,
            f"{p}{sep}median": mean, f"{p}{sep}max": mean * 1.02}


def point(rng: random.Random, exp: str) -> tuple[dict, dict, dict | None]:
    if exp == "model":
        s = {"size": rng.choice(["small", "medium", "large", "xl", "2.7B"]),
             "seq": rng.choice([128, 256, 512, 1024]), "batch": 4,
             "mode": rng.choice(["forward", "forward-backward", "train"]),
             "precision": rng.choice(["fp32", "bf16"]), "compile": rng.random() < 0.5,
             "checkpoint": "none", "device": "cuda", "seed": 0}
        step = rng.uniform(20, 400)
        m = {**_stats("fwd", step / 3), **_stats("bwd", step / 2), **_stats("opt", step / 6),
             **_stats("step", step), "tokens_per_s": 4 * 512 / step * 1e3, "tflops": 100 / step,
             "mfu": 0.1}
        smp = {k: [step] * 10 for k in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms")}
        smp["warmup"] = {k: [step * 3] * 5 for k in ("fwd_ms", "bwd_ms", "opt_ms", "step_ms")}
        return s, m, smp
    if exp == "attention":
        s = {"impl": rng.choice(["naive", "compiled", "sdpa", "flash-torch", "flash-triton"]),
             "seq": 2 ** rng.randint(7, 16), "d_head": rng.choice([16, 32, 64, 128]),
             "precision": rng.choice(["fp32", "bf16"]), "pass": "fwd+bwd", "device": "cuda"}
        f = s["seq"] / 1e3
        return s, {"fwd_ms_mean": f, "bwd_ms_mean": 2 * f, "e2e_ms_mean": 3 * f, "e2e_ms_min": 2.9 * f,
                   "e2e_ms_max": 3.1 * f, "mem_before_bwd_bytes": s["seq"] ** 2 * 4}, None
    if exp == "memory":
        s = {"size": rng.choice(["small", "medium", "large"]),
             "seq": rng.choice([128, 256, 512]), "mode": "train",
             "checkpoint": rng.choice(["none", "sqrt", "every:2"]), "device": "cuda"}
        return s, {"peak_bytes": rng.uniform(1, 40) * 2**30, **_stats("step", 100.0)}, None
    if exp == "comm":
        s = {"op": rng.choice(["all-reduce", "all-gather"]), "backend": "nccl",
             "world_size": rng.choice([2, 4, 8]), "bytes": 2 ** rng.randint(10, 30),
             "precision": "fp32", "device": "cuda"}
        t = 0.01 + s["bytes"] / 1e8
        return s, {"time_ms_mean": t, "time_ms_min": t, "time_ms_max": t,
                   "busbw_gbps": s["bytes"] / t / 1e6, "algbw_gbps": 1.0}, None
    if exp == "ddp":
        s = {"impl": rng.choice(["naive", "flat", "overlap", "bucketed", "torch"]),
             "bucket_mb": rng.choice([1, 5, 10, 25, 100]), "world_size": 2, "backend": "nccl",
             "size": "small", "device": "cuda"}
        return s, {**_stats("step", 80.0), **_stats("comm", 10.0), "comm_fraction": 0.12}, None
    if exp == "precision":
        return ({"kind": "accumulate", "variant": rng.choice("abcd"), "device": "cpu"},
                {"result": 9.95, "target": 10.0}, None)
    s = {"target": "model", "size": rng.choice(["small", "medium"]), "mode": "train",
         "precision": "bf16", "device": "cuda"}
    return s, {"time_basis": "cuda", "step_ms_mean": 50.0}, None


def build(path: Path, n_runs: int, seed: int = 0) -> None:
    from cs336sys.store.db import Store, point_key

    rng = random.Random(seed)
    now = datetime.now(timezone.utc).replace(tzinfo=None)
    store = Store(path, EXPERIMENTS)
    weights = {"model": 30, "attention": 30, "memory": 10, "comm": 15, "ddp": 10,
               "precision": 3, "profile": 2}
    invs, runs, kernels = [], [], []
    n_inv = max(1, n_runs // 20)
    for i in range(n_inv):
        t0 = now - timedelta(days=29.5 * (1 - i / n_inv))
        inv = f"inv-{i:05d}"
        invs.append((inv, t0.strftime(FMT), rng.choice(["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB"]),
                     f"{rng.randrange(10):040x}", rng.random() < 0.1))
        for j in range(n_runs // n_inv):
            exp = rng.choices(list(weights), weights=list(weights.values()))[0]
            s, m, smp = point(rng, exp)
            status = rng.choices(["ok", "oom", "error", "skipped"], [96, 2, 1, 1])[0]
            t = (t0 + timedelta(seconds=j)).strftime(FMT)
            rid = f"run-{i:05d}-{j:03d}"
            runs.append((rid, inv, exp, status, None if status == "ok" else status,
                         json.dumps(s), json.dumps(m if status == "ok" else {}),
                         json.dumps(smp) if smp and status == "ok" else None, t, t,
                         point_key(exp, s)))
            if exp == "profile" and status == "ok":
                kernels += [(rid, ph, r, f"kernel_{r}", 10, 1.0, 0.1, 0.1, "cuda")
                            for ph in ("forward", "backward") for r in range(1, 11)]
    c = store.conn
    c.execute("BEGIN")
    c.executemany("INSERT INTO invocations (id, started, gpu, gpu_count, git_commit, git_dirty, "
                  "torch_version, command, argv) VALUES (?, ?, ?, ?1 IS NOT NULL, ?, ?, '2.11.0', "
                  "'bench', '[]')", invs)
    c.executemany("INSERT INTO runs (id, invocation_id, experiment, status, error, settings, "
                  "metrics, samples, started, created, point_key) VALUES "
                  "(?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)", runs)
    c.executemany("INSERT INTO kernel_stats (run_id, phase, rank, name, calls, total_ms, "
                  "mean_ms, share, time_basis) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)", kernels)
    c.execute("COMMIT")
    store.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--keep", type=Path, help="build the store and reports here and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.keep or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        db = work / "bench.db"
        db.unlink(missing_ok=True)
        t = time.perf_counter()
        build(db, args.runs)
        print(f"built {args.runs} runs in {time.perf_counter() - t:.1f} s ({db.stat().st_size / 2**20:.1f} MiB)")
        times = []
        for _ in range(args.repeat):
            t = time.perf_counter()
            proc = subprocess.run(
                [sys.executable, "-m", "cs336sys", "report", "--since", "30d", "--db", str(db),
                 "--out", str(work / "report")], capture_output=True, text=True,
            )
            times.append(time.perf_counter() - t)
            if proc.returncode != 0:
                print(proc.stderr, file=sys.stderr)
                return 1
        best, med = min(times), statistics.median(times)
        verdict = "PASS" if med < GOAL_S else "FAIL"
        print(f"cs336sys report --since 30d over {args.runs} runs: best {best:.2f} s, "
              f"median {med:.2f} s of {len(times)} (goal < {GOAL_S:.0f} s): {verdict}")
    return 0 if med < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
