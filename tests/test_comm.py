"""`cs336sys comm` and its pieces: sizes with units, the exact-result check, every op on two
Gloo ranks with no wrong element, nccl-tests' bandwidth formulas, and bad input."""

import json
import sqlite3
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from cs336sys.cli import app
from cs336sys.experiments import comm as exp
from cs336sys.measure.units import format_size, parse_size
from cs336sys.sweep.points import SpecError
from tests.conftest import view_rows

runner = CliRunner()
rows = view_rows('comm_runs')


@pytest.mark.parametrize(
    "text, n",
    [("1MB", 10**6), ("10MB", 10**7), ("1GB", 10**9), ("1.5KB", 1500), ("4KiB", 4096),
     ("1MiB", 2**20), ("2gib", 2 * 2**30), ("4096", 4096), ("16 B", 16)],
)
def test_parse_size(text, n):
    assert parse_size(text) == n


@pytest.mark.parametrize("text", ["", "MB", "1XB", "-1MB", "0.1B", "1e3"])
def test_parse_size_refuses(text):
    with pytest.raises(ValueError):
        parse_size(text)


def test_format_size_round_trips_the_defaults():
    for text in ("1MB", "10MB", "100MB", "1GB", "1MiB"):
        assert format_size(parse_size(text)) == text
    # 1MB rounded down to whole shards of 3 ranks (999,996 B) still reads as a size
    assert format_size(exp.buffer_bytes(10**6, "fp32", 3)) == "1MB"
    assert [format_size(n) for n in (999, 1234, 999_400, 2 * 10**9)] == [
        "999B", "1.23KB", "999KB", "2GB"
    ]
    # a computed count that is a multiple of 1,024 reads in the units of its column's other
    # cells ('88658KiB' stood beside '68.1MB'); a whole binary unit still reads as one
    assert [format_size(n) for n in (88658 * 1024, 1536 * 2**10, 2**40, 4 * 2**30)] == [
        "90.8MB", "1536KiB", "1TiB", "4GiB"]
    # a size as typed reads back as typed, decimal first (`1024MB` read `1.02GB`)
    for text in ("1024MB", "2048KB", "1500MiB", "3GiB"):
        assert format_size(parse_size(text)) == text


def test_buffer_bytes_rounds_to_whole_shards():
    assert exp.buffer_bytes(10**6, "fp32", 2) == 10**6
    assert exp.buffer_bytes(10**6 + 3, "fp32", 2) == 10**6  # 250000 elements, even
    assert exp.buffer_bytes(10, "bf16", 4) == 8  # 4 elements: one per rank
    assert exp.buffer_bytes(1, "fp32", 6) == 24  # at least one element per rank


@pytest.mark.parametrize("op", exp.OPS)
@pytest.mark.parametrize("rank", [0, 2])
@pytest.mark.parametrize("in_place", [False, True])
def test_expected_values_match_a_hand_simulation(op, rank, in_place):
    """The exact expected output of each op, against a plain-Python simulation of 3 ranks."""
    n, numel = 3, 12
    shard = numel // n
    inputs = {r: [(i % 3) + (r % 3) for i in range(numel)] for r in range(n)}
    if op == "all-reduce":
        want = [sum(inputs[r][i] for r in range(n)) for i in range(numel)]
    elif op == "broadcast":
        want = inputs[0]
    elif op == "all-gather":  # rank r contributes the first `shard` elements of its pattern
        want = [inputs[r][i] for r in range(n) for i in range(shard)]
    else:
        want = [sum(inputs[r][rank * shard + i] for r in range(n)) for i in range(shard)]
    inp, _, out, expected_at = exp._make_op(op, numel, n, rank, torch.float32, "cpu",
                                            in_place=in_place)
    if in_place and op == "all-gather":  # this rank's shard of the output, filled
        assert inp.data_ptr() == out.data_ptr() + rank * shard * 4
        assert inp.tolist() == inputs[rank][:shard]
    elif in_place and op == "reduce-scatter":  # this rank's shard of the input
        assert out.data_ptr() == inp.data_ptr() + rank * shard * 4
    else:
        assert (inp.data_ptr() == out.data_ptr()) == (op in exp.IN_PLACE_ONLY)
    out.copy_(torch.tensor(want, dtype=torch.float32))
    assert exp._count_wrong(out, expected_at) == 0
    out[1] += 1
    out[-1] -= 2
    assert exp._count_wrong(out, expected_at) == 2


