"""How a kind declares the options of its command: the parameters of a function, each an
`Annotated` type that Typer reads. The experiment's module declares them with its command
(sweep/declaration.py, `Command`); the CLI's shared groups use the same two functions
(cli/options.py). Each option is named as the kind's `specs(...)` names its keyword.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

ListOpt = list[str] | None


def list_option(help: str, *names: str, **settings: Any) -> Any:
    """A list option: comma lists or repetition (`--seq 128,256` or `--seq 128 --seq 256`),
    None when not given. `size: list_option("Size preset(s).") = None`."""
    return Annotated[ListOpt, typer.Option(*names, help=help, **settings)]


def option(help: str, kind: Any, *names: str, **settings: Any) -> Any:
    """An option of one value of `kind`: `seed: option("Seed for the inputs.", int) = 0`."""
    return Annotated[kind, typer.Option(*names, help=help, **settings)]
