"""Memory snapshots of one training step: a PNG timeline on any device, a CUDA pickle.

`draw_timeline` plots the live tensor bytes recorded by `LiveTensorTracker(record=True)`
against the allocation/free event index, with the forward, backward and optimizer phases
shaded, like the "Active Memory Timeline" of pytorch.org/memory_viz but drawn by cs336sys
itself (matplotlib, Agg), so it exists on a CPU too. The x axis is the event index, not
time: the tracker's own Python overhead would distort a time axis, and the index spreads
the many small allocations of a step evenly.

`cuda_memory_history` wraps PyTorch's allocator recorder
(https://pytorch.org/docs/stable/torch_cuda_memory.html): `_record_memory_history` keeps a
stack trace per allocation, `_dump_snapshot` writes the pickle that memory_viz loads. Both
are private-but-documented APIs present in torch 2.1 onwards; only the arguments common to
every version since are passed.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from cs336sys.measure.landing import staged

# Phase colours: forward, backward, optimizer, then anything else.
_COLOURS = {"forward": "#4c72b0", "backward": "#dd8452", "optimizer": "#55a868"}


def draw_timeline(
    events: Sequence[Any],
    phases: Sequence[tuple[str, int, int]],
    path: str | Path,
    title: str,
) -> Path:
    """Write a PNG of live bytes (MiB) per event with the phases shaded; returns the path.

    `events` are `live_tensors.Event`s; `phases` are (label, first event, last event).
    Where the events carry the allocator's figure (CUDA), it is drawn as a second line.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    mib = 2**20
    xs = [e.index for e in events]
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.step(xs, [e.live / mib for e in events], where="post", color="black", lw=1.2,
            label="live tensor bytes (tracker)")
    if events and all(e.allocated is not None for e in events):
        ax.step(xs, [e.allocated / mib for e in events], where="post", color="#c44e52",
                lw=0.8, ls="--", label="allocated (CUDA allocator)")
    top = max([e.live for e in events] + [1]) / mib
    for label, first, last in phases:
        if last < first:
            continue  # a phase without allocations or frees
        colour = _COLOURS.get(label, "#8172b3")
        ax.axvspan(first - 0.5, last + 0.5, color=colour, alpha=0.15, lw=0)
        ax.text((first + last) / 2, top * 1.02, label, ha="center", va="bottom",
                fontsize=9, color=colour)
    if events:
        peak = max(events, key=lambda e: e.live)
        # on the side of the peak with room: to its right it ran past a late peak's axes
        left = peak.index > (events[0].index + events[-1].index) / 2
        ax.annotate(f"peak {peak.live / mib:.2f} MiB", (peak.index, peak.live / mib),
                    xytext=(-5 if left else 5, -12), textcoords="offset points", fontsize=8,
                    ha="right" if left else "left")
    ax.set_ylim(0, top * 1.12)
    ax.set_xlabel("allocation / free event")
    ax.set_ylabel("MiB")
    ax.set_title(title, fontsize=10)
    ax.legend(loc="lower right", fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    # The Software text chunk tells a later run that cs336sys wrote this file (cli/outputs.py);
    # staged: a signal while it is saved leaves the last PNG there, not half a new one
    with staged() as stage:
        fig.savefig(stage.path(path), dpi=120, metadata={"Software": "cs336sys"})
    plt.close(fig)
    return path


@contextmanager
def cuda_memory_history(path: str | Path | None, max_entries: int = 1_000_000) -> Iterator[None]:
    """Record the CUDA allocator's history inside the block and dump it to `path` (a pickle
    for pytorch.org/memory_viz). A no-op when `path` is None or CUDA is absent."""
    import torch

    if path is None or not torch.cuda.is_available():
        yield
        return
    torch.cuda.memory._record_memory_history(max_entries=max_entries)
    try:
        yield
        with staged() as stage:
            torch.cuda.memory._dump_snapshot(str(stage.path(path)))
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
