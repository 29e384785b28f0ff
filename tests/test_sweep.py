"""The sweep runner (sweep/runner.py), from plain Python: the rows it writes are the
CLI's, and --resume, skip-after-OOM, failures, groups and process groups are handled once,
here, for every experiment."""

from __future__ import annotations

import json
import signal
from dataclasses import replace

import pytest

from cs336sys.experiments import model, run_sweep
from cs336sys.store import Recorder
from cs336sys.sweep.points import point_key
from cs336sys.sweep.runner import Quiet
from tests.conftest import MICRO, invoke, query
from tests.sweep_workers import TOY, TOY_RANKS, Toy


class ListSink:
    """Keeps what it is handed, in order; `done` answers for resume."""

    def __init__(self, done=()):
        self.added, self.updated, self._done = [], [], set(done)

    def add(self, experiment, spec, result):
        self.added.append((experiment.kind, spec, result.status))
        return len(self.added) - 1

    def update(self, handle, result):
        self.updated.append((handle, dict(result.metrics)))

    def done(self, experiment):
        return self._done


class Events(Quiet):
    def __init__(self):
        self.events = []

    def start(self, experiment, total):
        self.events.append(("start", total))

    def resumed(self, skipped):
        self.events.append(("resumed", skipped))

    def advance(self, point):
        self.events.append(("advance", point.spec.n))

    def finish(self):
        self.events.append(("finish",))


# -- the rows: Python and the CLI alike ---------------------------------------------------------


def test_run_sweep_from_python_writes_the_rows_the_cli_writes(tmp_path, monkeypatch):
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    cli_db, py_db = tmp_path / "cli.db", tmp_path / "python.db"
    result = invoke("model", *MICRO, "--seq", "16,32", "--mode", "forward,train",
                    "--db", cli_db)
    assert result.exit_code == 0, result.output
    specs = model.specs(size=["tiny"], d_model=64, d_ff=128, num_layers=2, num_heads=4,
                        vocab_size=256, batch=[2], warmup=1, iters=3, device="cpu",
                        seq=[16, 32], mode=["forward", "train"])
    with Recorder(py_db, command="model", device="cpu") as rec:
        points = run_sweep(model.EXPERIMENT, specs, rec)
    assert [p.result.status for p in points] == ["ok"] * 4

    sql = "SELECT experiment, status, settings, metrics, samples, point_key FROM runs ORDER BY created"
    cli, py = query(cli_db, sql), query(py_db, sql)
    assert len(cli) == len(py) == 4
    for a, b in zip(cli, py, strict=True):
        assert (a["experiment"], a["status"], a["settings"], a["point_key"]) == (
            b["experiment"], b["status"], b["settings"], b["point_key"])
        ma, mb = json.loads(a["metrics"]), json.loads(b["metrics"])
        assert ma.keys() == mb.keys()
        assert json.loads(a["samples"]).keys() == json.loads(b["samples"]).keys()
        # what does not depend on the clock is equal: same seed, same model, same loss
        for k in ("params", "tokens_per_step", "flops_per_step", "logits_dtype", "loss_first",
                  "loss_last"):
            assert ma[k] == mb[k], k
    prov = "SELECT host, device, gpu, cpu, torch_version, git_commit, git_dirty, exit_status FROM invocations"
    assert query(cli_db, prov) == query(py_db, prov)
    view = "SELECT * FROM model_runs ORDER BY created"
    for a, b in zip(query(cli_db, view), query(py_db, view), strict=True):
        assert {k for k, v in a.items() if v is not None} == {k for k, v in b.items() if v is not None}


