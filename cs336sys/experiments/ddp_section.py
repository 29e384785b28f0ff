"""The ddp experiment's report section beyond its declared table: memory per rank against
the analytic figure, and the bucket-size sweep."""

from __future__ import annotations

from cs336sys.experiments.model_section import SIZE
from cs336sys.report.plots import Plot
from cs336sys.report.sections import Row, Section, add_plot, left_out, mib, series, text, with_gpu


def section(sec: Section, pts: list[Row]) -> None:
    """Memory per rank against the analytic figure, and the bucket-size sweep."""
    measured = [r for r in pts if r.get("mem_before_opt_params_bytes") is not None]
    if measured:  # rows stored before the sharding release have no memory figures
        m = with_gpu(measured, ["impl", "opt sharding", "world", "params MiB", "grads MiB",
                                "opt state MiB", "live before step MiB", "peak MiB"], lambda r: [
            text(r["impl"]), text(r["optimizer_sharding"]), text(r["world_size"]),
            *(f"{mib(r[f'mem_{w}_{k}_bytes'])} ({mib(r[f'expected_{k}_bytes'])})"
              for w, k in (("before_opt", "params"), ("before_opt", "grads"),
                           ("after_opt", "opt_state"))),
            mib(r["mem_before_opt_bytes"]), mib(r["mem_peak_bytes"]),
        ], shown=("impl", "optimizer_sharding", "world_size", "bucket_mb", *SIZE))
        m.title = "Memory per rank: measured (analytic expectation)"
        m.note = ("Rank 0, in the step after warm-up. Parameters and gradients just before the "
                  "optimizer step, optimizer state just after it; 'live' counts everything.")
        sec.tables.append(m)
    every = series(pts, "bucket_mb", "step_ms_mean", first=("impl", "world_size"))
    lines = {k: v for k, v in every.items() if len(v) > 1}  # the bucketed sweeps only
    add_plot(sec, "Bucket-size sweep", "ddp-buckets",
          Plot.lines(lines, "bucket size (MiB)", "step time (ms)", "Step time against bucket size",
                     logx=True),
          note=left_out(list(lines), list(every),
                        "series (those with one bucket size are in the table)"))
