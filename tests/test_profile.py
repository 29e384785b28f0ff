"""`cs336sys profile`: phase attribution, kernel_stats rows, the attention breakdown, traces,
nsys, bad input, and the v2 -> v3 store migration."""

import json
import re
import sqlite3
from types import SimpleNamespace
from unittest import mock

import pytest
import torch

from cs336sys.experiments import profile_events
from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.experiments.profile_events import summarize
from cs336sys.measure import nvtx
from cs336sys.store import Store, schema
from tests.conftest import MICRO, invoke, query, view_rows

rows = view_rows('profile_runs')
ATTN = ["--seq", "32", "--d-head", "16", "--batch", "2", "--heads", "2"]
ATTN += ["--warmup", "1", "--iters", "2", "--device", "cpu"]


# -- attribution, against hand-made events ---------------------------------------------------


def _event(name, start, end, self_us=0.0, kernels=(), **kw):
    fields = dict(name=name, time_range=SimpleNamespace(start=start, end=end),
                  self_cpu_time_total=self_us, kernels=list(kernels), device_type="DeviceType.CPU",
                  is_async=False, is_user_annotation=name.startswith("cs336sys::"))
    return SimpleNamespace(**{**fields, **kw})


def _kernel(name, us):
    return SimpleNamespace(name=name, device=0, duration=us)


EVENTS = [
    _event("cs336sys::forward", 0, 100, self_us=7),
    _event("cs336sys::scores", 10, 40),
    _event("aten::mm", 12, 30, self_us=10, kernels=[_kernel("gemm", 4)]),
    _event("aten::div", 31, 39, self_us=6, kernels=[_kernel("div_k", 1)]),
    _event("cs336sys::softmax", 41, 60),
    _event("aten::softmax", 42, 59, self_us=8, kernels=[_kernel("softmax_k", 2)]),
    _event("aten::mm", 70, 90, self_us=12, kernels=[_kernel("gemm", 6)]),
    _event("Optimizer.step#AdamW.step", 71, 72, self_us=50, is_user_annotation=True),
    _event("aten::mm", 95, 99, self_us=3, is_async=True, kernels=[_kernel("async", 99)]),
    _event("aten::add", 101, 104, self_us=100, kernels=[_kernel("outside", 100)]),  # no phase
    _event("cs336sys::backward", 200, 300),
    _event("cs336sys::scores", 210, 220),  # a checkpointed recompute: backward, not a part
    _event("aten::mm", 211, 215, self_us=20, kernels=[_kernel("gemm", 8)]),
    _event("MmBackward0", 250, 260, self_us=5, kernels=[_kernel("gemm", 2), _kernel("copy", 1)]),
    _event("gemm", 251, 253, self_us=0, device_type="DeviceType.CUDA"),  # a device event
]


def test_cpu_attribution_uses_op_self_time_by_phase():
    kernels, totals, parts = summarize(EVENTS, on_cuda=False, top=1)
    # forward: mm 10 + 12, div 6, softmax 8 (ranges, annotations, async, outside: left out)
    assert totals == {"forward": 36 / 1e3, "backward": 25 / 1e3}
    # the scores range: its matmul is QKᵀ, its scaling (div) the mask part; no PV range, no PV
    assert parts == {"qk": 10 / 1e3, "mask": 6 / 1e3, "softmax": 8 / 1e3}
    got = [(k["phase"], k["rank"], k["name"], k["calls"], k["total_ms"], k["share"])
           for k in kernels]
    assert got == [
        ("forward", 1, "aten::mm", 2, 22 / 1e3, 22 / 36),
        ("forward", 2, "(other)", 2, 14 / 1e3, 14 / 36),
        ("backward", 1, "aten::mm", 1, 20 / 1e3, 20 / 25),
        ("backward", 2, "(other)", 1, 5 / 1e3, 5 / 25),
        # every phase together: which op leads forward and backward both (nsys_profile (b))
        ("step", 1, "aten::mm", 3, 42 / 1e3, 42 / 61),
        ("step", 2, "(other)", 3, 19 / 1e3, 19 / 61),
    ]
    assert kernels[0]["mean_ms"] == 11 / 1e3 and {k["time_basis"] for k in kernels} == {"cpu"}


def test_matmul_share_by_phase_from_the_same_attribution():
    """CPU: forward mm 22 of 36 µs, backward mm 20 of 25 (MmBackward0 is not an aten mm:
    its time is its children's, here none); CUDA: gemm kernels 10 of 13, 10 of 11. The
    step's, every phase's time together, is what nsys_profile (d) asks of a training step:
    it was left to the reader, who took the phases' shares for it."""
    assert profile_events.matmul_shares(EVENTS, on_cuda=False) == {
        "forward": 22 / 36, "backward": 20 / 25, "step": 42 / 61}
    assert profile_events.matmul_shares(EVENTS, on_cuda=True) == {
        "forward": 10 / 13, "backward": 10 / 11, "step": 20 / 24}
    for name in ("sm90_xmma_gemm_bf16", "nvjet_tst_128x256", "cutlass_80_wmma",
                 "triton_tem_fused_mm_0", "aten::addmm", "aten::bmm"):
        assert profile_events.MATMUL.search(name), name
    for name in ("aten::matmul", "aten::linear", "softmax_k", "vectorized_elementwise"):
        assert not profile_events.MATMUL.search(name), name