def test_every_metric_a_point_stores_is_declared(tmp_path):
    """What `run` returns is what the view shows: no metric or setting outside the
    experiment's declaration (local experiments, one cheap point each)."""
    from cs336sys.experiments import attention, memory, memory_residuals, precision, profile

    tiny = dict(size=["tiny"], d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
                batch=[2], seq=[16], warmup=1, iters=1, device="cpu")
    attn = dict(seq=[32], d_head=[16], batch=[1], warmup=1, iters=1, device="cpu")
    cases = [
        (model.EXPERIMENT, model.specs(**tiny)),
        (attention.EXPERIMENT, attention.specs(impl=["naive", "sdpa"], **attn)),
        (memory.EXPERIMENT, memory.specs(**tiny, snapshot=tmp_path / "snap")),
        (memory_residuals.EXPERIMENT, memory_residuals.specs(
            compile=False, size=["tiny"], d_model=64, d_ff=128, num_heads=4,
            seq=[16], device="cpu")),
        (precision.EXPERIMENT, precision.accumulate_specs(variant=["fp16"], additions=10,
                                                          device="cpu")),
        (precision.EXPERIMENT, precision.autocast_specs(device="cpu")),
        (profile.EXPERIMENT, profile.specs("model", model.specs(**tiny), top=3)),
        (profile.EXPERIMENT, profile.specs("attention", attention.specs(impl=["naive"], **attn))),
    ]
    for experiment, specs in cases:
        for p in run_sweep(experiment, specs):
            assert p.result.status in ("ok", "skipped"), (experiment.kind, p.result.error)
            assert set(p.result.metrics) <= set(experiment.metric_names), experiment.kind
            assert set(p.spec.settings()) <= set(experiment.settings), experiment.kind


# -- what the runner does, on a toy experiment --------------------------------------------------


def test_points_reach_the_sink_as_they_finish_with_start_and_duration():
    sink, events = ListSink(), Events()
    points = run_sweep(TOY, [Toy(1), Toy(13), Toy(3)], sink, progress=events)
    assert [(p.spec.n, p.result.status) for p in points] == [(1, "ok"), (13, "error"), (3, "ok")]
    assert [s for _, _, s in sink.added] == ["ok", "error", "ok"]
    assert [p.handle for p in points] == [0, 1, 2]
    assert "ValueError: unlucky" in points[1].result.error
    assert points[0].result.metrics == {"twice": 2}
    assert all(p.result.started and p.result.duration_s >= 0 for p in points)
    assert events.events == [("start", 3), ("advance", 1), ("advance", 13), ("advance", 3),
                             ("finish",)]


def test_resume_runs_only_the_points_the_sink_does_not_hold():
    specs = [Toy(1, size=1), Toy(2, size=2), Toy(3, size=3)]
    done = {point_key("toy", s.settings()) for s in specs[:2]}
    sink, events = ListSink(done=done), Events()
    points = run_sweep(TOY, specs, sink, resume=True, progress=events)
    assert [p.spec.n for p in points] == [3]
    assert ("resumed", 2) in events.events
    with pytest.raises(ValueError, match="resume"):
        run_sweep(TOY, specs, resume=True)  # no sink to ask


def test_after_an_oom_larger_points_of_the_same_family_are_skipped():
    specs = [Toy(1, size=32), Toy(2, size=64), Toy(3, size=128), Toy(4, size=32, family="b"),
             Toy(5, size=256), Toy(6, size=128, family="b")]
    got = [(p.spec.n, p.result.status) for p in run_sweep(TOY, specs, ListSink())]
    assert got == [(1, "ok"), (2, "oom"), (3, "skipped"), (4, "ok"), (5, "skipped"), (6, "ok")]
    skipped = run_sweep(TOY, specs[:3])[2].result
    assert "size 64 ran out of memory" in skipped.error
    got = [p.result.status for p in run_sweep(TOY, specs[:3], skip_after_oom=False)]
    assert got == ["ok", "oom", "oom"]


def test_metrics_set_across_a_group_reach_the_sink_when_the_group_is_complete():
    def best(group):
        lowest = min(r.metrics["twice"] for _, r in group)
        for _, r in group:
            r.metrics["lowest"] = r.metrics["twice"] == lowest

    grouped = TOY.__class__(**{**vars(TOY), "group_by": lambda s: s.family, "across": best})
    sink = ListSink()
    specs = [Toy(3), Toy(1, family="b"), Toy(2), Toy(4, family="b"), Toy(5, family="c")]
    points = run_sweep(grouped, specs, sink)
    assert [(h, m["lowest"]) for h, m in sink.updated] == [(0, False), (2, True), (1, True),
                                                           (3, False), (4, True)]
    assert [p.result.metrics["lowest"] for p in points] == [False, True, True, False, True]


