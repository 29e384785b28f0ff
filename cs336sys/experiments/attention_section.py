"""The attention experiment's report section beyond its declared table: latency and memory
against sequence length (FlashAttention-2 paper, Fig. 4-5 style, log-log), one panel per
head dim; interpreted Triton points have a table of their own (APART)."""

from __future__ import annotations

from cs336sys.report.plots import Plot
from cs336sys.report.sections import Row, Section, add_plot, panels


def interpreted(r: Row) -> bool:
    """A point timed under TRITON_INTERPRET=1: the CPU emulating the kernel (the stored
    `interpreted` metric), not comparable to native timings."""
    return bool(r.get("interpreted"))


def section(sec: Section, pts: list[Row]) -> None:
    """Latency and memory against sequence length, one panel per head dim, native points only
    (interpreted ones have their own table)."""
    native = [r for r in pts if not interpreted(r)]
    for r in native:  # forward-only sweeps have no e2e time: plot what was measured
        r["_ms"] = r["e2e_ms_mean"] if r["e2e_ms_mean"] is not None else r["fwd_ms_mean"]
    first = ("impl", "precision")
    lat = panels(native, "seq", "_ms", facet="d_head", first=first)
    mem = panels(native, "seq", "mem_before_bwd_bytes", facet="d_head", scale=2**-20, first=first)
    n = len(pts) - len(native)
    note = (f"Left out: {n} interpreted point{'s' * (n != 1)} (Triton under TRITON_INTERPRET=1, "
            "in their own table above): their times are the CPU emulator's.") if n else ""
    add_plot(sec, "Latency against sequence length", "attention-latency",
          Plot(lat, "sequence length (tokens)", "forward+backward (or forward) time (ms)",
               "Attention latency", logx=True, logy=True), note=note)
    add_plot(sec, "Memory held before backward", "attention-memory",
          Plot(mem, "sequence length (tokens)", "memory before backward (MiB)",
               "Attention memory", logx=True), note=note)



# Points shown in a table of their own: (which, title suffix).
APART = (interpreted, " — Triton interpreted (TRITON_INTERPRET=1): the CPU emulates the kernel, "
         "so these times are not comparable to native ones")