@pytest.mark.parametrize("n", [85, 86, 128, 1000])
def test_a_right_bf16_all_reduce_over_many_ranks_is_right(n):
    """The sum of every rank's pattern, rounded to bf16 as a right all-reduce returns it,
    is the expected value: past 85 ranks it went over 256 and was rounded, and every point
    was `wrong`."""
    numel = 6
    _, _, out, expected_at = exp._make_op("all-reduce", numel, n, 0, torch.bfloat16, "cpu")
    exact = [sum(float(exp._pattern(r, i)) for r in range(n)) for i in range(numel)]
    out.copy_(torch.tensor(exact, dtype=torch.float64).to(torch.bfloat16))
    assert exp._count_wrong(out, expected_at) == 0


def test_placements_expand_where_the_op_has_both():
    got = [(s.op, s.placement) for s in exp.specs(op=["all-reduce", "all-gather",
                                                       "reduce-scatter"],
                                                   bytes=["1KB"], world_size=[2],
                                                   device="cpu")]
    assert got == [("all-reduce", "in-place"), ("all-gather", "out-of-place"),
                   ("all-gather", "in-place"), ("reduce-scatter", "out-of-place"),
                   ("reduce-scatter", "in-place")]
    one = exp.specs(op=["all-gather"], placement=["in-place"], bytes=["1KB"],
                    world_size=[2], device="cpu")
    assert [s.placement for s in one] == ["in-place"]
    with pytest.raises(exp.SpecError, match="broadcast in torch.distributed work in place"):
        exp.specs(op=["broadcast"], placement=["out-of-place"], device="cpu")


def test_sizes_that_round_to_one_buffer_are_one_point():
    """1B, 2B and 4B are all one fp32 element per rank (8 B at 2 ranks); nccl-tests measures
    such a size once, and so the closing average counts it once."""
    got = exp.specs(bytes=["1B,2B,4B,16B"], world_size=[2], device="cpu")
    assert [s.bytes for s in got] == [8, 16]
    three = exp.specs(bytes=["8B:64B:x2"], world_size=[3], device="cpu")
    assert [s.bytes for s in three] == [12, 24, 60]


def test_a_collective_that_returns_wrong_values_is_stored_wrong(monkeypatch, tmp_path):
    """A point whose output differs from the exact values is `wrong`, not `ok`: it must not
    count towards the problem, nor be skipped by --resume."""
    import types

    import torch.distributed as dist

    made = exp._make_op

    def off_by_one(*args, **kwargs):
        source, op, output, expected_at = made(*args, **kwargs)
        return source, (lambda: (op(), output.add_(1))), output, expected_at

    monkeypatch.setattr(exp, "_make_op", off_by_one)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0,
                            world_size=1)
    try:
        spec = exp.specs(bytes=["64B"], world_size=[1], device="cpu", warmup=0, iters=1)[0]
        got = exp.run(types.SimpleNamespace(world_size=1, rank=0, device="cpu"), spec)
    finally:
        dist.destroy_process_group()
    assert got.status == "wrong" and got.metrics["wrong"] == 16
    assert got.error == "wrong: 16 elements of the all-reduce output differ from the exact " \
        "values, on rank 0"


def test_busbw_factors_follow_nccl_tests():
    assert exp.busbw_factor("all-reduce", 4) == pytest.approx(1.5)
    assert exp.busbw_factor("all-gather", 4) == pytest.approx(0.75)
    assert exp.busbw_factor("reduce-scatter", 2) == pytest.approx(0.5)
    assert exp.busbw_factor("broadcast", 8) == 1.0


