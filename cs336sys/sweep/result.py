"""The Result of one sweep point, and the guard that turns exceptions into Results.

Out-of-memory is a result, not a crash (docs/architecture.md): the point gets status `oom` and the sweep
goes on; any other exception becomes status `error` with its message. KeyboardInterrupt is
not caught, so Ctrl-C still stops a sweep (rows already written stay). The user's code that
is not written yet (`Unfinished`, or NotImplementedError raised in the user's own files) is
`skipped`; a point measured but failing its correctness check is `wrong` (the experiment
says so). Broken user code is a stored result too.
"""

from __future__ import annotations

import functools
import gc
import re
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.provenance import package_version
from cs336sys.sweep import stopping, torch_state


@dataclass
class Result:
    status: str  # ok | wrong (measured, but failed its check) | oom | error | skipped
    metrics: dict[str, Any] = field(default_factory=dict)
    samples: dict[str, Any] | None = None
    error: str | None = None
    # When the point started (measure/clock.now) and how long it took; the sweep runner
    # stamps both where the experiment did not.
    started: str | None = None
    duration_s: float | None = None
    # Rows for tables linked to the run, by table name (a profile's `kernel_stats`).
    tables: dict[str, list[dict[str, Any]]] = field(default_factory=dict)


_OOM_MARKERS = (
    "out of memory",  # CUDA: "CUDA out of memory. Tried to allocate ..."
    "can't allocate memory",  # CPU: "DefaultCPUAllocator: can't allocate memory"
    "not enough memory",
)


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message, with the one it introduces where it only
    introduces one: inductor's `TypeError:` has its cause on the next line; Triton's
    `at 5:8:` a dozen lines of the kernel's source, then the cause on the last. '' for none."""
    lines = [line.strip() for line in str(exc).strip().splitlines()]
    first = lines[0] if lines else ""
    if first.endswith(":"):
        said = [line for line in lines[1:] if line]
        cause = said[-1] if said and re.fullmatch(r"at \d+:\d+:", first) else \
            next(iter(said), "")
        first = f"{first} {cause}".strip()
    return first


# Failures whose message names a symptom, not its cause: the cause, said after the message.
# Triton 3.9 dropped block pointers (the course teaches them; its hosts pin Triton <= 3.6).
_CAUSES = {
    "Block pointers have been removed": "tl.make_block_ptr is gone from Triton {triton}: a "
    "kernel built on block pointers runs under Triton 3.6 or older, the course's version",
    # Triton's launcher without a GPU: a kernel outside the interpreter, or @triton.autotune
    # (it times its configs on a device) inside it
    "0 active drivers": "Triton found no GPU: on a CPU its kernels run only in its "
    "interpreter (TRITON_INTERPRET=1), and @triton.autotune, which times its configs on a "
    "GPU, not even there (give the kernel one config on a CPU)",
}


def hint(exc: BaseException, text: str) -> None:
    """Give `exc` what to do about it, said after its stored reason (guarded); the exception
    itself, its message and traceback, stay the user's."""
    exc.cs336sys_hint = text  # type: ignore[attr-defined]


def cause(said: str, whole: str = "") -> str:
    """`said` with the cause of a known symptom in it, or in `whole` (the exception's whole
    message: Triton's CompilationError says `at 14:18:` first, the symptom lines below),
    after it (_CAUSES); else `said` as it is."""
    for symptom, why in _CAUSES.items():
        if symptom in said or symptom in whole:
            triton = package_version("triton") or "(not installed)"
            return f"{said}; {why.format(triton=triton)}"
    return said


def is_oom(exc: BaseException) -> bool:
    if isinstance(exc, MemoryError):
        return True
    try:
        import torch

        if isinstance(exc, torch.cuda.OutOfMemoryError):
            return True
    except ImportError:  # pragma: no cover - torch is a dependency
        pass
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in _OOM_MARKERS)


def free_memory() -> None:
    """Give back what a failed point held, so the next point starts clean."""
    gc.collect()
    try:
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    except ImportError:  # pragma: no cover
        pass


class Unfinished(Exception):  # a state of the user's code, not a failure
    """The user's code for this point is not written yet (an adapters function that still
    raises NotImplementedError): the point is stored as `skipped`, with this message."""


@functools.cache
def _library_folders() -> tuple[str, ...]:
    """Where code that is not the user's lives: this package, the standard library and
    site-packages (torch, triton)."""
    import sys
    import sysconfig
    from pathlib import Path

    paths = {str(Path(__file__).resolve().parents[1])}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        for prefix in {sys.prefix, sys.base_prefix, sys.exec_prefix}:
            where = sysconfig.get_path(key, vars={"base": prefix, "platbase": prefix})
            if where:
                paths.add(str(Path(where).resolve()))
    return tuple(sorted(paths))


def is_library_file(path: Any) -> bool:
    """Whether `path` is cs336sys's, the standard library's or an installed package's."""
    from pathlib import Path

    return str(Path(path).resolve()).startswith(_library_folders())