def test_ctrl_c_stops_the_sweep_and_keeps_what_was_stored():
    import tests.sweep_workers as workers

    def interrupted(spec):
        if spec.n == 2:
            raise KeyboardInterrupt
        return workers.Result("ok", metrics={"twice": 2 * spec.n})

    sink, events = ListSink(), Events()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(replace(TOY, run=interrupted), [Toy(1), Toy(2), Toy(3)], sink, progress=events)
    assert [s.n for _, s, _ in sink.added] == [1]
    assert events.events[-1] == ("finish",)


def test_a_ctrl_c_an_import_swallowed_stops_the_sweep_at_the_next_point():
    """torch's C extension swallows a KeyboardInterrupt raised while it imports numpy; the
    signal is remembered (sweep/stopping.py) and raised again before the next point."""
    import signal

    from cs336sys.sweep import stopping

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stopping.install()
    try:
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass  # what the import did with it
        sink = ListSink()
        with pytest.raises(KeyboardInterrupt):
            run_sweep(TOY, [Toy(1), Toy(2)], sink)
        assert sink.added == []
        assert stopping.untold() == "Interrupted: this command stored nothing"
        assert stopping.exit_code() == 130
    finally:
        stopping.reset()
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


def test_a_signal_inside_a_backward_under_anomaly_mode_prints_no_forward_traceback():
    """torch.compile traces the backward under autograd's anomaly mode; a SIGTERM raised in a
    backward node there made torch print the forward's traceback above the stop's line
    (seen with `memory residuals`'s compiled point)."""
    import signal
    import warnings

    import torch

    from cs336sys.sweep import stopping
    from cs336sys.sweep.stopping import Terminated

    class SignalledBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            signal.raise_signal(signal.SIGTERM)  # arrives while the backward runs
            return grad * 2

    previous = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    stopping.install()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = torch.ones(3, requires_grad=True)
            with torch.autograd.detect_anomaly(check_nan=False), pytest.raises(Terminated):
                SignalledBackward.apply(x.view(3)).sum().backward()
            warnings.warn("a warning after the signal", UserWarning, stacklevel=1)  # still shown
        said = [str(w.message) for w in caught]
        assert not [m for m in said if m.startswith("Error detected in")], said
        assert said[-1] == "a warning after the signal"
    finally:
        signal.signal(signal.SIGINT, previous[0])
        signal.signal(signal.SIGTERM, previous[1])


@pytest.mark.parametrize("signal_after", ["Terminated", "WorkerError"])
def test_a_stop_after_the_last_point_of_a_process_group_stores_nothing_more(
        monkeypatch, signal_after):
    """SIGTERM while the ranks are reaped after the last point was stored: the runner
    looked up the point that was running (none) and raised IndexError."""
    from cs336sys.parallel import launcher
    from cs336sys.sweep.result import Result
    from cs336sys.sweep.stopping import Terminated

    def launch(fn, world, backend, args, on_emit, preload=None):
        todo, _ = args
        for i in range(len(todo)):
            on_emit((i, Result("ok", metrics={"sum": 1, "ranks": world})))
        if signal_after == "Terminated":
            raise Terminated("terminated by signal 15 (SIGTERM)")
        raise launcher.WorkerError(1, "exited with code 1 after the last point", "")

    monkeypatch.setattr(launcher, "launch", launch)
    sink = ListSink()
    specs = [Toy(1, world_size=2), Toy(2, world_size=2)]
    if signal_after == "Terminated":
        with pytest.raises(Terminated):
            run_sweep(TOY_RANKS, specs, sink)
    else:
        with pytest.warns(RuntimeWarning, match="a rank failed after the last point"):
            run_sweep(TOY_RANKS, specs, sink)
    assert [(s.n, status) for _, s, status in sink.added] == [(1, "ok"), (2, "ok")]


@pytest.mark.slow
def test_a_failed_point_ends_its_process_group_and_a_fresh_one_runs_the_rest():
    specs = [Toy(1, world_size=2), Toy(2, world_size=2), Toy(3, world_size=2)]
    sink = ListSink()
    points = run_sweep(TOY_RANKS, specs, sink)
    assert [(p.spec.n, p.result.status) for p in points] == [(1, "ok"), (2, "error"), (3, "ok")]
    assert points[0].result.metrics == {"sum": 3, "ranks": 2}  # (1 + rank 0) + (1 + rank 1)
    assert points[2].result.metrics == {"sum": 3 + 4, "ranks": 2}
    assert "rank 1 gives up at n=2" in points[1].result.error
    assert all(p.result.started and p.result.duration_s is not None for p in points)
    assert [s.n for _, s, _ in sink.added] == [1, 2, 3]


