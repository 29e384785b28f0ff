"""Plumbing shared by the subcommands: the --db option, user errors, recording an
invocation and its runs, sweep progress, and table output.

Nothing here imports torch; commands import heavy modules inside their bodies.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from cs336sys.bench.sweep import split_list

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


def choices(
    values: Sequence[str] | None, allowed: Sequence[str], option: str, default: Sequence[str] = ()
) -> list[str]:
    """Split a list option and check every value is one of `allowed`."""
    out = split_list(values) or list(default)
    for v in out:
        if v not in allowed:
            fail(f"{option}: unknown value {v!r}; choose from {', '.join(allowed)}")
    return out


def positive_ints(
    values: Sequence[str] | None, option: str, default: Sequence[int] = ()
) -> list[int]:
    """Split a list option of positive integers (`--context-length 128,256`)."""
    items = split_list(values)
    if not items:
        return list(default)
    out = []
    for v in items:
        try:
            n = int(v)
        except ValueError:
            fail(f"{option}: {v!r} is not an integer")
        if n <= 0:
            fail(f"{option} must be positive, got {n}")
        out.append(n)
    return out


def check_db(db: Path) -> None:
    """Refuse a --db path that exists but is not a SQLite database, before any work."""
    from cs336sys.store.db import StoreError, check_path

    try:
        check_path(db)
    except StoreError as exc:
        fail(exc)


def check_triton(on_cuda: bool, option: str) -> None:
    """Refuse the Triton kernels where they cannot run, before anything is written."""
    import importlib.util
    import os

    if importlib.util.find_spec("triton") is None:
        fail(f"{option} needs the triton package (pip install triton)")
    interpreting = os.environ.get("TRITON_INTERPRET") == "1"
    if not on_cuda and not interpreting:
        fail(f"{option} needs CUDA, or TRITON_INTERPRET=1 to run the kernels in Triton's "
             "interpreter on CPU (slow; rows are marked interpreted)")  # fmt: skip
    if on_cuda and interpreting:
        fail(
            "TRITON_INTERPRET=1 runs Triton kernels on CPU tensors only: unset it, or pass --device cpu"
        )


class Recorder:
    """One CLI invocation in the store: its provenance row and a row per finished point."""

    def __init__(self, store: Any, invocation_id: str, provenance: dict[str, Any]):
        self.store = store
        self.invocation_id = invocation_id
        self.provenance = provenance
        self.errors = 0

    def pending(self, experiment: str, specs: list, resume: bool) -> list:
        """The specs still to run: with --resume, those not stored ok for this git commit."""
        if not resume:
            return specs
        from cs336sys.store.db import point_key

        done = self.store.done_points(experiment, self.provenance.get("git_commit"))
        todo = [s for s in specs if point_key(experiment, s.settings()) not in done]
        if len(todo) < len(specs):
            typer.echo(
                f"--resume: skipping {len(specs) - len(todo)} point(s) already stored", err=True
            )
        return todo

    def add(self, experiment: str, settings: dict[str, Any], result: Any, started: str) -> str:
        if result.status == "error":
            self.errors += 1
            typer.echo(f"\nerror at {_brief(settings)}: {result.error.splitlines()[0]}", err=True)
        return self.store.add_run(
            self.invocation_id,
            experiment,
            result.status,
            settings,
            metrics=result.metrics,
            samples=result.samples,
            error=result.error,
            started=started,
            duration_s=result.duration_s,
        )

    def add_kernel_stats(self, run_id: str, rows: list[dict[str, Any]]) -> None:
        """Store a profiled run's op/kernel summary rows (table kernel_stats)."""
        if rows:
            self.store.add_kernel_stats(run_id, rows)


@contextmanager
def recording(db: Path, command: str, device: str) -> Iterator[Recorder]:
    """Open the store, write the invocation row, and always record how it ended."""
    from cs336sys.bench.provenance import collect
    from cs336sys.store.db import Store, StoreError

    provenance = collect(device)
    try:
        store = Store(db)
    except StoreError as exc:
        fail(exc)
    inv = store.begin_invocation(provenance, ["cs336sys", *sys.argv[1:]], command)
    rec = Recorder(store, inv, provenance)
    status = 1
    try:
        yield rec
        status = 1 if rec.errors else 0
    except KeyboardInterrupt:
        status = 130
        raise
    except typer.Exit as exc:
        status = exc.exit_code
        raise
    finally:
        store.finish_invocation(inv, status)
        store.close()


def progress(items: Sequence[Any], label: str, show: Any = None) -> Iterator[Any]:
    """Iterate a sweep with a progress bar on stderr (stdout stays clean for tables)."""
    with typer.progressbar(
        items,
        label=label,
        file=sys.stderr,
        show_pos=True,
        item_show_func=(lambda it: show(it) if it is not None and show else None),
    ) as bar:
        yield from bar


def _brief(settings: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in settings.items() if k not in ("device", "seed"))


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