def user_frame(exc: BaseException, root: Any = None) -> str | None:
    """Where in the user's code `exc` was raised: `file:line` of the innermost frame of its
    traceback that lies under `root` (a folder), or, without one, outside cs336sys, the
    standard library and site-packages; None when every frame is library code. The file is
    shown relative to the current folder when it is inside it."""
    from pathlib import Path

    found = None
    for frame in traceback.extract_tb(exc.__traceback__):
        name = frame.filename
        if name.startswith("<"):
            continue
        where = str(Path(name).resolve())
        mine = where.startswith(str(Path(root).resolve())) if root is not None else not is_library_file(where)
        if mine:
            found = (where, frame.lineno)
    if found is None:
        return None
    path = Path(found[0])
    try:
        path = path.relative_to(Path.cwd().resolve())
    except ValueError:
        pass
    return f"{path}:{found[1]}"


def unwritten(exc: BaseException) -> bool:
    """Whether `exc` is the user's own "not written yet": a NotImplementedError raised in
    their code (a stub of the handout's), not a library's missing kernel. Such a point is
    skipped, in one process or on ranks (sweep/ranks.serve marks it for the launcher)."""
    return isinstance(exc, NotImplementedError) and user_frame(exc) is not None \
        and _raised_by_user(exc)


def _raised_by_user(exc: BaseException) -> bool:
    """The innermost frame of the traceback, where `exc` was raised, is the user's code."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith("<")]
    return bool(frames) and not is_library_file(frames[-1].filename)


def _stopped_by_signal(exc: BaseException) -> bool:
    """Whether `exc` wraps a signal's stop: what the signal interrupted turned its
    KeyboardInterrupt or Terminated into another exception (Python 3.10 and 3.11 raise
    "RuntimeError: Error calling __set_name__" for one raised as a dataclass is made, in a
    module a point imports)."""
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt | stopping.Terminated):
            return True
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return False


def _caught(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """`fn(*args, **kwargs)`, or the Result its exception makes (guarded)."""
    try:
        return fn(*args, **kwargs)
    except Unfinished as exc:
        return Result("skipped", error=str(exc))
    except SystemExit as exc:
        # the user's, wherever their code is on the way down: argparse's parse_args() at the
        # top of a module of theirs exits from the standard library
        if user_frame(exc) is None:
            raise
        return Result("error", error=f"{user_frame(exc)}: SystemExit: it called "
                      f"sys.exit({exc.code!r}), which would have ended the command")
    except KeyboardInterrupt as exc:
        # Ctrl-C's stops the sweep; one the user's code raised with no key pressed is its
        # error, or every --resume would stop at the same point, blamed on the user
        if stopping.is_stop(exc) or user_frame(exc) is None:
            raise
        return _failed(exc, "raised with no Ctrl-C pressed, which would have stopped the "
                       "command")
    except stopping.Terminated:
        raise
    except Exception as exc:  # every failure becomes a stored row
        if stopping.pending() is not None and _stopped_by_signal(exc):
            stopping.check()  # raises the signal as itself: the runner stores the stop
        return _failed(exc)
    except BaseException as exc:  # not an Exception (asyncio's CancelledError, a class of
        if stopping.is_stop(exc):  # the user's): a row too, not the sweep's end
            stopping.check()  # (a signal pending: raised as itself)
        return _failed(exc)


def _failed(exc: BaseException, why: str = "") -> Result:
    """The Result of a point that raised `exc`: its type and first line (or `why`), the user's
    file and line first where it came from there; skipped for a stub, oom, else error."""
    said = cause(": ".join(part for part in (type(exc).__name__, why or first_line(exc))
                           if part), str(exc))
    where = user_frame(exc)
    if where is not None:
        said = f"{where}: {said}"
    if getattr(exc, "cs336sys_hint", None):
        said = f"{said}; {exc.cs336sys_hint}"
    if unwritten(exc):
        return Result("skipped", error=f"not implemented: {said}")
    if is_oom(exc):
        return Result("oom", error=said)
    tb = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return Result("error", error=said + "\n\n" + tb)


def guarded(fn: Callable[..., Result], *args: Any, **kwargs: Any) -> Result:
    """Run one point; never raises except KeyboardInterrupt, Terminated and cs336sys's own
    SystemExit (the user's code calling sys.exit() is that point's error: exiting there
    ended the whole command, with nothing stored and no line).

    An error's first line names the exception and, when it was raised in the user's code
    (not cs336sys, the standard library or site-packages), the file and line it came from:
    `cs336_systems/flash.py:42: ZeroDivisionError: division by zero`."""
    t0 = time.perf_counter()
    with torch_state.kept() as changed:  # a switch the code under test turned: not the next's
        result = _caught(fn, *args, **kwargs)
    if changed:
        print(torch_state.said(changed), file=sys.stderr)
    # Every point hands its memory back so the next one starts from an empty cache (a large
    # point after a small one must not OOM on the small one's leftovers). Only here, once
    # _caught has returned, are a failed point's exception, traceback, frames and tensors gone.
    free_memory()
    result.duration_s = time.perf_counter() - t0
    return result
