"""The commands that kinds declare with themselves (sweep/declaration.py, `Command`): each
becomes `cs336sys <kind>` here, with no module of its own in cli/. Its options are the
shared groups it names, its own and the store's; its body is the one call every measuring
command makes, `run_experiment(EXPERIMENT, EXPERIMENT.specs, options)`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, MutableMapping
from typing import Any

import typer
from typer.core import TyperCommand

from cs336sys.cli.common import run_experiment
from cs336sys.cli.options import (
    estimate_options,
    model_options,
    nsys_options,
    options_of,
    shape_options,
    store_options,
)
from cs336sys.experiments.catalog import kind_of, summary

# The shared option groups a declared command may name (cli/options.py); the model's come
# before the kind's own options, the others after them.
GROUPS = {"model": (model_options, shape_options), "estimate": (estimate_options,),
          "nsys": (nsys_options,)}


def command_name(kind: str) -> str:
    """The name of a kind's declared command: the kind, dashes for underscores."""
    return kind.replace("_", "-")


def with_options(declared: Any, *more: Any, drop: tuple[str, ...] = ()) -> Any:
    """`options_of` for a declared command's options: the model's groups if it names them,
    its own, its other groups, then `more` (a command that reuses them: `profile model`)
    and the store's; less its `drop` and `drop`."""
    unknown = sorted(set(declared.groups) - set(GROUPS))
    if unknown:
        raise ValueError(f"no option group {', '.join(unknown)}; choose from {', '.join(GROUPS)}")
    first = [g for name in declared.groups if name == "model" for g in GROUPS[name]]
    then = [g for name in declared.groups if name != "model" for g in GROUPS[name]]
    return options_of(*first, declared.options, *then, *more, store_options,
                      drop=(*declared.drop, *drop))


def command_of(kind: str) -> Any:
    """The Typer command function of the command that `kind` (a name in the catalog's KINDS)
    declares; its summary is the line `cs336sys --help` lists for it."""
    experiment = kind_of(kind)
    declared = experiment.command
    if declared is None:
        raise ValueError(f"experiments/{kind}.py declares no command: give its EXPERIMENT "
                         "command=Command(...), or write one in cli/ and name the kind in "
                         "WRITTEN_HERE (cli/__init__.py)")

    def command(**options: Any) -> None:
        # the declaration as its module holds it when the command runs (a test may replace it)
        now = kind_of(kind)
        run_options = {name: options.pop(name) for name in now.command.run_options}
        early = now.command.starts_ranks is not None and now.command.starts_ranks(options)
        run_experiment(now, now.specs, options, command=command_name(kind),
                       describe=now.command.describe, ranks=now.command.ranks,
                       starts_ranks=early,
                       emulation=now.command.emulation, after=_printer(now.command.closing),
                       **run_options)

    examples = "\n\n".join(f"    {line}" for line in declared.examples)
    word = "Example" if len(declared.examples) == 1 else "Examples"
    command.__doc__ = (f"{summary(kind)}\n\n{declared.help.strip()}\n\nStored in the view "
                       f"{experiment.view}.\n\n{word}:\n\n{examples}\n")
    command.__name__ = experiment.kind
    return with_options(declared)(command)


def _printer(closing: Callable[[list[dict]], list[str]] | None) -> Callable[[list], None] | None:
    """What prints a command's closing lines after its tables, from its points' rows."""
    if closing is None:
        return None

    def after(points: list) -> None:
        from cs336sys.report.tables import row_of

        for line in closing([row_of(p.spec, p.result) for p in points]):
            typer.echo(line)

    return after


def click_command(kind: str) -> Any:
    """The click command that `kind` declares, as Typer builds it."""
    app = typer.Typer(rich_markup_mode=None, pretty_exceptions_enable=False,
                      add_completion=False)
    app.command(command_name(kind))(command_of(kind))
    return typer.main.get_command(app)


class Commands(MutableMapping):
    """A group's commands, the declared ones built on first use: `cs336sys --help` lists
    them with their summaries, and a command line builds only the command it names.
    `declared` maps a command's name to its kind; they come before the command `before`."""

    def __init__(self, built: dict[str, Any], declared: dict[str, str], before: str,
                 prepare: Callable[[Any], Any]) -> None:
        self.built, self.declared, self.prepare = dict(built), dict(declared), prepare
        both = sorted(set(self.built) & set(self.declared))
        if both:
            raise ValueError(f"{', '.join(both)}: a command written in cli/ and declared by a "
                             "kind; name the kind in WRITTEN_HERE (cli/__init__.py)")
        names = list(self.built)
        at = names.index(before) if before in names else len(names)
        self.order = [*names[:at], *self.declared, *names[at:]]

    def __getitem__(self, name: str) -> Any:
        if name not in self.built and name in self.declared:
            self.built[name] = self.prepare(click_command(self.declared[name]))
        return self.built[name]

    def __contains__(self, name: object) -> bool:
        return name in self.built or name in self.declared

    def __iter__(self) -> Iterator[str]:
        return iter([*self.order, *(n for n in self.built if n not in self.order)])

    def __len__(self) -> int:
        return len(set(self.order) | set(self.built))

    def __setitem__(self, name: str, command: Any) -> None:
        self.built[name] = command

    def __delitem__(self, name: str) -> None:
        self.built.pop(name, None)
        self.declared.pop(name, None)
        self.order = [n for n in self.order if n != name]

    def short_help(self, name: str, limit: int) -> str | None:
        """The line `--help` lists for `name`; a declared command's without building it."""
        if name in self.built:
            return None if self.built[name].hidden else self.built[name].get_short_help_str(limit)
        return TyperCommand(name, help=summary(self.declared[name])).get_short_help_str(limit)
