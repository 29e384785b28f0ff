"""Measuring machinery: sweep expansion, stats, OOM capture, device and peak tables."""

import statistics
import time
import weakref

import pytest
import torch

from cs336sys.measure.device import peak_tflops, resolve_device
from cs336sys.measure.stats import summarize
from cs336sys.sweep import result as result_mod
from cs336sys.sweep.points import expand, split_list
from cs336sys.sweep.result import Result, guarded, is_oom


def test_split_list_accepts_commas_and_repetition():
    assert split_list(["small,medium", "large", " small , xl,"]) == [
        "small",
        "medium",
        "large",
        "xl",
    ]
    assert split_list(None) == [] and split_list([]) == []


def test_expand_is_the_cartesian_product_first_axis_slowest():
    points = expand({"a": [1, 2], "b": ["x", "y", "z"]})
    assert len(points) == 6
    assert points[:3] == [{"a": 1, "b": "x"}, {"a": 1, "b": "y"}, {"a": 1, "b": "z"}]
    assert expand({"a": [1], "b": []}) == []


def test_summarize_matches_statistics_module():
    xs = [3.0, 1.0, 4.0, 1.0, 5.0]
    s = summarize(xs)
    assert s == {
        "mean": statistics.fmean(xs),
        "std": statistics.stdev(xs),
        "min": 1.0,
        "median": 3.0,
        "max": 5.0,
        # numpy's default percentiles on [1, 1, 3, 4, 5], by hand: p at (n-1)·q = 4q
        "p10": 1.0,  # 0.4: between 1 and 1
        "p90": 4.6,  # 3.6: 4 + 0.6·(5 - 4)
        "iqr": 3.0,  # Q3 at 3.0 is 4, Q1 at 1.0 is 1
        "n": 5,
        "drift": None,  # too few samples to split in thirds
    }
    assert summarize([2.0]) == {"mean": 2.0, "std": 0.0, "min": 2.0, "median": 2.0, "max": 2.0,
                                "p10": 2.0, "p90": 2.0, "iqr": 0.0, "n": 1, "drift": None}
    assert summarize([]) == dict.fromkeys(("mean", "std", "min", "median", "max", "p10", "p90", "iqr",
                                           "n", "drift"))
    # a clock that slows: the last third's median (12) over the first third's (10)
    assert summarize([10.0, 10.0, 11.0, 11.0, 12.0, 12.0])["drift"] == pytest.approx(0.2)
    # an even count: the median is the mean of the middle two
    assert summarize([10.0, 1.0, 3.0, 2.0])["median"] == 2.5


