"""The `cs336sys` command line (Typer). Thin: options -> specs -> run -> store -> print.

Importing this package must not import torch, so that `cs336sys --help` and `cs336sys sql`
answer at once; commands import what they need inside their bodies.
"""

from __future__ import annotations

import errno
import os
import types
import typing
from contextlib import contextmanager
from typing import Annotated

import typer
from typer.core import TyperGroup

from cs336sys import __version__
from cs336sys.cli import common
from cs336sys.cli.browse import browse
from cs336sys.cli.common import as_typed
from cs336sys.cli.db import db_app
from cs336sys.cli.declared import Commands, command_name
from cs336sys.cli.env import env
from cs336sys.cli.handout import handout_app
from cs336sys.cli.memory import memory_app
from cs336sys.cli.plan import plan
from cs336sys.cli.precision import precision
from cs336sys.cli.profile import profile_app
from cs336sys.cli.report import report
from cs336sys.cli.sql import sql
from cs336sys.cli.vocabulary import (
    BARE_VALUES,
    command_at,
    command_path,
    typed_spellings,
    with_bare_values,
)
from cs336sys.experiments.catalog import KINDS
from cs336sys.sweep import stopping
from cs336sys.sweep.points import MAX_SIZE

# The kinds whose command cli/ writes, each with why; every other kind of the catalog is
# `cs336sys <kind>`, made from the Command it declares (cli/declared.py).
WRITTEN_HERE = {
    "memory": "a group of two kinds' commands: memory peak and memory residuals",
    "memory_residuals": "memory residuals, in the memory group",
    "plan": "its sink sets the store's measured runs beside the plan",
    "profile": "a group: profile model and profile attention, over two kinds' options",
    "precision": "a group of two cases: precision accumulate and precision autocast",
}


class Root(TyperGroup):
    """The root group: notes which name of each option was typed for the command named on
    the line (errors then use it), gives a bare option the value it means
    (cli/vocabulary.py), and guards every integer option. The kinds' declared commands are
    built when first named (cli/declared.py): `cs336sys --help` imports no experiment."""

    def __init__(self, *args, **kwargs):  # click's signature
        super().__init__(*args, **kwargs)
        prepared(self)
        declared = {command_name(k): k for k in KINDS if k not in WRITTEN_HERE}
        self.commands = Commands(self.commands, declared, before="plan", prepare=prepared)

    def list_commands(self, ctx):  # click's signature
        return list(self.commands)  # the names alone: none is built

    def format_commands(self, ctx, formatter):  # click's signature
        """The commands and their summaries, the declared ones' without building them."""
        limit = formatter.width - 6 - max(map(len, self.commands))
        rows = [(name, line) for name in self.list_commands(ctx)
                if (line := self.commands.short_help(name, limit)) is not None]
        with formatter.section("Commands"):
            formatter.write_dl(rows)

    def parse_args(self, ctx, args):  # click's signature
        path = command_path(self, args)
        command = command_at(self, path)
        common.TYPED.clear()
        common.TYPED.update(typed_spellings(command, args[len(path):],
                                            BARE_VALUES.get(" ".join(path), {})))
        return super().parse_args(ctx, [*path, *with_bare_values(args[len(path):], path, command)])

    def make_context(self, *args, **kwargs):
        with _one_line_errors():
            return super().make_context(*args, **kwargs)

    def invoke(self, ctx):
        with _one_line_errors():
            return super().invoke(ctx)


@contextmanager
def _one_line_errors():
    """Bad input is one line on stderr (docs/bad-input.md): click's usage errors print the
    usage and a "Try ... -h" line above the error; here the error alone, same exit code."""
    # click's classes, wherever this typer takes click from (vendored since typer 0.2x)
    bases = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    ClickException, UsageError = bases["ClickException"], bases["UsageError"]
    try:
        yield
    except UsageError as exc:
        line = ClickException(exc.format_message())
        line.exit_code = exc.exit_code
        raise line from None
    except OSError as exc:  # a name past the file system's 255 bytes, in any path option:
        if exc.errno != errno.ENAMETOOLONG:  # Path.exists() raises it (Python 3.11)
            raise
        line = ClickException(f"{exc.strerror}: {exc.filename}")
        line.exit_code = 2
        raise line from None


