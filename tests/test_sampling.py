"""How many samples a point takes, its drift, and the interval of a ratio (measure/sampling.py),
with a fake clock and a fake do_bench; and how tables show them."""

from __future__ import annotations

import math
import re
import statistics
import sys
import types
from dataclasses import dataclass, replace

import pytest

from cs336sys.measure import timing
from cs336sys.measure.sampling import Enough, drift, ratio_interval, verdict
from cs336sys.report.intervals import NOT_INTERLEAVED_NOTE, RUNS_APART_NOTE, speedups
from cs336sys.report.tables import _ratios, point_table
from cs336sys.sweep.declaration import Experiment, Ratio
from cs336sys.sweep.result import Result
from cs336sys.sweep.runner import run_sweep


class FakeClock:
    """perf_counter that moves `call_s` at each read that ends a call: time_loop reads it
    three times a call (start, return, end), so a call takes `step_s`."""

    def __init__(self, call_s: float) -> None:
        self.t, self.reads, self.call_s = 0.0, 0, call_s

    def __call__(self) -> float:
        self.reads += 1
        if self.reads % 3 == 0:  # the end of a call
            self.t += self.call_s
        return self.t


def test_enough_needs_the_count_and_the_time_and_stops_at_the_cap():
    enough = Enough(min_count=10, min_seconds=1.0, max_count=50)
    assert not enough([200.0] * 9)  # 1.8 s but 9 samples
    assert not enough([20.0] * 10)  # 10 samples but 0.2 s
    assert enough([100.0] * 10)
    assert enough([1.0] * 50)  # the cap wins over the time


def test_time_loop_keeps_sampling_until_the_minimum_time():
    clock = FakeClock(0.0625)  # 62.5 ms a call (exact in binary)
    samples = timing.time_loop(lambda: None, 2, 5, "cpu", min_seconds=1.0, clock=clock)
    assert samples == [62.5] * 16  # 5 asked, 1 s needs 16
    assert len(timing.time_loop(lambda: None, 0, 5, "cpu", clock=FakeClock(0.0625))) == 5
    # a call of 1 us would need a million samples for 1 s: the cap
    fast = timing.time_loop(lambda: None, 0, 5, "cpu", min_seconds=1.0, clock=FakeClock(1e-6))
    assert len(fast) == timing.MAX_SAMPLES


def test_do_bench_is_asked_again_until_it_gives_enough_samples(monkeypatch):
    calls = []

    def do_bench(fn, grad_to_none=None, return_mode=None, **budget):
        calls.append(budget)
        return [50.0, 51.0, 52.0]  # three samples a call: what it chose

    monkeypatch.setitem(sys.modules, "triton.testing", types.SimpleNamespace(do_bench=do_bench))
    got = timing.time_do_bench(lambda: None, min_count=10, min_seconds=0.0)
    assert len(got) == 12 and len(calls) == 4  # every sample kept, none invented
    got = timing.time_do_bench(lambda: None, min_count=1, min_seconds=1.0)
    assert sum(got) >= 1000 and calls[-1]["rep"] == 1000.0  # asked for 1 s of repetitions


def test_drift_compares_the_last_third_with_the_first():
    assert drift([10, 10, 10, 10, 10, 10]) == 0
    assert drift([10, 10, 10.5, 10.5, 11, 11]) == pytest.approx(0.1)
    assert drift([1, 2, 3, 4, 5]) is None  # too few to split


def test_a_ratio_is_called_only_when_its_interval_excludes_one():
    a = [100.0 + i % 5 for i in range(30)]
    clearly = ratio_interval(a, [80.0 + i % 5 for i in range(30)])
    assert clearly.ratio == pytest.approx(82 / 102) and clearly.high < 1
    assert verdict(clearly) == "faster"
    # the H200's xl ablation (reports/nvidia-h200): `none` against `flash`, and `compile`
    none = [189.3, 271.5, 212.9, 269.7]
    noisy = ratio_interval(none, [250.6, 230.0, 255.0, 212.0])
    assert noisy.low < 1 < noisy.high and verdict(noisy) == "no difference"
    assert verdict(ratio_interval(none, [104.9, 121.7, 107.5, 133.4, 104.8, 105.0])) == "faster"
    assert verdict(ratio_interval([10.0] * 5, [12.0] * 5)) == "slower"
    assert ratio_interval([], [1.0]) is None and verdict(None) == ""
    assert ratio_interval(a, [80.0] * 3) == ratio_interval(a, [80.0] * 3)  # deterministic