@pytest.mark.slow
def test_a_ranks_memory_error_is_oom_and_an_interrupt_its_code_raised_is_its_error():
    """On a rank, numpy's MemoryError was stored `error` (the parent sees it as text), and a
    KeyboardInterrupt the code raised was blamed on the peer whose connection it closed."""
    specs = [Toy(4, world_size=2), Toy(5, world_size=2), Toy(6, world_size=2)]
    points = run_sweep(TOY_RANKS, specs, ListSink())
    assert [(p.spec.n, p.result.status) for p in points] == [(4, "oom"), (5, "error"),
                                                              (6, "ok")]
    assert "MemoryError: Unable to allocate" in points[0].result.error
    assert points[1].result.error.startswith("rank 1 failed: tests/sweep_workers.py:"), \
        points[1].result.error
    assert "KeyboardInterrupt" in points[1].result.error.splitlines()[0]


def test_under_torchrun_an_interrupt_the_users_code_raises_is_its_points_error(monkeypatch):
    """Under torchrun a rank's failure raises in its own process: a KeyboardInterrupt the
    user's code raised (no key pressed) ended the run as Ctrl-C, storing nothing, and every
    --resume stopped there again. It is the point's error; a real stop stays a stop."""
    from cs336sys.sweep import runner, stopping

    def raised(exc):
        def launch(*args, **kwargs):
            exc.cs336sys_where = "cs336_systems/ddp.py:19"  # as serve marks the user's
            raise exc
        return launch

    monkeypatch.setattr(runner, "under_torchrun", lambda: True)
    monkeypatch.setattr(stopping, "raised_by_code", lambda exc: True)  # no signal pending
    monkeypatch.setattr(runner.launcher, "launch", raised(KeyboardInterrupt()))
    sink = ListSink()
    with pytest.raises(RuntimeError, match="your code raised KeyboardInterrupt on this rank"):
        run_sweep(TOY_RANKS, [Toy(1, world_size=2)], sink)
    assert [(s.n, status) for _, s, status in sink.added] == [(1, "error")]
    monkeypatch.setattr(stopping, "raised_by_code", lambda exc: False)  # Ctrl-C's
    sink = ListSink()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(TOY_RANKS, [Toy(1, world_size=2)], sink)
    assert sink.added == []


def test_specs_take_only_the_options_names():
    """0.2's keyword names (context_length, batch_size, global_batch, steps, dtype) are gone:
    a TypeError names the one given, never a point built from it."""
    from cs336sys.experiments import attention, ddp

    for specs, old in ((model.specs, "context_length"), (model.specs, "batch_size"),
                       (model.specs, "steps"), (model.specs, "dtype"),
                       (ddp.specs, "global_batch"), (attention.specs, "dtype")):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
            specs(**{old: [8]}, device="cpu")


def test_specs_read_a_string_or_one_value_as_the_command_line_would():
    """A list option given as "128,256" is split at commas as the command line splits it,
    and one value is a list of one: "128" once swept seq 1, 2 and 8 (its characters)."""
    from cs336sys.experiments import attention

    def seqs(**given):
        return sorted({s.seq for s in attention.specs(**given, device="cpu")})

    assert seqs(seq="128") == seqs(seq=128) == seqs(seq=["128"]) == [128]
    assert seqs(seq="128,256") == seqs(seq=[128, 256]) == [128, 256]
    assert {s.impl for s in attention.specs(impl="naive,sdpa", device="cpu")} == {"naive", "sdpa"}
    assert {s.size for s in model.specs(size="tiny", device="cpu")} == {"tiny"}
    # a checkpoint list keeps groups:A,B whole; one string was read letter by letter
    assert [s.checkpoint for s in model.specs(size="tiny", checkpoint="none,groups:2,2",
                                              device="cpu")] == ["none", "groups:2,2"]
    assert [s.checkpoint for s in model.specs(size="tiny", checkpoint="every:1",
                                              device="cpu")] == ["every:1"]


