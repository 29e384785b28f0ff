"""The plan against the store: this GPU's measured C and W (`cs336sys plan --measured`), the
ddp runs a planned point can be set beside, and the report's plan section.

Reads the store only (store/db.py's read-only connection); no torch, no matplotlib until a
plot is drawn. experiments/plan.py computes the points; the CLI joins the two.
"""

from __future__ import annotations

import io
import sqlite3
from dataclasses import dataclass
from typing import Any

from cs336sys.bench.declaration import Column
from cs336sys.bench.declaration import Table as Declared
from cs336sys.report.sections import Row, Section, Table, num

REPLICA_IMPLS = ("naive", "flat", "overlap", "bucketed", "torch")  # experiments/ddp_setup.py
FSDP_IMPLS = ("fsdp", "torch-fsdp")


class NoMeasurement(LookupError):
    """The store holds no row to measure C or W on this GPU; the message says what to run."""


@dataclass(frozen=True)
class Measured:
    """C and W as this GPU achieved them, and the runs they come from."""

    gpu: str
    flops: float  # best model TFLOP/s x 1e12
    egress: float  # best comm busbw x 1e9
    memory_bytes: int
    model_run: str
    comm_run: str
    precision: str  # of the model run
    comm_op: str

    @property
    def source(self) -> str:
        return (f"measured: model run {self.model_run[:8]} ({self.precision}, "
                f"{self.flops / 1e12:.4g} TFLOP/s), comm run {self.comm_run[:8]} "
                f"({self.comm_op}, busbw {self.egress / 1e9:.4g} GB/s)")  # fmt: skip


def _rows(conn: sqlite3.Connection, sql: str, params: tuple) -> list[dict[str, Any]]:
    cur = conn.execute(sql, params)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r, strict=True)) for r in cur]


def measured(conn: sqlite3.Connection, gpu: str, host_memory: int | None = None) -> Measured:
    """C from the ok `model` row with the highest TFLOP/s on `gpu` (the invocations' GPU
    name, 'cpu' for CPU runs), W from the ok `comm` row with the highest bus bandwidth that
    got every element right, among the ring collectives the plan's formulas are for
    (all-reduce, all-gather, reduce-scatter: their busbw is nccl-tests' W) when there are
    any, else among every op; NoMeasurement names the command to run when either is
    missing. Memory is the GPU's as the model run recorded it (`host_memory` for 'cpu')."""
    model = _rows(conn, """
        SELECT r.id, i.gpu_memory_gb, json_extract(r.metrics, '$.tflops') AS tflops,
               json_extract(r.settings, '$.precision') AS precision
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'model' AND r.status = 'ok' AND i.gpu = ?
           AND json_extract(r.metrics, '$.tflops') > 0
         ORDER BY tflops DESC, r.created DESC LIMIT 1""", (gpu,))  # fmt: skip
    comm = _rows(conn, """
        SELECT r.id, json_extract(r.metrics, '$.busbw_gbps') AS busbw,
               json_extract(r.settings, '$.op') AS op
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'comm' AND r.status = 'ok' AND i.gpu = ?
           AND json_extract(r.metrics, '$.busbw_gbps') > 0
           AND coalesce(json_extract(r.metrics, '$.wrong'), 0) = 0
         ORDER BY op IN ('all-reduce', 'all-gather', 'reduce-scatter') DESC, busbw DESC,
                  r.created DESC LIMIT 1""", (gpu,))  # fmt: skip
    if not model or not comm:
        stored = [r[0] for r in conn.execute(
            "SELECT DISTINCT i.gpu FROM runs r JOIN invocations i ON i.id = r.invocation_id "
            "WHERE r.experiment IN ('model', 'comm') AND r.status = 'ok' ORDER BY 1")]  # fmt: skip
        first = ("cs336sys model --precision bf16" if not model else
                 "cs336sys comm --op all-reduce,all-gather,reduce-scatter")  # fmt: skip
        what = "model" if not model else "comm"
        others = (
            f" (it has rows of: {', '.join(map(str, stored))}; --gpu picks one)" if stored else ""
        )
        raise NoMeasurement(f"--measured: the store has no ok {what} rows for {gpu}{others}; "
                            f"run `{first}` on this GPU first")  # fmt: skip
    m, c = model[0], comm[0]
    gib = m["gpu_memory_gb"]
    memory = int(gib * 2**30) if gib else (host_memory or 0)
    return Measured(gpu, m["tflops"] * 1e12, c["busbw"] * 1e9, memory, m["id"], c["id"],
                    str(m["precision"]), str(c["op"]))  # fmt: skip


def chip(point: dict[str, Any]) -> str:
    """The GPU a planned point is for, as it appears in stored GPU names: the measured
    GPU's name, or a preset's chip ('H100' of 'H100 SXM 80GB')."""
    if point["hardware"] == "measured":
        return point["device_name"]
    return point["device_name"].split()[0]