def test_oom_detection():
    assert is_oom(torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB"))
    assert is_oom(
        RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1")
    )
    assert is_oom(MemoryError())
    assert not is_oom(RuntimeError("shape mismatch"))
    assert not is_oom(ValueError("out of memory"))  # only RuntimeErrors carry allocator messages


def test_guarded_turns_exceptions_into_results_and_frees_the_failed_points_tensors(monkeypatch):
    refs = []
    alive_when_freed = []
    monkeypatch.setattr(
        result_mod, "free_memory", lambda: alive_when_freed.append(refs[0]() is not None)
    )

    def point():
        big = torch.ones(1000)
        refs.append(weakref.ref(big))
        raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB")

    r = guarded(point)
    # raised outside cs336sys (in this file), so the line names where, then the exception
    assert r.status == "oom" and r.error.startswith("tests/test_bench.py:")
    assert r.error.partition(": ")[2].startswith("OutOfMemoryError: CUDA out of memory")
    assert alive_when_freed == [False]  # the tensor was already gone when memory was freed

    r = guarded(lambda: 1 / 0)
    line = r.error.splitlines()[0]
    assert r.status == "error" and "Traceback" in r.error
    assert line == f"tests/test_bench.py:{_line_of('guarded(lambda: 1 / 0)')}: ZeroDivisionError: division by zero"
    ok = guarded(lambda: Result("ok", metrics={"x": 1}))
    assert ok.status == "ok" and ok.duration_s >= 0

    def interrupted():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        guarded(interrupted)


def test_a_signal_wrapped_by_what_it_interrupted_stops_the_sweep_not_a_row():
    """SIGTERM while a point imports a module that makes a dataclass: Python 3.10 and 3.11
    raise "RuntimeError: Error calling __set_name__" from the stop. The point is the
    signal's, raised as itself (the runner stores it as stopped), not an error row; the same
    RuntimeError without a signal received is an error row."""
    from cs336sys.sweep import stopping

    def wrapped():
        try:
            raise stopping.Terminated("terminated by signal 15 (SIGTERM)")
        except stopping.Terminated as stop:
            raise RuntimeError("Error calling __set_name__ on 'Field' instance") from stop

    assert guarded(wrapped).status == "error"  # no signal received: a failure like any
    stopping._received.append(15)  # the handler's record (conftest forgets it after)
    with pytest.raises(stopping.Terminated):
        guarded(wrapped)
    assert guarded(lambda: 1 / 0).status == "error"  # no stop in its chain


def test_peak_table():
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("NVIDIA H100 PCIe", "bf16") == 756.0
    assert peak_tflops("NVIDIA H200", "fp32") == 67.0
    assert peak_tflops("NVIDIA H200 NVL", "bf16") == 835.5  # not the SXM's 989.4
    assert peak_tflops("NVIDIA H200", "fp32", tf32=True) == 494.7
    assert peak_tflops("NVIDIA A100-SXM4-80GB", "bf16") == 312.0
    assert peak_tflops("NVIDIA L40S", "bf16") == 362.05  # its data sheet, dense (not 366)
    assert peak_tflops(None, "bf16") is None and peak_tflops("Some CPU", "fp32") is None


def test_resolve_device_on_cpu():
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        assert resolve_device("auto") == "cpu"
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda:0")
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("tpu")


def test_a_phase_is_launch_bound_when_its_host_time_is_most_of_its_wall_time():
    from cs336sys.measure.timing import LAUNCH_BOUND, launch_bound, launch_metrics

    assert LAUNCH_BOUND == 0.9
    assert launch_bound(9.0, 10.0, "cuda:0") is True  # the GPU waited for the host
    assert launch_bound(8.9, 10.0, "cuda:0") is False
    assert launch_bound(10.0, 10.0, "cpu") is None  # synchronous: host time is wall time
    assert launch_bound(None, 10.0, "cuda:0") is None
    samples = {"fwd_ms": [10.0, 12.0], "fwd_host_ms": [9.8, 10.6],  # 10.2 of 11: bound
               "bwd_ms": [20.0, 20.0], "bwd_host_ms": [2.0, 2.0],
               "opt_ms": [5.0], "opt_host_ms": [4.9]}
    got = launch_metrics(samples, ("fwd", "bwd", "opt", "comm"), "cuda:0")
    assert got == {"fwd_host_ms_mean": pytest.approx(10.2), "bwd_host_ms_mean": 2.0,
                   "opt_host_ms_mean": 4.9, "launch_bound": True,
                   "launch_bound_phases": "fwd,opt"}
    on_cpu = launch_metrics(samples, ("fwd",), "cpu")
    assert on_cpu["launch_bound"] is None and on_cpu["launch_bound_phases"] is None
    none = launch_metrics({"fwd_ms": [1.0]}, ("fwd",), "cuda:0")  # do_bench: no host times
    assert none == {"launch_bound": None, "launch_bound_phases": None}


def test_do_bench_points_get_host_times_for_the_launch_bound_flag(monkeypatch):
    """do_bench's events hide the host behind its L2 flush (25 us timed, 77-99 us of host
    time per call on an H200), so the timer also times HOST_CALLS calls on the host, each
    after the gradients are reset as do_bench resets them."""
    pytest.importorskip("triton")
    import triton.testing

    from cs336sys.measure import timing

    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, **kw: [0.5, 0.25, 0.5])
    x = torch.ones(3, requires_grad=True)
    grads_seen = []

    def call():
        grads_seen.append(x.grad)
        time.sleep(0.002)
        (2 * x).sum().backward()

    host: list[float] = []
    got = timing.time_do_bench(call, grad_to_none=[x], host=host, device="cpu")
    assert got == [0.5, 0.25, 0.5]
    assert len(host) == timing.HOST_CALLS and all(1.9 <= h < 500 for h in host)
    assert grads_seen == [None] * timing.HOST_CALLS  # reset before each, never accumulated
    flags = timing.launch_metrics({"fwd_ms": got, "fwd_host_ms": host}, ("fwd",), "cuda:0")
    assert flags["launch_bound"] is True and flags["launch_bound_phases"] == "fwd"
    assert timing.time_do_bench(call, device="cpu") == got  # no host list: no extra calls
    assert len(grads_seen) == timing.HOST_CALLS


def _line_of(text: str) -> int:
    """The line of this file that holds `text` (once)."""
    from pathlib import Path

    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, start=1) if text in line and "_line_of" not in line)
