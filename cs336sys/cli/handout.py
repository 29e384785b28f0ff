"""`cs336sys handout`: the assignment's problems with their status in the store and the
commands that answer them; `handout run` runs those commands, `handout report` writes the
writeup starter (handout/)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    catalog,
    check_db,
    choices,
    fail,
    given,
    say,
    stored_here,
    user_code,
    user_errors,
    wrote,
)
from cs336sys.cli.handout_todo import typed_line, without_triton, without_unfinished
from cs336sys.cli.options import Adapters, Replace, list_option, option
from cs336sys.cli.vocabulary import command_at, command_path
from cs336sys.measure.environ import environ
from cs336sys.sweep import stopping

handout_app = typer.Typer(name="handout", add_completion=False, pretty_exceptions_enable=False)

Year = option("The handout release: 2026 or 2025 (or set CS336SYS_HANDOUT).", str | None,
              "--year", envvar="CS336SYS_HANDOUT", show_default="2026")
Names = Annotated[list[str] | None, typer.Argument(
    help="Problems, as the handout names them (benchmarking_script, flash_benchmarking, ...).",
    show_default=False, metavar="[PROBLEM]...")]


def _on_gpu() -> bool:
    """Whether this machine has an NVIDIA GPU (nvidia-smi, without importing torch)."""
    from cs336sys.measure.provenance import smi_gpus

    return bool(smi_gpus())


def _problems(names: list[str] | None, year: str | None) -> list:
    """The problems named (every one of the release without names); exit 2 for an unknown
    name or release."""
    from cs336sys.handout import named, problems

    with user_errors():
        return named(names, year) if names else list(problems(year))


def _commands(problem: Any, on_gpu: bool, yours: bool = False) -> list[list[str]]:
    """The argument lists of a problem's runs on this machine (its check, with --yours, for
    an implementation)."""
    if problem.kind == "implement":  # the check's words after `cs336sys`
        return [shlex.split(check)[1:] for check in problem.checks] if yours else []
    found = (run.args(on_gpu, yours) for run in problem.runs)
    return [args for args in found if args is not None]


def _statuses(db: Path, problems: list, release: str) -> tuple[list, Any]:
    """Each problem's status in the handout `release`, and the runs per experiment that carry
    no problem's label; a store that does not exist holds none (one that cannot be read is
    one line and exit 2). An empty file, or a SQLite file without tables (what a first
    command interrupted leaves), is a store that holds none yet."""
    from cs336sys.handout.status import statuses, unlabelled
    from cs336sys.store.db import StoreError, connect_readonly, no_tables
    from cs336sys.store.guard import check_path

    try:  # (`:memory:`, which exists as no file, read as no store)
        conn = connect_readonly(db, catalog) if check_path(db).exists() else None
    except StoreError as exc:
        fail(exc)
    if conn is not None and no_tables(conn):
        conn.close()
        conn = None
    if conn is None:
        return statuses(None, problems), unlabelled(None, problems)
    try:
        return statuses(conn, problems, release), unlabelled(conn, problems)
    finally:
        conn.close()


def _or_group(ctx: Any, name: str, value: Any) -> Any:
    """The subcommand's `name`, else the one given to `handout` before it: `cs336sys handout
    --year 2025 run ...` runs the 2025 problems (they fell back to 2026), `handout --db X
    report` reads X."""
    parent = ctx.parent
    if not given(ctx, name) and parent is not None and given(parent, name):
        return parent.params[name]
    return value


def _again(year: str | None, db: Path) -> str:
    """The options a printed `cs336sys handout ...` line needs to mean this release and store."""
    return (f" --year {year}" if year else "") + (f" --db {db}" if db != DEFAULT_DB else "")


@handout_app.callback(invoke_without_command=True)
def handout(ctx: typer.Context, year: Year = None, db: DbOption = DEFAULT_DB) -> None:
    """Every problem of the assignment's handout with its points, what it asks to measure,
    its status in this store, and the commands that answer it on this machine (those of
    `handout run --yours` where the store holds your code's runs of it).

    A problem's runs are the invocations labelled with its name: `handout run` labels them
    so. The 2026 release has 27 problems, the 2025 one 21 (--year 2025).

    Example:

        cs336sys handout

        cs336sys handout --year 2025

        cs336sys handout run benchmarking_script memory_profiling

        cs336sys handout report --format md,tex,typst --out writeup/
    """
    if ctx.invoked_subcommand is not None:
        return
    from cs336sys.handout import problems
    from cs336sys.handout.problem import CPU_NOTE, GPU_NOTE, IMPLEMENT
    from cs336sys.handout.status import in_words
    from cs336sys.models.config import HANDOUT_ENV, HANDOUTS
    from cs336sys.models.config import handout as release

    with user_errors():
        every = list(problems(year))
        chosen = year or release()
    on_gpu = _on_gpu()
    # Prose fits the terminal, each line after the first indented under its problem; a
    # command stays whole on a `  $ ` line of its own, to be copied.
    say(f"CS336 assignment 2, {chosen} handout: {len(every)} problems, "
        f"{sum(p.points for p in every)} points; commands {GPU_NOTE if on_gpu else CPU_NOTE}.",
        then="  ")
    typer.echo()
    found, others = _statuses(db, every, chosen)
    if others:  # measured by hand: they answer no problem until labelled
        say(f"{in_words(others)} in this store count for no problem: a problem's runs are "
            f"those labelled with its name (`handout run` labels them; by hand, give `--label "
            f"PROBLEM`).", then="  ")
        typer.echo()
    for status in found:
        p = status.problem
        say(f"{p.name} ({p.points} pt{'s' * (p.points != 1)}, §{p.section}): {status.line()}",
            then="  ")
        say(p.asks, "  ")
        # the commands that measured what the store holds: the user's code's where it does;
        # an implementation's check, which runs the user's code; each labelled, so that run
        # as printed it counts for the problem (`handout run` labels its own)
        # (another release than the commands' default, in the variable they all read: a
        # labelled run records the release it ran under and counts for its problems alone)
        other = f"{HANDOUT_ENV}={chosen} " * (chosen != HANDOUTS[0])
        for args in _commands(p, on_gpu, yours=status.yours or p.kind == IMPLEMENT):
            typer.echo(f"  $ {other}{typed_line([*args, '--label', p.name], on_gpu)}"
                       + (f" --db {db}" if given(ctx, "db") else ""))
        if not on_gpu and any(r.cpu == "" for r in p.runs):
            typer.echo("  (part of it needs a GPU)")
    typer.echo()
    say("Run them (PROBLEM... or --all), then write the writeup starter:")
    typer.echo(f"  $ cs336sys handout run{_again(year, db)} PROBLEM...")
    typer.echo(f"  $ cs336sys handout report{_again(year, db)}")


