"""A problem of the assignment's handout, declared as an experiment is: its name, points,
what it asks, the cs336sys commands that answer it, and its tables in the handout's shapes.

A release module (handout/y2026.py, y2025.py) lists its problems in the handout's order. The
declarations import nothing heavy: `cs336sys handout` lists them at once.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from cs336sys.handout import your_adamw
from cs336sys.sweep.declaration import SUBCOMMANDS, Column, experiment_of

# What a problem asks for, and so what its status can be.
MEASURE = "measure"  # tables, plots or numbers from runs: `handout run` measures them
COMPUTE = "compute"  # the accounting problems: `cs336sys plan` computes their figures
IMPLEMENT = "implement"  # the user's code: the course's tests check it, cs336sys too
WRITTEN = "written"  # a written answer: nothing to measure
KINDS = (MEASURE, COMPUTE, IMPLEMENT, WRITTEN)



# How a problem's commands are sized, on a GPU and on a CPU: said by `handout`, `handout run`
# and, for runs measured on a CPU, by the writeup.
GPU_NOTE = "sized as the handout says (a GPU)"
CPU_NOTE = ("cut down for a CPU: the tiny model, short sequences (attention: head dims 16 "
            "and 32, fp32 alone where the handout adds bf16) and fewer timed steps than the "
            "handout's 5 warm-up and 10 timed (its sizes need a GPU)")


@dataclass(frozen=True)
class Run:
    """One cs336sys command that answers a problem (or one of its parts): its arguments on a
    GPU and cut down for a CPU (None: the same; "": it needs a GPU), and, where the problem
    is about the user's code, the same measuring theirs (`handout run --yours`)."""

    gpu: str
    cpu: str | None = None
    yours: str | None = None
    yours_cpu: str | None = None
    part: str = ""  # which part of the problem, "(b)"
    yours_only: bool = False  # a run of the user's code alone (`gpu` names its experiment)
    cpu_note: str = ""  # what its CPU command measures in place of what the handout asks
    # what it measures is the same on any device (no sizes, no time): a CPU owes no GPU run
    anywhere: bool = False
    # its training steps are to run the user's AdamW (handout/your_adamw.py) with `yours`
    your_adamw: bool = False

    def args(self, on_gpu: bool, yours: bool = False) -> list[str] | None:
        """The arguments after `cs336sys`, for a GPU or a CPU (None where it cannot run, or
        where it measures only the user's code and `yours` is off)."""
        if self.yours_only and not yours:
            return None
        if yours and self.yours is not None:
            line = self.yours if on_gpu or self.yours_cpu is None else self.yours_cpu
        else:
            line = self.gpu if on_gpu or self.cpu is None else self.cpu
        if not line:
            return None
        if yours and self.your_adamw:
            found = your_adamw.option()
            return shlex.split(line) + (["--optimizer", found] if found else [])
        return shlex.split(line)

    @property
    def experiment(self) -> str:
        """The experiment kind whose rows this command stores."""
        return experiment_of(" ".join(shlex.split(self.gpu)[:2]))

    @property
    def name(self) -> str:
        """The command's name: `memory residuals`, `attention`."""
        words = shlex.split(self.gpu)[:2]
        return " ".join(words if tuple(words) in SUBCOMMANDS else words[:1])


@dataclass(frozen=True)
class Pivot:
    """A table in the handout's shape over a problem's stored rows of one experiment: a row
    per value of `rows` (settings), and per value of `across` (a setting; None: one group)
    the `values` columns. Rows must match `where`; any other setting that tells two rows
    apart joins `rows`, so nothing is hidden."""

    title: str
    experiment: str
    rows: tuple[str, ...]
    values: tuple[Column, ...]
    across: str | None = None
    where: Mapping[str, Any] = field(default_factory=dict)
    note: str = ""


@dataclass(frozen=True)
class AsReported:
    """An experiment's tables as its report section has them: those it declares and those
    its `section` adds (profile's attention parts and top kernels per point)."""

    experiment: str


