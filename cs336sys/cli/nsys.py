"""`--nsys` on a measuring command: run each of its points again under Nsight Systems.

The command lines and the report names are measure/nsys.py's; here the command's own
options become the command line that nsys runs (`command_line`), and the points are
recorded one after the other (`record`). cli/common.run_experiment calls `record` in place of
measuring; a refusal is NsysRefused, which it prints as one line with exit code 2.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from cs336sys.measure import nsys
from cs336sys.sweep.points import told_apart

# What the command under nsys leaves out of this command's options: --nsys itself, the
# dry run (which would print instead of recording), and --rounds, which it takes as 1: nsys
# stops at the end of the first measured range (--capture-range-end=stop), so of 3 rounds
# (attention's and step's CUDA default) it recorded the first round's timed steps alone.
_NOT_PASSED_ON = ("nsys", "dry_run", "exec_", "rounds")


class NsysRefused(Exception):
    """--nsys cannot record here: one line for the user."""


def under_nsys(points: list) -> list:
    """The one point this process records when --nsys runs it under nsys, else all."""
    try:
        index = nsys.chosen_point()
    except ValueError as exc:
        raise NsysRefused(exc) from None
    if index is None:
        return points
    if not 0 <= index < len(points):
        raise NsysRefused(f"{nsys.POINT_ENV}={index}: this command has {len(points)} point(s)")
    return [points[index]]


def command_line(ctx: typer.Context) -> list[str]:
    """The words after `cs336sys` that run this command again with the options it was given
    (on the command line or from the environment; defaults stay defaults): lists joined by
    commas, flags for True (the negative flag for False where there is one); `--rounds 1`
    where the command has rounds."""
    out = []  # the subcommands' names, not the program's (`python -m cs336sys` is 3 words)
    level = ctx
    while level.parent is not None:
        out.insert(0, level.info_name)
        level = level.parent
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        source = ctx.get_parameter_source(param.name)
        if (param.name in _NOT_PASSED_ON or value is None
                or param.param_type_name != "option" or source is None
                or source.name == "DEFAULT"):
            continue
        if value is True or value is False:
            flag = param.opts[0] if value else (param.secondary_opts or [None])[0]
            if param.is_flag and flag and (value or param.secondary_opts):
                out.append(flag)
        else:
            out += [param.opts[0],
                    ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)]
    if any(param.name == "rounds" for param in ctx.command.params):
        out += ["--rounds", "1"]
    return out


def record(ctx: typer.Context, points: list, command: str, describe: Callable[[Any], str] | None, *,
           ranks: bool, dry: bool) -> int:
    """Record each point under nsys, one report per point in a folder of this invocation;
    print every command first. The exit code: 0 when every recording ended well, else 1,
    with one line on stderr naming each point not recorded and why (nsys's exit code, or no
    report written); a point's row, if the command under nsys stored one, says how its
    measuring went, not the recording. `dry`: print the commands, run nothing -- also where
    nsys or CUDA is missing, to read them before a GPU host runs them."""
    path = shutil.which("nsys")
    device = str(points[0].device)
    cuda = on_cuda(device)
    lacks = " and ".join(([] if path else ["nsys is not on PATH"])
                         + ([] if cuda else [f"device {device} is no CUDA device"]))
    if path is None and not dry:
        raise NsysRefused("--nsys: Nsight Systems (nsys) is not installed or not on PATH")
    if not cuda and not dry:
        raise NsysRefused(f"--nsys needs a CUDA device: NVTX ranges and the kernels nsys "
                          f"records are CUDA's (device {device})")
    path = path or "nsys"
    if nsys.FOLDER.exists() and not nsys.FOLDER.is_dir():
        raise NsysRefused(f"--nsys: {nsys.FOLDER} is not a directory; the reports go in it")
    where = nsys.folder(command)
    named = told_apart([describe(p) if describe else f"{command} point {i + 1}"
                        for i, p in enumerate(points)], [p.settings() for p in points])
    recs = nsys.recordings(path, command_line(ctx), named, where, ranks)
    for rec in recs:
        typer.echo(nsys.shown(rec))
    if dry:
        typer.echo(f"dry run: {len(recs)} nsys command(s) above; nothing recorded"
                   + (f" (here {lacks}: they are for a CUDA host with nsys)" if lacks else ""))
        return 0
    where.mkdir(parents=True, exist_ok=True)
    failed = []
    for rec in recs:
        typer.echo(f"recording {rec.point} -> {rec.report}.nsys-rep")
        code = subprocess.run(rec.command, check=False).returncode
        if code in (130, -2):  # Ctrl-C: the command under nsys said what it stored
            typer.echo("interrupted: the reports above this line are complete", err=True)
            return 130
        if code != 0:
            failed.append(f"{rec.point} (nsys exited {code})")
        elif not _written(rec.report):
            failed.append(f"{rec.point} (nsys exited 0 but wrote no {rec.report.name}.nsys-rep)")
    typer.echo(f"{len(recs) - len(failed)} of {len(recs)} report(s) in {where}/; open them "
               "with nsys-ui (Nsight Systems)")
    if failed:
        typer.echo("not recorded: " + "; ".join(failed), err=True)
    return 1 if failed else 0


def on_cuda(device: str) -> bool:
    """Whether the points run on CUDA, where nsys has kernels and NVTX ranges to record."""
    return device.startswith("cuda")


def _written(report: Path) -> bool:
    return report.with_name(report.name + ".nsys-rep").is_file()