def ddp_match(conn: sqlite3.Connection, point: dict[str, Any]) -> dict[str, Any] | None:
    """The ddp run to set beside a planned dp or fsdp point (`point` its settings): ok, the
    same model, sequence length, batch tokens and world size, an impl of the strategy
    (dp: the replica impls without optimizer sharding; fsdp: fsdp, torch-fsdp), on the
    point's GPU; bf16 runs first (the plan is bf16), then the fastest step."""
    impls = {"dp": REPLICA_IMPLS, "fsdp": FSDP_IMPLS}.get(point["strategy"])
    if impls is None:
        return None
    keys = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
    s = "json_extract(r.settings, '$.{}')".format
    found = _rows(conn, f"""
        SELECT r.id, i.gpu, {s('impl')} AS impl, {s('precision')} AS precision,
               json_extract(r.metrics, '$.step_ms_mean') AS step_ms,
               json_extract(r.metrics, '$.comm_ms_mean') AS comm_ms,
               json_extract(r.metrics, '$.comm_bytes') AS comm_bytes
          FROM runs r JOIN invocations i ON i.id = r.invocation_id
         WHERE r.experiment = 'ddp' AND r.status = 'ok'
           AND {' AND '.join(f"{s(k)} = ?" for k in keys)}
           AND {s('context_length')} = ? AND {s('global_batch')} * {s('context_length')} = ?
           AND {s('world_size')} = ?
           AND {s('impl')} IN ({', '.join('?' * len(impls))})
           AND coalesce({s('optimizer_sharding')}, 'none') = 'none'
           AND json_extract(r.metrics, '$.step_ms_mean') > 0""",
        (*(point[k] for k in keys), point["seq"], point["batch_tokens"], point["n"], *impls))  # fmt: skip
    name = chip(point).lower()
    exact = point["hardware"] == "measured"
    found = [r for r in found if (r["gpu"] == point["device_name"] if exact
                                  else name in str(r["gpu"]).lower())]  # fmt: skip
    if not found:
        return None
    return min(found, key=lambda r: (r["precision"] != "bf16", r["step_ms"]))


def beside(plan: dict[str, Any], run: dict[str, Any]) -> dict[str, Any]:
    """The metrics a planned point gets from the ddp run set beside it."""
    ratio = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    return {
        "measured_run_id": run["id"],
        "measured_impl": f"{run['impl']} {run['precision']}",
        "measured_step_ms": run["step_ms"],
        "measured_comm_ms": run["comm_ms"],
        "measured_comm_bytes": run["comm_bytes"],
        "measured_step_ratio": ratio(run["step_ms"], plan.get("step_ms")),
        "measured_comm_ratio": ratio(run["comm_ms"], plan.get("comm_ms")),
    }


# -- the report section -------------------------------------------------------------------------

_ORDER = ("dp", "fsdp", "tp", "fsdp-tp")  # experiments/plan.STRATEGIES (report may not import it)