@pytest.mark.parametrize("given, said", [
    ({"iters": [2]}, "--iters takes one value, got [2]"),
    ({"warmup": "1"}, "--warmup takes one integer, got '1'"),
    ({"iters": 2.0}, "--iters takes one integer, got 2.0"),
    ({"seed": True}, "--seed takes one integer, got True"),
    ({"rounds": [1]}, "--rounds takes one value, got [1]"),
    ({"min_time": "1"}, "--min-time takes one number of seconds, got '1'"),
])
def test_a_list_or_a_string_for_a_one_value_option_is_a_spec_error(given, said):
    """A scalar option given a list (as the list options are) raises SpecError with the
    command line's words, not a TypeError from inside a comparison."""
    from cs336sys.experiments import attention
    from cs336sys.sweep.points import SpecError

    with pytest.raises(SpecError) as caught:
        attention.specs(**given, device="cpu")
    assert str(caught.value) == said


@pytest.mark.parametrize("experiment, given", [
    ("model", {"device": ["cpu"]}), ("model", {"compile": [True]}),
    ("plan", {"size": ["8b", "xl"]}), ("ddp", {"optimizer": ["adamw"]}),
    ("step", {"attention": ["sdpa"]}), ("memory", {"device": ["cpu"]}),
])
def test_every_experiments_one_value_option_refuses_a_list(experiment, given):
    """docs/python-api.md: a list given to a one-value option raises SpecError; most ended
    in an AttributeError from inside (`'list' object has no attribute 'split'`)."""
    import importlib

    from cs336sys.sweep.points import SpecError

    specs = importlib.import_module(f"cs336sys.experiments.{experiment}").specs
    ((name, value),) = given.items()
    with pytest.raises(SpecError) as caught:
        specs(**given)
    assert str(caught.value) == f"--{name} takes one value, got {value!r}"


def test_run_sweep_refuses_points_of_another_experiment_before_storing_anything(tmp_path):
    """Attention's points handed to model's experiment failed inside the first point with
    "'AttentionSpec' object has no attribute 'config'", after the store had been opened."""
    from cs336sys.experiments import attention

    db = tmp_path / "r.db"
    with pytest.raises(TypeError, match="run_sweep\\('model'\\) takes points of ModelSpec, "
                                        "not AttentionSpec"):
        run_sweep(model.EXPERIMENT, attention.specs(impl="naive", seq=[16], d_head=[8],
                                                    device="cpu"))
    with Recorder(db, command="notebook", device="cpu") as rec, pytest.raises(TypeError):
        run_sweep(model.EXPERIMENT, [*model.specs(size=["tiny"], seq=[8], device="cpu"),
                                     *attention.specs(impl="naive", seq=[16], device="cpu")], rec)
    assert query(db, "SELECT * FROM runs") == []


def test_profile_specs_take_only_points_of_their_target():
    """profile.specs("attention", model.specs(...)) was accepted: a model point to be run as
    attention's. Each target takes its own experiment's points, in the command's words."""
    from cs336sys.experiments import attention, profile
    from cs336sys.sweep.points import SpecError

    with pytest.raises(SpecError, match="profile 'attention' takes points of attention.specs"
                                        r"\(\), not ModelSpec"):
        profile.specs("attention", model.specs(size=["tiny"], seq=[8], device="cpu"))
    with pytest.raises(SpecError, match="not AttentionSpec"):
        profile.specs("model", attention.specs(impl="naive", seq=[16], device="cpu"))
    (spec,) = profile.specs("model", model.specs(size=["tiny"], seq=[8], device="cpu"))
    assert spec.point.size == "tiny"


def test_plan_specs_take_the_command_lines_hardware_default_and_a_string():
    """From Python, plan.specs without hardware refused ("give a preset or --measured")
    where the command line plans an H100, and hardware="h100" looked up "h", "1", ..."""
    from cs336sys.experiments import plan
    from cs336sys.sweep.points import SpecError

    def keys(**given):
        return sorted({s.hardware for s in plan.specs(size="xl", strategy=["dp"], n=[4],
                                                      **given)})

    assert keys() == ["h100"]
    assert keys(hardware="h100,b200") == keys(hardware=["b200", "h100"]) == ["b200", "h100"]
    with pytest.raises(SpecError, match="did you mean 'h100'"):
        keys(hardware="h10")


