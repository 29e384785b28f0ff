"""`cs336sys env`: what would be recorded with a measurement taken here."""

from __future__ import annotations

import json

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption, fail, user_code
from cs336sys.cli.options import Adapters, option
from cs336sys.measure.device import resolve_device


def env(
    db: DbOption = DEFAULT_DB,
    device: option("auto, cpu, cuda or cuda:N.", str) = "auto",
    as_json: option("Print JSON.", bool, "--json") = False,
    adapters: Adapters = None,
) -> None:
    """Print what would be recorded with a measurement: device, versions, git commit, and
    your code (the adapters file found, what it implements, your repository's commit).

    Example:

        cs336sys env --json
    """
    from cs336sys import yours
    from cs336sys.measure.provenance import collect

    try:
        resolved = resolve_device(device)
    except ValueError as exc:
        fail(exc)
    user_code(adapters)
    found = yours.engage()  # as a measurement of your code would record it
    info = {**collect(resolved), "db": str(db)}
    if found is not None:
        info["adapters_implemented"] = found.summary().partition("; ")[2]
    if as_json:
        typer.echo(json.dumps(info, indent=2))
        return
    width = max(map(len, info))
    for key, value in info.items():
        typer.echo(f"{key:<{width}}  {'' if value is None else value}")
