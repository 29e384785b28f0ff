"""Plumbing shared by the subcommands: the --db option, user errors, the store recorder as
a sweep's sink, and the table printed when a sweep ends (the progress bar is
cli/progress_bar.py).

A command that measures is one call, `run_experiment(EXPERIMENT, specs, locals())`: its
options -> the experiment's `specs(...)` -> `run_sweep` into the store -> the printed tables.
Nothing here imports torch; commands import heavy modules inside their bodies.
"""

from __future__ import annotations

import os
import sqlite3
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext, suppress
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from cs336sys.cli.nsys import NsysRefused, record, under_nsys
from cs336sys.cli.progress_bar import Bar
from cs336sys.experiments import catalog as kinds
from cs336sys.measure.environ import kept
from cs336sys.measure.landing import held
from cs336sys.measure.units import format_duration
from cs336sys.sweep import stopping
from cs336sys.sweep.points import SpecError, distinct
from cs336sys.sweep.points import choices as checked

# Stands for "not given": resolved by `_default_store` when the command runs, so that the
# store is found from the folder the user stands in (measure/paths.py, default_store).
DEFAULT_DB = Path("db/results.db")


def given(ctx: typer.Context, name: str) -> bool:
    """Whether the command's option `name` was given (typed, or from its variable), not
    left at its default."""
    source = ctx.get_parameter_source(name)
    # By name: typer may bring its own copy of click, whose ParameterSource is another enum.
    return source is not None and getattr(source, "name", "") not in ("DEFAULT", "DEFAULT_MAP")


def _default_store(ctx: typer.Context, param: typer.CallbackParam, value: Path) -> Path:
    """--db as given, CS336SYS_DB, else db/results.db at the top of this git checkout (or the
    user's data folder outside one)."""
    from cs336sys.measure.paths import default_store

    if not given(ctx, param.name):
        return default_store()
    if not value.name.strip():  # ' ' (a pasted blank, an empty CS336SYS_DB='  ') made a store
        fail("--db: empty value; give a file name, or leave --db (and CS336SYS_DB) out for "
             "the default store")
    return value.expanduser()  # CS336SYS_DB='~/x.db' made a folder named `~` here


DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        envvar="CS336SYS_DB",
        help="SQLite results store (or set CS336SYS_DB).",
        callback=_default_store,
        show_default="db/results.db at the top of this git checkout, else "
        "results.db in the user data folder",
    ),
]


def catalog() -> Any:
    """Every experiment's declaration (experiments/catalog.py), imported when first needed,
    so that `--help` imports no experiment."""
    return kinds.EXPERIMENTS


# Option -> the spelling the user typed for it on this command line (`--attention` ->
# `--impl`): set by the root group (cli.Root) as it parses.
TYPED: dict[str, str] = {}


def as_typed(message: str) -> str:
    """`message` with the option it starts with named as the user typed it."""
    name = message.split(":", 1)[0].split(" ", 1)[0]
    typed = TYPED.get(name)
    return typed + message[len(name):] if typed else message


