"""Plumbing shared by the subcommands: the --db option, user errors, the store recorder as
a sweep's sink, a progress bar, and the table printed when a sweep ends.

A command that measures reads: options -> `exp.specs(...)` inside `user_errors()` ->
`run_sweep` inside `recording(...)` -> `show(...)`. Nothing here imports torch; commands
import heavy modules inside their bodies.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

DEFAULT_DB = Path("db/results.db")

DbOption = Annotated[
    Path,
    typer.Option(
        "--db",
        envvar="CS336SYS_DB",
        help="SQLite results store (or set CS336SYS_DB).",
        dir_okay=False,
    ),
]


def fail(message: object) -> NoReturn:
    """Bad input: one clear line on stderr, exit code 2 (nothing has been written yet)."""
    typer.echo(f"Error: {message}", err=True)
    raise typer.Exit(2)


@contextmanager
def user_errors() -> Iterator[None]:
    """Turn the library's SpecError (an option it cannot use) into one line and exit 2."""
    from cs336sys.bench.sweep import SpecError

    try:
        yield
    except SpecError as exc:
        fail(exc)


def choices(
    values: Sequence[str] | None, allowed: Sequence[str], option: str, default: Sequence[str] = ()
) -> list[str]:
    """Split a list option and check every value is one of `allowed` (exit 2 if not)."""
    from cs336sys.bench.sweep import choices as checked

    with user_errors():
        return checked(values, allowed, option, default)


def check_db(db: Path) -> None:
    """Refuse a --db path that exists but is not a SQLite database, before any work."""
    from cs336sys.store.db import StoreError, check_path

    try:
        check_path(db)
    except StoreError as exc:
        fail(exc)


class NullSink:
    """The sink of ranks other than 0 under torchrun: they measure but never write."""

    errors = 0

    def add(self, *args: Any) -> None:
        return None


@contextmanager
def recording(db: Path, command: str, device: str, rank: int | None = None) -> Iterator[Any]:
    """The store's Recorder for this invocation, as the sweep's sink; records how the
    command ended, and ends it with exit code 1 when a point was stored as `error`.
    Under torchrun (`rank` given) only rank 0 writes."""
    if rank:
        sink = NullSink()
        yield sink
        return
    from cs336sys.bench.result import Terminated
    from cs336sys.store.db import StoreError
    from cs336sys.store.recorder import Recorder

    try:
        rec = Recorder(db, command, device=device, argv=["cs336sys", *sys.argv[1:]])
    except StoreError as exc:
        fail(exc)
    status = 1
    try:
        yield rec
        status = 1 if rec.errors else 0
    except KeyboardInterrupt:
        status = 130
        raise
    except Terminated:
        status = 143  # 128 + SIGTERM, as a shell reports it
        raise
    except typer.Exit as exc:
        status = exc.exit_code
        raise
    finally:
        rec.close(status)
    if rec.errors:
        raise typer.Exit(1)


class Bar:
    """The sweep runner's progress, as a bar on stderr (stdout stays clean for tables)."""

    def __init__(self, label: str, show: Callable[[Any], str] | None = None, on: bool = True):
        self.label, self.show, self.on = label, show, on
        self.bar: Any = None

    def start(self, experiment: Any, total: int) -> None:
        if self.on:
            self.bar = typer.progressbar(
                length=total, label=self.label, file=sys.stderr, show_pos=True,
                item_show_func=lambda spec: self.show(spec) if spec is not None and self.show else None,
            )  # fmt: skip
            self.bar.__enter__()

    def resumed(self, skipped: int) -> None:
        typer.echo(f"--resume: skipping {skipped} point(s) already stored", err=True)

    def advance(self, point: Any) -> None:
        result = point.result
        if result.status == "error" and self.on:
            brief = " ".join(f"{k}={v}" for k, v in point.spec.settings().items()
                             if k not in ("device", "seed"))  # fmt: skip
            typer.echo(f"\nerror at {brief}: {result.error.splitlines()[0]}", err=True)
        if self.bar is not None:
            self.bar.current_item = point.spec  # shown by item_show_func
            self.bar.update(1)

    def finish(self) -> None:
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
            self.bar = None


def show(experiment: Any, points: Iterable[Any]) -> None:
    """Print the experiment's declared tables over the finished points."""
    from cs336sys.report.tables import as_text, point_tables, row_of

    rows = [row_of(p.spec, p.result) for p in points]
    typer.echo(as_text(point_tables(experiment.tables, rows, status=True)))


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