@pytest.mark.slow
def test_every_op_on_two_gloo_ranks_is_exact(db_path):
    result = runner.invoke(
        app,
        ["comm", "--db", str(db_path), "--op", "all-reduce,all-gather,reduce-scatter,broadcast",
         "--bytes", "4KB,1MB", "--precision", "fp32,bf16", "--world-size", "2", "--warmup", "1",
         "--iters", "4"],
    )
    assert result.exit_code == 0, result.output
    got = rows(db_path)
    assert len(got) == 24  # all-gather and reduce-scatter out of place and in place
    assert sorted({(r["op"], r["placement"]) for r in got}) == [
        ("all-gather", "in-place"), ("all-gather", "out-of-place"), ("all-reduce", "in-place"),
        ("broadcast", "in-place"), ("reduce-scatter", "in-place"),
        ("reduce-scatter", "out-of-place")]
    for r in got:
        assert r["status"] == "ok" and r["wrong"] == 0
        assert r["backend"] == "gloo" and r["world_size"] == 2 and r["device"] == "cpu"
        assert r["time_ms_min"] <= r["time_ms_mean"] <= r["time_ms_max"]
        algbw = r["bytes"] / (r["time_ms_mean"] / 1e3) / 1e9
        assert r["algbw_gbps"] == pytest.approx(algbw)
        assert r["busbw_gbps"] == pytest.approx(algbw * exp.busbw_factor(r["op"], 2))
    assert {r["bytes"] for r in got} == {4000, 10**6}
    # the statistics of every timed quantity, over each iteration's time averaged over the
    # ranks (time_ms_min was the fastest rank's mean, its median rank 0's alone): the same
    # names mean the same in every view; the ranks' own means apart
    for r in rows(db_path, "SELECT r.samples, c.* FROM runs r JOIN comm_runs c "
                           "ON c.run_id = r.id"):
        ranks = json.loads(r["samples"])
        per_iter = [statistics.fmean(t) for t in zip(ranks["rank0"], ranks["rank1"],
                                                     strict=True)]
        assert r["time_ms_median"] == pytest.approx(statistics.median(per_iter))
        assert r["time_ms_min"] == pytest.approx(min(per_iter))
        assert r["time_ms_n"] == len(per_iter) and r["time_ms_std"] is not None
        means = [statistics.fmean(ranks[k]) for k in ("rank0", "rank1")]
        assert (r["time_ms_rank_min"], r["time_ms_rank_max"]) == pytest.approx(
            (min(means), max(means)))
    assert "busbw GB/s" in result.stdout
    assert "Avg bus bandwidth: " in result.stdout and "(reduce-scatter in-place gloo 2 ranks" \
        in result.stdout