def test_cuda_attribution_uses_kernel_time_of_the_launching_event():
    kernels, totals, parts = summarize(EVENTS, on_cuda=True, top=10)
    assert totals == {"forward": 13 / 1e3, "backward": 11 / 1e3}
    assert parts == {"qk": 4 / 1e3, "mask": 1 / 1e3, "softmax": 2 / 1e3}
    by = {(k["phase"], k["name"]): (k["calls"], k["total_ms"]) for k in kernels}
    assert by == {
        ("forward", "gemm"): (2, 10 / 1e3),
        ("forward", "softmax_k"): (1, 2 / 1e3),
        ("forward", "div_k"): (1, 1 / 1e3),
        ("backward", "gemm"): (2, 10 / 1e3),
        ("backward", "copy"): (1, 1 / 1e3),
        ("step", "gemm"): (4, 20 / 1e3),
        ("step", "softmax_k"): (1, 2 / 1e3),
        ("step", "div_k"): (1, 1 / 1e3),
        ("step", "copy"): (1, 1 / 1e3),
    }
    assert [k["rank"] for k in kernels if k["phase"] == "forward"] == [1, 2, 3]
    assert {k["time_basis"] for k in kernels} == {"cuda"}


def test_cuda_phases_come_from_host_ranges_and_backward_kernels_of_autograds_thread_count():
    """A profile shaped like a CUDA one (an H100 run, docs/gpu.md): every
    range twice, on the host (main thread) and as a device-side copy that spans only the
    kernels the main thread launched; the backward's ops and kernels on autograd's own thread.
    The device copy of backward covers only `loss.backward()`'s fill kernel (1 µs)."""
    main, worker, cuda = 1, 2, "DeviceType.CUDA"
    events = [
        _event("cs336sys::forward", 0, 100, thread=main),
        _event("cs336sys::forward", 5, 60, device_type=cuda, thread=main),  # device copy
        _event("aten::mm", 10, 20, self_us=3, kernels=[_kernel("gemm", 40)], thread=main),
        _event("aten::softmax", 21, 30, self_us=2, kernels=[_kernel("softmax_k", 10)], thread=main),
        _event("cs336sys::backward", 200, 300, thread=main),
        _event("cs336sys::backward", 201, 202, device_type=cuda, thread=main),  # 1 µs copy
        _event("aten::fill_", 200.5, 201, self_us=1, kernels=[_kernel("fill", 1)], thread=main),
        _event("MmBackward0", 210, 260, self_us=2, thread=worker),
        _event("aten::mm", 211, 230, self_us=4, kernels=[_kernel("gemm", 80)], thread=worker),
        _event("aten::mm", 231, 250, self_us=4, kernels=[_kernel("gemm", 70)], thread=worker),
        _event("SoftmaxBackward0", 261, 280, self_us=1, thread=worker),
        _event("aten::_softmax_backward_data", 262, 279, self_us=2,
               kernels=[_kernel("softmax_bwd_k", 15)], thread=worker),
        _event("cs336sys::optimizer", 300, 350, thread=main),
        _event("cs336sys::optimizer", 305, 340, device_type=cuda, thread=main),
        _event("aten::_foreach_add_", 306, 310, self_us=3, kernels=[_kernel("adam_k", 20)],
               thread=main),
    ]
    kernels, totals, _ = summarize(events, on_cuda=True, top=10)
    phase_of = {(k["phase"], k["name"]): (k["calls"], k["total_ms"]) for k in kernels}
    assert phase_of == {
        ("forward", "gemm"): (1, 40 / 1e3),
        ("forward", "softmax_k"): (1, 10 / 1e3),
        ("backward", "gemm"): (2, 150 / 1e3),
        ("backward", "softmax_bwd_k"): (1, 15 / 1e3),
        ("backward", "fill"): (1, 1 / 1e3),
        ("optimizer", "adam_k"): (1, 20 / 1e3),
        ("step", "gemm"): (3, 190 / 1e3),
        ("step", "adam_k"): (1, 20 / 1e3),
        ("step", "softmax_bwd_k"): (1, 15 / 1e3),
        ("step", "softmax_k"): (1, 10 / 1e3),
        ("step", "fill"): (1, 1 / 1e3),
    }
    assert totals == {"forward": 50 / 1e3, "backward": 166 / 1e3, "optimizer": 20 / 1e3}
    assert totals["backward"] > totals["forward"]


def test_ranges_are_profiler_events_only_when_asked():
    assert profile_events.RANGE_PREFIX == nvtx.RANGE_PREFIX
    x = torch.ones(4, 4)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with nvtx.nvtx_range("forward"):
            x @ x
        with nvtx.profiler_ranges(True), nvtx.nvtx_range("backward"):
            x @ x
    names = {e.name for e in prof.events()}
    assert "cs336sys::backward" in names and "cs336sys::forward" not in names


# -- the commands, on a micro model ----------------------------------------------------------


