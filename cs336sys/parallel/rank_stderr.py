"""What each local rank writes on stderr: still shown on the command's stderr, and its last
words kept for the failure of a rank that dies without reporting.

A rank that ends by a signal (an abort: a C++ exception nothing caught, as Gloo's `Received
data size doesn't match expected size. Is there a distributed collective mismatch in your
code?`, or NCCL's watchdog) says why only on its stderr, then cannot send its error over its
pipe. Each rank therefore writes its file descriptor 2 to a file of its own (the kernel
writes an abort's message there before the process ends, which a thread reading a pipe in
the dying rank could not promise); the launcher copies what the files gain to its own
stderr while it waits, and keeps their last lines.
"""

from __future__ import annotations

import os

from cs336sys.measure.scratch import folder, remove

_TAIL_BYTES = 8192  # what is kept of each rank's stderr for its failure
_PREFIX = "cs336sys-ranks-"  # then the launching process's id: whose folder it is
_SHOWN_LINES = 20  # of those, the lines a failure's traceback carries


def redirect(path: str) -> None:
    """In a rank: file descriptor 2 (Python's sys.stderr, C++'s std::cerr) onto `path`."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(fd, 2)
    os.close(fd)


class RankStderr:
    """A file per rank in a folder of its own, copied to fd 2 of this process by `copy`;
    `close` copies the rest and removes the folder."""

    def __init__(self, world_size: int):
        self.folder = folder(_PREFIX)  # (and the folders of commands killed before)
        self.paths = [os.path.join(self.folder, f"rank{r}.stderr") for r in range(world_size)]
        for path in self.paths:
            open(path, "wb").close()
        self._files = [open(path, "rb") for path in self.paths]
        self._tails = [b""] * world_size

    def copy(self) -> None:
        """Write what each rank's stderr gained since the last call to this process's
        stderr (the descriptor: what the ranks wrote went there before)."""
        for rank, f in enumerate(self._files):
            new = f.read()
            if not new:
                continue
            self._tails[rank] = (self._tails[rank] + new)[-_TAIL_BYTES:]
            try:
                os.write(2, new)
            except OSError:  # the terminal is gone; the tail is still kept
                pass

    def last_words(self, rank: int) -> tuple[str, str]:
        """What rank `rank` last wrote on stderr: its telling line (a C++ exception's
        `what():`, else the last line) and its last lines; ('', '') where it wrote nothing."""
        self.copy()
        text = self._tails[rank].decode(errors="replace")
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        if not lines:
            return "", ""
        said = [line for line in lines if "what():" in line]
        line = (said[-1].split("what():", 1)[1] if said else lines[-1]).strip()
        fatal = [i for i, x in enumerate(lines) if x.startswith("Fatal Python error:")]
        if fatal and not said:  # faulthandler's: the error, and where the crashing thread was
            line = lines[fatal[-1]] + _crash_site(lines[fatal[-1]:])
        return line, "\n".join(lines[-_SHOWN_LINES:])

    def close(self) -> None:
        self.copy()
        for f in self._files:
            f.close()
        remove(self.folder)


# Frames of these are not where the user's code crashed (the standard library, installed
# packages, cs336sys): the first other frame of the crashing thread is.
_NOT_THEIRS = ("/lib/python3", "site-packages", "/cs336sys/", "<frozen ", "<string>")


def _crash_site(lines: list[str]) -> str:
    """` (File "...", line N in fn)`: the innermost frame of faulthandler's "Current
    thread" stack that is the user's (else its innermost), from the lines after its
    "Fatal Python error"; '' where there is none."""
    at = next((i for i, x in enumerate(lines) if x.startswith("Current thread")), None)
    frames = []
    for x in lines[at + 1:] if at is not None else []:
        if not x.strip().startswith("File "):
            break
        frames.append(x.strip())
    theirs = [f for f in frames if not any(mark in f for mark in _NOT_THEIRS)]
    return f" ({(theirs or frames)[0]})" if frames else ""