def _takes_an_int(param) -> bool:
    """An option of one integer (`int` or `int | None`): every one passes `_bounded`."""
    annotation = getattr(getattr(param, "type_descriptor", None), "annotation", None)
    if annotation is int:
        return True
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return set(typing.get_args(annotation)) == {int, type(None)}
    return False


def _bounded(callback):
    """The one guard of every integer option, whatever command declares it: a value past
    2^62 either way is refused in one line (exit 2) as it is parsed, before any check or
    write; torch takes sizes, counts and seeds as 64-bit integers."""
    def check(ctx, param, value):
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_SIZE:
            # the words of sweep/points.check_size, which the spec functions say it in
            usage = {cls.__name__: cls for cls in typer.BadParameter.__mro__}["UsageError"]
            raise usage(as_typed(f"{param.opts[0]}: {value} is too large (at most 2^62)"), ctx=ctx)
        return callback(ctx, param, value) if callback is not None else value

    return check


def prepared(command):
    """`command` and every command below it with its examples kept as written and each
    integer option guarded."""
    for each in (command, *_every_command(command)):
        each.help = examples_verbatim(each.help)
        for param in getattr(each, "params", ()):
            if _takes_an_int(param):
                param.callback = _bounded(param.callback)
    return command


def _every_command(group):
    for command in getattr(group, "commands", {}).values():
        yield command
        yield from _every_command(command)


def examples_verbatim(text: str | None) -> str | None:
    """A help text whose indented paragraphs (the examples) click prints as written: it
    rewraps every other paragraph to the terminal's width, and rewrapped, an example broke
    between an option and its value, or ran into the next one. Click leaves a paragraph
    alone when a line of only \\b comes first."""
    if not text or "\b\n" in text:
        return text
    import inspect

    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join("\b\n" + p if p.startswith(" ") else p for p in paragraphs)


app = typer.Typer(
    name="cs336sys",
    cls=Root,
    no_args_is_help=True,
    # `cs336sys --install-completion` sets up tab completion for bash, zsh, fish, PowerShell.
    add_completion=True,
    pretty_exceptions_enable=False,
    # Help texts are plain text: with Rich markup on, "[default: small]" was read as a
    # style tag and silently dropped from every --help.
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"cs336sys {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Print the version.")
    ] = False,
) -> None:
    """A lab bench for LLM-systems work: each command measures, stores every point in
    SQLite tagged with the GPU, commit and settings, and prints a table; `report` compares
    stored runs.

    Examples:

        cs336sys model --size tiny --precision fp32,bf16

        cs336sys attention --seq 1024,4096 --attention sdpa,flash-torch

        cs336sys report --since today --out reports/
    """


app.command()(env)
app.command()(sql)
app.add_typer(memory_app, name="memory")
app.command()(plan)
app.add_typer(profile_app, name="profile")
app.add_typer(precision, name="precision")
# here the kinds' declared commands (model, attention, comm, ddp, step, ...), in the catalog's
# order
app.command()(report)
app.command()(browse)
app.add_typer(db_app, name="db")
app.add_typer(handout_app, name="handout")


def main() -> None:
    """The command line, once cs336sys/__main__.py has installed the signal handlers."""
    if all(v in os.environ for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK")):
        # One rank of torchrun's: end with its agent, from the start (an agent killed while
        # this rank still imports would leave it running otherwise).
        from cs336sys.parallel.launcher import die_with_parent

        die_with_parent(os.getppid())
    code: int | str | None = 0
    try:
        app()  # (typer turns KeyboardInterrupt into exit code 130 once the command parses)
    except SystemExit as exc:
        code = exc.code
    except BaseException:
        # A KeyboardInterrupt while typer builds the command, SIGTERM's Terminated (typer
        # lets it through), or, after a Ctrl-C an import swallowed, the half-imported module
        # failing its next import ("cannot load module more than once per process"): the
        # signal's stop, ended below. Without a signal, as raised.
        if stopping.pending() is None:
            raise
    stopping.finish()  # a signal from now on comes after the command's work and words
    if stopping.pending() is None:
        stopping.done(code)
    # A signal: say what it left if nobody did (it came during start-up, or was swallowed
    # by an import and the command went on), and end as the signal asks.
    line = stopping.untold()
    if line is not None:
        typer.echo(line, err=True)
    stopping.end()