def fail(message: object) -> NoReturn:
    """Bad input: one clear line on stderr, exit code 2 (nothing has been written yet)."""
    typer.echo(f"Error: {as_typed(str(message))}", err=True)
    raise typer.Exit(2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's SpecError (an option it cannot use) into one line and exit 2."""
    try:
        yield
    except SpecError as exc:
        fail(exc)


def user_code(adapters: Path | None) -> None:
    """Decide the adapters file before the specs are built: --adapters (or
    CS336SYS_ADAPTERS), else tests/adapters.py at the top of this checkout. A path that
    does not exist or a file that does not parse is one line and exit 2; so is a file named
    with --adapters that does not import (docs/yours.md: one found, not named, stops only
    what asks for its implementations)."""
    from cs336sys import yours

    try:
        found = yours.use(adapters)
        if adapters is not None and found is not None:
            _ = found.module  # (imported once: what asks for it later takes this one)
    except yours.AdaptersError as exc:
        fail(exc)


def announce_user_code(given: bool = False) -> None:
    """One line on stderr naming the adapters file and what it implements, once one of its
    implementations is in the sweep (or it was named with --adapters)."""
    from cs336sys import yours

    found = yours.engaged() or (yours.active() if given else None)
    if found is not None:
        typer.echo(found.summary(), err=True)


def choices(
    values: Sequence[str] | None, allowed: Sequence[str], option: str, default: Sequence[str] = ()
) -> list[str]:
    """Split a list option and check every value is one of `allowed` (exit 2 if not)."""
    with user_errors():
        return checked(values, allowed, option, default)


def check_db(db: Path) -> None:
    """Refuse a --db path that cannot take this command's rows, before any work."""
    from cs336sys.store.db import StoreError, check_path

    try:
        check_path(db, writing=True)
    except StoreError as exc:
        fail(exc)


# Measured on this project's 2-core CI box (a Xeon with AVX512-BF16 but no AVX512-FP16):
# `cs336sys model --size tiny --precision fp32,fp16 --device cpu`, median step time, fp16
# emulated via float32 took 30.6x fp32's (benchmarks/emulated_precision.py measures it again).
EMULATED_SLOWDOWN = 30


def emulated(device: str, precisions: Iterable[str]) -> None:
    """One line on stderr for each 16-bit precision this CPU only emulates: such a sweep
    is not stuck, it is slow (bf16 on a CPU without AVX512-BF16 ran 18 minutes)."""
    if not device.startswith("cpu"):
        return
    from cs336sys.experiments.precision import native_support

    for dtype in dict.fromkeys(p for p in precisions if p in ("bf16", "fp16")):
        native, why = native_support("cpu", dtype)
        if native is False:
            typer.echo(f"warning: {dtype} is emulated on this CPU ({why}); expect each step "
                       f"to take about {EMULATED_SLOWDOWN}x as long as in fp32", err=True)


def oversubscribed(specs: Iterable[Any]) -> None:
    """One line on stderr when Gloo ranks outnumber the cores this process may use: the
    ranks then share cores and the times measure that contention too."""
    import os

    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    worlds = sorted({s.world_size for s in specs if s.backend == "gloo" and s.world_size > cores})
    if worlds:
        typer.echo(f"warning: --world-size {','.join(map(str, worlds))} runs more ranks than "
                   f"the {cores} CPU core(s) here: ranks share cores, so times include that "
                   "contention", err=True)


class NullSink:
    """The sink of ranks other than 0 under torchrun: they measure but never write."""

    errors = 0

    def add(self, *args: Any) -> None:
        return None


STOPPED_BUSY_S = 2.0  # how long a stopped command waits to record its end


@contextmanager
def recording(
    db: Path, command: str, device: str, rank: int | None = None, label: str | None = None
) -> Iterator[Any]:
    """The store's Recorder for this invocation, as the sweep's sink; records how the
    command ended, names the store on stderr at the end (after Ctrl-C: how many points it
    holds and how to go on), and ends with exit code 1 when a point was stored as `error`.
    Under torchrun (`rank` given) only rank 0 writes."""
    if rank:
        sink = NullSink()
        yield sink
        return
    from cs336sys.store.db import StoreError
    from cs336sys.store.recorder import Recorder

    try:
        rec = Recorder(db, command, device=device, argv=["cs336sys", *sys.argv[1:]], label=label,
                       experiments=catalog())
    except StoreError as exc:
        fail(exc)
    status = 1

    def stopped(why: str) -> None:
        typer.echo(f"\n{why}: {rec.added} point(s) stored in {db}; run the same command with "
                   "--resume to measure the rest", err=True)
        stopping.told()

    try:
        try:
            yield rec
        except Exception:
            if stopping.pending() is None:
                raise
            # after a Ctrl-C an import swallowed, a later import fails (sweep/stopping.py):
            # the stop is the signal's, and ends as it does below
            stopping.check()
        status = 1 if rec.errors else 0
    except KeyboardInterrupt:
        status = 130
        stopped("Interrupted")
        raise typer.Exit(130) from None  # not click's "Aborted!" with exit code 1
    except stopping.Terminated as exc:
        status = stopping.exit_code()  # 143 or 129, as a shell reports it
        stopped(str(exc))
        raise
    except typer.Exit as exc:
        status = exc.exit_code
        raise
    except sqlite3.Error as exc:  # a point could not be written: a full disk, an I/O error
        typer.echo(f"Error: cannot write to {db}: {exc} (is its disk full?); {rec.added} "
                   "point(s) stored before; run the same command with --resume to measure the "
                   "rest", err=True)
        raise typer.Exit(1) from None
    finally:
        with held():  # a signal from here on ends the command with the line below
            with suppress(sqlite3.Error):  # a store that cannot be written: its end unrecorded
                # stopped, it does not wait a minute, signals held, for a lock another
                # program keeps (a SQLite browser's): the end goes unrecorded instead
                rec.close(status, busy_s=STOPPED_BUSY_S if status in stopping.EXIT_CODES else None)
            global _points_stored
            _points_stored += rec.added
            line = f"{rec.added} point(s) stored in {db} (invocation {rec.invocation_id[:8]})"
            stopping.stored(line)
    typer.echo(line, err=True)
    if rec.errors:
        raise typer.Exit(1)


_points_stored = 0  # points stored by every command this process ran (handout run runs several)


def stored_here() -> int:
    """How many points the commands this process ran have stored, so far."""
    return _points_stored


def cannot_write(out: Path, exc: OSError) -> NoReturn:
    """Exit 2 for an output that could not be written, naming the path that refused (a
    report's `report.html` that is a folder, its `report_files` that is a file)."""
    where = exc.filename2 or exc.filename
    named = f": {where}" if where and Path(where).name[:1] != "." else ""  # not a staged name
    fail(f"--out {out}: cannot write there ({exc.strerror or exc}{named})")


def wrote(paths: list[Path]) -> None:
    """Files a command has written (a report, a writeup): the line a Ctrl-C or SIGTERM that
    comes after them ends the command with, `Interrupted: wrote PATH and N more file(s)`."""
    more = f" and {len(paths) - 1} more file(s)" if len(paths) > 1 else ""
    stopping.stored(f"wrote {paths[0]}{more}" if paths else "wrote no file")


def terminal_width() -> int:
    """$COLUMNS, else the terminal's width, else 80."""
    import shutil

    return shutil.get_terminal_size((80, 24)).columns


def say(text: str, indent: str = "", then: str | None = None) -> None:
    """Prose to stdout in lines that fit the terminal (`terminal_width`), broken at spaces,
    never inside a word or a backquoted command, which is copied whole (tables.fill);
    `indent` leads the first line, `then` (else `indent`) the others."""
    from cs336sys.report.tables import fill

    typer.echo(fill(text, terminal_width(), indent, then))


def show(experiment: Any, points: Iterable[Any], wide: bool = False) -> None:
    """Print the experiment's declared tables over the finished points, then why each point
    that is not ok is so (skipped, error with its file and line, wrong with its figures).
    The settings every row shares are one line above a table and a table wider than the
    terminal is cut between columns; `wide` prints every column in one piece."""
    from cs336sys.report.sections import failures
    from cs336sys.report.tables import as_text, declared_tables, row_of

    rows = [row_of(p.spec, p.result) for p in points]
    for r, p in zip(rows, points, strict=True):
        r["error"] = p.result.error
    tables = declared_tables(experiment, rows, status=True, lift=0 if wide else 1)
    typer.echo(as_text(tables, width=None if wide else terminal_width()))
    for f in failures(rows):
        typer.echo(f"{f.status}: {f.point}: {f.why}")


def dry_run(experiment: Any, points: list, force: bool = False) -> str:
    """--dry-run's line: the points and their estimated time (experiments/preflight.py, for
    the experiments that estimate), those --force would run counted as run; nothing is
    measured or written."""
    if not points:  # --resume: all stored
        return "dry run: every point is stored ok already; nothing to measure"
    estimates = [(experiment.estimate(p), p) for p in points] if experiment.estimate else []
    # what the run would store skipped, by the same memory estimate, is no work to wait for
    # (the leaderboard's 8B on a laptop read as 28 days, and nothing said it would not run)
    judged = [(e, None if force else e.refusal(p)) for e, p in estimates if e is not None]
    refused = [why for _, why in judged if why]
    seconds = [e.seconds for e, why in judged if e.seconds is not None and not why]
    line = f"dry run: {len(points)} point(s)"
    if seconds:
        line += (f", estimated {format_duration(sum(seconds))} from their size and this device's speed"
                 + (f" ({len(seconds)} of them)" if len(seconds) < len(points) else ""))
    elif not refused:
        line += ", no time estimate for this experiment"
    if refused:
        line += f"; {len(refused)} would be skipped (the first {refused[0]})"
    return line + "; nothing measured"


def _not_stored(experiment: Any, points: list, db: Path, device: str,
                label: str | None) -> list:
    """The points --resume would measure, read from the store without writing to it (a dry
    run counts and estimates those, not every point)."""
    from cs336sys.measure.provenance import collect
    from cs336sys.store.db import StoreError, connect_readonly, done_points
    from cs336sys.sweep.runner import not_done

    if not db.exists():
        return points
    try:
        conn = connect_readonly(db)
        try:
            done = done_points(conn, experiment.kind, collect(device), label)
        finally:
            conn.close()
    except StoreError as exc:
        fail(exc)
    todo = not_done(experiment, points, done)
    if len(todo) < len(points):
        say(f"--resume: skipping {len(points) - len(todo)}/{len(points)} point(s) stored ok")
    return todo


def with_handout(specs: Callable[..., list], options: dict[str, Any]) -> list:
    """`specs(**options)` with size names read in the handout release `options` names
    (`--handout`, popped; the environment's or the newest where absent)."""
    from cs336sys.models.config import using_handout

    with using_handout(options.pop("handout", None)):
        return specs(**options)


def run_experiment(
    experiment: Any,
    specs: Callable[..., list],
    options: dict[str, Any],
    *,
    command: str | None = None,
    describe: Callable[[Any], str] | None = None,
    ranks: bool = False,
    starts_ranks: bool = False,
    emulation: bool = True,
    after: Callable[[list], None] | None = None,
    sink: Callable[[Any], AbstractContextManager[Any]] | None = None,
    recorded_device: str | None = None,
    shown: Callable[[list], None] | None = None,
    quiet: bool = False,
    **run_options: Any,
) -> None:
    """The one tail of every measuring command. `options` are the command's parameters (its
    `**options`, or `dict(locals())` taken first thing in its body): `db`, `resume`, `label`
    and `adapters` are the command's, every other one is a keyword of `specs`. In order:
    the adapters file is chosen; `specs(**options)` builds and validates the points (bad
    input: one line, exit 2, nothing written); with --nsys each point is run again under
    Nsight Systems instead (cli/nsys.py), and under it only its point is kept; the store is
    opened (a refusal: one line, exit 2); warnings (user code, emulated 16-bit dtypes,
    oversubscribed ranks); `run_sweep` stores each point as it finishes; the tables
    are printed (`shown(points)` instead, where given) and `after` sees the points. `ranks`:
    the points run on process groups, and under torchrun only rank 0 writes and prints;
    `starts_ranks`: these will (a distributed kind's always do), so the fork server starts
    first.
    `sink(recorder)`: a context that gives the sweep's sink in place of the recorder;
    `recorded_device`: the device the invocation is stored with, where its points have none
    (plan computes); `quiet`: no progress bar. `run_options` go to `run_sweep`."""
    from cs336sys.attention.opt_in import bad_variable
    from cs336sys.measure.compile_backend import backend_problem
    from cs336sys.parallel.launcher import start_method_problem
    from cs336sys.sweep.runner import run_sweep

    # the environment's switches by value: one line, exit 2 (a bad backend failed each point)
    for problem in (bad_variable(), backend_problem(), start_method_problem()):
        if problem:
            fail(problem)
    options = dict(options)
    db, resume, label = options.pop("db"), options.pop("resume", False), options.pop("label", None)
    wide, force = options.pop("wide", False), options.pop("force", False)
    dry, nsys = options.pop("dry_run", False), options.pop("nsys", False)
    takes_user_code = "adapters" in options
    adapters = options.pop("adapters", None)
    ctx = options.pop("ctx", None)
    rank = None
    if ranks:
        from cs336sys.sweep.ranks import torchrun_rank

        rank = torchrun_rank()
        if rank is not None and resume:
            # Ranks must run identical point lists; only rank 0 can read its store.
            fail("--resume is not supported under torchrun")
    # points that start ranks: their fork server imports torch beside this process
    early = nullcontext()
    if (experiment.distributed or starts_ranks) and not (dry or nsys):  # (none under torchrun)
        from cs336sys.parallel.launcher import started_early

        early = started_early(experiment.rank_preload)
    release = options.get("handout")
    with early, kept("CS336SYS_HANDOUT"):  # models/config.HANDOUT_ENV, read by the ranks too
        if takes_user_code:
            user_code(adapters)
        with user_errors():
            points = distinct(experiment.kind, with_handout(specs, options))
        if release is not None:  # the invocation's release, as `handout run` records it
            os.environ["CS336SYS_HANDOUT"] = str(release).strip()
        if not points:
            fail("nothing to measure: the options select no point")
        command = command or experiment.kind
        try:
            points = under_nsys(points)  # this process runs one point for --nsys
            if nsys:
                check_db(db)  # before any nsys run, whose rows go there
                raise typer.Exit(record(ctx, points, command, describe, ranks=ranks, dry=dry))
        except NsysRefused as exc:
            fail(exc)
        # the device the invocation measured on: a GPU if any point ran there (comm's gloo,nccl)
        device = recorded_device or next(
            (p.device for p in points if str(getattr(p, "device", "")).startswith("cuda")),
            getattr(points[0], "device", "cpu"))  # a new kind's Spec may have no device
        if dry:
            if resume:
                points = _not_stored(experiment, points, db, device, label)
            say(dry_run(experiment, points, force))
            return
        # a process group's invocation is stored with rank 0's device
        stored_on = ("cuda:0" if device == "cuda" else "cpu") if ranks else device
        # opening the store checks --db first: a refusal is its one line, before any warning
        with recording(db, command, stored_on, rank, label=label) as rec, \
                (sink or nullcontext)(rec) as target:
            if not rank:
                if takes_user_code:
                    announce_user_code(adapters is not None)
                if ranks:
                    oversubscribed(points)
                if emulation:
                    emulated(device, [s.precision for s in points if hasattr(s, "precision")])
            done = run_sweep(experiment, points, target, resume=resume, force=force,
                             progress=Bar(command, describe, on=not (rank or quiet)), **run_options)
            if not rank:
                if shown is not None:
                    shown(done)
                else:
                    show(experiment, done, wide)
                if after is not None:
                    after(done)


def table(rows: Iterable[Sequence[Any]], headers: Sequence[str], numparse: bool = True) -> str:
    """Aligned text table; numparse=False keeps pre-formatted cells exactly as given."""
    from tabulate import tabulate

    return tabulate(
        list(rows),
        headers=list(headers),
        tablefmt="simple",
        missingval="",
        disable_numparse=not numparse,
    )
