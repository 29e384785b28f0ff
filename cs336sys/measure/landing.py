"""Outputs that land whole, or not at all, when a command is stopped or fails part-way.

A Ctrl-C (KeyboardInterrupt), SIGTERM or SIGHUP (sweep/stopping.py's Terminated) raises at
the next check Python makes, which can fall between two writes of one output: a report with
its HTML written and its markdown not, a truncated PNG, the old export replaced by half a
new one.

- `held()`: the signals that stop a command (STOPS) are held back across a block that must
  not be cut, and delivered as soon as it ends: the store's COMMIT and what it counts
  (store/transaction.py), the renames below and the line that says what landed. Their
  handlers are swapped for one that only notes the signal, rather than blocked: a blocked
  signal is delivered to another of the process's threads (torch's, OpenBLAS's), whose
  C-level handler has Python run the handler in the main thread all the same.
- `staged()`: files are written under hidden temporary names beside where they go, then
  renamed into place together, signals held, once the whole block has run. A block that
  raises (a signal, a full disk) leaves no temporary file, no folder it created, and every
  file that was there before as it was.

    with staged(landed=lambda paths: say(paths)) as stage:
        stage.path(out / "report.html").write_text(html)
        fig.savefig(stage.path(out / "report_files" / "a.png"))
"""

from __future__ import annotations

import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

__all__ = ["STOPS", "Stage", "held", "staged"]

# The signals that stop a command from outside: Ctrl-C, SIGTERM (`timeout`, `kill`, Slurm)
# and SIGHUP (the terminal or SSH session that started it closed, without nohup or tmux).
STOPS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextmanager
def held() -> Iterator[None]:
    """The block runs with the STOPS signals noted, not handled; the first one noted is
    handled as the block ends, by the handler it would have met (the main thread only:
    Python runs handlers nowhere else). A handler already on its way when the block starts
    may still run first, before anything in the block has."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted: list[int] = []
    before: dict[int, Any] = {}
    try:
        for signum in STOPS:
            handler = signal.getsignal(signum)
            if handler in (signal.SIG_IGN, None):  # ignored, or set outside Python
                continue
            before[signum] = handler
            signal.signal(signum, lambda n, _frame: noted.append(n))
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        if noted:
            _deliver(noted[0], before[noted[0]])


def _deliver(signum: int, handler: Any) -> None:
    """What the signal would have done outside the block: call its handler (which raises,
    under cs336sys's CLI), or end the process as the default action does."""
    if callable(handler):
        handler(signum, None)
    else:  # SIG_DFL, back in place: SIGTERM's and SIGHUP's default ends the process
        signal.raise_signal(signum)


class Stage:
    """The files of one `staged` block: where each is written, and where it goes."""

    def __init__(self) -> None:
        self._moves: list[tuple[Path, Path]] = []  # (temporary, final)
        self._made: list[Path] = []  # folders this stage created, outermost first

    def path(self, final: str | Path) -> Path:
        """A new empty file to write `final`'s content into (same folder, same suffix, so
        that writers that read the format from the name still do); its folders are made."""
        final = Path(final)
        missing = [d for d in (final.parent, *final.parent.parents) if not d.exists()]
        final.parent.mkdir(parents=True, exist_ok=True)
        self._made += [d for d in reversed(missing) if d not in self._made]
        fd, tmp = tempfile.mkstemp(prefix=f".{final.name}.", suffix=final.suffix,
                                   dir=final.parent)
        os.close(fd)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp makes 0600; give the file the usual mode
        self._moves.append((Path(tmp), final))
        return Path(tmp)

    def land(self) -> list[Path]:
        """Rename every file into place, in the order asked; the final paths."""
        for tmp, final in self._moves:
            os.replace(tmp, final)
        return [final for _, final in self._moves]

    def discard(self) -> None:
        """Remove what is still temporary, and the folders this stage made if left empty."""
        for tmp, _ in self._moves:
            tmp.unlink(missing_ok=True)
        for folder in reversed(self._made):
            try:
                folder.rmdir()
            except OSError:  # not empty: something landed or was put there meanwhile
                pass


@contextmanager
def staged(landed: Callable[[list[Path]], Any] | None = None) -> Iterator[Stage]:
    """Files written in the block land together when it ends (see the module); `landed` is
    called with their paths inside the same held window, so that a signal cannot fall
    between the files landing and the caller counting them."""
    stage = Stage()
    try:
        yield stage
    except BaseException:
        with held():
            stage.discard()
        raise
    with held():
        try:
            paths = stage.land()
        except BaseException:
            stage.discard()
            raise
        if landed is not None:
            landed(paths)