@pytest.mark.slow
def test_profile_model_rows_and_kernel_stats(db_path):
    result = invoke("profile", "model", *MICRO, "--seq", "16", "--top", "1000",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    (run,) = rows(db_path, "SELECT * FROM profile_runs")
    assert (run["status"], run["target"], run["profiler"], run["mode"]) == (
        "ok",
        "model",
        "torch",
        "train",
    )
    assert (run["time_basis"], run["profiled_steps"], run["iters"], run["warmup"]) == (
        "cpu",
        3,
        3,
        1,
    )
    stats = rows(db_path, "SELECT * FROM kernel_stats ORDER BY phase, rank")
    assert {s["run_id"] for s in stats} == {run["run_id"]}
    for phase, short in (("forward", "fwd"), ("backward", "bwd"), ("optimizer", "opt")):
        mine = [s for s in stats if s["phase"] == phase]
        assert mine and sum(s["share"] for s in mine) == pytest.approx(1.0)
        assert [s["rank"] for s in mine] == list(range(1, len(mine) + 1))
        assert all(s["total_ms"] > 0 or s["calls"] > 0 for s in mine)
        for s in mine:
            assert s["mean_ms"] == pytest.approx(s["total_ms"] / s["calls"])
        # the summed op self time, per step; on one thread it fits inside the phase's wall time
        total = sum(s["total_ms"] for s in mine)
        assert run[f"{short}_profiled_ms_mean"] == pytest.approx(total / 3)
        assert 0 < run[f"{short}_profiled_ms_mean"] <= run[f"{short}_ms_mean"]
    # every phase together: their op time and calls summed (nsys_profile (b))
    step = {s["name"]: s for s in stats if s["phase"] == "step"}
    assert sum(s["total_ms"] for s in step.values()) / 3 == pytest.approx(
        sum(run[f"{p}_profiled_ms_mean"] for p in ("fwd", "bwd", "opt")))
    assert sum(s["share"] for s in step.values()) == pytest.approx(1)
    assert step["aten::mm"]["calls"] == 3 * (15 + 30)
    calls = {(s["phase"], s["name"]): s["calls"] for s in stats}
    # Only the 3 measured steps, warm-up excluded: 15 bias-free Linear layers per forward
    # (2 layers x q, k, v, o, w1, w2, w3, and the LM head) are one aten::mm each; backward
    # takes two (input and weight gradients); attention is 2 bmm per layer.
    assert calls[("forward", "aten::mm")] == 3 * 15
    assert calls[("backward", "aten::mm")] == 3 * 30
    assert calls[("forward", "aten::bmm")] == 3 * 2 * 2
    # Naive attention's parts against their FLOPs, summed over the 2 layers (B 2, H 4, T 16, d 16).
    assert run["qk_flops"] == run["pv_flops"] == 2 * (2 * 2 * 4 * 16 * 16 * 16)
    assert run["softmax_flops"] == 2 * (5 * 2 * 4 * 16 * 16)
    for part in ("qk", "softmax", "pv"):
        assert run[f"{part}_ms_mean"] > 0
        assert run[f"{part}_gflops"] == pytest.approx(
            run[f"{part}_flops"] / run[f"{part}_ms_mean"] / 1e6
        )
    # the scaling and mask apart from QKᵀ's matmul, which is the layers' first bmm
    assert run["mask_ms_mean"] > 0 and "mask_flops" not in run  # element-wise: no FLOPs
    parts = sum(run[f"{part}_ms_mean"] for part in ("qk", "mask", "softmax", "pv"))
    assert parts < run["fwd_profiled_ms_mean"]
    assert "aten::mm" in result.stdout and "QKᵀ" in result.stdout
    # the printout answers per step: 15 mm calls a forward, not the 45 of the 3 steps
    line = next(ln for ln in result.stdout.splitlines() if " aten::mm " in ln)
    assert line.split()[2] == "15", line
    assert "calls/step" in result.stdout and "ms/step" in result.stdout


def test_profile_attention_breakdown_and_sdpa(db_path):
    result = invoke("profile", "attention", *ATTN, "--impl", "naive,sdpa", "--top", "3",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    got = rows(db_path, "SELECT * FROM profile_runs ORDER BY created")
    assert [(r["impl"], r["status"]) for r in got] == [("naive", "ok"), ("sdpa", "ok")]
    naive, sdpa = got
    scores = 2 * 2 * 32 * 32  # B·H·T²
    assert (naive["qk_flops"], naive["softmax_flops"], naive["pv_flops"]) == (
        2 * scores * 16, 5 * scores, 2 * scores * 16
    )
    for part in ("qk", "softmax", "pv"):
        assert naive[f"{part}_ms_mean"] > 0 and naive[f"{part}_gflops"] > 0
    assert sdpa["qk_ms_mean"] is None  # no naive ranges in the fused kernel
    # the batch and heads the FLOPs count, which the points' labels leave out, are named
    assert "Same in every row: batch=2, heads=2, causal=yes" in " ".join(result.stdout.split())
    for r in got:
        stats = rows(db_path, f"SELECT * FROM kernel_stats WHERE run_id = '{r['run_id']}'")
        assert {s["phase"] for s in stats} == {"forward", "backward", "step"}
        for phase in ("forward", "backward", "step"):
            shares = [s["share"] for s in stats if s["phase"] == phase]
            assert len(shares) <= 4 and sum(shares) == pytest.approx(1.0)
    calls = rows(db_path, "SELECT calls FROM kernel_stats WHERE phase = 'forward' "
                 f"AND name = 'aten::bmm' AND run_id = '{naive['run_id']}'")
    assert calls == [{"calls": 2 * 2}]  # QKᵀ and PV, in each of the 2 measured calls
    # a step is its forward and backward: the phases' host times summed in made it twice that
    for r in got:
        samples = json.loads(query_samples(db_path, r["run_id"]))
        for fwd, bwd, step in zip(samples["fwd_ms"], samples["bwd_ms"], samples["step_ms"],
                                  strict=True):
            assert step == pytest.approx(fwd + bwd)


def query_samples(db_path, run_id):
    return rows(db_path, f"SELECT samples FROM runs WHERE id = '{run_id}'")[0]["samples"]


def test_trace_writes_valid_chrome_json(db_path, tmp_path, monkeypatch):
    trace = tmp_path / "trace.json"
    args = ["profile", "attention", *ATTN, "--impl", "naive", "--pass", "forward"]
    assert invoke(*args, "--trace", trace, "--db", db_path).exit_code == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert {"cs336sys::forward", "cs336sys::scores"} <= {e.get("name") for e in events}
    assert invoke(*args, "--seq", "16,32", "--trace", trace, "--db", db_path).exit_code == 0
    for name in ("trace-1.json", "trace-2.json"):
        assert "traceEvents" in json.loads((tmp_path / name).read_text())
    # a folder not there yet is made, as --snapshot's is (docs/experiments/profile.md's
    # `--trace traces/tiny.json` was refused)
    inside = tmp_path / "traces" / "t.json"
    assert invoke(*args, "--trace", inside, "--db", db_path).exit_code == 0
    assert "traceEvents" in json.loads(inside.read_text())
    # a relative --trace is stored as the absolute path it wrote
    monkeypatch.chdir(tmp_path)
    assert invoke(*args, "--trace", "rel/t.json", "--db", db_path).exit_code == 0
    paths = rows(db_path, "SELECT trace_path FROM profile_runs ORDER BY created")
    assert [p["trace_path"] for p in paths] == [
        str(trace),
        *(str(tmp_path / f"trace-{i}.json") for i in (1, 2)),
        str(inside),
        str(tmp_path / "rel" / "t.json"),
    ]
    # profiled again into the same names: the stored rows' traces are kept, the next free
    # names taken and said (a second run wrote over the first's, which its rows still named)
    first = trace.read_bytes()
    again = invoke(*args, "--seq", "16,32,64", "--trace", trace, "--db", db_path)
    assert again.exit_code == 0 and trace.read_bytes() == first
    written = [str(tmp_path / f"trace-{i}.json") for i in (3, 4, 5)]
    assert f"traces written: {', '.join(written)}" in again.stdout
    again = invoke(*args, "--trace", trace, "--db", db_path)
    assert f"trace written: {tmp_path / 'trace-6.json'}" in again.stdout


def test_nvtx_mode_profiles_nothing_and_still_times(db_path):
    result = invoke("profile", "model", *MICRO, "--seq", "8", "--mode", "forward",
                    "--nvtx", "--db", db_path)
    assert result.exit_code == 0, result.output
    (run,) = rows(db_path, "SELECT * FROM profile_runs")
    assert run["profiler"] == "nvtx" and run["fwd_ms_mean"] > 0 and run["fwd_profiled_ms_mean"] is None
    assert rows(db_path, "SELECT count(*) AS n FROM kernel_stats") == [{"n": 0}]
    # said once, on a CPU: the ranges are CUDA's
    assert result.stderr.count("--nvtx without CUDA: its ranges are CUDA's, so nothing is "
                               "profiled") == 1


def test_nsys_without_nsys_is_bad_input(db_path, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no nsys here
    result = invoke("profile", "model", *MICRO, "--nsys", "--db", db_path)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --nsys: Nsight Systems (nsys) is not installed or not on PATH"
    ]
    assert not db_path.exists()


@pytest.mark.parametrize(
    "extra,message",
    [
        (["--top", "0"], "--top must be positive"),
        (["--exec"], "--exec runs the Nsight Systems command"),
        (["--trace", "{tmp}/a-file/t.json"], "is not a directory"),
        (["--trace", "{tmp}"], "is a directory"),
        (["--nvtx", "--trace", "{tmp}/t.json"], "--nsys/--nvtx do not run"),
        (["--checkpoint", "every:9"], "--checkpoint"),
        (["--size", "huge"], "unknown size"),
    ],
)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(db_path, tmp_path, extra, message):
    (tmp_path / "a-file").write_text("mine\n")
    extra = [e.replace("{tmp}", str(tmp_path)) for e in extra]
    result = invoke("profile", "model", *MICRO, "--seq", "8", *extra, "--db", db_path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], lines
    assert not db_path.exists()


def test_bad_attention_input_uses_the_attention_validation(db_path):
    result = invoke("profile", "attention", *ATTN, "--impl", "magic", "--db", db_path)
    assert result.exit_code == 2 and "--impl: unknown value 'magic'" in result.stderr
    assert not db_path.exists()


def test_help_has_examples():
    for args in (["profile"], ["profile", "model"], ["profile", "attention"]):
        result = invoke(*args, "--help")
        assert result.exit_code == 0 and "Example" in result.stdout
        assert f"cs336sys {' '.join(args)}" in result.stdout


# -- the store ---------------------------------------------------------------------------------


def test_v2_store_is_migrated_and_keeps_its_rows(db_path):
    conn = sqlite3.connect(db_path, isolation_level=None)
    schema.migrate(conn, target=2)
    conn.execute("INSERT INTO invocations (id, command, gpu) VALUES ('i1', 'model', 'cpu')")
    conn.execute(
        "INSERT INTO runs (id, invocation_id, experiment, status, settings, metrics, point_key)"
        " VALUES ('r1', 'i1', 'model', 'ok', ?, ?, 'k1')",
        (json.dumps({"size": "small"}), json.dumps({"step_ms_mean": 3.0})),
    )
    conn.close()
    with Store(db_path, EXPERIMENTS) as s:
        assert schema.version(s.conn) == schema.SCHEMA_VERSION == 10
        assert s.query("SELECT run_id, size, step_ms_mean FROM model_runs") == [
            {"run_id": "r1", "size": "small", "step_ms_mean": 3.0}
        ]
        row = {"phase": "forward", "rank": 1, "name": "aten::mm", "calls": 2, "total_ms": 1.5,
               "mean_ms": 0.75, "share": 1.0, "time_basis": "cpu"}
        assert s.add_kernel_stats("r1", [row]) == 1
        assert s.query("SELECT run_id, name, calls, share FROM kernel_stats") == [
            {"run_id": "r1", "name": "aten::mm", "calls": 2, "share": 1.0}
        ]
        with pytest.raises(sqlite3.IntegrityError):  # linked to runs: no orphan rows
            s.add_kernel_stats("no-such-run", [row])


@pytest.mark.gpu
def test_profile_on_cuda_ranks_kernels_by_device_time(db_path):
    micro = [a if a != "cpu" else "cuda" for a in MICRO]
    result = invoke("profile", "model", *micro, "--seq", "64", "--db", db_path)
    assert result.exit_code == 0, result.output
    (run,) = rows(db_path, "SELECT * FROM profile_runs")
    assert run["time_basis"] == "cuda" and run["qk_ms_mean"] > 0 and run["fwd_profiled_ms_mean"] > 0
    stats = rows(db_path, "SELECT * FROM kernel_stats")
    assert {s["time_basis"] for s in stats} == {"cuda"}
    assert {s["phase"] for s in stats} == {"forward", "backward", "optimizer", "step"}
    assert not any(s["name"].startswith("aten::") for s in stats)  # kernels, not ops
    # as the report names them: no namespaces, signatures or lambdas (the H200's profile of
    # 2026-11: 32 kernels, the longest 105 characters), and no two alike
    from cs336sys.report.kernel_names import readable_all

    names = readable_all(sorted({s["name"] for s in stats}))
    assert len(set(names)) == len(names)
    assert all("at::native::" not in n and not n.startswith("void ") and len(n) <= 160
               for n in names), names
    for phase in ("forward", "backward", "optimizer"):
        shares = [s["share"] for s in stats if s["phase"] == phase]
        assert sum(shares) == pytest.approx(1.0)


@pytest.mark.gpu
def test_profile_on_cuda_finds_the_backward_kernels(db_path):
    """Backward launches its kernels from autograd's own thread; they are backward's, and a
    train step's backward does about twice the forward's work."""
    micro = [a if a != "cpu" else "cuda" for a in MICRO]
    result = invoke("profile", "model", *micro, "--seq", "128", "--mode", "train",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    (run,) = rows(db_path, "SELECT * FROM profile_runs")
    assert run["bwd_profiled_ms_mean"] > run["fwd_profiled_ms_mean"] > 0


def test_a_trace_that_would_overwrite_a_store_is_refused(db_path, tmp_path):
    """--trace naming the store itself, or another results store: one line, exit 2, both
    stores byte for byte as they were."""
    import hashlib

    from cs336sys.store import Store

    other = tmp_path / "other.db"
    for path in (db_path, other):
        Store(path, EXPERIMENTS).close()
    before = {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (db_path, other)}
    for trace, said in ((db_path, "is the results store (--db); writing would overwrite it"),
                        (other, "is a SQLite database; writing would replace it")):
        result = invoke("profile", "model", *MICRO, "--seq", "8", "--trace", trace,
                        "--db", db_path)
        assert result.exit_code == 2, result.output
        (line,) = result.stderr.strip().splitlines()
        assert said in line
    assert {p: hashlib.sha256(p.read_bytes()).hexdigest() for p in (db_path, other)} == before


def test_the_users_attention_is_split_at_its_softmax():
    """Each call of the user's attention: the matmuls before the softmax are QKᵀ, the other
    ops before it the scale and mask, then the softmax, then PV; a call without a softmax is
    not split."""
    from cs336sys.experiments.profile_events import Item, user_parts

    call = [Item("aten::bmm", 1, 10), Item("aten::div", 2, 1), Item("aten::masked_fill", 3, 2),
            Item("aten::_softmax", 4, 5), Item("aten::bmm", 5, 7)]
    assert user_parts([call, call]) == {"qk": 20.0, "mask": 6.0, "softmax": 10.0, "pv": 14.0}
    assert user_parts([[Item("aten::bmm", 1, 10)]]) == {}
    # a copy of PV's operand is no part, as QKᵀ's is not QKᵀ: PV read as slow as QKᵀ for it
    copied = [*call[:4], Item("aten::copy_", 4.5, 4), Item("aten::bmm", 5, 7)]
    assert user_parts([copied])["pv"] == 7.0


def test_pv_is_its_ranges_matrix_multiplications_as_qk_is():
    """The final matmul range of naive attention: on a CPU torch's matmul copies its operands
    there (0.26 of PV's 0.64 ms a step), which PV counted and QKᵀ, whose copies fall under
    scale, mask, did not: their GFLOP/s read alike for a PV matmul 1.7x faster."""
    events = [
        _event("cs336sys::forward", 0, 100),
        _event("cs336sys::scores", 10, 30),
        _event("aten::copy_", 11, 12, self_us=3),
        _event("aten::bmm", 13, 20, self_us=10),
        _event("cs336sys::softmax", 31, 40),
        _event("aten::_softmax", 32, 39, self_us=4),
        _event("cs336sys::final matmul", 41, 60),
        _event("aten::copy_", 42, 44, self_us=5),
        _event("aten::bmm", 45, 50, self_us=6),
    ]
    _, totals, parts = summarize(events, on_cuda=False, top=5)
    assert parts == {"qk": 10 / 1e3, "mask": 3 / 1e3, "softmax": 4 / 1e3, "pv": 6 / 1e3}
    assert totals == {"forward": 28 / 1e3}  # the copies still count in the phase


def test_a_profiled_point_of_the_users_model_is_named_by_it():
    """The user's model (--model) and ours at one size read alike in every title and row of
    the profile's tables but for the model's name."""
    from cs336sys.experiments.profile_section import attention_parts, label

    row = {"target": "model", "size": "tiny", "d_model": 512, "num_layers": 4, "seq": 64,
           "mode": "forward", "precision": "fp32", "status": "ok", "qk_ms_mean": 1.0}
    assert label(row) == "tiny (512×4) T=64 forward fp32"
    assert label({**row, "model": "cs336_basics"}) == "cs336_basics tiny (512×4) T=64 forward fp32"
    parts = attention_parts([{**row, "model": "cs336_basics"}])
    assert parts.title == "Attention's parts in the forward (per step)"
    assert parts.rows[0][0].startswith("cs336_basics ")
    # the same point on two GPUs: a GPU column, and each point's top kernels titled by it
    from cs336sys.experiments.profile_section import section
    from cs336sys.report.sections import Section

    two = [{**row, "run_id": "a", "gpu": "cpu"}, {**row, "run_id": "b", "gpu": "H100"}]
    parts = attention_parts(two)
    assert parts.headers[:2] == ["gpu", "point"] and [r[0] for r in parts.rows] == ["cpu", "H100"]
    kernel = {"phase": "forward", "rank": 1, "name": "aten::mm", "calls": 2, "total_ms": 1.0,
              "mean_ms": 0.5, "share": 1.0, "time_basis": "cpu"}
    sec = Section("profile", "Profile", linked={"a": [kernel], "b": [kernel]})
    section(sec, two)
    assert [t.title.split(" fp32 ")[1] for t in sec.tables[1:]] == [
        "[cpu] (CPU self time)", "[H100] (CPU self time)"]


def test_the_users_attention_function_is_marked_while_profiled_and_put_back(monkeypatch):
    """The function is found in the module of the model's class or of any submodule's: a
    model subclassed in a file of its own, or whose attention class lives in another file,
    was profiled without the split and without a word."""
    import sys
    import types

    from torch import nn

    from cs336sys.experiments.profile import user_attention_marked
    from cs336sys.measure import nvtx as nvtx_module

    module = types.ModuleType("their_attention")
    module.scaled_dot_product_attention = lambda q, k, v, mask: q
    monkeypatch.setitem(sys.modules, "their_attention", module)
    monkeypatch.setitem(sys.modules, "their_model", types.ModuleType("their_model"))
    Attention = type("Attention", (nn.Module,), {"__module__": "their_attention"})
    Model = type("Model", (nn.Module,), {"__module__": "their_model"})
    model = Model()
    model.attn = Attention()
    original = module.scaled_dot_product_attention
    with nvtx_module.profiler_ranges(True), torch.profiler.profile() as prof:
        with user_attention_marked(model):
            assert module.scaled_dot_product_attention(1, 2, 3, None) == 1
    assert module.scaled_dot_product_attention is original
    assert not hasattr(sys.modules["their_model"], "scaled_dot_product_attention")
    assert any(e.name == "cs336sys::attention (yours)" for e in prof.events())


# Names as the CUDA profiler gave them on the H200 (reports/nvidia-h200/results.db): the op
# sits deep in the template arguments, past the 48 characters the plot used to keep.
MUL = ("void at::native::elementwise_kernel<128, 2, at::native::gpu_kernel_impl_nocast<"
       "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor"
       "<float> > >(at::TensorIteratorBase&, at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> > const&)::{lambda(int)#1}>(int, "
       "at::native::gpu_kernel_impl_nocast<at::native::BinaryFunctor<float, float, float, "
       "at::native::binary_internal::MulFunctor<float> > >(at::TensorIteratorBase&, "
       "at::native::BinaryFunctor<float, float, float, at::native::binary_internal::MulFunctor"
       "<float> > const&)::{lambda(int)#1})")
MASK = ('void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<at::nat'
        'ive::(anonymous namespace)::masked_fill_kernel(at::TensorIterator&, c10::Scalar const&'
        ')::{lambda()#1}::operator()() const::{lambda()#12}::operator()() const::{lambda(c10::B'
        'Float16, bool)#1}>(at::TensorIteratorBase&, at::native::(anonymous namespace)::masked_'
        'fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() const'
        '::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda('
        'int)#1}>(int, at::native::gpu_kernel_impl_nocast<at::native::(anonymous namespace)::ma'
        'sked_fill_kernel(at::TensorIterator&, c10::Scalar const&)::{lambda()#1}::operator()() '
        'const::{lambda()#12}::operator()() const::{lambda(c10::BFloat16, bool)#1}>(at::TensorI'
        'teratorBase&, at::native::(anonymous namespace)::masked_fill_kernel(at::TensorIterator'
        '&, c10::Scalar const&)::{lambda()#1}::operator()() const::{lambda()#12}::operator()() '
        'const::{lambda(c10::BFloat16, bool)#1} const&)::{lambda(int)#1})')
COPY = ("void at::native::vectorized_elementwise_kernel<8, at::native::bfloat16_copy_kernel_cuda("
        "at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, 2ul> >(int, at::native::"
        "bfloat16_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda(float)#1}, std::array<char*, "
        "2ul>)")


def test_a_kernels_name_keeps_what_tells_it_apart():
    from cs336sys.report.kernel_names import cut_middle, readable, readable_all

    assert readable(MUL) == ("elementwise_kernel<128, 2, gpu_kernel_impl_nocast<"
                                  "BinaryFunctor<float, float, float, MulFunctor<float>>>>")
    assert readable(MASK) == "elementwise_kernel<128, 4, gpu_kernel_impl_nocast<masked_fill_kernel>>"
    assert readable(COPY) == "vectorized_elementwise_kernel<8, bfloat16_copy_kernel_cuda>"
    for plain in ("aten::mm", "nvjet_sm90_tst_96x128_64x7_2x1_v_bz_TNN", "_attn_fwd", "(other)"):
        assert readable(plain) == plain  # CPU ops and plain kernel names as they are
    assert readable(MUL, 40) == "elementwise_kernel<…MulFunctor<float>>>>"  # its op kept
    # one op in two dtypes reads alike once shortened: told apart by order, not merged
    bf16 = MASK.replace("c10::BFloat16, bool", "float, bool")
    assert readable_all([MASK, bf16, MASK, "aten::mm"]) == [
        readable(MASK), readable(MASK) + " #2", readable(MASK), "aten::mm"]
    # a plot's axis keeps the op, at the name's end
    assert cut_middle(readable(MUL), 52).endswith("MulFunctor<float>>>>")
    assert len(cut_middle(readable(MUL), 52)) == 52
    # two names the middle's cut reads alike (the H200's A- and BUnaryFunctor of one Mul,
    # two bars of one label) keep where they differ; others keep the middle's cut
    from cs336sys.report.kernel_names import cut_apart

    a, b = (f"vectorized_elementwise_kernel<4, {x}UnaryFunctor<float, float, float, "
            "MulFunctor<float>>>" for x in "AB")
    cut = cut_apart([a, b, readable(MUL), "aten::mm"], 52)
    assert cut[0] != cut[1] and "AUnaryFunctor" in cut[0] and "BUnaryFunctor" in cut[1]
    assert all(len(c) <= 52 for c in cut) and cut[2:] == [cut_middle(readable(MUL), 52),
                                                           "aten::mm"]


def test_profile_attention_takes_no_timer_options_it_would_not_use(db_path):
    """The profiler times --iters calls in one round: --rounds and --min-time were taken,
    stored as the point's settings and never used (and CUDA's default of 3 rounds refused
    --iters 2). They are no options of profile attention, and no rounds are stored."""
    out = invoke("profile", "attention", *ATTN, "--impl", "naive", "--rounds", "2",
                 "--db", db_path)
    assert out.exit_code == 2 and "No such option: --rounds" in out.stderr
    out = invoke("profile", "attention", *ATTN, "--impl", "naive", "--db", db_path)
    assert out.exit_code == 0, out.output
    (row,) = query(db_path, "SELECT json_extract(settings, '$.min_time') AS min_time, "
                            "json_type(settings, '$.rounds') AS rounds FROM runs")
    assert (row["min_time"], row["rounds"]) == (0.0, None)


def test_a_kernel_reads_the_same_in_every_table_of_the_profile():
    """Two kernels that shorten alike (one copy in fp32 and bf16) are told apart by `#2`: the
    same kernel gets the same label in each point's table and on the CPU's labels, whatever
    its rank there (it went by rank: the bf16 copy read bare where it ranked first)."""
    from cs336sys.experiments import profile
    from cs336sys.report.kernel_names import readable
    from cs336sys.report.sections import Section

    copy = ("void at::native::elementwise_kernel<128, 4, at::native::gpu_kernel_impl_nocast<"
            "at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)::{lambda()#3}::"
            "operator()() const::{lambda(%s)#1}>(at::TensorIteratorBase&, %s const&)::"
            "{lambda(int)#1}>(int, %s)")
    fp32, bf16 = (copy % ((t,) * 3) for t in ("float", "c10::BFloat16"))
    assert readable(fp32) == readable(bf16)

    def kernel(phase, rank, name):
        return {"phase": phase, "rank": rank, "name": name, "calls": 1, "total_ms": 3.0 - rank,
                "mean_ms": 1.0, "share": 0.5, "time_basis": "cuda"}

    rows = []
    for run_id, seq in (("r1", 64), ("r2", 128)):
        s = {"target": "model", "size": "small", "seq": seq, "mode": "train",
             "precision": "bf16"}
        rows.append({**s, "_settings": s, "status": "ok", "run_id": run_id})
    linked = {"r1": [kernel("forward", 1, bf16)],
              "r2": [kernel("forward", 1, fp32), kernel("backward", 1, bf16)]}
    sec = Section("profile", "Profile", linked=linked)
    profile.section(sec, rows)
    short = readable(fp32)
    assert [[row[2] for row in t.rows] for t in sec.tables] == [
        [short], [f"{short} #2", short]]  # bf16's name sorts first
    # a --compare report builds each side's section apart: the other side's kernels count
    sec = Section("profile", "Profile", linked={"r1": [kernel("forward", 1, bf16)],
                                                "r2": [kernel("forward", 1, fp32)]})
    profile.section(sec, rows[1:])
    assert [row[2] for t in sec.tables for row in t.rows] == [f"{short} #2"]
    from cs336sys.cli.profile import _details

    def point(run_id):
        return SimpleNamespace(
            spec=SimpleNamespace(target="model", point=SimpleNamespace(model=None),
                                 settings=dict),
            result=SimpleNamespace(status="ok", metrics={},
                                   tables={"kernel_stats": linked[run_id]}))

    with mock.patch("cs336sys.cli.profile._labels", lambda points: {id(p): "p" for p in points}):
        printed = _details([point("r1"), point("r2")])
    labels = [re.split(r"\s{2,}", line)[1] for line in printed.splitlines()
              if line.startswith("1 ")]
    assert [label.endswith("#2") for label in labels] == [False, True, False], printed


def test_points_that_read_alike_get_titles_apart_in_the_report_and_the_table(db_path):
    """`profile model --attention naive,sdpa`: two tables and two report sections were
    headed `tiny T=32 forward fp32`; the setting that differs now follows the words."""
    from cs336sys.experiments.profile_section import section
    from cs336sys.report.sections import Section

    rows = []
    for i, attention in enumerate(("naive", "sdpa")):
        s = {"target": "model", "size": "tiny", "seq": 32, "mode": "forward",
             "precision": "fp32", "attention": attention, "top": 10}
        rows.append({**s, "_settings": s, "status": "ok", "run_id": f"r{i}"})
    kernel = {"phase": "forward", "rank": 1, "name": "aten::mm", "calls": 1, "total_ms": 1.0,
              "mean_ms": 1.0, "share": 1.0, "time_basis": "cpu"}
    sec = Section("profile", "Profile", linked={"r0": [kernel], "r1": [kernel]})
    section(sec, rows)
    assert [t.title for t in sec.tables] == [
        f"Top ops: model tiny T=32 forward fp32 attention={a} (CPU self time)"
        for a in ("naive", "sdpa")]
    r = invoke("profile", "model", *MICRO, "--seq", "16", "--mode", "forward", "--attention",
               "naive,sdpa", "--warmup", "0", "--iters", "1", "--db", db_path)
    assert r.exit_code == 0, r.output
    heads = [line.split(" | ")[0] for line in r.stdout.splitlines() if " | forward | " in line]
    assert heads == [f"tiny (64×2) T=16 forward fp32 attention={a}" for a in ("naive", "sdpa")
                     ], heads


def test_a_profiled_triton_point_is_marked_interpreted(db_path):
    """Under TRITON_INTERPRET=1 the profile's times are the emulator's: attention's rows
    said so and profile's did not, showing 17 ms a call as the kernel's."""
    if torch.cuda.is_available():
        pytest.skip("this machine runs Triton on the GPU")
    r = invoke("profile", "attention", "--attention", "triton,naive", "--seq", "16",
               "--d-head", "16", "--batch", "1", "--pass", "forward", "--warmup", "0",
               "--iters", "1", "--device", "cpu", "--db", db_path)
    assert r.exit_code == 0, r.output
    got = {row["impl"]: row["interpreted"] for row in query(
        db_path, "SELECT impl, interpreted FROM profile_runs")}
    assert got == {"triton": 1, "naive": 0}
    assert "triton seq=16 d=16 fp32 (Triton interpreted)" in r.stdout
    assert "naive seq=16 d=16 fp32 (Triton" not in r.stdout
    # the per-phase tables' headings too (they showed the emulator's 133 ms as the kernel's)
    heads = [line.split(" | ")[0] for line in r.stdout.splitlines() if " | forward | " in line]
    assert heads == ["triton seq=16 d=16 fp32 (Triton interpreted)", "naive seq=16 d=16 fp32"]


def test_the_report_lists_each_phases_rows_together(tmp_path):
    """The report read kernel_stats ordered forward, backward, then the rest by rank: the
    optimizer's rows and those of every phase together (`step`) came interleaved."""
    import sqlite3

    from cs336sys.report.render import kernel_stats

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE kernel_stats (run_id TEXT, phase TEXT, rank INTEGER)")
    phases = ("step", "optimizer", "backward", "forward")
    conn.executemany("INSERT INTO kernel_stats VALUES ('r', ?, ?)",
                     [(p, rank) for rank in (1, 2) for p in phases])
    got = [(k["phase"], k["rank"]) for k in kernel_stats(conn, ["r"])["r"]]
    assert got == [(p, rank) for p in reversed(phases) for rank in (1, 2)]


def test_a_trace_where_nothing_can_be_written_is_refused_before_the_point_runs(db_path):
    """As root os.access says yes to /proc: the point ran, then failed to write its trace
    and was stored as an error. The folder is tried, as memory --snapshot tries it."""
    result = invoke("profile", "model", *MICRO, "--seq", "8", "--trace", "/proc/x.json",
                    "--db", db_path)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: --trace /proc/x.json: cannot write in /proc")
    assert not db_path.exists()


def test_profile_attention_checks_your_kernel_as_attention_does(db_path, tmp_path, monkeypatch):
    """`profile attention` ran the user's kernel unchecked: one without the 1/√d scale was
    profiled and stored ok (profile model, and attention, store it wrong)."""
    from tests.user_repos import course_repo, edit, with_gallery

    repo = with_gallery(course_repo(tmp_path), "attention")
    monkeypatch.chdir(repo)
    for impl in ("yours-torch", "yours-s=cs336_systems.gallery_attention:NoScale"):
        r = invoke("profile", "attention", "--attention", impl, "--seq", "32", "--d-head", "16",
                   "--batch", "1", "--heads", "2", "--warmup", "1", "--iters", "1",
                   "--db", db_path)
        assert r.exit_code in (0, 1), r.output
    rows = query(db_path, "SELECT impl, status, error, code FROM profile_runs ORDER BY created")
    assert [(r["impl"], r["status"]) for r in rows] == [("yours-torch", "ok"),
                                                        ("yours-s", "wrong")], rows
    assert rows[1]["error"].startswith("wrong: it computes attention without the 1/√d scale")
    assert "cs336_systems/gallery_attention.py" in rows[1]["code"]  # what was profiled
    # your FlashAttention raising at a size the handout never tests: not judged, as
    # attention stores it (it was an error)
    edit(repo, "cs336_systems/flash_attention.py", "        scale = 1.0 / math.sqrt(d)\n",
         "        assert n_q % 32 == 0, 'whole tiles'\n        scale = 1.0 / math.sqrt(d)\n")
    r = invoke("profile", "attention", "--attention", "yours-torch", "--seq", "48",
               "--d-head", "16", "--batch", "1", "--warmup", "1", "--iters", "1",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    last = query(db_path, "SELECT status, error FROM profile_runs ORDER BY created")[-1]
    assert last["status"] == "skipped" and last["error"].startswith("not judged: ") and \
        last["error"].endswith("yours-torch raised AssertionError: whole tiles"), last
