"""What the attention experiment shows: its declared table (the cells it derives from a row)
and its report section beyond it: latency and memory against sequence length
(FlashAttention-2 paper, Fig. 4-5 style, log-log), one panel per head dim; interpreted Triton
points have a table of their own (APART)."""

from __future__ import annotations

from collections.abc import Mapping
from functools import partial
from typing import Any

from cs336sys.report.intervals import interpreted
from cs336sys.report.plots import Plot
from cs336sys.report.sections import Row, Section, add_plot, median_or_mean, panels
from cs336sys.sweep.declaration import (
    HOST_BOUND,
    Column,
    Ratio,
    Table,
    column_table,
    setting_columns,
)


def section(sec: Section, pts: list[Row]) -> None:
    """Latency and memory against sequence length, one panel per head dim, native points only
    (interpreted ones have their own table)."""
    native = [r for r in pts if not interpreted(r)]
    for r in native:  # forward-only sweeps have no e2e time: plot what was measured
        # medians, as `vs naive` and TFLOP/s beside it: a slow first call moved the mean
        # (naive under sdpa in the plot, sdpa 1.22x faster in the table)
        r["_ms"] = median_or_mean(r, "e2e_ms" if r["e2e_ms_mean"] is not None else "fwd_ms")
    first, named = ("impl", "precision"), {"impl": impl_label}  # as the table names them
    lat = panels(native, "seq", "_ms", facet="d_head", first=first, named=named)
    mem = panels(native, "seq", "mem_before_bwd_bytes", facet="d_head", scale=2**-20,
                 first=first, named=named)
    n = len(pts) - len(native)
    note = (f"Left out: {n} interpreted point{'s' * (n != 1)} (Triton under TRITON_INTERPRET=1, "
            "marked (interp.) in the tables): their times and memory are the CPU emulator's."
            ) if n else ""
    add_plot(sec, "Latency against sequence length", "attention-latency",
          Plot(lat, "sequence length (tokens)", "median forward+backward (or forward) time (ms)",
               "Attention latency", logx=True, logy=True), note=note)
    add_plot(sec, "Memory held before backward", "attention-memory",
          Plot(mem, "sequence length (tokens)", "memory before backward (MiB)",
               "Attention memory", logx=True), note=note)



# Points shown in a table of their own: (which, title suffix).
APART = (interpreted, " — Triton interpreted (TRITON_INTERPRET=1): the CPU emulates the kernel, "
         "so these times are not comparable to native ones")


def impl_label(row: Mapping[str, Any]) -> str:
    """The implementation, with the SDPA backend or the opt-in Triton kernels that ran, and an
    interpreter mark."""
    impl = str(row.get("impl"))
    if row.get("sdpa_backend_used"):
        impl += f"[{row['sdpa_backend_used']}]"
    if row.get("triton_kernels") not in (None, "pointer"):
        impl += f"[{row['triton_kernels']}]"
    impl += " +compile" if row.get("compile") else ""
    return impl + (" (interp.)" if row.get("interpreted") else "")


def _main_ms(row: Mapping[str, Any], stat: str = "mean") -> float | None:
    """What a point is compared by: end-to-end time, else forward, else backward; its mean,
    or the `stat` given ("median": what opt-ins are compared by)."""
    return next((row[k] for k in (f"e2e_ms_{stat}", f"fwd_ms_{stat}", f"bwd_ms_{stat}")
                 if row.get(k)), None)


def _opt_in(row: Mapping[str, Any]) -> str | None:
    """A Triton point's opt-in kernel paths where they depart from the default, else None:
    the "vs default" column shows where some point has one."""
    chosen = row["_settings"].get("triton_opt_in")
    return chosen if chosen not in (None, "default") else None


def _tflops(row: Mapping[str, Any]) -> float | None:
    return row.get("tflops_e2e") or row.get("tflops_fwd") or row.get("tflops_bwd")


