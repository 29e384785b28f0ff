"""`--nsys`: each point of a sweep recorded by Nsight Systems, one report per point.

A measuring command given --nsys does not measure in its own process. For each of its points
it runs the same command again under `nsys profile`, told which point to run through the
environment (POINT_ENV), with NVTX ranges on (CS336SYS_NVTX=1: the phases, the collectives,
and MEASURED_RANGE around the timed steps). nsys records only MEASURED_RANGE
(`--capture-range=nvtx`), so warm-up, compilation and the float64 check stay out of the
report. Each report is named after its point, in a folder of its own per invocation; every
command is printed before it runs, so that it can be run again by hand. The point's row is
stored by the command nsys runs, as any other.

The flags are the handout's "more comprehensive profiling run": CUDA, cuDNN, cuBLAS, OS
runtime and NVTX traced, PyTorch's module calls and autograd ranges with shapes, and the
Python and CUDA backtraces of each kernel launch (their cost is the handout's warning: the
times in an nsys report are not the benchmark's). `--gpu-metrics-devices` is left out: it needs
administrator rights on most machines. Ranges pushed by name are unregistered NVTX strings,
which nsys matches only with NSYS_NVTX_PROFILER_REGISTER_ONLY=0 (Nsight Systems user guide,
"NVTX capture range"). Ranks forked without exec (the launcher's fork server) are traced
only with --trace-fork-before-exec=true.

No torch here: the CLI builds these command lines before anything heavy is imported.
"""

from __future__ import annotations

import os
import re
import shlex
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

POINT_ENV = "CS336SYS_NSYS_POINT"  # which point (0-based) the command under nsys runs
NVTX_ENV = "CS336SYS_NVTX"  # "1": NVTX ranges on in the process and its ranks
MEASURED_RANGE = "measured_steps"  # the range around the timed steps; nsys records it alone
FOLDER = Path("nsys")  # where each invocation's folder of reports goes

TRACE = "--trace=cuda,cudnn,cublas,osrt,nvtx"
FLAGS = (
    TRACE, "--pytorch=functions-trace,autograd-shapes-nvtx", "--cudabacktrace=all",
    "--python-backtrace=cuda",
    "--capture-range=nvtx", f"--nvtx-capture={MEASURED_RANGE}", "--capture-range-end=stop",
    "--force-overwrite=true",
)


@dataclass(frozen=True)
class Recording:
    """One point's nsys run: the command line and the report it writes."""

    point: str  # the point in words
    report: Path  # without nsys's .nsys-rep suffix, as --output takes it
    command: list[str]


def chosen_point() -> int | None:
    """The point this process runs under nsys (POINT_ENV), or None outside an --nsys run."""
    value = os.environ.get(POINT_ENV)
    if value is None:
        return None
    if not value.isdigit():
        raise ValueError(f"{POINT_ENV}={value!r}: not a point's number")
    return int(value)


def nvtx_asked() -> bool:
    """Whether the environment turns NVTX ranges on (NVTX_ENV=1)."""
    return os.environ.get(NVTX_ENV) == "1"


def file_name(index: int, point: str) -> str:
    """A report's file name: its number in the sweep, then the point in words, made safe."""
    slug = re.sub(r"[^A-Za-z0-9.=+-]+", "-", point).strip("-") or "point"
    return f"{index + 1:02d}-{slug}"


def folder(command: str, now: datetime | None = None) -> Path:
    """The folder of one invocation's reports: nsys/<command>-<UTC time>."""
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%d-%H%M%S")
    return FOLDER / f"{command.replace(' ', '-')}-{stamp}"


# `memory`'s reports also track CUDA memory ("Nsight Systems also has flags for memory
# profiling", the handout's memory_profiling (f)): the allocations in the timeline.
MEMORY_FLAGS = ("--cuda-memory-usage=true",)


def command(nsys: str, args: list[str], index: int, report: Path,
            ranks: bool = False) -> list[str]:
    """The nsys command line that records point `index` of `cs336sys ARGS`."""
    env = f"{POINT_ENV}={index},{NVTX_ENV}=1,NSYS_NVTX_PROFILER_REGISTER_ONLY=0"
    fork = ["--trace-fork-before-exec=true"] if ranks else []
    memory = MEMORY_FLAGS if args[:1] == ["memory"] else ()
    return [nsys, "profile", *FLAGS, *memory, *fork, f"--env-var={env}", f"--output={report}",
            sys.executable, "-m", "cs336sys", *args]


def recordings(nsys: str, args: list[str], points: list[str], where: Path,
               ranks: bool = False) -> list[Recording]:
    """A Recording per point of `cs336sys ARGS` (`points`: each in words), into `where`."""
    out = []
    for i, point in enumerate(points):
        report = where / file_name(i, point)
        out.append(Recording(point, report, command(nsys, args, i, report, ranks)))
    return out


def shown(rec: Recording) -> str:
    """The command as one shell line."""
    return shlex.join(rec.command)
