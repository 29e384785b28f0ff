"""The sweep runner: the one loop over the points of a sweep, for every experiment.

    from cs336sys.experiments import model, run_sweep
    from cs336sys.store import Recorder

    specs = model.specs(size=["tiny"], seq=[64, 128], precision=["fp32", "bf16"])
    with Recorder("db/results.db", command="notebook") as rec:
        points = run_sweep(model.EXPERIMENT, specs, rec)   # the rows `cs336sys model` writes
    [(p.spec.seq, p.result.metrics["step_ms_mean"]) for p in points]

`run_sweep` is the only place that loops over specs. It applies `--resume` (points the sink
already holds ok for this commit on this machine are not run again) and skip-after-OOM (once a point runs
out of memory, the points larger along the experiment's `oom_axis`, all else equal, are
stored as `skipped`), stamps when each point started and how long it took, hands every
finished point to the sink at once (so Ctrl-C or a crash keeps what was done), reports
progress, and, for experiments that compare points of a group (memory's lowest peak), lets
the experiment set metrics across the group when its last point has run.

How a point runs is the executor's business. `local` runs one point at a time in this
process, an exception becoming an `error` or `oom` Result (sweep/result.py). Distributed
experiments run on `process_groups`: one process group per world size, spawned locally or
joined under torchrun, every rank running the same points in lock-step, rank 0 reporting
each Result as it finishes. A failed point ends its group: it is stored, and a fresh group
runs the points that remain; under torchrun the group cannot be rebuilt, so the failed
point is stored and the run ends with the failure.

Library code: nothing here prints (docs/architecture.md); the CLI passes a Progress that draws a bar.
Experiments never import the store: a sink is anything with `add`.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from cs336sys.measure.clock import now
from cs336sys.measure.progress import step_done
from cs336sys.parallel import launcher
from cs336sys.parallel.launcher import under_torchrun
from cs336sys.parallel.rank_results import WorkerError
from cs336sys.sweep import stopping
from cs336sys.sweep.declaration import Experiment
from cs336sys.sweep.points import point_key
from cs336sys.sweep.ranks import serve
from cs336sys.sweep.result import Result, guarded, is_oom, unwritten
from cs336sys.sweep.stopping import INTERRUPTED, Terminated, check


@dataclass
class Point:
    """A finished point: its spec, its Result, and what the sink returned for it (run id)."""

    spec: Any
    result: Result
    handle: Any = None


class Sink(Protocol):
    """Where finished points go. Optional: `done(experiment) -> set of point keys` stored
    ok (needed for resume) and `update(handle, result)` (metrics set across a group)."""

    def add(self, experiment: Experiment, spec: Any, result: Result) -> Any: ...


class Progress(Protocol):
    """What the runner reports; a Progress may also have `begin(spec)`, called before a
    point runs in this process. Steps inside a point arrive through measure/progress.py."""

    def start(self, experiment: Experiment, total: int) -> None: ...
    def resumed(self, skipped: int) -> None: ...
    def advance(self, point: Point) -> None: ...
    def finish(self) -> None: ...


class Quiet:
    """No progress at all (the default: library code shows nothing)."""

    def start(self, experiment: Experiment, total: int) -> None:
        pass

    def resumed(self, skipped: int) -> None:
        pass

    def advance(self, point: Point) -> None:
        pass

    def finish(self) -> None:
        pass


Skip = Callable[..., Result | None]  # skip(spec, announce=True)
Emit = Callable[[Any, Result], None]
Executor = Callable[[Experiment, list, Skip, Emit], None]


def run_sweep(
    experiment: Experiment,
    specs: Iterable[Any],
    sink: Sink | None = None,
    *,
    resume: bool = False,
    skip_after_oom: bool = True,
    progress: Progress | None = None,
    executor: Executor | None = None,
    force: bool = False,
) -> list[Point]:
    """Run every point of `specs` (Specs of `experiment`), hand each to `sink` as it
    finishes, and return the finished points in the order they finished. Where the
    experiment declares `estimate`, a point estimated not to fit in the device's free
    memory is stored as skipped with the estimate, not started, unless `force`."""
    progress = progress or Quiet()
    specs = list(specs)
    for spec in specs:  # before anything runs or is stored: a row of one kind under another
        if not isinstance(spec, experiment.spec):
            kinds = experiment.spec if isinstance(experiment.spec, tuple) else (experiment.spec,)
            raise TypeError(f"run_sweep({experiment.kind!r}) takes points of "
                            f"{' or '.join(k.__name__ for k in kinds)}, not "
                            f"{type(spec).__name__}: build them with that experiment's specs()")
    if resume:
        if sink is None or not hasattr(sink, "done"):
            raise ValueError("resume needs a sink that knows what it holds (a Recorder)")
        todo = not_done(experiment, specs, sink.done(experiment))
        if len(todo) < len(specs):
            progress.resumed(len(specs) - len(todo))
        specs = todo

    points: list[Point] = []
    oom_at: dict[str, Any] = {}  # the other settings -> smallest oom_axis value that OOM'd
    axis = experiment.oom_axis if skip_after_oom else None
    group_of = experiment.group_by if experiment.across is not None else None
    sizes = Counter(group_of(s) for s in specs) if group_of else Counter()
    groups: dict[Any, list[Point]] = {}

    def family(spec: Any) -> str:
        return point_key(experiment.kind, {k: v for k, v in spec.settings().items() if k != axis})

    begin = getattr(progress, "begin", None)  # optional: told which point runs next
    estimates = {id(s): experiment.estimate(s) for s in specs} if experiment.estimate else {}
    seconds = [e.seconds for s in specs if (e := estimates.get(id(s))) and e.seconds is not None
               and (force or not e.refusal(s))]  # the points that will run
    if seconds and hasattr(progress, "estimated"):
        progress.estimated(sum(seconds), len(specs))

    def skip(spec: Any, announce: bool = True) -> Result | None:
        """What to store instead of running `spec` (None: run it); asked just before (with
        `announce`, the progress is told that it runs next)."""
        if begin is not None and announce:
            begin(spec)
        estimate = estimates.get(id(spec))
        why = None if estimate is None or force else estimate.refusal(spec)
        if why:
            return Result("skipped", error=f"skipped: {why}", metrics=estimate.metrics())
        if axis is None:
            return None
        smallest = oom_at.get(family(spec))
        value = spec.settings()[axis]
        if smallest is None or value <= smallest:
            return None
        return Result("skipped", error=f"skipped: {axis} {smallest} ran out of memory with the "
                                       "same other settings (--no-skip-after-oom runs it)")

    def emit(spec: Any, result: Result) -> None:
        if result.started is None:
            result.started = now()
        if id(spec) in estimates:  # stored beside the measurement
            for k, v in estimates[id(spec)].metrics().items():
                result.metrics.setdefault(k, v)
        handle = sink.add(experiment, spec, result) if sink is not None else None
        point = Point(spec, result, handle)
        points.append(point)
        if axis is not None and result.status == "oom":
            value = spec.settings()[axis]
            key = family(spec)
            oom_at[key] = min(value, oom_at.get(key, value))
        if group_of is not None:
            _across(experiment, sink, groups.setdefault(group_of(spec), []), point,
                    sizes[group_of(spec)])
        progress.advance(point)

    run = executor or (process_groups if experiment.distributed else local)
    if executor is None and experiment.run_on_ranks is not None:
        run = both_ways
    progress.start(experiment, len(specs))
    try:
        run(experiment, specs, skip, emit)
    finally:
        progress.finish()
    return points


def _across(experiment: Experiment, sink: Any, group: list[Point], point: Point, size: int) -> None:
    """Once the group's last point has run, let the experiment set metrics across it, and
    give the sink the results whose metrics changed."""
    group.append(point)
    if len(group) < size:
        return
    before = [copy.deepcopy(p.result.metrics) for p in group]
    experiment.across([(p.spec, p.result) for p in group])
    for p, old in zip(group, before, strict=True):
        if p.result.metrics != old and sink is not None and hasattr(sink, "update"):
            sink.update(p.handle, p.result)


# -- executors --------------------------------------------------------------------------------


def both_ways(experiment: Experiment, specs: list, skip: Skip, emit: Emit) -> None:
    """The points of one world size in this process (`local`), those of several on process
    groups (`experiment.run_on_ranks`), each run of consecutive points as it comes."""
    on_ranks = dataclasses.replace(experiment, run=experiment.run_on_ranks, distributed=True)
    for ranked, run in itertools.groupby(specs, key=lambda s: s.world_size > 1):
        if ranked:
            process_groups(on_ranks, list(run), skip, emit)
        else:
            local(experiment, list(run), skip, emit)


def not_done(experiment: Experiment, specs: list, done: set[str]) -> list:
    """The points of `specs` --resume measures: those whose key is not in `done`, the keys
    stored ok by this code on this machine (Store.done_points)."""
    return [s for s in specs if point_key(experiment.kind, s.settings()) not in done]


def local(experiment: Experiment, specs: list, skip: Skip, emit: Emit) -> None:
    """One point at a time, in this process; `experiment.run(spec)`. Points that split
    into rounds run in interleaved rounds (`in_rounds`)."""
    if experiment.split is not None and any(len(experiment.split(s)) > 1 for s in specs):
        in_rounds(experiment, specs, skip, emit)
        return
    for spec in specs:
        check()  # a Ctrl-C that an import swallowed stops the sweep here (sweep/stopping.py)
        started, t0 = now(), time.perf_counter()
        try:
            result = skip(spec) or guarded(experiment.run, spec)
        except Terminated as exc:  # the interrupted point is stored, then the sweep ends
            emit(spec, Result("error", error=str(exc), started=started,
                              duration_s=time.perf_counter() - t0))
            raise
        result.started = result.started or started
        if result.duration_s is None:  # a skipped point: the time it took to decide so
            result.duration_s = time.perf_counter() - t0
        emit(spec, result)


def in_rounds(experiment: Experiment, specs: list, skip: Skip, emit: Emit) -> None:
    """Round 1 of every point, then round 2 of every point in reverse order, ...: each round
    runs the spec `experiment.split` gives for it, and once a point's last round has run
    its Results are merged (`experiment.merge`) and emitted. A round that is not ok (oom,
    error) is the point's result and ends its rounds. Stopped by a signal (Ctrl-C too), the
    points with rounds done are merged and emitted from what they have, those short of their
    rounds as errors that keep their samples (`short_of_rounds`: --resume measures them
    again); under SIGTERM an interrupted point with no round done is stored as an error."""
    plan = [experiment.split(s) for s in specs]
    done: dict[int, list[Result]] = {}
    ended: set[int] = set()
    order = list(enumerate(zip(specs, plan, strict=True)))
    for round_ in range(max(len(rounds) for rounds in plan)):
        # every other round in reverse (A B, B A): what a point's place in a round does to
        # it (the caches the point before it left) falls on each point alike, not always
        # on the same one, where the rounds' interval (report/intervals.py) would read it
        # as a steady difference
        for i, (spec, rounds) in order if round_ % 2 == 0 else reversed(order):
            if i in ended or round_ >= len(rounds):
                continue
            one = rounds[round_]
            check()
            started, t0 = now(), time.perf_counter()
            try:
                decided = skip(spec) if round_ == 0 else None
                result = decided or guarded(experiment.run, one)
            except (Terminated, KeyboardInterrupt) as exc:
                for j, results in done.items():  # the interrupted point too, if it has any
                    if j not in ended and results:
                        emit(specs[j], short_of_rounds(experiment.merge(specs[j], results),
                                                       len(plan[j]), exc))
                if isinstance(exc, Terminated) and not done.get(i):
                    emit(spec, Result("error", error=str(exc), started=started,
                                      duration_s=time.perf_counter() - t0))
                raise
            result.started = result.started or started
            if result.duration_s is None:
                result.duration_s = time.perf_counter() - t0
            if decided is not None or result.status not in ("ok", "wrong"):
                ended.add(i)
                emit(spec, result)
                continue
            done.setdefault(i, []).append(result)
            if round_ == len(rounds) - 1:
                ended.add(i)
                emit(spec, experiment.merge(spec, done[i]))


def short_of_rounds(result: Result, rounds: int, stop: BaseException) -> Result:
    """A point a signal stopped before its last round: an error that keeps what its rounds
    measured. Stored ok, its third of the samples passed for the point, and --resume, which
    measures what is not ok, skipped it."""
    done = result.metrics.get("rounds_done", rounds)
    if done >= rounds or result.status != "ok":
        return result
    why = str(stop) if isinstance(stop, Terminated) else INTERRUPTED
    return dataclasses.replace(result, status="error", error=(
        f"{why} after {done} of its {rounds} rounds: the samples are those rounds' alone; "
        "--resume measures the point again"))


def process_groups(experiment: Experiment, specs: list, skip: Skip, emit: Emit) -> None:
    """`experiment.run(ctx, spec)` on every rank of one process group per world size and
    backend (the specs' `world_size` and `backend`), rank 0's Results emitted as they
    finish."""
    by_world: dict[tuple[int, str], list] = {}
    for spec in specs:
        by_world.setdefault((spec.world_size, spec.backend), []).append(spec)
    for (world, _), group in by_world.items():
        todo = []
        for spec in group:
            decided = skip(spec, announce=False)  # a refused point is not started on every rank
            if decided is not None:
                emit(spec, decided)
            else:
                todo.append(spec)
        while todo:
            check()  # as in `local`: before ranks start
            finished: list[int] = []
            # when the point now running started: at the launch, then as each one finishes
            since = [now(), time.perf_counter()]

            def arrived(message: tuple, todo: list = todo, finished: list = finished,
                        since: list = since) -> None:
                if message[0] == "step":  # rank 0 is so far into a point
                    _, index, done, total = message
                    step_done(done, total, todo[index])
                    return
                index, result = message
                finished.append(index)
                since[:] = [now(), time.perf_counter()]
                emit(todo[index], result)

            def failure(status: str, text: str, since: list = since) -> Result:
                return Result(status, error=text, started=since[0],
                              duration_s=time.perf_counter() - since[1])

            try:
                launcher.launch(serve, world, todo[0].backend, args=(todo, experiment.run),
                       on_emit=arrived, preload=experiment.rank_preload)
                todo = []
            except Terminated as exc:  # the ranks are reaped; store the point, then end
                if len(finished) < len(todo):  # (none is running once the last has finished)
                    emit(todo[len(finished)], failure("error", str(exc)))
                raise
            except WorkerError as exc:
                if len(finished) == len(todo):  # every point stored; a rank failed after them
                    warnings.warn(f"a rank failed after the last point was stored: {exc}",
                                  RuntimeWarning, stacklevel=2)
                    break
                failed = todo[len(finished)]
                if exc.status == "skipped":  # the user's stub, raised on a rank
                    emit(failed, failure("skipped", f"not implemented: {exc.message}"))
                else:  # (a rank's status says an out-of-memory its text may not)
                    oom = exc.status == "oom" or is_oom(exc)
                    emit(failed, failure("oom" if oom else "error",
                                         f"{exc}\n{exc.traceback}".strip()))
                todo = todo[len(finished) + 1 :]
            except BaseException as exc:
                # under torchrun this rank's failure raises here: an Exception, or another
                # the user's code raised (serve marks it), but a signal's stop
                theirs = isinstance(exc, Exception) or bool(
                    getattr(exc, "cs336sys_where", None) and not stopping.is_stop(exc))
                if not under_torchrun() or not theirs:
                    raise
                # torchrun's group cannot be rebuilt without the failed rank: store the point
                # it failed on, then end the run with the failure.
                failed = todo[len(finished)]
                text = f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}".strip()
                if unwritten(exc):  # the user's stub, raised here (sweep/ranks.serve marks it)
                    text = f"not implemented: {exc.cs336sys_where}: {type(exc).__name__}: {exc}"
                    emit(failed, failure("skipped", text))
                else:
                    emit(failed, failure("oom" if is_oom(exc) else "error", text))
                if isinstance(exc, Exception):
                    raise
                # not a stop (exit 130, "--resume", which stopped there again): a failure
                raise RuntimeError(f"your code raised {type(exc).__name__} on this rank; "
                                   "the point is stored as its error") from exc
