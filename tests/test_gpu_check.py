"""`make gpu-check` (benchmarks/gpu_check.py) where it can be checked without a GPU: it says so
and exits 2, and its verdict reads the views the reference set fills."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cs336sys.store import Store

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
PROV = {"host": "lab", "device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
        "git_commit": "abc", "git_dirty": 0}  # fmt: skip


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the machine without CUDA"
)
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "r")], env=env,
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "Error: make gpu-check needs a CUDA GPU (torch.cuda.is_available() is False)"
    ]
    # a Python without torch (the CPU boxes' system Python, say): one line too
    out = subprocess.run([sys.executable, "-S", "-c", f"import runpy, sys; sys.argv = [{str(SCRIPT)!r}]; "
                          f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "needs torch with CUDA" in out.stderr
    assert not (tmp_path / "r").exists()


def test_the_verdict_reads_what_the_reference_set_stores(tmp_path):
    gpu_check = _module()
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    db = tmp_path / "results.db"
    shape = {"seq": 16384, "d_head": 64, "heads": 16, "batch": 1, "dtype": "bf16", "causal": True}
    with Store(db) as s:
        inv = s.begin_invocation(PROV, [], "attention")
        for impl, backend, used, ms in (("triton", None, None, 5.0), ("naive", None, None, 94.0),
                                        ("sdpa", "cudnn", "cudnn", 4.5)):  # fmt: skip
            s.add_run(inv, "attention", "ok", {**shape, "impl": impl, "sdpa_backend": backend},
                      {"e2e_ms_median": ms, "sdpa_backend_used": used})  # fmt: skip
        for size, precision, bound, phases in (("small", "bf16", True, "fwd,opt"),
                                               ("2.7B", "fp32", False, "")):  # fmt: skip
            s.add_run(inv, "model", "ok", {"size": size, "precision": precision, "mode": "train"},
                      {"launch_bound": bound, "launch_bound_phases": phases})  # fmt: skip
        s.add_run(inv, "profile", "ok", {"size": "small", "target": "model"},
                  {"fwd_profiled_ms_mean": 6.0, "bwd_profiled_ms_mean": 12.0})  # fmt: skip
    rows = {target: (measured, met) for target, measured, met in
            gpu_check.verdict(db, 95.0, 420.0, "2000-01-01")}  # fmt: skip
    assert rows["gpu tests under 120 s"] == ("95 s", "met")
    assert rows["gpu-check under 8 minutes"] == ("7.0 min", "met")
    assert rows["leaderboard: triton fwd+bwd under 5.4 ms"] == ("5.000 ms", "met")
    assert rows["leaderboard: triton at least 15x faster than naive"] == ("18.8x", "met")
    assert rows["leaderboard: triton faster than SDPA cuDNN in the same run"] == (
        "5.000 vs 4.500 ms", "NOT met")  # fmt: skip
    assert rows["small bf16 train (batch 4, context 512) is launch-bound"] == ("fwd,opt", "met")
    assert rows["2.7B fp32 train is not launch-bound"] == ("", "met")
    assert rows["profile small: backward kernel time above forward's"] == ("12.0 vs 6.0 ms", "met")
    assert rows["profile xl: backward kernel time above forward's"] == ("not measured", "n/a")


OWED = ROOT / "benchmarks" / "gpu_owed.py"


def _owed(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(OWED), *args], env=env, capture_output=True,
                          text=True)  # fmt: skip


def test_gpu_owed_lists_its_steps_and_refuses_bad_numbers(tmp_path):
    """`make gpu-owed` (issues 15-17's GPU figures): each listed command names a script or
    command that exists, and a bad --only is one line, exit 2, before anything runs."""
    listed = _owed("--list")
    assert listed.returncode == 0, listed.stderr
    commands = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("   ")]
    scripts = [c for c in commands if c.endswith(".py")]
    assert scripts and all((ROOT / s).exists() for s in scripts)
    assert listed.stdout.count("\n   ") == listed.stdout.count("issue 1")
    bad = _owed("--only", "0,99", "--out", str(tmp_path / "o"))
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "--only takes step numbers" in bad.stderr and not (tmp_path / "o").exists()


@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the machine without CUDA"
)
def test_gpu_owed_without_cuda_says_so_in_one_line(tmp_path):
    out = _owed("--out", str(tmp_path / "o"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "Error: make gpu-owed needs a CUDA GPU (torch.cuda.is_available() is False)"
    ]
    assert not (tmp_path / "o").exists()