@dataclass(frozen=True)
class StepPlot:
    """Step time against degree, a line per strategy, one panel per GPU: comm-bound points
    drawn as crosses, and each strategy's largest compute-bound degree (`n_max`) as a
    dotted vertical line in its colour, beyond which its steps wait on the wire."""

    panels: tuple[
        tuple[str, tuple[tuple[str, tuple[tuple[int, float, bool], ...], float], ...]], ...
    ]
    title: str

    @property
    def informative(self) -> bool:
        return any(len(pts) > 1 for _, lines in self.panels for _, pts, _ in lines)

    def draw(self) -> bytes:
        import matplotlib

        matplotlib.use("Agg")
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FuncFormatter

        from cs336sys.report.plots import short

        n = len(self.panels)
        fig = Figure(figsize=(min(4, n) * 3.6 + 0.6, 3.6 * -(-n // 4) + 0.6), dpi=100)
        axes = fig.subplots(-(-n // 4), min(4, n), squeeze=False, sharey=True)
        for ax, (name, lines) in zip(axes.flat, self.panels, strict=False):
            xs = [x for _, pts, _ in lines for x, _, _ in pts]
            for i, (label, pts, limit) in enumerate(lines):
                colour = f"C{_ORDER.index(label) if label in _ORDER else i}"
                # dp, fsdp and fsdp-tp coincide where compute-bound: styles tell them apart
                style = {"fsdp": "--", "fsdp-tp": ":"}.get(label, "-")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, label=label,
                        linestyle=style, linewidth=2.5 if label == "dp" else 1.5)  # fmt: skip
                for bound in (False, True):
                    sel = [p for p in pts if p[2] == bound]
                    ax.scatter([p[0] for p in sel], [p[1] for p in sel], color=colour, zorder=3,
                               marker="x" if bound else "o", s=40 if bound else 16)  # fmt: skip
                if xs and limit <= max(xs) * 2:
                    ax.axvline(limit, color=colour, linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("degree N (devices)", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_formatter(FuncFormatter(short))
            ax.tick_params(labelsize=8)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        axes[0][0].set_ylabel("step time (ms, planned)", fontsize=9)
        handles, labels = axes.flat[0].get_legend_handles_labels()
        handles += [Line2D([], [], color="k", marker="x", linestyle=""),
                    Line2D([], [], color="k", linestyle=":", linewidth=1)]  # fmt: skip
        labels += ["communication-bound", "N max (last degree that hides)"]
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
        fig.suptitle(self.title, fontsize=10)
        fig.subplots_adjust(left=0.1, right=0.98, top=0.86, bottom=0.26, wspace=0.08)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        return buf.getvalue()


def step_plot(pts: list[Row]) -> StepPlot:
    """The StepPlot of the ok points: a panel per GPU, model and batch."""
    panels: dict[str, dict[str, list]] = {}
    limits: dict[tuple[str, str], float] = {}
    for r in pts:
        if r.get("status") != "ok" or r.get("step_ms") is None:
            continue
        s = r["_settings"]
        name = f"{s['device_name']}: {s['size']} B={s['batch_tokens']:,}"
        panels.setdefault(name, {}).setdefault(s["strategy"], []).append(
            (s["n"], r["step_ms"], bool(r.get("comm_bound")))
        )
        limits[name, s["strategy"]] = r.get("n_max") or 0
    body = tuple(
        (name, tuple((k, tuple(sorted(lines[k])), limits[name, k])
                     for k in sorted(lines, key=lambda k: (_ORDER + (k,)).index(k))))
        for name, lines in panels.items()
    )  # fmt: skip
    return StepPlot(body, "Planned step time against degree (× communication-bound)")


MEASURED = Declared(
    "Plan meets measurement: ddp runs of the same model, batch and world size",
    (
        Column(
            "hardware",
            "device_name",
            setting=True,
            covers=("hardware", "flops", "egress", "memory_bytes", "source"),
        ),
        Column("strategy", "strategy", setting=True),
        Column("N", "n", setting=True),
        Column("measured impl", "measured_impl"),
        Column("step ms plan", "step_ms", "num"),
        Column("step ms measured", "measured_step_ms", "num"),
        Column("measured/plan", "measured_step_ratio", "num"),
        Column("comm ms plan", "comm_ms", "num"),
        Column("comm ms measured", "measured_comm_ms", "num"),
        Column("comm measured/plan", "measured_comm_ratio", "num"),
        Column("bytes plan", "comm_bytes", "size"),
        Column("bytes measured", "measured_comm_bytes", "size"),
    ),
    note="Each dp or fsdp point beside the ddp run on its GPU with the same model, sequence "
    "length, batch tokens and world size (dp: the replica impls, fsdp: fsdp and torch-fsdp; "
    "bf16 first, then the fastest). Measured step includes the optimizer step, which the "
    "plan leaves out; measured comm is what the step waited for (exposed) for the replicas and "
    "torch-fsdp, the time any collective was in flight for fsdp, and the plan's all of it; "
    "bytes: S of every collective in one step (the replicas reduce fp32 gradients, the "
    "plan bf16 ones).",
)


def measured_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.get("measured_run_id")]


def section(sec: Section, pts: list[Row]) -> None:
    """After the declared tables: the closed forms, the plan beside measured ddp runs, and
    step time against degree with the communication-bound region marked."""
    from cs336sys.report.sections import Figure
    from cs336sys.report.tables import point_tables

    table = inequalities(pts)
    if table:
        sec.tables.append(table)
    sec.tables.extend(point_tables([MEASURED], measured_rows(pts), counts=True, lift=True))
    plot = step_plot(pts)
    if plot.informative:
        sec.figures.append(Figure(
            "Step time against degree", "plan-steps", plot=plot,
            note="Crosses: communication-bound points (the step waits on communication in "
            "forward or backward). Dotted lines: each strategy's N max, the largest degree "
            "whose communication still hides behind compute."))  # fmt: skip


def inequalities(pts: list[Row]) -> Table | None:
    """Per strategy, the closed-form condition and the largest degree per GPU."""
    seen: dict[tuple, list[str]] = {}
    for r in pts:
        if r.get("status") != "ok":
            continue
        s = r["_settings"]
        seen[(s["strategy"], s["device_name"], s["size"], s["batch_tokens"])] = [
            s["strategy"], r.get("inequality") or "", s["device_name"], f"{s['size']} B={s['batch_tokens']:,}",
            num(r.get("n_max")), num(r.get("n_max_ffn")),
        ]  # fmt: skip
    if not seen:
        return None
    rows = [seen[k] for k in sorted(seen, key=lambda k: ((*_ORDER, k[0]).index(k[0]), k[1:]))]
    return Table("When communication stops hiding: the closed forms",
                 ["strategy", "condition (single FFN layer)", "GPU", "model, batch",
                  "N max, whole model", "N max, FFN"], rows,
                 note="C dense bf16 FLOP/s, W egress bytes/s per device, B batch tokens, "
                 "F d_ff; X, Y the FSDP and TP degrees (docs/experiments/plan.md).")  # fmt: skip
