"""How many samples a point takes, its drift, and the interval of a ratio (measure/sampling.py),
with a fake clock and a fake do_bench; and how tables show them."""

from __future__ import annotations

import sys
import types

import pytest

from cs336sys.measure import timing
from cs336sys.measure.sampling import Enough, drift, ratio_interval, take, verdict
from cs336sys.report.tables import _ratios
from cs336sys.sweep.declaration import Ratio


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
    assert take(iter(range(100)).__next__, Enough(3)) == [0, 1, 2]


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
    # the step ablation's `none` on the H200: 4 samples spread 189-271 ms, against 190-200 ms
    noisy = ratio_interval([189.0, 271.0, 230.0, 255.0], [190.0, 195.0, 200.0, 197.0])
    assert noisy.low < 1 < noisy.high and verdict(noisy) == "no difference"
    assert verdict(ratio_interval([10.0] * 5, [12.0] * 5)) == "slower"
    assert ratio_interval([], [1.0]) is None and verdict(None) == ""
    assert ratio_interval(a, [80.0] * 3) == ratio_interval(a, [80.0] * 3)  # deterministic


def _row(switches, samples, opt_ms=None):
    median = sorted(samples)[len(samples) // 2]
    return {"status": "ok", "gpu": None, "switches": switches, "step_ms_median": median,
            "opt_ms_median": opt_ms, "_settings": {"switches": switches, "size": "xl"},
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