@handout_app.command("run")
def run(
    ctx: typer.Context,
    names: Names = None,
    every: option("Every problem that has something to measure or compute.", bool,
                  "--all") = False,
    year: Year = None,
    yours: option("Measure your code where the problem is about it (your adapters' "
                  "implementations, --model cs336_basics) and check your implementations.",
                  bool, "--yours") = False,
    dry_run: option("Print each command and its points' estimated time; measure nothing.",
                    bool, "--dry-run") = False,
    force: option("Run the points estimated not to fit in memory or to take too long "
                  "(interpreted Triton) too: --force to each command that estimates them.",
                  bool, "--force") = False,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Run the commands that answer the problems, each labelled with its problem's name and
    run with --resume: points already stored ok under that label, at this commit on this
    machine and your code as it is, are not measured again, so an interrupted run picks up
    where it stopped.

    Example:

        cs336sys handout run benchmarking_script --dry-run

        cs336sys handout run --all

        cs336sys handout run flash_benchmarking --yours
    """
    if adapters is not None:  # every command the run starts reads it as its own --adapters
        from cs336sys.yours.adapters import ENV

        user_code(adapters)  # a missing or broken file: one line, before anything else
        ctx.with_resource(environ(**{ENV: str(adapters)}))  # as it was once the run ends
    year, db = _or_group(ctx, "year", year), _or_group(ctx, "db", db)
    problems = _problems(names, year)  # --year and the names checked first
    # every command sizes its models as this release does (a 2025 check's xl is 1600x48),
    # and its invocation records the release, which the listing and the writeup read
    from cs336sys.models.config import HANDOUT_ENV
    from cs336sys.models.config import handout as release

    chosen = year or release()
    ctx.with_resource(environ(**{HANDOUT_ENV: chosen}))
    if yours:
        _same_release(adapters, chosen)
    if bool(names) == every:
        fail("name the problems to run, or give --all (not both)")
    check_db(db)
    on_gpu = _on_gpu()
    todo = [(p, args) for p in problems for args in _commands(p, on_gpu, yours)]
    from cs336sys.handout.problem import CPU_NOTE, GPU_NOTE, fitted, nothing_to_run

    if not todo:
        fail(nothing_to_run(problems, yours))
    root = ctx.find_root().command
    todo, short = fitted(todo, _gpu_count()) if on_gpu else (todo, [])
    if not todo:  # every command needs more GPUs than this host has
        _nothing_run(short)
    todo, untriton = without_unfinished(todo)  # (a kernel not written: so said, not the host)
    todo, unrunnable = without_triton(todo, on_gpu)
    untriton += unrunnable
    if not todo:
        _nothing_run(untriton)
    refused, needs_gpus = _refusals(root, todo, db)  # a dry run too: one line, exit 2
    if refused:
        _nothing_run(refused)
    left_out = [t for t, _ in needs_gpus]
    short += [line for _, line in needs_gpus]
    todo = [t for t in todo if t not in left_out]
    if not todo:
        _nothing_run(short)
    for line in short:  # what this host leaves owed, before anything is measured
        say(f"Left for a host with more GPUs: {line}.", then="  ")
    for line in untriton:
        say(f"Left out: {line}.", then="  ")
    from cs336sys.handout.your_adamw import unfound

    for line in unfound([p for p, _ in todo]) if yours else ():
        say(line, then="  ")
    say(f"{len(todo)} command(s), {GPU_NOTE if on_gpu else CPU_NOTE}.")
    worst, before, at = 0, stored_here(), todo[0][0].name

    def stopped_at(name: str) -> str:
        return (f"handout run stopped at {name}: {stored_here() - before} point(s) stored in "
                f"{db} by this run; run the same command again to measure the rest (points "
                "stored ok are not measured again)")

    try:
        for i, (problem, args) in enumerate(todo, start=1):
            at = problem.name
            typer.echo(f"\n[{i}/{len(todo)}] {problem.name}:\n  $ {typed_line(args, on_gpu)}")
            if args[0] == "plan":
                if dry_run:
                    typer.echo("arithmetic: answers in under a second")
                    continue
                line = [*args, "--label", problem.name, "--db", str(db)]
            else:
                line = [*args, "--label", problem.name, "--db", str(db), "--resume",
                        *(["--dry-run"] if dry_run else []),  # a dry run counts what is left
                        *(["--force"] if force and _takes_force(root, args) else [])]
            code = _invoke(root, line)
            stopping.check()  # a command the signal stopped: the run stops below
            if code not in (0, None):
                typer.echo(f"{problem.name}: `{typed_line(args, on_gpu)}` ended with exit code {code}",
                           err=True)
                worst = max(worst, code if isinstance(code, int) else 1)
        if not dry_run:
            typer.echo()
            again = f" --year {year}" if year else ""
            say(f"Done: `cs336sys handout{again} --db {db}` shows where each problem stands.")
    except (KeyboardInterrupt, stopping.Terminated):  # in a command, or between two
        _stop_if_signalled(stopped_at(at))
        raise
    # what a signal from here to the exit ends with (not the last command's own line)
    stopping.stored(f"handout run stored {stored_here() - before} point(s) in {db}")
    raise typer.Exit(min(worst, 1))


def _nothing_run(why: list[str]) -> NoReturn:
    """Exit 2 with the first reason no command of the run can run, and how many more."""
    more = f" (and {len(why) - 1} more)" if len(why) > 1 else ""
    fail(f"nothing was run: {why[0]}{more}")


def _same_release(given: Path | None, release: str) -> None:
    """Exit 2 where the adapters file has the DDP functions of the other release only: its
    checks would each be refused for a function it was never meant to have."""
    from cs336sys.yours.adapters import Adapters, AdaptersError, find

    try:
        found = find(given)
        generation = Adapters(*found).generation if found is not None else ""
    except (AdaptersError, OSError, SyntaxError):  # said by the commands that read it
        return
    if generation in ("2025", "2026") and generation != release:
        fail(f"--yours: {found[0]} has the {generation} handout's DDP functions, and these are "
             f"the {release} handout's problems: give --year {generation}")


def _gpu_count() -> int:
    """The GPUs this process's ranks may use (CUDA_VISIBLE_DEVICES counts, as for NCCL)."""
    from cs336sys.parallel.world_size import max_local_world_size

    return max_local_world_size("cuda")


def _refusals(root: Any, todo: list, db: Path) -> tuple[list[str], list]:
    """Every command's points built first, as its --dry-run builds them, with its output
    held back: a command that would refuse (exit 2: no adapters file for --yours, an option
    this machine cannot run) is found before anything is measured, not after the ones
    before it. Its problem and its line, for each; apart, each command refused only because
    this host has too few GPUs for its ranks, with its line (it is left out, not fatal)."""
    import contextlib
    import io

    from cs336sys.parallel.world_size import NCCL_RANK_PER_GPU

    refused, needs_gpus = [], []
    for problem, args in todo:
        if args[0] == "plan":  # arithmetic: it checks and answers at once
            continue
        err = io.StringIO()
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
            code = _invoke(root, [*args, "--label", problem.name, "--db", str(db), "--dry-run"])
        _stop_if_signalled(f"handout run stopped at {problem.name}, while checking the "
                           "commands: nothing was stored")
        if code == 2:
            lines = err.getvalue().strip().splitlines() or ["refused"]
            line = f"{problem.name}: {lines[-1].removeprefix('Error: ')}"
            if NCCL_RANK_PER_GPU in line:
                needs_gpus.append(((problem, args), line))
            else:
                refused.append(line)
    return refused, needs_gpus


def _stop_if_signalled(line: str) -> None:
    """Where Ctrl-C or SIGTERM stopped the run, end it with `line` (what the run stored) as
    its last word, and the signal's exit code (130, 143 or 129)."""
    if stopping.pending() is None:
        return
    typer.echo(line, err=True)
    stopping.told()
    raise typer.Exit(stopping.exit_code())


def _takes_force(root: Any, args: list[str]) -> bool:
    """Whether the command `args` names (`attention`, `profile model`) estimates its points
    and so takes --force (cli/options.estimate_options)."""
    command = command_at(root, command_path(root, args))
    return any("--force" in getattr(p, "opts", ()) for p in command.params)


def _invoke(root: Any, args: list[str]) -> int | None:
    """Run `cs336sys ARGS` in this process through the root group; its exit code. A Ctrl-C
    or SIGTERM stops the whole run, once the command's own handling has ended it (its exit
    code, 130, 143 or 129, and the signal pending: the run then says what it stored)."""
    # click's classes, wherever this typer takes click from (vendored since typer 0.2x)
    from cs336sys import yours

    click_exception = {c.__name__: c for c in typer.BadParameter.__mro__}["ClickException"]
    try:
        with yours.kept():  # what one command engages is not the next one's code
            return root.main(args=args, prog_name="cs336sys", standalone_mode=False)
    except stopping.Terminated:  # the command stored its point and said so; SIGTERM is pending
        return stopping.exit_code()
    except typer.Exit as exc:
        return exc.exit_code
    except click_exception as exc:
        exc.show(file=sys.stderr)
        return exc.exit_code


@handout_app.command("report")
def report(
    ctx: typer.Context,
    names: Names = None,
    year: Year = None,
    fmt: list_option("html, md, tex and/or typst. [default: md,tex,typst]", "--format") = None,
    out: option("Folder for the writeup starter (created if missing).", str,
                "--out") = "writeup",
    force: Replace = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Write the writeup starter: per problem, in the handout's order, what it asks, one
    method line (GPU, commit, versions, warm-up, samples), its tables in the handout's shapes
    (sizes x phases, d x seq, sizes x processes, mean ± std) and its plots, from the runs
    labelled with its name. LaTeX tables are booktabs tabulars and Typst tables #table(...),
    each in its own file too, ready to \\input or #include. Facts only: no prose answers.

    Example:

        cs336sys handout report --format md,tex,typst --out writeup/

        cs336sys handout report benchmarking_script pytorch_attention --format tex
    """
    from cs336sys.cli.outputs import refuse_to_replace, refuse_to_replace_any
    from cs336sys.handout import writeup
    from cs336sys.measure.paths import why_unwritable
    from cs336sys.models.config import handout as release
    from cs336sys.report.render import EXTENSIONS, FORMATS, write
    from cs336sys.store.db import StoreError, connect_readonly, no_tables

    year, db = _or_group(ctx, "year", year), _or_group(ctx, "db", db)
    problems = _problems(names, year)
    formats = choices(fmt, FORMATS, "--format", default=("md", "tex", "typst"))
    if not out.strip():  # (Path("") is ".": an empty value would mean this folder)
        fail("--out: empty value; give a folder")
    out = Path(out)
    if out.exists() and not out.is_dir():
        fail(f"--out: {out} exists and is not a folder")
    for f in formats:
        refuse_to_replace([out / f"writeup.{EXTENSIONS[f]}"], f, "--out", force, db)
    problem = why_unwritable(out)
    if problem:
        fail(f"--out {out}: {problem}")
    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    if no_tables(conn):  # an empty file: what a first command interrupted leaves
        conn.close()
        fail(f"{db} holds no runs yet (an empty store): run an experiment first, or pass --db")
    on_gpu = _on_gpu()
    commands = {p.name: [typed_line(a) for a in _commands(p, on_gpu)] for p in problems}
    try:
        with user_errors():
            chosen = year or release()
        rep = writeup.build(conn, problems, chosen, catalog(), commands)
    finally:
        conn.close()
    refuse_to_replace_any(rep, out, formats, "writeup", force, db)
    written = write(rep, out, formats, stem="writeup", landed=wrote)
    for path in written:
        if path.parent == out:
            typer.echo(path)