def _row(switches, samples, opt_ms=None, rounds=2):
    median = sorted(samples)[len(samples) // 2]
    return {"status": "ok", "gpu": None, "switches": switches, "step_ms_median": median,
            "opt_ms_median": opt_ms,
            "_settings": {"switches": switches, "size": "xl", "rounds": rounds},
            "_samples": {"step_ms": samples}}


def test_the_ratio_cell_gives_the_interval_and_flags_an_impossible_saving():
    from cs336sys.experiments.step import TABLE

    ratio = next(c.ratio for c in TABLE.columns if c.ratio is not None)
    none = _row("none", [100.0, 101.0, 99.0, 100.5, 100.2, 99.8], opt_ms=5.0)
    adamw = _row("fused-adamw", [90.0, 91.0, 89.0, 90.5, 90.2, 89.8])
    ce = _row("fused-ce", [99.0, 101.5, 100.0, 98.5, 101.0, 100.2])
    cells = _ratios(ratio, [none, adamw, ce])
    assert cells[0] == "1.00×"
    assert cells[1].startswith("1.11× faster (") and "IMPOSSIBLE: saves 10 ms, the optimizer " \
        "step takes 5 ms" in cells[1]
    assert cells[2].startswith("1.00× no difference (")
    # without raw samples (rows stored before): the ratio alone, as before
    plain = _ratios(Ratio(lambda r: r.get("step_ms_median"), {"switches": "none"}, ("switches",)),
                    [none, adamw])
    assert plain == ["1.00×", "1.11×"]
    # three steps a side, CPU's default: no test can tell, and the cell says so rather than
    # stand as a bare ratio read as a change
    few = _ratios(ratio, [_row("none", [2516.0, 1010.0, 4022.0]),
                          _row("fused-ce", [2734.0, 1251.0, 4217.0])])
    assert few[1] == "0.92× (too few samples to tell)"
    # four a side: a bootstrap of the medians calls 8 % of equal pairs a change (5 a side: 3.5 %;
    # benchmarks/bootstrap_false_rate.py)
    four = _ratios(ratio, [_row("none", [100.0, 101.0, 99.0, 100.5]),
                           _row("fused-ce", [80.0, 81.0, 79.0, 80.5])])
    assert four[1] == "1.25× (too few samples to tell)"


def test_too_few_samples_still_say_the_sides_came_from_different_commands():
    """fp32 from a later command against bf16 from the first read "4.53x (too few samples
    to tell)" where, in the command that ran both, fp32 was the faster: with too few
    samples the cell did not say its sides were runs apart, nor its note why."""
    from cs336sys.report.intervals import RUNS_APART, TOO_FEW, sample_interval

    few = [{"invocation_id": i, "_settings": {"precision": p}, "_samples": {"step_ms": s}}
           for i, p, s in (("x", "fp32", [1125.0, 1130.0]), ("y", "bf16", [249.0, 250.0]))]
    assert sample_interval("step_ms", *few, True) == f" ({TOO_FEW}; {RUNS_APART})"
    same = [{**r, "invocation_id": "x"} for r in few]
    assert sample_interval("step_ms", *same, True) == f" ({TOO_FEW})"


def test_points_run_one_after_the_other_get_no_verdict():
    """Two points of one command that ran one after the other, in an experiment that has no
    rounds at all (ddp: torch's DDP against itself read 0.64x and 1.34x "faster"/"slower") or
    with one round: the interval, no verdict."""
    from cs336sys.report.intervals import NOT_INTERLEAVED, sample_interval

    a = [100.0, 101.0, 99.0, 100.5, 100.2, 99.8]
    b = [90.0, 91.0, 89.0, 90.5, 90.2, 89.8]
    ddp = [{"invocation_id": "x", "_settings": {"impl": i}, "_samples": {"step_ms": s}}
           for i, s in (("torch", a), ("yours", b))]
    said = sample_interval("step_ms", *ddp, True)
    assert NOT_INTERLEAVED in said and "faster" not in said
    one_round = [_row("none", a, rounds=1), _row("fused-adamw", b, rounds=1)]
    assert NOT_INTERLEAVED in sample_interval("step_ms", *one_round, True)
    assert sample_interval("step_ms", _row("none", a), _row("fused-adamw", b), True
                           ).startswith(" faster (")


@dataclass(frozen=True)
class Toy:
    name: str
    iters: int
    rounds: int
    fails_in_round: int | None = None

    def settings(self):
        return {"name": self.name}


def test_points_in_rounds_run_interleaved_and_are_merged():
    """Round 1 of every point, then round 2 in reverse order, then round 3 as the first:
    drift, and what a point's place in a round does to it, fall on every point alike. A
    round that is not ok ends its point's rounds and is its result."""
    order, rounds_run = [], {}

    def run(spec):
        order.append(spec.name)
        rounds_run[spec.name] = rounds_run.get(spec.name, 0) + 1
        if rounds_run[spec.name] == spec.fails_in_round:
            return Result("oom", error="out of memory")
        return Result("ok", samples={"t": [float(len(order))] * spec.iters})

    def merge(spec, results):
        return Result("ok", metrics={"rounds": len(results)},
                      samples={"t": [x for r in results for x in r.samples["t"]]})

    toy = Experiment(kind="toy", title="toy", spec=Toy, run=run, metrics=(), merge=merge,
                     split=lambda s: [replace(s, iters=s.iters // s.rounds)] * s.rounds)
    points = run_sweep(toy, [Toy("a", 6, 3), Toy("b", 6, 3), Toy("c", 2, 1), Toy("d", 6, 3, 2)])
    assert order == ["a", "b", "c", "d", "d", "b", "a", "a", "b"]
    got = {p.spec.name: p.result for p in points}
    assert got["a"].samples["t"] == [1.0, 1.0, 7.0, 7.0, 8.0, 8.0] and got["a"].metrics["rounds"] == 3
    assert got["c"].metrics["rounds"] == 1
    assert got["d"].status == "oom" and "d" not in order[5:]  # its oom ended its rounds
    assert [p.spec.name for p in points] == ["c", "d", "a", "b"]  # each stored once, when done


@pytest.mark.parametrize("stop", [KeyboardInterrupt, "sigterm"])
def test_a_signal_keeps_the_rounds_done_as_errors_resume_measures_again(stop):
    """Ctrl-C in a sweep of rounds threw every finished round away (0 points stored: only
    SIGTERM was caught); SIGTERM stored a point with one round of three `ok`, which --resume
    then skipped. Each point with rounds done is stored with its samples, as an error that
    says how many rounds ran; under SIGTERM the point it stopped, with none, too."""
    from cs336sys.report.sections import stopped
    from cs336sys.sweep import rounds as in_rounds
    from cs336sys.sweep.stopping import INTERRUPTED, TERMINATED, Terminated

    stop = Terminated(f"{TERMINATED} 15 (SIGTERM)") if stop == "sigterm" else stop()
    order, emitted = [], []

    def run(spec):
        order.append(spec.name)
        if len(order) == 6:  # round 2 of c, after d's (round 2 runs in reverse)
            raise stop
        return Result("ok", samples={"t": [1.0] * spec.iters})

    toy = Experiment(kind="toy", title="toy", spec=Toy, run=run, metrics=(),
                     merge=lambda spec, results: in_rounds.merged(
                         results, "ok", {}, in_rounds.joined(results)),
                     split=lambda s: [replace(s, iters=s.iters // s.rounds)] * s.rounds)
    from cs336sys.sweep.runner import in_rounds as runner

    with pytest.raises(type(stop)):
        runner(toy, [Toy("a", 6, 3), Toy("b", 6, 3), Toy("c", 6, 3), Toy("d", 6, 3)],
               lambda spec: None, lambda spec, result: emitted.append((spec.name, result)))
    got = {name: r for name, r in emitted}
    assert sorted(got) == ["a", "b", "c", "d"]  # c stopped in its second round
    assert [got[n].metrics["rounds_done"] for n in "abcd"] == [1, 1, 1, 2]
    assert got["d"].samples["t"] == [1.0] * 4  # what it measured is kept
    why = INTERRUPTED if isinstance(stop, KeyboardInterrupt) else TERMINATED
    for r in got.values():
        assert r.status == "error" and r.error.startswith(why), r.error
        assert "of its 3 rounds" in r.error and "--resume" in r.error
        assert stopped({"status": r.status, "error": r.error})  # hides no earlier row


@pytest.mark.slow  # three step points, twice each
def test_the_step_ablation_runs_in_rounds(tmp_path):
    from tests.conftest import invoke, query

    db = tmp_path / "r.db"
    result = invoke("step", "--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-layers",
                    "1", "--num-heads", "2", "--vocab-size", "64", "--seq", "16", "--iters", "4",
                    "--rounds", "2", "--switches", "none,fused-adamw", "--db", db)
    assert result.exit_code == 0, result.output
    rows = query(db, "SELECT * FROM step_runs ORDER BY created")  # round 2 ran in reverse
    assert [(r["switches"], r["rounds"], r["rounds_done"], r["step_ms_n"]) for r in rows] == [
        ("fused-adamw", 2, 2, 4), ("none", 2, 2, 4)]
    import json

    samples = json.loads(query(db, "SELECT samples FROM runs LIMIT 1")[0]["samples"])
    assert len(samples["step_ms"]) == 4 and len(samples["round_medians"]) == 2
    bad = invoke("step", "--rounds", "5", "--iters", "3", "--db", tmp_path / "x.db")
    assert bad.exit_code == 2 and "--rounds must be from 1 to --iters (3), got 5" in bad.output
    assert not (tmp_path / "x.db").exists()


def test_a_step_point_splits_into_rounds_that_compile_cold_once():
    from cs336sys.experiments import step
    from cs336sys.experiments.step_ablation import split

    (spec,) = step.specs(switches=["compile"], iters=10, rounds=3, min_time=0.9, device="cpu")
    rounds = split(spec)
    assert [(r.iters, r.min_time, r.warm_cache) for r in rounds] == [
        (4, pytest.approx(0.3), False), (4, pytest.approx(0.3), True), (4, pytest.approx(0.3), True)]
    # the course's do_bench timing (40 s a point on CUDA) once, in the round whose figure
    # merge keeps: it ran in every round, 120 s a point at the default 3
    from dataclasses import replace

    assert [r.course_timing for r in split(replace(spec, course_timing=True))] == [
        True, False, False]


def test_attention_implementations_run_in_rounds_checked_once(tmp_path, monkeypatch):
    """Two rounds of two implementations at one shape: each point checked against float64
    in its first round only, its samples those of both rounds."""
    import json

    from cs336sys.experiments import attention
    from tests.conftest import invoke, query

    checked = []
    real = attention.checked
    monkeypatch.setattr(attention, "checked",
                        lambda spec, *a: checked.append(spec.check_round) or real(spec, *a))
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "naive,sdpa", "--seq", "32", "--d-head", "16",
                    "--batch", "1", "--warmup", "1", "--iters", "4", "--rounds", "2",
                    "--device", "cpu", "--db", db)
    assert result.exit_code == 0, result.output
    assert checked == [True, True, False, False]  # round 1 of each, then round 2 of each
    rows = query(db, "SELECT * FROM attention_runs ORDER BY created")  # round 2 in reverse
    assert [(r["impl"], r["rounds"], r["rounds_done"], r["e2e_ms_n"], r["check"]) for r in rows] \
        == [("sdpa", 2, 2, 4, "pass"), ("naive", 2, 2, 4, "pass")]
    samples = json.loads(query(db, "SELECT samples FROM runs LIMIT 1")[0]["samples"])
    assert len(samples["e2e_ms"]) == 4 and len(samples["round_medians"]["e2e_ms"]) == 2


def test_model_points_run_in_rounds_and_their_speedup_gets_a_verdict(tmp_path, monkeypatch):
    """`model --rounds 2`: fp32 and bf16 build, warm up and time their share in round 1, then
    in round 2; each point's figures are those of all its timed steps, and the fp32 -> bf16
    ratio, whose steps interleaved, gets a verdict."""
    import json
    import statistics

    from cs336sys.experiments import model
    from tests.conftest import invoke, micro, query

    built, checked = [], []
    make_step, before_timing = model.make_step, model.before_timing
    monkeypatch.setattr(model, "make_step",
                        lambda *a, **kw: built.append(kw["precision"]) or make_step(*a, **kw))
    monkeypatch.setattr(model, "before_timing", lambda *a, first_round: (
        first_round and checked.append(a[1])) or before_timing(*a, first_round=first_round))
    db = tmp_path / "r.db"
    args = ["model", *micro(iters=6, num_layers=1), "--seq", "16", "--precision", "fp32,bf16",
            "--db", db]
    result = invoke(*args, "--rounds", "2")
    assert result.exit_code == 0, result.output
    assert built == ["fp32", "bf16", "bf16", "fp32"]  # round 2 in reverse
    assert checked == ["adamw", "adamw"]  # round 1 of each point only
    rows = query(db, "SELECT * FROM model_runs ORDER BY created")
    assert [(r["precision"], r["rounds"], r["rounds_done"], r["step_ms_n"]) for r in rows] == [
        ("bf16", 2, 2, 6), ("fp32", 2, 2, 6)]
    for row in query(db, "SELECT samples, metrics FROM runs"):
        samples, metrics = json.loads(row["samples"]), json.loads(row["metrics"])
        steps = samples["step_ms"]
        assert len(samples["round_medians"]) == 2 and len(samples["loss"]) == 2 * (1 + 3)
        assert metrics["step_ms_median"] == pytest.approx(statistics.median(steps))
        assert metrics["tokens_per_s"] == pytest.approx(
            metrics["tokens_per_step"] / (statistics.mean(steps) / 1e3))
        assert metrics["loss_last"] == samples["loss"][-1] and len(samples["warmup"]["step_ms"]) == 1
    # (one round: `not interleaved`, test_points_run_one_after_the_other_get_no_verdict)
    out = tmp_path / "report"
    assert invoke("report", "--db", db, "--out", out, "--format", "md").exit_code == 0
    text = (out / "report.md").read_text()
    (line,) = [x for x in text[text.index("**Speedup fp32 → bf16"):].splitlines()[2:6]
               if x.startswith("| tiny T=16")]
    assert "not interleaved" not in line, line
    assert any(w in line for w in ("faster", "slower", "no difference")), line
    bad = invoke(*args, "--rounds", "7", "--db", tmp_path / "x.db")
    assert bad.exit_code == 2 and "--rounds must be from 1 to --iters (6), got 7" in bad.output
    # each round builds the model again: with no warm-up, a cold step heads every round's
    # samples, where the warm-up study reads one (a +300 ms first forward read 1.46x, not 20x)
    cold = invoke(*args, "--rounds", "2", "--warmup", "0,1", "--db", tmp_path / "x.db")
    assert cold.exit_code == 2 and "with --warmup 0 every round's first timed step is a " \
        "cold one" in cold.output, cold.output
    assert not (tmp_path / "x.db").exists()


def test_rounds_say_how_a_point_was_measured_not_which_it_is():
    """A point measured in 3 rounds is the point measured in 1, or before its command had
    --rounds (the report's latest row, --compare's pairs); memory and profile, which time
    nothing side by side, store no rounds, and no point stores whether it checked."""
    from cs336sys.experiments import memory, model
    from cs336sys.report.sections import skey

    before = {"_settings": {"size": "small", "precision": "bf16", "iters": 10}}
    after = {"_settings": {"size": "small", "precision": "bf16", "iters": 12, "rounds": 3}}
    assert skey(before) == skey(after)
    (point,) = model.specs(size=["tiny"], seq=[16], iters=4, rounds=2, device="cpu")
    assert point.settings()["rounds"] == 2 and "check_round" not in point.settings()
    assert "check_round" not in model.EXPERIMENT.settings
    (kept,) = memory.specs(size=["tiny"], seq=[16], iters=1, device="cpu")
    assert "rounds" not in kept.settings() and "rounds" not in memory.EXPERIMENT.settings
    from cs336sys.experiments import profile

    (profiled,) = profile.specs("model", model.specs(size=["tiny"], seq=[16], rounds=1,
                                                     device="cpu"), top=3)
    assert "rounds" not in profiled.settings() and "rounds" not in profile.EXPERIMENT.settings


def test_a_speedup_table_compares_medians_and_calls_a_change_only_when_it_can():
    """The model section's fp32 -> bf16 table divided means: one slow bf16 step (120 ms of
    six) read 0.81x, bf16 slower by a fifth, where its median step is 5 % slower. It now
    divides medians, gives the interval, and with 3 samples a side gives no verdict (no test
    can call 3 against 3; a bootstrap of one sample a side read `faster (1.32–1.32)`), and
    says so."""
    def run(precision, samples):
        return {"status": "ok", "gpu": None, "_settings": {"size": "small", "precision": precision},
                "step_ms_mean": sum(samples) / len(samples),
                "step_ms_median": sorted(samples)[len(samples) // 2], "_samples": {"step_ms": samples}}

    fp32 = run("fp32", [55.0, 55.3, 55.5, 55.2, 55.4, 55.1])
    bf16 = run("bf16", [58.0, 57.0, 59.0, 120.0, 58.5, 57.5])
    ((_, a, b, ratio),) = speedups([fp32, bf16], "precision", "fp32", "bf16", "step_ms",
                                   lambda r: "small")
    # the model runs its points one after the other: the interval, no verdict
    assert (a, b) == ("55.3", "58.5") and re.fullmatch(
        r"0\.95× \(0\.\d\d–0\.\d\d, not interleaved\)", ratio), ratio
    few = speedups([run("fp32", [55.0, 55.3, 55.5]), run("bf16", [41.0, 40.5, 40.8])],
                   "precision", "fp32", "bf16", "step_ms", lambda r: "small")
    assert few[0][3] == "1.36× (too few samples to tell)"


def test_ddp_against_torch_gives_its_interval_from_the_ranks_steps():
    """`vs torch` divided mean step times with no interval: 1.21x on 3 noisy steps read as a
    finding. It divides medians of the slowest rank's steps, with the interval and verdict
    where each side has 4 steps or more (no verdict: ddp runs its points one by one)."""
    from cs336sys.experiments.ddp_section import TABLE

    ratio = next(c.ratio for c in TABLE.columns if c.header == "vs torch")

    def run(impl, steps):
        ranks = [{"step": steps}, {"step": [t - 1.0 for t in steps]}]  # rank 0 the slower
        return {"status": "ok", "gpu": None, "step_ms_median": sorted(steps)[len(steps) // 2],
                "_settings": {"impl": impl, "shard_optimizer": "none", "size": "tiny"},
                "_samples": {"ranks": ranks}}

    torch_ddp = run("torch", [290.0, 288.0, 292.0, 291.0, 289.0, 290.5])
    naive = run("naive", [350.0, 352.0, 349.0, 351.0, 353.0, 350.5])
    cells = _ratios(ratio, [torch_ddp, naive])
    assert cells[0] == "1.00×" and re.fullmatch(
        r"1\.21× \(1\.\d\d–1\.\d\d, not interleaved\)", cells[1]), cells[1]
    few = _ratios(ratio, [run("torch", [290.0, 288.0, 292.0]), run("naive", [350.0, 352.0, 349.0])])
    assert few[1] == "1.21× (too few samples to tell)"


def test_attention_against_naive_gives_its_interval_from_end_to_end_samples():
    """`vs naive` divided means with no interval: on a CPU, sdpa at 1.08x of naive read as a
    speed-up. It divides medians (means where a row has none) with the interval and verdict
    of the end-to-end samples."""
    from cs336sys.experiments.attention_section import TABLE

    ratio = next(c.ratio for c in TABLE.columns if c.header == "vs naive")

    def run(impl, e2e):  # interleaved in three rounds
        return {"status": "ok", "gpu": None, "e2e_ms_median": sorted(e2e)[len(e2e) // 2],
                "_settings": {"impl": impl, "seq": 64, "rounds": 3},
                "_samples": {"e2e_ms": e2e}}

    naive = run("naive", [0.30, 0.25, 0.33, 0.24, 0.31, 0.27])
    sdpa = run("sdpa", [0.26, 0.29, 0.24, 0.30, 0.25, 0.28])
    cells = _ratios(ratio, [naive, sdpa])
    assert cells[1].startswith("1.07× no difference (")
    fast = run("flash-torch", [0.10, 0.11, 0.10, 0.12, 0.11, 0.10])
    assert _ratios(ratio, [naive, fast])[1].startswith("2.73× faster (")
    mean_only = {"status": "ok", "gpu": None, "e2e_ms_mean": 0.2,
                 "_settings": {"impl": "sdpa", "seq": 64, "rounds": 3}}
    assert _ratios(ratio, [{**naive, "e2e_ms_mean": 0.3, "e2e_ms_median": None}, mean_only]) \
        == ["1.00×", "1.50×"]  # rows stored without medians: their means, no interval


def test_points_of_different_commands_get_an_interval_but_no_verdict():
    """Resampling steps within each run cannot see how far runs drift apart: on the shared
    H100 store two runs of one bf16 point had medians 23 % apart, and fp32 -> bf16 paired
    with the faster of them read `1.06× faster (1.02–1.33)` (0.86×, no difference, beside
    the bf16 run of the fp32 point's own command). Rows of different invocations keep the
    interval and say `runs apart`, with the note that says why."""
    from cs336sys.experiments.attention_section import TABLE

    def run(precision, samples, invocation):
        return {"status": "ok", "gpu": None, "invocation_id": invocation,
                "_settings": {"size": "small", "precision": precision},
                "step_ms_median": sorted(samples)[len(samples) // 2],
                "_samples": {"step_ms": samples}}

    fp32 = run("fp32", [67.0, 67.2, 67.5, 67.1, 67.4, 66.9], "a")
    bf16 = [63.4, 63.6, 63.9, 63.5, 63.8, 63.2]
    ((*_, apart),) = speedups([fp32, run("bf16", bf16, "b")], "precision", "fp32", "bf16",
                              "step_ms", lambda r: "small")
    assert re.fullmatch(r"1\.06× \(1\.\d\d–1\.\d\d, runs apart\)", apart), apart
    ((*_, together),) = speedups([fp32, run("bf16", bf16, "a")], "precision", "fp32", "bf16",
                                 "step_ms", lambda r: "small")
    assert together.endswith(", not interleaved)")  # one command, one point at a time

    def attention(impl, e2e, invocation):
        s = {"impl": impl, "seq": 64, "d_head": 16}
        return {**s, "status": "ok", "gpu": None, "invocation_id": invocation, "_settings": s,
                "e2e_ms_mean": sum(e2e) / len(e2e), "e2e_ms_median": sorted(e2e)[len(e2e) // 2],
                "_samples": {"e2e_ms": e2e}}

    t = point_table(TABLE, [attention("naive", [0.30, 0.31, 0.29, 0.30, 0.32, 0.30], "a"),
                            attention("sdpa", [0.10, 0.11, 0.10, 0.12, 0.11, 0.10], "b")])
    assert t.rows[1][t.headers.index("vs naive")].endswith("runs apart)")
    assert RUNS_APART_NOTE in t.note


def test_points_that_could_interleave_and_did_not_get_an_interval_but_no_verdict():
    """Two runs of one CPU step on a loaded machine read fused-ce `6.22× faster (2.39–7.79)`
    and `1.29× faster (1.15–1.47)` against none: the points ran one after the other (one
    round, the CPU default), and the machine's load between them was read as a speed-up.
    Where an experiment can interleave its points' steps (--rounds), only interleaved
    points get a verdict; the others keep the interval, marked, with the note."""
    from cs336sys.experiments.attention_section import TABLE

    def attention(impl, e2e, rounds):
        s = {"impl": impl, "seq": 64, "d_head": 16, "rounds": rounds}
        return {**s, "status": "ok", "gpu": None, "invocation_id": "a", "_settings": s,
                "rounds_done": rounds, "e2e_ms_mean": sum(e2e) / len(e2e),
                "e2e_ms_median": sorted(e2e)[len(e2e) // 2], "_samples": {"e2e_ms": e2e}}

    naive, fast = [0.30, 0.31, 0.29, 0.30, 0.32, 0.30], [0.10, 0.11, 0.10, 0.12, 0.11, 0.10]
    t = point_table(TABLE, [attention("naive", naive, 1), attention("sdpa", fast, 1)])
    cell = t.rows[1][t.headers.index("vs naive")]
    assert re.fullmatch(r"2\.\d\d× \(\d\.\d\d–\d\.\d\d, not interleaved\)", cell), cell
    assert NOT_INTERLEAVED_NOTE in t.note
    t = point_table(TABLE, [attention("naive", naive, 3), attention("sdpa", fast, 3)])
    assert t.rows[1][t.headers.index("vs naive")].startswith("2.73× faster (")
    assert NOT_INTERLEAVED_NOTE not in t.note


def test_interleaved_points_are_judged_round_by_round():
    """On a loaded 2-core CPU, `attention --impl naive,yours=...:naive_attention --rounds 3`
    (a function against itself) read `189.34× faster`: one round of naive that load slowed
    gave ten slow samples, which the bootstrap took for ten independent ones. The rounds
    are paired (round i of both ran in one pass) and the t interval of their ratios joins
    the samples': a loaded round widens it to no verdict, and steady rounds still decide."""
    from cs336sys.measure.sampling import rounds_interval
    from cs336sys.report.intervals import sample_interval

    def attention(impl, rounds):
        e2e = [m * (1 + 0.01 * (i % 5)) for m in rounds for i in range(10)]
        s = {"impl": impl, "seq": 128, "d_head": 32, "rounds": len(rounds)}
        return {**s, "status": "ok", "gpu": None, "invocation_id": "a", "_settings": s,
                "rounds_done": len(rounds), "e2e_ms_median": sorted(e2e)[len(e2e) // 2],
                "_samples": {"e2e_ms": e2e, "round_medians": {"e2e_ms": rounds}}}

    naive = attention("naive", [7.69, 182.0, 0.89])  # the hunt's round medians
    same = attention("yours", [1.18, 0.81, 0.67])
    said = sample_interval("e2e_ms", naive, same, True)
    assert said.startswith(" no difference ("), said
    steady = sample_interval("e2e_ms", attention("naive", [2.0, 2.1, 1.9]),
                             attention("flash", [1.0, 1.04, 0.96]), True)
    assert steady.startswith(" faster (1.9"), steady
    # the interval itself: paired by round, on the log scale, t with k - 1 degrees of freedom
    found = rounds_interval([1.0, 2.0], [0.5, 1.0])
    assert (found.ratio, found.low, found.high) == pytest.approx((0.5, 0.5, 0.5))
    found = rounds_interval([1.0, 1.0, 1.0], [0.9, 1.0, 1.1])
    logs = [math.log(x) for x in (0.9, 1.0, 1.1)]
    half = 4.303 * statistics.stdev(logs) / math.sqrt(3)
    assert found.low == pytest.approx(math.exp(statistics.fmean(logs) - half))
    assert rounds_interval([1.0], [2.0]) is None and rounds_interval([1.0, 2.0], [1.0]) is None
    # the step's and model's rows keep the step's round medians as a plain list
    none = {**_row("none", [100.0, 101.0, 99.0, 100.5, 100.2, 99.8]), "invocation_id": "a"}
    adamw = {**_row("fused-adamw", [90.0, 91.0, 89.0, 90.5, 90.2, 89.8]), "invocation_id": "a"}
    none["_samples"]["round_medians"], adamw["_samples"]["round_medians"] = [100.0, 100.0], \
        [60.0, 95.0]
    assert sample_interval("step_ms", none, adamw, True).startswith(" no difference (")


def test_the_impossible_footnote_joins_only_a_table_that_shows_one():
    """A step table of one `none` point (no fused-adamw at all) ended with the note that
    fused-adamw saved more than the optimizer step takes."""
    from cs336sys.experiments.step import TABLE
    from cs336sys.report.tables import point_tables

    none = _row("none", [100.0, 101.0, 99.0, 100.5, 100.2, 99.8], opt_ms=5.0)
    adamw = _row("fused-adamw", [90.0, 91.0, 89.0, 90.5, 90.2, 89.8])
    (alone,) = point_tables([TABLE], [none])
    assert "IMPOSSIBLE" not in alone.note
    (both,) = point_tables([TABLE], [none, adamw])
    assert "IMPOSSIBLE: fused-adamw saved more than the optimizer step takes" in both.note
