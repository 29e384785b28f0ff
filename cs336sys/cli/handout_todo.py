"""What `handout run` leaves out before it runs anything, and how it prints a command: the
user's Triton kernel where this host cannot run it, and the points of a getter of the
adapters file that is not written yet (`raise NotImplementedError`)."""

from __future__ import annotations

import shlex

from cs336sys.cli.vocabulary import without_value
from cs336sys.sweep.points import SpecError, check_triton

TRITON_YOURS = "yours-triton"


def typed_line(args: list[str], on_gpu: bool = True) -> str:
    """The command as typed; on a CPU, your Triton kernel's under the interpreter it needs."""
    interpret = not on_gpu and TRITON_YOURS in ",".join(args).split(",")
    return "TRITON_INTERPRET=1 " * interpret + "cs336sys " + shlex.join(args)


def without_triton(todo: list, on_gpu: bool) -> tuple[list, list[str]]:
    """`todo` without the user's Triton kernel where sweep/points.check_triton refuses it for
    want of triton or of CUDA and the interpreter, a line per command it left, with why (a
    Triton adapter written mid-assignment stopped every problem's run). A kernel not written
    yet is left out before, by without_unfinished, for that reason."""
    try:
        check_triton(on_gpu, "your Triton kernel")
        return todo, []
    except SpecError as exc:
        why = str(exc).split(" to run the kernels", 1)[0]  # (the interpreter's words follow)
    kept, lines = [], []
    for problem, args in todo:
        if TRITON_YOURS not in ",".join(args).split(","):
            kept.append((problem, args))
            continue
        lines.append(f"{problem.name}'s {TRITON_YOURS} points of `{typed_line(args)}` ({why})")
        if TRITON_YOURS not in args:  # the kernel beside others: they still run
            kept.append((problem, without_value(args, TRITON_YOURS)))
    return kept, lines


# The options whose values name an adapters entry, and the entries' kinds they take.
_ENTRY_OPTIONS = {"--attention": ("attention",), "--impl": ("attention", "ddp", "fsdp"),
                  "--ddp": ("ddp", "fsdp"), "--shard-optimizer": ("optimizer",),
                  "--optimizer": ("adamw",)}


def without_unfinished(todo: list) -> tuple[list, list[str]]:
    """`todo` without the points of an adapters entry whose getter or hook the file defines
    but has not written yet (only `raise NotImplementedError`): a line per value it cut, with
    why. An FSDP not written yet was run, its points stored `skipped`, and the problem read
    `checked`. The value leaves its own option's list: the command keeps cs336sys's points
    (the unsharded baseline beside `--shard-optimizer yours`; under `--ddp`, `--optimizer`,
    cs336sys's own where the list empties), and goes only where its --attention or --impl,
    the code it measures, is left empty."""
    from cs336sys import yours

    adapters = yours.active()
    if adapters is None:
        return todo, []
    kept, lines = [], []
    for problem, args in todo:
        left, subject = list(args), True
        for i, (flag, value) in enumerate(zip(args, args[1:], strict=False)):
            if flag not in _ENTRY_OPTIONS:
                continue
            stays = []
            for impl in value.split(","):
                entry = next((yours.entries(k)[impl] for k in _ENTRY_OPTIONS[flag]
                              if impl in yours.entries(k)), None)
                unwritten = adapters.unwritten(entry) if entry is not None else []
                if unwritten:
                    lines.append(f"{problem.name}'s {impl} points of `{typed_line(args)}` "
                                 f"({unwritten[0]} is not implemented in {adapters.shown} yet)")
                else:
                    stays.append(impl)
            if len(stays) < len(value.split(",")):
                left[i + 1] = ",".join(stays)
                subject = subject and (bool(stays) or flag not in ("--attention", "--impl"))
        if subject:
            kept.append((problem, _emptied_out(left)))
    return kept, lines


def _emptied_out(args: list[str]) -> list[str]:
    """`args` without the options whose value was emptied (`--ddp ''`: cs336sys's default)."""
    out: list[str] = []
    for word in args:
        if word == "" and out and out[-1].startswith("--"):
            out.pop()
            continue
        out.append(word)
    return out