@pytest.mark.slow
def test_torchrun_joins_the_group_and_only_rank0_writes(db_path, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "cs336sys", "comm", "--db", str(db_path), "--bytes", "1KB",
           "--op", "all-reduce,broadcast", "--warmup", "1", "--iters", "2"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = rows(db_path)
    assert [(r["op"], r["world_size"], r["wrong"]) for r in got] == [
        ("all-reduce", 2, 0),
        ("broadcast", 2, 0),
    ]
    conn = sqlite3.connect(db_path)
    assert conn.execute("SELECT count(*), max(exit_status) FROM invocations").fetchone() == (1, 0)
    assert proc.stdout.count("busbw GB/s") == 1  # one table, from rank 0


@pytest.mark.slow
def test_under_torchrun_a_failed_point_is_stored_by_rank0_and_ends_the_run(db_path, tmp_path):
    script = Path(__file__).parent / "torchrun_failing_sweep.py"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           str(script), str(db_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert proc.returncode != 0 and "boom at point 2" in proc.stderr
    conn = sqlite3.connect(db_path)
    got = conn.execute("SELECT settings, status, error FROM runs ORDER BY created").fetchall()
    assert [(json.loads(s)["n"], st) for s, st, _ in got] == [(1, "ok"), (2, "error")], (
        got, proc.stderr[-3000:])  # what went wrong, where it fails on a loaded machine
    assert got[1][2].startswith("RuntimeError: boom at point 2 on rank 0")
    assert conn.execute("SELECT count(*), max(exit_status) FROM invocations").fetchone()[0] == 1
    assert conn.execute("SELECT exit_status FROM invocations").fetchone()[0] != 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--bytes", "10XB"], "--bytes"),
        (["--op", "all-to-all"], "--op"),
        (["--placement", "out-of-place"], "--placement out-of-place: all-reduce"),
        (["--placement", "sideways"], "--placement"),
        (["--world-size", "0"], "--world-size must be positive"),
        (["--precision", "fp64"], "--precision"),
        (["--iters", "0"], "--iters"),
        (["--backend", "mpi"], "--backend"),
        (["--backend", "nccl", "--device", "cpu"], "nccl needs CUDA"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(db_path, args, message):
    result = runner.invoke(app, ["comm", "--db", str(db_path), *args])
    assert result.exit_code == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert not db_path.exists()


def test_backends_are_a_list_each_with_its_device():
    """gloo,nccl is one run of both (Gloo on CPU tensors, NCCL on the GPUs); NCCL without
    CUDA is refused, naming the option."""
    points = exp.specs(backend=["gloo"], bytes=["1KB"], world_size=[2], device="cpu")
    assert {(p.backend, p.device) for p in points} == {("gloo", "cpu")}
    if not torch.cuda.is_available():
        with pytest.raises(SpecError, match="--backend nccl needs CUDA"):
            exp.specs(backend=["gloo", "nccl"], bytes=["1KB"], world_size=[2])


def test_durations_read_as_people_say_them():
    from cs336sys.measure.units import format_duration

    assert [format_duration(s) for s in (40, 89.4, 90, 719, 7199, 7200, 12600, 172_799, 172_800,
                                         7_696_440)] == [
        "40 s", "89 s", "2 min", "12 min", "120 min", "2.0 h", "3.5 h", "48.0 h", "2 days",
        "89 days"]


@pytest.mark.parametrize("command", [["comm", "--bytes", "1KB"],  # ddp's batch splits over them
                                     ["ddp", "--impl", "naive", "--size", "tiny", "--batch", "{n}"]])
def test_more_local_ranks_than_the_host_starts_are_refused_in_one_line(tmp_path, command):
    """A million Gloo ranks ran the command out of open files: a 65-line traceback, exit 1,
    an empty store left behind. They are refused up front, naming the cap and why."""
    from cs336sys.parallel.world_size import local_gloo_cap

    cap, _ = local_gloo_cap()
    db = tmp_path / "r.db"
    args = [a.format(n=cap + 1) for a in command]
    result = CliRunner().invoke(app, [*args, "--world-size", str(cap + 1), "--device", "cpu",
                                      "--db", str(db)])
    assert result.exit_code == 2, result.output
    assert f"world size {cap + 1} is more local Gloo ranks than this host starts: at most " \
        f"{cap}" in result.output
    assert "Traceback" not in result.output and not db.exists()


def test_a_noisy_collective_is_flagged_as_every_timing_is():
    """comm stored std, median and drift but showed its mean alone in µs: a broadcast whose
    std was twice its mean read as a figure. Its time column is every timing's."""
    from cs336sys.experiments import comm as exp
    from cs336sys.report.tables import point_tables

    row = {"status": "ok", "op": "broadcast", "placement": "in-place", "backend": "gloo",
           "world_size": 2, "precision": "fp32", "bytes": 8, "iters": 10,
           "time_ms_mean": 0.518, "time_ms_std": 1.07, "time_ms_median": 0.164,
           "time_ms_p10": 0.15, "time_ms_p90": 2.9, "time_ms_iqr": 0.2, "time_ms_n": 10,
           "time_ms_rank_max": 0.6, "algbw_gbps": 1e-5, "busbw_gbps": 1e-5, "wrong": 0,
           "_settings": {"op": "broadcast", "bytes": 8}}
    (table,) = point_tables(exp.EXPERIMENT.tables, [row])
    cells = dict(zip(table.headers, table.rows[0], strict=True))
    assert cells["time ms"].startswith("0.518 ± 1.1 (median 0.164")
    assert "noisy" in cells["time ms"] and cells["slowest rank ms"] == "0.6"



def test_the_overhead_benchmark_builds_comms_own_point():
    """benchmarks/comm_overhead.py (the figures of docs/experiments/comm.md, `make bench`)
    built its CommSpec by position and broke when `placement` was added: TypeError on rank
    0. Its point is comm's own all-reduce, as `cs336sys comm` builds it."""
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "comm_overhead.py"
    spec = importlib.util.spec_from_file_location("comm_overhead", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    point = bench.comm_point(2**20, 2, "gloo", 0, 2)
    (ours,) = exp.specs(op=["all-reduce"], bytes=["1MiB"], world_size=[2], warmup=0, iters=2,
                        device="cpu")
    assert point == ours