def test_metric_table_reads_rows_units_and_continued_meanings():
    from cs336sys.sweep.declaration import Metric, metric_table, setting_columns

    assert metric_table("""
        peak_bytes   bytes  peak of the step
        check        -      pass, or fail: every element within
                              atol + rtol·|ref|
    """) == (Metric("peak_bytes", "bytes", "peak of the step"),
             Metric("check", "", "pass, or fail: every element within atol + rtol·|ref|"))
    with pytest.raises(ValueError, match="expected name, unit and meaning"):
        metric_table("peak_bytes bytes")
    with pytest.raises(ValueError, match="continuation before any row"):
        metric_table("\n  x\n y - z")
    cols = setting_columns("size seq ckpt=checkpoint")
    assert [(c.header, c.key, c.setting) for c in cols] == [
        ("size", "size", True), ("seq", "seq", True), ("ckpt", "checkpoint", True)]


def test_column_table_reads_headers_keys_formats_and_optional_columns():
    from cs336sys.report.tables import _FORMATS
    from cs336sys.sweep.declaration import FORMATS, Column, column_table

    assert column_table("""
        step ms            step_ms     mean_std
        N max (FFN, 2 x)   n_max_ffn   num       optional
    """) == (Column("step ms", "step_ms", "mean_std"),
             Column("N max (FFN, 2 x)", "n_max_ffn", "num", optional=True))
    with pytest.raises(ValueError, match="a header, a key and a format"):
        column_table("step_ms mean_std")  # no header
    with pytest.raises(ValueError, match="a header, a key and a format"):
        column_table("step ms  step_ms  mean")  # a format the tables do not know
    assert set(FORMATS) == {*_FORMATS, "mean_std"}  # what the tables format, each declared


@pytest.mark.parametrize("signum, status", [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_recorder_stopped_by_a_signal_records_its_exit_status(db_path, signum, status):
    """`with Recorder(...)` recorded 143 for every Terminated; SIGHUP's is 129, as the
    command's."""
    from cs336sys.store.recorder import Recorder
    from cs336sys.sweep.stopping import Terminated

    with pytest.raises(Terminated), Recorder(db_path, command="notebook", device="cpu"):
        raise Terminated("stop", signum)
    assert query(db_path, "SELECT exit_status FROM invocations") == [{"exit_status": status}]


def test_a_known_symptom_below_a_messages_first_line_is_still_named():
    """Triton compiling a block-pointer kernel for a GPU raises CompilationError, whose
    message starts `at 14:18:` and says the symptom lines below: the stored reason kept the
    first line alone and lost "make_block_ptr is gone from Triton ..." (the interpreter's
    one-line error got it)."""
    from cs336sys.sweep.result import _failed

    class CompilationError(Exception):
        pass

    exc = CompilationError("at 14:18:\n    q_ptr = tl.make_block_ptr(Q, ...)\n              ^\n"
                           "Block pointers have been removed in favor of the tensor "
                           "descriptor API")
    said = _failed(exc).error
    # (the first line only introduces the source lines: its cause, on the last, is kept)
    assert said.startswith("CompilationError: at 14:18: Block pointers have been removed in "
                           "favor of the tensor descriptor API; tl.make_block_ptr is gone from "
                           "Triton "), said


def test_a_first_line_that_only_introduces_the_next_takes_it():
    """Inductor's error reads `TypeError: ` and its cause on the line below: a point on the
    user's correct attention was stored `InductorError: TypeError: ` and nothing more."""
    from cs336sys.sweep.result import first_line

    exc = RuntimeError("TypeError: \n  A Boolean argument can only be used in Eq and Ne\n\n"
                       "Set TORCHDYNAMO_VERBOSE=1 for the internal stack trace")
    assert first_line(exc) == "TypeError: A Boolean argument can only be used in Eq and Ne"
    assert first_line(RuntimeError("boom\nmore")) == "boom"
    # Triton's: where, a dozen lines of the kernel, then the cause (the `def` line read as it)
    triton = RuntimeError("at 5:8:\ndef kern2(X, Y, N: tl.constexpr):\n    x = tl.load(X)\n"
                          "    z = tl.dot(x, x)\n        ^\ninput and other must have equal "
                          "ranks >= 2")
    assert first_line(triton) == "at 5:8: input and other must have equal ranks >= 2"
    assert first_line(RuntimeError("")) == ""