@dataclass(frozen=True)
class Problem:
    """A problem of the handout: its name as the handout spells it, its points, what it asks
    to measure (one line), how it is answered (KINDS), the runs that answer it, its tables,
    and for an implementation the cs336sys command that checks it."""

    name: str
    points: int
    asks: str
    kind: str = MEASURE
    runs: tuple[Run, ...] = ()
    # a Pivot, an experiment kind (its declared tables), AsReported or a function of the
    # rows (handout/pivot.py)
    tables: tuple[Pivot | str | AsReported | Callable, ...] = ()
    # IMPLEMENT: the command that checks the user's code, or the commands, run in order
    check: str | tuple[str, ...] = ""
    section: str = ""  # the handout's section, "2.1.3"

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{self.name}: kind {self.kind!r} is not one of {KINDS}")
        if self.kind in (MEASURE, COMPUTE) and not self.runs:
            raise ValueError(f"{self.name}: a problem to {self.kind} needs its runs")

    @property
    def checks(self) -> tuple[str, ...]:
        """The commands that check the user's code (none where nothing checks it)."""
        return (self.check,) if isinstance(self.check, str) and self.check else tuple(self.check)

    @property
    def experiments(self) -> tuple[str, ...]:
        """The experiment kinds whose rows answer it, in the order its runs store them."""
        return tuple(dict.fromkeys(r.experiment for r in self.runs))


def nothing_to_run(problems: list[Problem], yours: bool) -> str:
    """Why `handout run` has nothing to run for `problems`, and what would: --yours, where
    one of them is checked with it, else the way an implementation of the user's own script
    is checked by hand (2025's naive_ddp: no adapters function, so no command of the run)."""
    checked = any(p.checks for p in problems if p.kind == IMPLEMENT)
    unchecked = [p for p in problems if p.kind == IMPLEMENT and not p.checks]
    if unchecked and (yours or not checked):
        p = unchecked[0]
        return (f"nothing to run: {p.name} is checked by no command handout run gives (no "
                f"adapters function holds it): {p.asks.rstrip('.')}, with `--label {p.name}` "
                "to count for it")
    return ("nothing to run: the problems chosen have nothing to measure here"
            + ("" if yours else " (implementations are checked with --yours)"))


def fitted(todo: list, gpus: int) -> tuple[list, list[str]]:
    """Each command's --world-size list cut to the sizes this host's GPUs run (NCCL puts one
    rank on each): the handout's 2,4,6 processes are 2,4 on four GPUs, and the rest is
    named, not a refusal of the whole run. A command none of whose sizes fits is left out."""
    fitted, short = [], []
    for problem, args in one_backend_each(todo):
        gloo = "--backend" in args and args[args.index("--backend") + 1] == "gloo"
        at = args.index("--world-size") + 1 if "--world-size" in args and not gloo else None
        sizes = args[at].split(",") if at is not None else []
        kept = [s for s in sizes if not s.isdigit() or int(s) <= gpus]
        if kept == sizes:
            fitted.append((problem, args))
            continue
        if kept:
            fitted.append((problem, [*args[:at], ",".join(kept), *args[at + 1:]]))
        left = ",".join(s for s in sizes if s not in kept)
        short.append(f"{problem.name}: world size {left} needs as many GPUs, one per rank; "
                     f"this host has {gpus}" + (f" (run at {','.join(kept)})" if kept
                                                else ""))
    return fitted, short


def one_backend_each(todo: list) -> list:
    """A command of `--backend gloo,nccl` as two, Gloo's and NCCL's: Gloo's ranks run on the
    CPU (the 2025 handout's 6 Gloo processes on a host of 4 GPUs), NCCL's one per GPU."""
    out = []
    for problem, args in todo:
        at = args.index("--backend") + 1 if "--backend" in args else None
        backends = args[at].split(",") if at is not None else []
        if len(backends) < 2 or "gloo" not in backends:
            out.append((problem, args))
            continue
        out += [(problem, [*args[:at], "gloo", *args[at + 1:]]),
                (problem, [*args[:at], ",".join(b for b in backends if b != "gloo"),
                           *args[at + 1:]])]
    return out
