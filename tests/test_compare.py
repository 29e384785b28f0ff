"""`report --compare`, `--fail-on-regression` and `--history`, and the Mann-Whitney U test
behind them (measure/significance.py), checked against exact values and textbook tables."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import statistics
from pathlib import Path

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.measure.significance import (
    _counts,
    exact_p,
    exact_p_tied,
    judge,
    mann_whitney_u,
    min_p,
    ranks,
)
from cs336sys.report import history as history_mod
from cs336sys.report.change import direction, timed_samples
from tests.conftest import invoke
from tests.report_fixture import build as build_fixture

# The verdicts, tables and plot data are the subject, not pixels (conftest).
pytestmark = pytest.mark.unrasterized

# -- the test itself --------------------------------------------------------------------------


def test_ranks_share_the_mean_rank_of_ties():
    assert ranks([10, 20, 20, 30, 20]) == [1, 3, 3, 5, 3]
    assert ranks([3.0, 1.0, 2.0]) == [3, 1, 2]


def test_exact_p_values_counted_by_hand():
    # 3 vs 3, no overlap: 1 arrangement of C(6,3)=20 at each extreme -> 2/20
    r = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert r.exact and r.u == 0 and r.p == pytest.approx(0.1)
    assert mann_whitney_u([1, 2], [3, 4]).p == pytest.approx(1 / 3)  # 2 of C(4,2)=6
    assert mann_whitney_u([1, 2, 3, 4], [5, 6, 7, 8]).p == pytest.approx(2 / 70)
    # 5 vs 5 with U=2 (7>5, 7>6): U=0,1,2 have 1,1,2 arrangements of 252 -> 2*4/252
    r = mann_whitney_u([1, 2, 3, 4, 7], [5, 6, 8, 9, 10])
    assert r.u == 2 and r.p == pytest.approx(8 / 252)
    # two-sided: swapping the samples changes U to n1*n2 - U, not p
    s = mann_whitney_u([5, 6, 8, 9, 10], [1, 2, 3, 4, 7])
    assert s.u == 23 and s.p == pytest.approx(r.p)
    # the counts of U are a distribution over the C(m+n, m) arrangements
    assert _counts(5, 5)[:6] == (1, 1, 2, 3, 5, 7)
    for m, n in ((1, 1), (3, 5), (8, 8)):
        assert sum(_counts(m, n)) == math.comb(m + n, m)


# Critical values of U, two-sided alpha = 0.05 (e.g. Siegel & Castellan, table J; the
# tables in most statistics textbooks): the largest U with p <= 0.05.
CRITICAL = {(3, 5): 0, (3, 8): 2, (4, 4): 0, (4, 6): 2, (4, 8): 4, (5, 5): 2, (5, 8): 6,
            (6, 6): 5, (6, 8): 8, (7, 7): 8, (7, 8): 10, (8, 8): 13}


@pytest.mark.parametrize("sizes, critical", CRITICAL.items())
def test_exact_test_reproduces_textbook_critical_values(sizes, critical):
    m, n = sizes
    assert exact_p(critical, m, n) <= 0.05 < exact_p(critical + 1, m, n)


def _u_by_pairs(x, y):
    """U of x counted pair by pair (x beats y: 1, a tie: 1/2): no ranks involved."""
    return sum((a > b) + 0.5 * (a == b) for a in x for b in y)


def test_exact_p_with_ties_over_every_arrangement_of_the_values():
    """Few samples with ties: exact, over every way of splitting the pooled values (the
    normal approximation gave 3 vs 3 with one tie p = 0.047, below the 0.1 that no split
    of 6 values can go under, and called a change)."""
    x, y = [1, 2, 2, 3], [2, 3, 4, 4, 5]
    r = mann_whitney_u(x, y)
    assert r.exact and r.u == _u_by_pairs(x, y) == 2.5
    pooled = x + y  # every 4 of the 9 as the first sample: U at least as far from 10
    far = [abs(_u_by_pairs([pooled[i] for i in c],
                           [v for i, v in enumerate(pooled) if i not in c]) - 10) >= 7.5
           for c in itertools.combinations(range(len(pooled)), len(x))]
    assert len(far) == 126 and r.p == pytest.approx(sum(far) / 126)
    assert mann_whitney_u([1, 1, 1], [1.2, 1.2, 1.2]).p == pytest.approx(0.1)
    j = judge([1, 1, 1], [1.2, 1.2, 1.2])
    assert j.outcome == "unknown" and j.reason == "too few samples to tell"
    # 1 sample against 39: the best p is 2/40, alpha itself, which tells nothing either
    j = judge([1.0], [float(v) for v in range(2, 41)])
    assert j.p == 2 / 40 and (j.outcome, j.reason) == ("unknown", "too few samples to tell")
    # 4 vs 3, one tie: 0.057 at best, not 0.050
    j = judge([10.0, 10.1, 10.2, 10.3], [12.0, 12.1, 12.1])
    assert j.outcome == "unknown" and j.p == pytest.approx(2 / 35)
    assert mann_whitney_u([2, 2, 2], [2, 2, 2, 2]).p == 1.0  # nothing to tell apart


def test_exact_p_with_ties_beyond_eight_a_side_counted_not_approximated():
    """4 vs 10 runs whose medians tie: the normal approximation gave p = 0.047 and called a
    regression that the exact p, 0.062, does not; the first 8 of B's runs alone read p = 0.089
    (not significant), so two more tied runs flipped the verdict."""
    a = [100, 100, 100, 101]
    b = [120, 130, 100, 130, 100, 130, 120, 101, 130, 101]
    r = mann_whitney_u(a, b)
    pooled, n1 = a + b, len(a)
    mean = n1 * len(b) / 2
    far = [abs(_u_by_pairs([pooled[i] for i in c],
                           [v for i, v in enumerate(pooled) if i not in c]) - mean)
           >= abs(r.u - mean) for c in itertools.combinations(range(len(pooled)), n1)]
    assert len(far) == 1001 and r.exact and r.p == pytest.approx(sum(far) / 1001)
    assert r.p == pytest.approx(0.0619, abs=1e-4)
    j = judge(a, b)
    assert j.outcome == "same" and j.reason == "not significant" and j.ratio == pytest.approx(1.2)
    # 20 vs 20 is still counted (n1·n2 = 400), and agrees with _counts where nothing ties
    x, y = list(range(20)), [v + 0.5 for v in range(15, 35)]
    r = mann_whitney_u(x, y)
    assert r.exact and r.u == _u_by_pairs(x, y)
    assert exact_p_tied(ranks(x + y), 20, r.u) == pytest.approx(exact_p(round(r.u), 20, 20))


def test_normal_approximation_with_ties_and_continuity_by_hand():
    # past 400 pairs: 21 vs 21 with ties of three 2s, two 3s and two 4s
    x = [1, 2, 2, 3, 6, 7, 8, 9, 10] + list(range(20, 32))
    y = [2, 3, 4, 4, 5, 11, 12, 13, 14] + list(range(40, 52))
    r = mann_whitney_u(x, y)
    u = _u_by_pairs(x, y)
    assert not r.exact and r.u == pytest.approx(u)
    # var = n1 n2 / 12 * ((n + 1) - sum(t^3 - t) / (n (n - 1)))
    var = 21 * 21 / 12 * (43 - (24 + 6 + 6) / (42 * 41))
    z = (max(u, 441 - u) - 220.5 - 0.5) / math.sqrt(var)
    assert r.p == pytest.approx(math.erfc(z / math.sqrt(2)))
    # beyond 400 pairs: the normal approximation, here U = 0 of 21 vs 20
    r = mann_whitney_u(range(21), range(21, 41))
    z = (420 - 210 - 0.5) / math.sqrt(21 * 20 / 12 * 42)
    assert not r.exact and r.p == pytest.approx(math.erfc(z / math.sqrt(2)))


def test_few_samples_can_never_be_significant():
    assert min_p(2, 2) == pytest.approx(1 / 3)
    assert min_p(3, 3) == pytest.approx(0.1)
    assert min_p(3, 4) > 0.05 > min_p(4, 4)
    j = judge([99, 100, 101], [119, 120, 121])  # 20% apart, but 3 vs 3
    assert j.outcome == "unknown" and j.reason == "too few samples to tell" and j.p == 0.1


def test_judge_needs_both_significance_and_the_threshold():
    rng = random.Random(1)
    a = [100 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(10)]
    assert judge(a, [v * 1.3 for v in a]).outcome == "up"
    assert judge(a, [v * 0.8 for v in a]).outcome == "down"
    small = judge(a, [v * 1.03 for v in a])
    assert small.p < 0.05 and small.outcome == "same"  # the test is sure; 3% is noise
    # the same distribution twice: nothing
    b = [100 * (1 + rng.uniform(-0.02, 0.02)) for _ in range(10)]
    assert judge(a, b).outcome == "same"
    # wide noise, medians 10% apart: not significant with enough samples to tell
    wide_a = [100, 60, 140, 80, 120, 95, 105, 70, 130, 100]
    wide_b = [v * 1.1 for v in reversed(wide_a)][:9] + [40.0]
    w = judge(wide_a, wide_b)
    assert w.p >= 0.05 and w.outcome == "same" and w.reason == "not significant"
    # single readings: the threshold alone, no p
    assert judge([1000], [1200], tested=False).outcome == "up"
    assert judge([1000], [1040], tested=False).outcome == "same"
    assert judge([1000], [1200], tested=False).p is None


def test_directions_by_unit():
    assert direction("ms") == (-1, "slower", "faster")
    assert direction("bytes") == (-1, "bigger", "smaller")
    assert direction("TFLOP/s") == (1, "faster", "slower")
    assert direction("GB/s")[0] == 1 and direction("")[0] == 0


def test_timed_samples_of_each_layout_never_the_warmup():
    model = {"step_ms": [10, 11], "fwd_ms": [3, 4], "warmup": {"step_ms": [500, 90]}}
    assert timed_samples(json.dumps(model), "step_ms") == [10, 11]
    comm = {"rank0": [1.0, 3.0], "rank1": [3.0, 5.0]}  # per iteration, the mean over ranks
    assert timed_samples(comm, "time_ms") == [2.0, 4.0]
    ddp = {"ranks": [{"step": [10, 30], "fwd": [1, 1]}, {"step": [20, 25], "fwd": [1, 1]}],
           "loss": [2.0, 1.9]}  # per step, the slowest rank
    assert timed_samples(ddp, "step_ms") == [20, 30]
    assert timed_samples(None, "step_ms") == [] and timed_samples("{", "step_ms") == []
    assert timed_samples({"saved_by_node": {"mm": 3}}, "saved_bytes") == []


# -- stores for the command -------------------------------------------------------------------

H100 = "NVIDIA H100 80GB HBM3"
A = "a1a1a1a1" * 5
B = "b2b2b2b2" * 5
C = "c3c3c3c3" * 5


class Builder:
    """A store with invocations at given commits and runs with given samples."""

    def __init__(self, path: Path):
        from cs336sys.store.db import Store

        self.path, self.store, self.n = path, Store(path, EXPERIMENTS), 0

    def invocation(self, inv: str, commit: str | None, started: str, gpu: str = H100,
                   dirty: int = 0) -> None:
        self.store.db["invocations"].insert({
            "id": inv, "command": "test", "argv": "[]", "started": started, "finished": started,
            "exit_status": 0, "host": "lab", "device": "cuda", "gpu": gpu, "gpu_count": 1,
            "torch_version": "2.11.0", "git_commit": commit, "git_dirty": dirty,
        })

    def run(self, inv, exp, settings, metrics, samples=None, created="2026-02-01 00:00:00.000000"):
        from cs336sys.store.db import point_key

        self.n += 1
        self.store.db["runs"].insert({
            "id": f"run-{self.n:04d}", "invocation_id": inv, "experiment": exp, "status": "ok",
            "settings": json.dumps(settings), "metrics": json.dumps(metrics),
            "samples": None if samples is None else json.dumps(samples), "created": created,
            "started": created, "duration_s": 1.0, "point_key": point_key(exp, settings),
        })

    def model(self, inv, created, precision, steps, size="small", context=128):
        s = {"size": size, "seq": context, "batch": 4, "mode": "train",
             "precision": precision, "compile": False, "device": "cuda", "seed": 0}
        mean = sum(steps) / len(steps)
        m = {"step_ms_mean": mean, "step_ms_min": min(steps), "step_ms_max": max(steps),
             "step_ms_median": sorted(steps)[len(steps) // 2], "step_ms_std": 0.0}
        self.run(
            inv, "model", s, m, {"step_ms": steps, "warmup": {"step_ms": [10 * mean]}}, created
        )

    def memory(self, inv, created, peak):
        s = {"size": "small", "seq": 128, "batch": 4, "mode": "train",
             "precision": "fp32", "checkpoint": "none", "device": "cuda"}
        self.run(inv, "memory", s, {"peak_bytes": peak}, None, created)

    def close(self) -> Path:
        self.store.close()
        return self.path


RUNS = 4  # runs a side of a point whose verdict a test reads: 4 vs 4 decides at p = 2/70


def noisy(center: float, n: int, seed: int, spread: float = 0.02) -> list[float]:
    rng = random.Random(seed)
    return [center * (1 + rng.uniform(-spread, spread)) for _ in range(n)]


@pytest.fixture(scope="module")
def regress_db(tmp_path_factory):
    """Commits A and B on one H100, four runs a side of each timed point (one run a side
    decides nothing beyond the threshold: test_one_run_a_side_decides_no_change); B: fp32
    30% slower, bf16 the same, tf32 20% faster, memory 20% bigger, a 3-vs-3 point of one run
    a side 20% slower; commit C has a run of its own."""
    b = Builder(tmp_path_factory.mktemp("regress") / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    b.invocation("inv-c", C, "2026-02-03 10:00:00.000000")
    ta, tb = "2026-02-01 10:{}:00.000000", "2026-02-02 10:{}:00.000000"
    for run in range(RUNS):
        for i, (precision, a, b_) in enumerate((("fp32", 100, 130), ("bf16", 50, 50),
                                               ("tf32", 80, 64))):
            at = f"{10 * i + run + 1:02d}"
            b.model("inv-a", ta.format(at), precision, noisy(a, 10, 100 * i + run))
            b.model("inv-b", tb.format(at), precision, noisy(b_, 10, 100 * i + 50 + run))
    ta, tb = "2026-02-01 10:0{}:00.000000", "2026-02-02 10:0{}:00.000000"
    b.model("inv-a", ta.format(4), "fp16", [99.0, 100.0, 101.0], size="medium")
    b.model("inv-b", tb.format(4), "fp16", [119.0, 120.0, 121.0], size="medium")
    b.memory("inv-a", ta.format(5), 1000 * 2**20)
    b.memory("inv-b", tb.format(5), 1200 * 2**20)
    b.model("inv-c", "2026-02-03 10:01:00.000000", "fp32", noisy(100, 10, 7), context=777)
    return b.close()


def report(db, out, *args):
    """`cs336sys report` on a terminal wide enough for every table in one piece and every
    line whole (test_terminal_width.py checks the cut to a narrow one)."""
    return invoke("report", "--db", db, "--out", out, *args, env={"COLUMNS": "200"})


def _table_line(stdout: str, *cells: str) -> str:
    found = [ln for ln in stdout.splitlines() if all(c in ln for c in cells)]
    assert len(found) == 1, (cells, stdout)
    return found[0]


@pytest.mark.slow
def test_compare_labels_every_change_and_prints_the_table_then_the_paths(regress_db, tmp_path):
    result = report(regress_db, tmp_path, "--compare", "a1a1", "b2b2")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("Comparison by commit: a1a1 (A) against b2b2 (B)\n")
    header = out.splitlines()[1].split()
    assert header == ["experiment", "point", "metric", "A", "B", "B/A", "verdict", "p"]
    fp32 = _table_line(out, "model", "precision=fp32")
    assert re.search(r"1\.\d+x slower\s+p=0\.029 \(4 vs 4 runs\)$", fp32) and "step ms" in fp32
    assert re.search(r"unchanged\s+p=0\.\d+ \(4 vs 4 runs\)$", _table_line(out, "precision=bf16"))
    assert re.search(r"1\.2\dx faster\s+p=0\.029 \(4 vs 4 runs\)$", _table_line(out, "precision=tf32"))
    assert "too few samples to tell  p=0.100 (1 vs 1 run)" in _table_line(out, "precision=fp16")
    assert re.search(r"1\.20x bigger\s+one reading$", _table_line(out, "memory ", "peak bytes"))
    summary = ("5 points compared: 1 faster, 1 slower, 1 bigger, 1 unchanged, "
               "1 undecided (too few samples to tell)")
    lines = out.splitlines()
    at = lines.index(summary)  # the table, its summary, then the paths written
    assert lines[at + 1 : at + 3] == [str(tmp_path / "report.html"), str(tmp_path / "report.md")]
    assert all(Path(p).is_file() for p in lines[at + 1 :])
    assert "One run a side" not in out  # the runs were the unit
    # the 30% slower point: B/A is the ratio of the medians, near 1.3
    assert 1.25 < float(fp32.split()[-8]) < 1.35


@pytest.mark.slow
def test_compare_report_covers_only_a_and_b(regress_db, tmp_path):
    result = report(regress_db, tmp_path, "--compare", "a1a1", "b2b2")
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    md = (tmp_path / "report.md").read_text()
    assert ">777<" not in html and "| 777 |" not in md  # commit C's run...
    for text in (html, md):
        assert "c3c3c3c3" not in text  # ...and commit
        assert "a1a1a1a1a1a1" in text and "b2b2b2b2b2b2" in text
    assert f"ok {6 * RUNS + 4} (in 2 invocations)" in md
    assert re.search(r'<td class="worse">1\.\d+x slower</td>', html)
    assert '<td class="better">1.2' in html and '<td class="worse">1.20x bigger</td>' in html
    assert "Mann-Whitney U" in html and "5 points compared: 1 faster" in html
    assert "| precision=fp16 size=medium |" in md or "too few samples to tell" in md
    # each experiment's section once per side: B's latest rows no longer hide A's
    a_memory = md.index("## Memory: peaks and activation checkpointing: A, a1a1")
    b_memory = md.index("## Memory: peaks and activation checkpointing: B, b2b2")
    assert "| 1,000.0 |" in md[a_memory:b_memory] and "| 1,200.0 |" in md[b_memory:]
    assert "| 1,200.0 |" not in md[a_memory:b_memory]
    assert "## Model: end-to-end training step: A, a1a1" in md
    # without --compare the same selection has commit C's run too
    result = report(regress_db, tmp_path / "all", "--format", "md")
    assert "| 777 |" in (tmp_path / "all" / "report.md").read_text()


@pytest.mark.slow  # four reports
def test_fail_on_regression_exits_1_after_writing(regress_db, tmp_path):
    result = report(regress_db, tmp_path / "a", "--compare", "a1a1", "b2b2",
                    "--fail-on-regression", "10", "--format", "md")
    assert result.exit_code == 1, result.output
    assert (tmp_path / "a" / "report.md").exists()  # written before the exit
    err = result.stderr.strip()
    assert err.startswith("Regression: 2 points worse than 10%: ")
    assert "precision=fp32" in err and "1.20x bigger" in err and "tf32" not in err
    assert "slower, p=0.029 (4 vs 4 runs)" in err  # the test and its unit, unnested
    # 30% and 20% are not worse than 50 (and an improvement never fails)
    result = report(regress_db, tmp_path / "b", "--compare", "a1a1", "b2b2",
                    "--fail-on-regression", "50", "--format", "md")
    assert result.exit_code == 0, result.output
    # between 20 and 30: only the slower step
    result = report(regress_db, tmp_path / "c", "--compare", "a1a1", "b2b2",
                    "--fail-on-regression", "25", "--format", "md")
    assert result.exit_code == 1 and "Regression: 1 point worse than 25%" in result.stderr
    # B against A the other way round: fp32 is now faster, tf32 slower (1/0.8 = 1.25x)
    result = report(regress_db, tmp_path / "d", "--compare", "b2b2", "a1a1",
                    "--fail-on-regression", "10", "--format", "md")
    assert result.exit_code == 1 and "tf32" in result.stderr and "fp32" not in result.stderr


@pytest.mark.parametrize(
    "args, message",
    [
        (["--fail-on-regression", "10"], "--fail-on-regression needs --compare A B"),
        (["--compare", "a1a1", "b2b2", "--fail-on-regression", "-5"], "0 or more"),
        # A is stored, but the other filters keep none of its runs: it said the sides ran
        # on different machines (A's host "unset") and exited 0
        (["--compare", "a1a1", "b2b2", "--where", "precision=no-such"],
         "'a1a1' has no run in this selection"),
    ],
)
def test_fail_on_regression_bad_input(regress_db, tmp_path, args, message):
    result = report(regress_db, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0]
    assert not (tmp_path / "out").exists()


def test_the_same_distribution_twice_flags_nothing(tmp_path):
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    for i, ctx in enumerate((64, 128, 256, 512, 1024, 2048)):
        b.model("inv-a", f"2026-02-01 10:{i:02d}:00.000000", "fp32", noisy(ctx, 12, i, 0.04),
                context=ctx)
        b.model("inv-b", f"2026-02-02 10:{i:02d}:00.000000", "fp32",
                noisy(ctx, 12, 100 + i, 0.04), context=ctx)
    result = report(b.close(), tmp_path / "out", "--compare", A[:6], B[:6],
                    "--fail-on-regression", "0")
    assert result.exit_code == 0, result.output
    assert "6 points compared: 0 faster, 0 slower, 6 unchanged" in result.stdout
    assert 'class="worse"' not in (tmp_path / "out" / "report.html").read_text()


def test_compare_by_gpu_matches_points_across_gpus(tmp_path):
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-h", A, "2026-02-01 10:00:00.000000", gpu=H100)
    b.invocation("inv-x", A, "2026-02-01 11:00:00.000000", gpu="NVIDIA A100-SXM4-80GB")
    for run in range(RUNS):
        b.model("inv-h", f"2026-02-01 10:0{run}:00.000000", "bf16", noisy(50, 8, run))
        b.model("inv-x", f"2026-02-01 11:0{run}:00.000000", "bf16", noisy(100, 8, 10 + run))
    result = report(b.close(), tmp_path / "out", "--compare", "NVIDIA A100-SXM4-80GB", H100,
                    "--format", "md")
    assert result.exit_code == 0, result.output
    assert "Comparison by gpu" in result.stdout
    assert re.search(r"2\.0\dx faster\s+p=0\.029", result.stdout)
    assert "1 point compared: 1 faster, 0 slower, 0 unchanged" in result.stdout


@pytest.mark.slow
def test_fixture_change_with_three_samples_a_side_is_too_few_to_tell(tmp_path):
    db = build_fixture(tmp_path / "fixture.db")
    result = report(db, tmp_path / "out", "--compare", "aaaa", "bbbb", "--format", "md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert "| precision=fp32 | 100 | 120 | 1.200 | too few samples to tell | p=0.100 (1 vs 1 run) | 3/3 samples |" in md
    # nor its absence: 3 samples a side can give no p below 0.1 (it read `unchanged`)
    assert ("| precision=bf16 | 50 | 51 | 1.020 | too few samples to tell | p=0.200 (1 vs 1 "
            "run) | 3/3 samples |") in md
    assert "2 points compared: 0 faster, 0 slower, 0 unchanged, 2 undecided (too few samples to tell)" in md


# -- history ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def history_db(tmp_path_factory):
    """Five commits, in time order e, a, d, b, c (not their hashes' order): size=small fp32
    steps up at the third and back down at the fifth; bf16 stays flat; one medium point at
    a single commit; memory without samples."""
    b = Builder(tmp_path_factory.mktemp("history") / "results.db")
    commits = ["e5" * 20, "a1" * 20, "d4" * 20, "b2" * 20, "c3" * 20]
    centers = [100, 101, 130, 131, 100]
    for i, (commit, center) in enumerate(zip(commits, centers, strict=True)):
        inv, t = f"inv-{i}", f"2026-03-0{i + 1} 10:00:00.000000"
        b.invocation(inv, commit, t)
        for run in range(RUNS):  # four runs a commit: one a side would decide nothing
            b.model(inv, f"2026-03-0{i + 1} 10:1{run}:00.000000", "fp32",
                    noisy(center, 10, 10 * i + run))
            b.model(inv, f"2026-03-0{i + 1} 10:2{run}:00.000000", "bf16",
                    noisy(50, 10, 500 + 10 * i + run))
    b.model("inv-0", "2026-03-01 10:03:00.000000", "fp32", noisy(300, 10, 99), size="medium")
    return b.close()


def test_history_marks_steps_in_commit_time_order(history_db, tmp_path):
    result = report(history_db, tmp_path, "--history", "--experiment", "model",
                    "--where", "size=small")
    assert result.exit_code == 0, result.output
    out = result.stdout
    assert out.startswith("History: 2 points measured at two commits or more; 2 steps detected "
                          "(1 regression, 1 improvement)\n")
    up = _table_line(out, "a1a1a1a → d4d4d4d")
    down = _table_line(out, "b2b2b2b → c3c3c3c")
    assert "precision=fp32" in up and re.search(r"1\.\d+x slower\s+p=0\.029 \(4 vs 4 runs\)$", up)
    assert "precision=fp32" in down and re.search(r"1\.\d+x faster\s+p=0\.029 \(4 vs 4 runs\)$", down)
    assert "bf16" not in out
    md = (tmp_path / "report.md").read_text()
    assert md.index("## History: model, step ms by commit") < md.index("## Model")
    assert "**Steps detected**" in md and "| precision=fp32 | a1a1a1a → d4d4d4d |" in md
    images = re.findall(r"!\[([^\]]*)\]\((report_files/history-[^)]+)\)", md)
    assert [t for t, _ in images] == [
        "precision=bf16: median step ms per commit",
        "precision=fp32: median step ms per commit",
    ]
    for _, ref in images:
        assert (tmp_path / ref).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    html = (tmp_path / "report.html").read_text()
    assert '<section id="history-model">' in html and '<td class="worse">' in html
    assert '<td class="better">' in html and "Mann-Whitney U" in html


def test_history_caps_the_plots_and_says_what_it_left_out(history_db, tmp_path, monkeypatch):
    monkeypatch.setattr(history_mod, "MAX_PLOTS", 1)
    result = report(history_db, tmp_path, "--history", "--experiment", "model", "--format", "md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report.md").read_text()
    assert len(re.findall(r"!\[[^\]]*\]\(report_files/history-", md)) == 1
    assert "Plotted 1 of 2 points with a history" in md
    assert "left out: model precision=bf16." in md
    assert "1 point measured at one commit only has no history." in md


def test_history_of_a_selection_without_two_commits_says_so(regress_db, tmp_path):
    result = report(regress_db, tmp_path, "--history", "--commit", "a1a1", "--format", "md")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("History: 0 points measured at two commits or more; 0 steps")
    assert (
        "No point of this selection was measured at two commits or more"
        in (tmp_path / "report.md").read_text()
    )


def test_history_keeps_a_dirty_checkout_apart_and_leaves_out_runs_without_a_commit():
    def row(commit, dirty, day, center, seed):
        steps = noisy(center, 8, seed)
        s = {"size": "small", "precision": "fp32", "seed": seed}  # the seed never matters
        return {"status": "ok", "git_commit": commit, "git_dirty": dirty, "gpu": H100,
                "created": f"2026-04-0{day} 00:00:00.000000", "_settings": s,
                "step_ms_mean": sum(steps) / len(steps), "_samples": {"step_ms": steps}}

    rows = [row(commit, dirty, day, center, 10 * day + run)  # four runs a commit
            for commit, dirty, day, center in ((B, 0, 1, 100), (B, 1, 2, 150), (A, 0, 3, 100))
            for run in range(RUNS)] + [row(None, 0, 4, 1, 4)]
    h = history_mod.build({"model": rows}, EXPERIMENTS, draw=False)
    (track,) = h.tracks
    assert [c.label for c in track.commits] == ["b2b2b2b", "b2b2b2b-dirty", "a1a1a1a"]
    assert [i for i, _ in track.steps] == [1, 2]
    assert [c.verdict[-6:] for _, c in track.steps] == ["slower", "faster"]
    assert h.no_commit == 1 and "1 run without a git commit left out." in h.sections[0].notes
    assert [f.png for f in h.sections[0].figures] == [b""]
    assert "precision=fp32 size=small  b2b2b2b → b2b2b2b-dirty" in h.text().splitlines()[2]


def test_history_plots_each_commit_at_the_median_its_step_is_judged_on():
    """A commit that ran a point twice, five samples of 1 ms and three of 30: the table gave
    its runs' medians' median (15.5 ms), the plot its pooled samples' (1 ms)."""
    def row(commit, day, steps):
        s = {"size": "small", "precision": "fp32"}
        return {"status": "ok", "git_commit": commit, "git_dirty": 0, "gpu": H100,
                "created": f"2026-04-0{day} 00:00:00.000000", "_settings": s,
                "step_ms_mean": sum(steps) / len(steps), "_samples": {"step_ms": steps}}

    rows = [row(B, 1, [1.0, 1.1, 0.9, 1.0]), row(A, 2, [1.0] * 5),
            row(A, 3, [30.0, 30.0, 30.0])]
    (track,) = history_mod.build({"model": rows}, EXPERIMENTS, draw=False).tracks
    # A's runs' medians 1.0 and 30.0: 15.5, where its eight samples' median is 1.0
    assert track.medians() == [1.0, 15.5]


def test_history_follows_the_users_commits_for_their_code_and_ours_for_cs336syss():
    """An invocation that ran the user's code records their commit on every row, cs336sys's
    naive beside yours-torch too: naive followed the user's commits (a README edit read as
    a step of naive), and a change of cs336sys's own merged into one commit."""
    from cs336sys.report.history import commit_of

    def row(impl, **s):
        return {"git_commit": "ours1", "git_dirty": 0, "user_commit": "theirs1",
                "user_dirty": 1, "_settings": {"impl": impl, **s}}

    assert commit_of(row("yours-torch")) == ("theirs1", True)
    assert commit_of(row("naive")) == ("ours1", False)
    assert commit_of(row(None, size="tiny", model="cs336_basics")) == ("theirs1", True)
    assert commit_of(row("naive", attention="yours-triton")) == ("theirs1", True)


def test_a_point_failed_in_b_shows_as_median_what_the_table_calls_median():
    """`error in B` rows showed A as the median of its runs' means (step_ms_mean: 40.2 where
    the samples' median was 23.1), under a heading of medians."""
    from cs336sys.report.change import Side, metrics
    from cs336sys.report.compare import _failed

    metric = metrics(EXPERIMENTS)["model"]
    steps = [20.0, 21.0, 23.0, 24.0, 100.0, 110.0]  # one run: mean 49.7, median 23.5
    r = {"status": "ok", "step_ms_mean": sum(steps) / 6, "_samples": {"step_ms": steps}}
    side = Side(r)
    side.add(r, metric)
    change = _failed("model", "p", metric, side, {"status": "error", "error": "boom"})
    assert change.a == 23.5 and change.verdict == "error in B"
    side.add({**r, "_samples": {"step_ms": [v + 10 for v in steps]}}, metric)
    assert _failed("model", "p", metric, side, {"status": "error"}).a == 28.5  # of 23.5, 33.5


def test_a_point_that_failed_in_a_and_runs_in_b_is_listed(tmp_path):
    """An OOM in A fixed in B vanished from the comparison (`1 point compared`), while the
    reverse is listed as `error in B`: it is listed, `oom in A`, with B's median."""
    b = Builder(tmp_path / "results.db")
    for inv, commit in (("i-a", A), ("i-b", B)):
        b.invocation(inv, commit, "2026-03-01 10:00:00.000000")
        for run in range(RUNS):
            b.model(inv, f"2026-03-01 10:0{run}:00.000000", "fp32", noisy(100, 10, run))
    b.run("i-a", "model", {"size": "small", "seq": 4096, "batch": 4, "mode": "train",
                           "precision": "fp32", "compile": False, "device": "cuda", "seed": 0},
          {}, None, "2026-03-01 10:09:00.000000")
    b.store.db.execute("UPDATE runs SET status = 'oom', error = 'CUDA out of memory' "
                       "WHERE id = ?", [f"run-{b.n:04d}"])
    b.model("i-b", "2026-03-01 10:09:00.000000", "fp32", [250.0, 251.0, 252.0], context=4096)
    db = b.close()
    out = report(db, tmp_path, "--compare", A[:7], B[:7]).stdout
    line = _table_line(out, "seq=4096")
    assert "oom in A" in line and "251" in line and "CUDA out of memory" in line, line
    assert "2 points compared: 0 faster, 0 slower, 1 unchanged, 1 failed in A, ok in B" in out
    # an ok run whose time came out NaN: said so, not "ok in A"
    from cs336sys.report.change import Side, metrics
    from cs336sys.report.compare import _fixed

    metric = metrics(EXPERIMENTS)["model"]
    side = Side({})
    side.add({"step_ms_mean": 250.0, "_samples": {"step_ms": [250.0]}}, metric)
    nan = _fixed("model", "p", metric, {"status": "ok", "step_ms_mean": float("nan")}, side)
    assert (nan.verdict, nan.how) == ("nan in A", "its step ms came out nan")


def test_compare_by_commit_keeps_a_dirty_checkouts_runs_apart(tmp_path):
    """Runs at commit b with uncommitted changes (a sleep added: 3x slower) pooled with its
    clean runs under b's name. `b` is its clean runs, `b-dirty` the others; a commit with
    dirty runs only is its dirty checkout, named so."""
    b = Builder(tmp_path / "results.db")
    for inv, commit, dirty, center in (("i-a", A, 0, 100), ("i-b", B, 0, 100),
                                       ("i-bd", B, 1, 300), ("i-c", C, 1, 300)):
        b.invocation(inv, commit, "2026-03-01 10:00:00.000000", dirty=dirty)
        for run in range(RUNS):
            b.model(inv, f"2026-03-01 10:0{run}:00.000000", "fp32",
                    noisy(center, 10, 10 * run + len(inv)))
    db = b.close()
    out = report(db, tmp_path, "--compare", A[:7], B[:7]).stdout
    assert "1 unchanged" in out and "x slower" not in out, out
    out = report(db, tmp_path, "--compare", A[:7], B[:7] + "-dirty").stdout
    assert "x slower" in out and f"against {B[:7]}-dirty (B)" in out, out
    result = report(db, tmp_path, "--compare", A[:7], C[:7])
    assert "x slower" in result.stdout and f"{C[:7]}-dirty" in result.stdout, result.stdout
    # C has dirty runs only: `C C-dirty` is them against themselves (a gate that passed)
    result = report(db, tmp_path / "same", "--compare", C[:7], C[:7] + "-dirty")
    assert result.exit_code == 2 and "select the same runs" in result.stderr, result.output
    # two spellings of one checkout (prefixes of two lengths, no git repository to resolve
    # them by) selected the same runs and read `unchanged`, a gate that passed
    for pair in ((C[:7], C[:8] + "-dirty"), (A[:7], A[:9])):
        result = report(db, tmp_path / "same", "--compare", *pair)
        assert result.exit_code == 2 and "select the same runs" in result.stderr, result.output
    # A was measured clean only: its dirty checkout has no run, and no other filter was given
    result = report(db, tmp_path / "same", "--compare", A[:7] + "-dirty", B[:7])
    assert result.exit_code == 2 and "every run of its commit was of a clean checkout" \
        in result.stderr, result.output


def test_history_calls_no_step_between_two_machines_and_names_a_library_change():
    """Commits measured on two CPU machines (every CPU is GPU `cpu`, a store merged from a
    laptop): a 25x step was the code's, with no word of the machine. It is no step; a torch
    upgrade between commits on one machine stays one, the library named beside it."""
    def row(commit, day, center, seed):
        steps = noisy(center, 8, seed)
        s = {"size": "small", "precision": "fp32"}
        return {"status": "ok", "git_commit": commit, "git_dirty": 0, "gpu": "cpu",
                "invocation_id": f"inv-{commit[:2]}", "created": f"2026-04-0{day} 00:00:00",
                "_settings": s, "step_ms_mean": sum(steps) / len(steps),
                "_samples": {"step_ms": steps}}

    rows = [row(commit, day, center, 10 * day + run)
            for commit, day, center in ((B, 1, 100), (A, 2, 25)) for run in range(RUNS)]
    vm = {"host": "vm", "cpu": "Xeon", "torch_version": "2.13.0"}
    machines = {"inv-b2": vm, "inv-a1": {**vm, "host": "laptop", "cpu": "Apple M2 Pro"}}
    h = history_mod.build({"model": rows}, EXPERIMENTS, draw=False, invocations=machines)
    (track,) = h.tracks
    assert track.steps == [] and "1 regression" not in h.summary()
    assert any(line.startswith("Another machine: 1 difference") and "host: A vm, B laptop"
               in line for line in h.caveat), h.caveat
    machines["inv-a1"] = {**vm, "torch_version": "2.14.0"}
    h = history_mod.build({"model": rows}, EXPERIMENTS, draw=False, invocations=machines)
    ((_, change),) = h.tracks[0].steps
    assert change.verdict.endswith("x faster (torch_version changed too)")
    assert change.kind == "improvement" and not h.caveat
    # one GPU model on two hosts (a lent GPU's host is new each session): still a step
    gpu_rows = [{**r, "gpu": H100} for r in rows]
    machines["inv-a1"] = {**vm, "host": "node-7"}
    h = history_mod.build({"model": gpu_rows}, EXPERIMENTS, draw=False, invocations=machines)
    ((_, change),) = h.tracks[0].steps
    assert change.verdict.endswith("x faster (host changed too)") and not h.caveat


def test_reruns_make_the_runs_the_unit_so_run_to_run_drift_is_noise(tmp_path):
    """Four runs a side of the same code whose levels drift from run to run (as on a shared
    VM: each run's steps tight, the runs 10 % apart): pooled samples would call it, the
    runs' medians do not. A real 30 % step over four runs a side is still found."""
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    levels_a, levels_b = (100, 112, 104, 108), (110, 101, 113, 106)  # interleaved: same code
    for i, (la, lb) in enumerate(zip(levels_a, levels_b, strict=True)):
        b.model("inv-a", f"2026-02-01 10:{i:02d}:00.000000", "fp32", noisy(la, 10, i, 0.005))
        b.model("inv-b", f"2026-02-02 10:{i:02d}:00.000000", "fp32", noisy(lb, 10, 50 + i, 0.005))
        b.model("inv-a", f"2026-02-01 11:{i:02d}:00.000000", "bf16", noisy(la / 2, 10, 9 + i, 0.005))
        b.model("inv-b", f"2026-02-02 11:{i:02d}:00.000000", "bf16",
                noisy(1.3 * lb / 2, 10, 90 + i, 0.005))
    result = report(b.close(), tmp_path / "out", "--compare", A[:6], B[:6], "--format", "md")
    assert result.exit_code == 0, result.output
    fp32 = _table_line(result.stdout, "precision=fp32")
    assert "unchanged" in fp32 and "(4 vs 4 runs)" in fp32
    bf16 = _table_line(result.stdout, "precision=bf16")
    assert re.search(r"1\.\d\dx slower\s+p=0\.029 \(4 vs 4 runs\)", bf16)  # 4 vs 4: p = 2/70
    assert "One run a side" not in result.stdout  # the runs were the unit


def test_one_run_a_side_decides_no_change(tmp_path):
    """Two runs of the same command on a shared CPU, one a side, read `1.14x slower p=0.020`
    and `50.57x slower p=0.001`: the pooled samples of one run cannot see the drift between
    runs, and half the points of such pairs were called a change, failing the CI gate. A
    difference beyond the threshold on one run a side is undecided, said so and why, and
    fails no gate; one within the threshold is unchanged."""
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    b.model("inv-a", "2026-02-01 10:01:00.000000", "fp32", noisy(100, 10, 1))
    b.model("inv-b", "2026-02-02 10:01:00.000000", "fp32", noisy(130, 10, 2))
    b.model("inv-a", "2026-02-01 10:02:00.000000", "bf16", noisy(50, 10, 3))
    b.model("inv-b", "2026-02-02 10:02:00.000000", "bf16", noisy(50.5, 10, 4))
    result = report(b.close(), tmp_path / "out", "--compare", A[:6], B[:6],
                    "--fail-on-regression", "10", "--format", "md")
    assert result.exit_code == 0, result.output  # no regression decided: nothing fails
    fp32 = _table_line(result.stdout, "precision=fp32")
    assert re.search(r"1\.\d+\s+one run a side\s+p<0\.001 \(1 vs 1 run\)$", fp32), fp32
    assert "unchanged" in _table_line(result.stdout, "precision=bf16")
    assert ("2 points compared: 0 faster, 0 slower, 1 unchanged, 1 undecided (one run a side)"
            in result.stdout)
    said = " ".join(result.stdout.split())
    assert "One run a side: the samples of one run see the scatter within it" in said
    assert "Run each side 4 times or more" in said
    assert "One run a side: the samples of one run" in (tmp_path / "out" / "report.md").read_text()


def test_a_change_past_the_threshold_is_decided_both_ways_alike():
    """A large difference the test cannot call read `unchanged` (1.50x, p=0.17); and the
    threshold took |B/A - 1|, so 1.051x slower counted and 1.051x faster (B/A 0.951) not;
    the gate took the unrounded factor, failing `1.12x slower` at 12 %."""
    from cs336sys.report.change import Metric, Side, assess

    assert judge([100.0] * 5, [105.1] * 5, tested=False).outcome == "up"
    assert judge([100.0] * 5, [95.1] * 5, tested=False).outcome == "down"  # 1.0515x
    metric = Metric("step_ms", "step ms", "step_ms_mean", "ms", timed=True)

    def side(runs):
        s = Side({"_settings": {}})
        s.samples, s.runs = [v for r in runs for v in (r, r)], list(runs)
        return s

    wide = assess("model", "p", metric, side([100, 60, 140, 100]), side([150, 90, 210, 150]))
    assert wide.kind == "undecided" and wide.verdict == "not significant", wide
    twelve = assess("model", "p", metric, side([100, 100.5, 99.5, 100.2]),
                    side([112.4, 112.9, 111.9, 112.6]))
    assert twelve.verdict == "1.12x slower" and twelve.percent == 12  # not 12.000000000000011
    # n A/B says what it counts: four runs a side here, eight samples of one run a side there
    # (the column read 4/4 and 5/5 alike)
    assert (twelve.n_a, twelve.n_b, twelve.n_of) == (4, 4, "runs")
    one = Side({"_settings": {}})
    one.samples, one.runs = [100.0, 101.0, 99.0, 100.5, 99.5], [100.0]
    other = Side({"_settings": {}})
    other.samples, other.runs = [120.0, 121.0, 119.0, 120.5, 119.5], [120.0]
    once = assess("model", "p", metric, one, other)
    assert (once.n_a, once.n_b, once.n_of) == (5, 5, "samples")


@pytest.mark.parametrize("status, error", [
    ("oom", "oom: CUDA out of memory. Tried to allocate 2.00 GiB"),
    ("wrong", "wrong: max err 0.5 above 1e-3"),
    ("error", "error: cs336_systems/ddp.py:12: RuntimeError: boom")])
def test_a_point_that_failed_in_b_is_a_regression_the_gate_sees(tmp_path, status, error):
    """A point ok in A whose latest run in B ran out of memory (or was wrong, or raised) was
    left out: `1 point compared: 1 unchanged`, exit 0 under --fail-on-regression. It is
    listed as failed in B, with why, and fails the gate; an older ok run in B does not hide
    it."""
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    for run in range(RUNS):
        for precision, t in (("fp32", 1), ("bf16", 2)):
            b.model("inv-a", f"2026-02-01 10:{t}{run}:00.000000", precision, noisy(100, 10, run))
    for run in range(RUNS):
        b.model("inv-b", f"2026-02-02 10:2{run}:00.000000", "bf16", noisy(100, 10, 10 + run))
    b.model("inv-b", "2026-02-02 10:10:00.000000", "fp32", noisy(100, 10, 20))  # ok, then
    s = {"size": "small", "seq": 128, "batch": 4, "mode": "train", "precision": "fp32",
         "compile": False, "device": "cuda", "seed": 0}
    b.store.db["runs"].insert({
        "id": "run-oom", "invocation_id": "inv-b", "experiment": "model", "status": status,
        "settings": json.dumps(s), "metrics": "{}", "samples": None,
        "error": error,
        "created": "2026-02-02 10:30:00.000000", "started": "2026-02-02 10:30:00.000000",
        "duration_s": 1.0, "point_key": "k"})
    # a point SIGTERM stopped in B measured nothing: its earlier ok run is compared
    from cs336sys.sweep.stopping import TERMINATED

    stopped = {**s, "precision": "bf16"}
    b.store.db["runs"].insert({
        "id": "run-term", "invocation_id": "inv-b", "experiment": "model", "status": "error",
        "settings": json.dumps(stopped), "metrics": "{}", "samples": None,
        "error": f"{TERMINATED} (SIGTERM)", "created": "2026-02-02 10:40:00.000000",
        "started": "2026-02-02 10:40:00.000000", "duration_s": 1.0, "point_key": "t"})
    result = report(b.close(), tmp_path / "out", "--compare", A[:6], B[:6],
                    "--fail-on-regression", "10", "--format", "html,md")
    assert result.exit_code == 1, result.output
    line = _table_line(result.stdout, "precision=fp32")
    assert f"{status} in B" in line and error.split(": ", 1)[1][:20] in line, line
    assert "nan" not in line
    assert "unchanged" in _table_line(result.stdout, "precision=bf16")
    assert "2 points compared: 0 faster, 0 slower, 1 unchanged, 1 failed in B" in result.stdout
    assert "Regression: 1 point worse than 10%" in result.stderr
    assert f'<td class="worse">{status} in B</td>' in (tmp_path / "out" / "report.html").read_text()


def test_a_history_whose_latest_commit_failed_a_point_fails_the_gate(tmp_path):
    """Every point of the newest commit out of memory: `0 points measured at two commits or
    more`, exit 0 under --fail-on-regression, as if nothing had happened. The point is named
    as failed at that commit, and the gate fails."""
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    for run in range(RUNS):
        b.model("inv-a", f"2026-02-01 10:0{run}:00.000000", "fp32", noisy(100, 10, run))
    s = {"size": "small", "seq": 128, "batch": 4, "mode": "train", "precision": "fp32",
         "compile": False, "device": "cuda", "seed": 0}
    b.store.db["runs"].insert({
        "id": "run-oom", "invocation_id": "inv-b", "experiment": "model", "status": "oom",
        "settings": json.dumps(s), "metrics": "{}", "samples": None,
        "error": "oom: CUDA out of memory", "created": "2026-02-02 10:30:00.000000",
        "started": "2026-02-02 10:30:00.000000", "duration_s": 1.0, "point_key": "k"})
    result = report(b.close(), tmp_path / "out", "--history", "--experiment", "model",
                    "--fail-on-regression", "10", "--format", "md")
    assert result.exit_code == 1, result.output
    assert "1 point failed at the latest commit" in result.stdout
    assert "Failed: model " in result.stdout and f"oom at {B[:7]}" in result.stdout
    assert f"oom at {B[:7]}" in result.stderr
    assert "Failed at the latest commit: model " in (tmp_path / "out" / "report.md").read_text()


def test_two_runs_a_side_are_too_few_runs_to_tell(tmp_path):
    b = Builder(tmp_path / "results.db")
    b.invocation("inv-a", A, "2026-02-01 10:00:00.000000")
    b.invocation("inv-b", B, "2026-02-02 10:00:00.000000")
    for i in range(2):
        b.model("inv-a", f"2026-02-01 10:{i:02d}:00.000000", "fp32", noisy(100, 10, i))
        b.model("inv-b", f"2026-02-02 10:{i:02d}:00.000000", "fp32", noisy(150, 10, 9 + i))
    result = report(b.close(), tmp_path / "out", "--compare", A[:6], B[:6], "--format", "md")
    assert "too few runs to tell" in _table_line(result.stdout, "step ms")


@pytest.mark.slow
def test_threshold_sets_the_smallest_change_that_counts(regress_db, tmp_path):
    # the fixture's fp32 step is 1.30x slower: a change at 5 % and at 25 %, not at 40 %
    for pct, word in (("5", "slower"), ("25", "slower"), ("40", "unchanged")):
        result = report(regress_db, tmp_path / pct, "--compare", "a1a1", "b2b2",
                        "--threshold", pct, "--format", "md")
        assert result.exit_code == 0, result.output
        line = next(ln for ln in result.stdout.splitlines()
                    if "precision=fp32" in ln and "step ms" in ln)
        assert word in line, (pct, line)
    md = (tmp_path / "40" / "report.md").read_text()
    assert "more than 40%" in md
    bad = report(regress_db, tmp_path / "bad", "--compare", "a1a1", "b2b2", "--threshold", "-1")
    assert bad.exit_code == 2 and "--threshold" in bad.stderr and not (tmp_path / "bad").exists()


def test_a_label_that_is_also_an_id_prefix_compares_by_label():
    """Labels "a" and "b" are also prefixes of hex invocation ids and commits; the exact
    label wins (a fresh-clone CI run once compared "by invocation" this way)."""
    import sqlite3

    from cs336sys.report.compare_sides import resolve

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE invocations (id TEXT, git_commit TEXT, user_commit TEXT, "
                 "label TEXT, gpu TEXT)")  # the columns resolve reads, as every store has them
    conn.executemany("INSERT INTO invocations VALUES (?, ?, NULL, ?, ?)",
                     [("a1f0", "b2e1", "a", "cpu"), ("b7c3", "a9d2", "b", "cpu")])
    assert resolve(conn, "a", "b") == ("label", "a", "b")
    assert resolve(conn, "a1", "b7") == ("invocation", "a1", "b7")
    assert resolve(conn, "b2", "a9") == ("commit", "b2", "a9")


def test_a_prefix_of_two_invocations_or_commits_is_refused_naming_them():
    """Labels `A` and `B` typed as `a` and `b`: `a` began two invocation ids (an attention
    and a model run) and both were pooled into side A, unsaid. A prefix that names two is
    refused, as git refuses an ambiguous short hash, with the label as stored."""
    import sqlite3

    from cs336sys.report.compare_sides import resolve
    from cs336sys.report.select import SelectionError

    conn = sqlite3.connect(":memory:")
    conn.execute("CREATE TABLE invocations (id TEXT, git_commit TEXT, user_commit TEXT, "
                 "label TEXT, gpu TEXT)")
    conn.executemany("INSERT INTO invocations VALUES (?, ?, NULL, ?, ?)",
                     [("aeb5e85e", "c0c0", "A", "cpu"), ("a551b2c0", "c0c0", "A", "cpu"),
                      ("b7c3d2e1", "d1d1", "B", "cpu"), ("f0f0f0f0", "d1e2", None, "cpu")])
    with pytest.raises(SelectionError, match=r"^--compare: 'a' is the start of 2 invocations "
                       r"\(a551b2c0, aeb5e85e\); give more of it, or the label as stored "
                       r"\('A': labels match exactly\)$"):
        resolve(conn, "a", "b")
    with pytest.raises(SelectionError, match=r"^--compare: 'd1' is the start of 2 commits "
                       r"\(d1d1, d1e2\); give more of it$"):
        resolve(conn, "c0", "d1")
    assert resolve(conn, "A", "B") == ("label", "A", "B")
    assert resolve(conn, "aeb", "b7") == ("invocation", "aeb", "b7")
    assert resolve(conn, "c0", "d1d") == ("commit", "c0", "d1d")  # one commit, two runs
    # `B` (upper case) read as the invocation `b7c3...` too (LIKE ignores case), and `b B`
    # was refused as two sides that select the same runs
    with pytest.raises(SelectionError, match=r"^--compare: 'b' is an invocation but 'B' is a "
                       r"label; labels match exactly: as stored, 'B'$"):
        resolve(conn, "b", "B")


@pytest.mark.slow
def test_history_fails_on_a_regression_only_at_the_last_step(history_db, tmp_path):
    # up at the third commit, down again at the fifth: the latest step is an improvement
    result = report(history_db, tmp_path / "all", "--history", "--experiment", "model",
                    "--fail-on-regression", "5")
    assert result.exit_code == 0, result.output
    # up to the third commit, the rise is the latest step: CI fails, naming the commit
    result = report(history_db, tmp_path / "third", "--history", "--experiment", "model",
                    "--until", "2026-03-03", "--fail-on-regression", "5")
    assert result.exit_code == 1, result.output
    assert "Regression: 1 point worse than 5%: model precision=fp32" in result.stderr
    assert "slower at d4d4d4d" in result.stderr
    assert (tmp_path / "third" / "report.html").exists()  # written before it fails
    # a threshold above the rise lets it pass
    result = report(history_db, tmp_path / "high", "--history", "--experiment", "model",
                    "--until", "2026-03-03", "--fail-on-regression", "50")
    assert result.exit_code == 0, result.output


def test_history_orders_hundreds_of_commits_at_once():
    """The order is a topological sort by first-run time: re-scanning every commit for each
    place took 5 s for 400 commits (a report of 800 took 50 s)."""
    import time

    n = 400
    first = {(f"{i:040x}", False): f"2026-01-01 00:00:{i:06d}" for i in range(n)}
    chain = {f"{i:040x}": {f"{j:040x}" for j in range(i + 1, n)} for i in range(n)}  # newest first
    started = time.monotonic()
    rank = history_mod.ranked(first, chain)
    assert time.monotonic() - started < 1.0
    assert [k[0] for k in sorted(rank, key=rank.get)] == [f"{i:040x}" for i in reversed(range(n))]


def test_a_compared_metric_that_came_out_nan_or_inf_is_no_measurement():
    """A metric stored as NaN or inf (kept apart by the store, read back by the report) was
    compared: `nan nan nanx faster`, and a regression's gate passed."""
    from cs336sys.report.change import aggregate, metrics

    metric = metrics(EXPERIMENTS)["model"]

    def row(value):
        return {"status": "ok", "gpu": H100, "created": "2026-05-01 00:00:00.000000",
                "_settings": {"size": "small"}, metric.column: value, "_samples": {}}

    assert aggregate([row(float("nan")), row(float("inf"))], metric) == {}
    (side,) = aggregate([row(float("nan")), row(12.0)], metric).values()
    assert side.values == [12.0]
    # NaN at B, after ok runs at A: listed as failed in B (it left the point out unseen, the
    # gate passing), and so at the latest commit of a history
    from cs336sys.report.change import failed_in_b

    a = [row(10.0 + i / 10) for i in range(4)]
    (b,) = failed_in_b(a, [row(float("nan"))], metric).values()
    assert b[metric.column] != b[metric.column]
    from cs336sys.report.compare import _failed

    (side,) = aggregate(a, metric).values()
    change = _failed("model", "size=small", metric, side, b)
    assert (change.verdict, change.how) == ("nan in B", f"its {metric.label} came out nan")
    h = history_mod.build({"model": [dict(r, git_commit=c, git_dirty=0) for c, r in
                                     (("a" * 40, a[0]), ("a" * 40, a[1]), ("b" * 40, row(11.0)),
                                      ("c" * 40, dict(row(float("nan")),
                                                      created="2026-05-02 00:00:00.000000")))]},
                          EXPERIMENTS, draw=False)
    assert [status for *_, status in h.failed] == [f"{metric.label} nan"]


def test_history_names_each_commit_by_its_subject_and_date(tmp_path, monkeypatch):
    """Commits of the repository the report runs in are labelled `abc1234 (date: subject)`
    in the step table and on the plot's axis; others keep their bare hash."""
    import subprocess

    repo = tmp_path / "repo"
    repo.mkdir()
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t", "GIT_COMMITTER_DATE": "2026-05-04T12:00:00Z",
           "GIT_AUTHOR_DATE": "2026-05-04T12:00:00Z"}
    for k, v in env.items():
        monkeypatch.setenv(k, v)

    def git(*args):
        return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True,
                              text=True).stdout.strip()

    git("init", "-q")
    hashes = []
    for subject in ("Plain step", "Fuse the LM head and the cross-entropy in one kernel"):
        git("commit", "-q", "--allow-empty", "-m", subject)
        hashes.append(git("rev-parse", "HEAD"))
    monkeypatch.chdir(repo)

    def row(commit, day, center, seed):
        steps = noisy(center, 8, seed)
        return {"status": "ok", "git_commit": commit, "git_dirty": 0, "gpu": H100,
                "created": f"2026-05-0{day} 00:00:00.000000",
                "_settings": {"size": "small", "precision": "fp32"},
                "step_ms_mean": sum(steps) / len(steps), "_samples": {"step_ms": steps}}

    def history(*measured):
        """The history of (commit, day, median) runs, RUNS runs each."""
        return history_mod.build({"model": [row(commit, day, center, 10 * day + run)
                                            for commit, day, center in measured
                                            for run in range(RUNS)]}, EXPERIMENTS, draw=False)

    h = history((hashes[0], 1, 100), (hashes[1], 2, 150), (C, 3, 150))
    (track,) = h.tracks
    first, second, other = track.commits
    assert (first.date, first.subject) == ("2026-05-04", "Plain step")
    assert second.title() == f"{hashes[1][:7]} (2026-05-04: Fuse the LM head and the cross-entropy …)"
    assert other.title() == C[:7] and other.subject == ""  # not a commit of this repository
    assert f"→ {second.title()}" in h.text()
    assert history_mod._tick(first) == f"{hashes[0][:7]} 05-04\nPlain step"

    # the child measured first, its parent after (a bisection, a base measured last): the
    # parent comes first, or a regression read as an improvement and passed the gate
    h = history((hashes[1], 1, 150), (hashes[0], 2, 100), (C, 3, 150))
    (track,) = h.tracks
    assert [c.key[0] for c in track.commits] == [hashes[0], hashes[1], C]
    assert [c.verdict[-6:] for _, c in track.steps] == ["slower"]
    # a side branch off the first commit, measured before the main line's head: commits
    # apart keep the time order (git's order between them is none), so the head stays last
    git("checkout", "-q", "-b", "side", hashes[0])
    git("commit", "-q", "--allow-empty", "-m", "Side1")  # one git lists after the head
    side = git("rev-parse", "HEAD")
    h = history((hashes[0], 1, 100), (side, 2, 100), (hashes[1], 3, 150))
    (track,) = h.tracks
    assert [c.key[0] for c in track.commits] == [hashes[0], side, hashes[1]]
    assert [(i, c.verdict[-6:]) for i, c in track.steps] == [(2, "slower")]
    assert track.before == [0, 0, 0]  # each compared with where it branched off
    # the side branch measured after the head: it is compared with the base, not with the
    # head, and the head's regression still fails the gate (it was the step before the last)
    h = history((hashes[0], 1, 100), (hashes[1], 2, 150), (side, 3, 100))
    (track,) = h.tracks
    assert [c.key[0] for c in track.commits] == [hashes[0], hashes[1], side]
    assert [(i, c.verdict[-6:]) for i, c in track.steps] == [(1, "slower")]
    assert [i for _, i, _ in h.latest_regressions(10)] == [1]
    assert f"{hashes[0][:7]} → {hashes[1][:7]}" in h.text()