def _max_err(row: Mapping[str, Any]) -> float | None:
    if row.get("max_err") is None:
        return None
    return max(row["max_err"], row.get("max_err_grad") or 0.0)


def _check(row: Mapping[str, Any]) -> str | None:
    """The verdict, marked when the point passed against non-causal attention."""
    if row.get("check") is None:
        return None
    return row["check"] + (" (non-causal)" if row.get("not_compared") else "")


def _impossible(row: Mapping[str, Any]) -> str | None:
    """'bwd > e2e' where a part, timed in its own loop, took longer than the forward and
    backward together beyond the spread of both (the part's 10th percentile above the
    whole's 90th): the machine was busy while one of them ran, and neither figure holds."""
    def lo(name: str) -> float | None:
        return row.get(f"{name}_p10") or row.get(f"{name}_median")

    def hi(name: str) -> float | None:
        return row.get(f"{name}_p90") or row.get(f"{name}_median")

    whole = hi("e2e_ms")
    parts = [p for p in ("fwd", "bwd") if whole and (lo(f"{p}_ms") or 0) > whole]
    return " ".join(f"{p} > e2e" for p in parts) or None


TABLE = Table(
    "Latency (mean ± std), memory held before backward, throughput, error",
    (
        Column("impl", "impl", cell=impl_label, setting=True),
        *setting_columns("d=d_head seq heads batch precision"),
        Column("causal", "causal", "yes_no", setting=True),
        *setting_columns("pass"),
        *column_table("""
            fwd ms              fwd_ms                mean_std
            bwd ms              bwd_ms                mean_std
            e2e ms              e2e_ms                mean_std
            mem before bwd MiB  mem_before_bwd_bytes  mib
        """),
        Column("TFLOP/s", cell=_tflops, fmt="num"),
        Column("max err", cell=_max_err, fmt="sci"),
        Column("check", "check", cell=_check, optional=True,
               note="check: pass when every element is within atol + rtol·|ref| (1e-2 in fp32 "
               "and fp16, 5e-2 in bf16), else the point is wrong (timed, never compared).",
               notes_if=(("non-causal", "pass (non-causal): your PyTorch FlashAttention "
                          "ignores is_causal, as the handout allows, or is off at causal points "
                          "(check_detail says which) and right non-causal, where the course's "
                          "tests check it; its times are not compared with causal points "
                          "(--no-causal measures it)."),)),
        Column("impossible", cell=_impossible, optional=True, flag=True,
               note="impossible: a part (fwd, bwd), timed apart, took longer than forward and "
               "backward together beyond the spread of both samples: the machine was busy "
               "while one ran; measure the point again."),
        Column("vs naive", ratio=Ratio(lambda r: _main_ms(r, "median") or _main_ms(r),
                                       {"impl": "naive"},
                                       ("impl", "sdpa_backend", "triton_opt_in"),
                                       samples="e2e_ms"),
               note="vs naive: naive's median time over this one's at the same shape, with "
               "the 95 % bootstrap interval of the end-to-end samples where each side has 5 "
               "or more, widened to the rounds' t interval where the points interleaved in "
               "rounds, and its verdict."),
        Column("vs default", cell=_opt_in, optional=True,
               ratio=Ratio(partial(_main_ms, stat="median"),
                           {"impl": "triton", "triton_opt_in": "default"},
                           ("triton_opt_in",), samples="e2e_ms"),
               note="vs default: the default Triton kernels' median time over this opt-in's at "
               "the same shape, in the same run (2.00x = twice as fast), with the 95 % "
               "bootstrap interval of that ratio from both points' end-to-end samples, "
               "widened to the rounds' t interval: faster or slower only when the interval "
               "excludes 1, else no difference; too few samples to tell under 5 a side."),
        HOST_BOUND,
    ),
    note="TFLOP/s from the median time. max err: largest error of O (and dQ, dK, dV) against "
    "a float64 reference.",
)