def test_the_compare_report_draws_every_sample_of_both_sides(regress_db, tmp_path):
    """Per experiment a strip plot: each compared point's samples on side A and on side B,
    exactly the stored ones (the report's tables give only their medians)."""
    from cs336sys.report.compare import compare
    from cs336sys.report.select import Selection
    from cs336sys.store.db import connect_readonly

    conn = connect_readonly(regress_db)
    try:
        cmp = compare(conn, Selection(), "a1a1", "b2b2", EXPERIMENTS)
        stored: dict[str, list[float]] = {}
        for sha, samples in conn.execute(
                "SELECT i.git_commit, r.samples FROM runs r JOIN invocations i ON i.id = "
                "r.invocation_id WHERE r.experiment = 'model' AND r.status = 'ok'"):
            stored.setdefault(sha, []).extend(json.loads(samples or "{}").get("step_ms", []))
    finally:
        conn.close()
    (model_fig,) = [f for f in cmp.figures if f.name == "compare-model"]
    strips = model_fig.plot.points
    assert len(strips) == len([c for c in cmp.changes if c.experiment == "model"])
    every_a = sorted(v for _, a, _ in strips for v in a)
    every_b = sorted(v for _, _, b in strips for v in b)
    # every model point ran on both sides: A's strips hold all of A's stored samples
    assert every_a == sorted(stored[A]) and every_b == sorted(stored[B])
    # the bars mark the table's figures, the medians of the runs' medians: the pooled
    # samples' medians put a bar at 619 ms where the table read 876
    found = [c for c in cmp.changes if c.experiment == "model"]
    assert model_fig.plot.bars == tuple((c.a, c.b) for c in found[:len(strips)])
    pooled = [(statistics.median(a), statistics.median(b)) for _, a, b in strips]
    assert pooled != list(model_fig.plot.bars)  # RUNS runs a side: not the same figure
    assert len(every_a) == 3 * 10 * RUNS + 3  # three points of 10 steps a run, one of 3
    result = report(regress_db, tmp_path, "--compare", "a1a1", "b2b2", "--format", "md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report.md").read_text()
    images = re.findall(r"!\[(model: [^\]]*every sample[^\]]*)\]\((report_files/[^)]+)\)", md)
    assert images and (tmp_path / images[0][1]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
