"""The plan experiment's report section beyond its declared table: the closed forms (when
communication stops hiding behind compute), the plan beside measured ddp runs, and step time
against degree with the communication-bound points marked."""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any

from cs336sys.experiments.plan_model import ACCOUNTING
from cs336sys.parallel import plan_math as pm
from cs336sys.parallel.plan_math import STRATEGIES as _ORDER
from cs336sys.report.plots import short
from cs336sys.report.sections import Figure, FilledTable, Row, Section, gib, num
from cs336sys.report.tables import point_tables
from cs336sys.sweep.declaration import Column, Table, column_table, model_size


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
        from matplotlib.ticker import FuncFormatter, NullFormatter

        n = len(self.panels)
        # at least the report's 7 in: one panel of 4.2 in cut its title, tick labels and the
        # y label (a student's plan of one GPU); margins in inches, whatever the width
        width = max(7.0, min(4, n) * 3.6 + 0.6)
        fig = Figure(figsize=(width, 3.6 * -(-n // 4) + 0.6), dpi=100)
        axes = fig.subplots(-(-n // 4), min(4, n), squeeze=False, sharey=True)
        ys = [y for _, lines in self.panels for _, pts, _ in lines for _, y, _ in pts if y > 0]
        # minor ticks labelled only within a decade: across several, 900, 800 and 700 were
        # printed over one another
        within_a_decade = bool(ys) and max(ys) < 10 * min(ys)
        for ax, (name, lines) in zip(axes.flat, self.panels, strict=False):
            xs = [x for _, pts, _ in lines for x, _, _ in pts]
            for i, (label, pts, limit) in enumerate(lines):
                colour = f"C{_ORDER.index(label) if label in _ORDER else i}"
                # dp, fsdp and fsdp-tp coincide where compute-bound: styles tell them apart
                style = {"fsdp": "--", "fsdp-tp": ":"}.get(label, "-")
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color=colour, label=label,
                        linestyle=style, linewidth=2.5 if label == "dp" else 1.5)
                for bound in (False, True):
                    sel = [p for p in pts if p[2] == bound]
                    ax.scatter([p[0] for p in sel], [p[1] for p in sel], color=colour, zorder=3,
                               marker="x" if bound else "o", s=40 if bound else 16)
                if xs and limit <= max(xs) * 2:
                    ax.axvline(limit, color=colour, linestyle=":", linewidth=1)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(name, fontsize=9)
            ax.set_xlabel("degree N (devices)", fontsize=9)
            ax.grid(True, alpha=0.3)
            ax.xaxis.set_major_formatter(FuncFormatter(short))
            ax.yaxis.set_major_formatter(FuncFormatter(short))  # 4k, not mathtext's 4 x 10^3
            ax.yaxis.set_minor_formatter(FuncFormatter(short) if within_a_decade
                                         else NullFormatter())
            ax.tick_params(labelsize=8)
        for ax in axes.flat[n:]:
            ax.set_visible(False)
        axes[0][0].set_ylabel("step time (ms, planned)", fontsize=9)
        # every panel's strategies: the first panel's alone left out those it did not plan
        legend = {label: handle for ax in axes.flat[:n]
                  for handle, label in zip(*ax.get_legend_handles_labels(), strict=True)}
        handles, labels = list(legend.values()), list(legend)
        handles += [Line2D([], [], color="k", marker="x", linestyle=""),
                    Line2D([], [], color="k", linestyle=":", linewidth=1)]
        labels += ["communication-bound", "N max (last degree that hides)"]
        fig.legend(handles, labels, loc="lower center", ncol=3, fontsize=7, frameon=False)
        fig.suptitle(self.title, fontsize=10)
        fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, top=0.86, bottom=0.26,
                            wspace=0.08)
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        return buf.getvalue()


def _model(r: Row) -> str:
    """The row's model: its size with d_model × layers and parameters."""
    return model_size({**r["_settings"], "params": r.get("params")})


def step_plot(pts: list[Row]) -> StepPlot:
    """The StepPlot of the ok points: a panel per GPU, model and batch."""
    panels: dict[str, dict[str, list]] = {}
    limits: dict[tuple[str, str], float] = {}
    for r in pts:
        if r.get("status") != "ok" or r.get("step_ms") is None:
            continue
        s = r["_settings"]
        name = f"{s['device_name']}: {_model(r)} B={s['batch_tokens']:,}"
        panels.setdefault(name, {}).setdefault(s["strategy"], []).append(
            (s["n"], r["step_ms"], bool(r.get("comm_bound")))
        )
        limits[name, s["strategy"]] = r.get("n_max") or 0
    body = tuple(
        (name, tuple((k, tuple(sorted(lines[k])), limits[name, k])
                     for k in sorted(lines, key=lambda k: (_ORDER + (k,)).index(k))))
        for name, lines in panels.items()
    )
    return StepPlot(body, "Planned step time against degree (× communication-bound)")


# A plan's point in a table: its hardware, strategy and device count (plan.py's tables too).
POINT = (
    Column(
        "hardware",
        "device_name",
        setting=True,
        covers=("hardware", "flops", "egress", "memory_bytes", "source"),
    ),
    # the two handouts' xl differ: every table names the model by its shape (_model)
    Column("model", cell=lambda r: _model({**r, "_settings": r.get("_settings") or r}),
           setting=True, covers=("size", "d_model", "num_layers", "num_heads", "d_ff",
                                  "vocab_size", "blocks")),
    Column("tokens", "batch_tokens", setting=True),
    Column("strategy", "strategy", setting=True),
    Column("N", "n", setting=True),
)
MEASURED = Table(
    "Plan meets measurement: ddp runs of the same model, batch and world size",
    (
        *POINT,
        Column("measured impl", "measured_impl"),
        *column_table("""
            step ms plan        step_ms              num
            step ms measured    measured_step_ms     num
            measured/plan       measured_step_ratio  num
            comm ms plan        comm_ms              num
            comm ms measured    measured_comm_ms     num
            comm measured/plan  measured_comm_ratio  num
            bytes plan          comm_bytes           size
            bytes measured      measured_comm_bytes  size
            sent plan           sent_bytes           size     optional
            sent measured       measured_sent_bytes  size     optional
        """),
    ),
    note="Each dp or fsdp point beside the ddp run on its GPU with the same model, sequence "
    "length, batch tokens and world size (dp: the replica impls, fsdp: fsdp and torch-fsdp; "
    "bf16 first, then the fastest). Measured step includes the optimizer step, which the "
    "plan leaves out; measured comm is what the step waited for (exposed) for the replicas and "
    "torch-fsdp, the time any collective was in flight for fsdp, and the plan's all of it "
    "(so comm measured/plan is given for naive, flat and fsdp alone); "
    "bytes: S of every collective in one step (the replicas reduce fp32 gradients, the "
    "plan bf16 ones); sent: what a device sends in them, ring algorithms.",
)


def measured_rows(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r.get("measured_run_id")]


def formula_tables(pts: list[Row]) -> list[FilledTable]:
    """The tables of closed forms that have rows, in order: the report's section and
    `cs336sys plan`'s printout both show them."""
    return [t for t in (closed_forms(pts), inequalities(pts), all_reduces(pts), mesh(pts)) if t]


def section(sec: Section, pts: list[Row]) -> None:
    """After the declared tables: the closed forms, the plan beside measured ddp runs, and
    step time against degree with the communication-bound region marked."""
    sec.tables.extend(t for t in (phases(pts), *formula_tables(pts)) if t)
    sec.tables.extend(point_tables([MEASURED], measured_rows(pts), counts=True, lift=1))
    plot = step_plot(pts)
    if plot.informative:
        sec.figures.append(Figure(
            "Step time against degree", "plan-steps", plot=plot,
            note="Crosses: communication-bound points (the step waits on communication in "
            "forward or backward). Dotted lines: each strategy's N max, the largest degree "
            "whose communication still hides behind compute, where it lies within twice the "
            "largest degree planned (the table has every N max)."))


def phases(pts: list[Row]) -> FilledTable | None:
    """Per point, forward and backward apart, as section 8's problems ask them: the FLOPs one
    device computes (its compute time at the data sheet's C) and the time its communication
    takes in that phase, and whether it hides behind the compute."""
    ok = [r for r in pts if r.get("status") == "ok"]
    # the GPU and the model where the points hold more than one
    keys = [k for k in ("device_name", "size", "batch_tokens")
            if len({r["_settings"].get(k) for r in ok}) > 1]
    rows = []
    for r in sorted(ok, key=lambda r: ((*_ORDER, r["_settings"]["strategy"]).index(
            r["_settings"]["strategy"]), *(str(r["_settings"].get(k)) for k in keys),
            r["_settings"]["n"])):
        s, cells = r["_settings"], []
        for phase in ("fwd", "bwd"):
            compute, comm = r.get(f"compute_{phase}_ms"), r.get(f"comm_{phase}_ms")
            if compute is None or comm is None:
                break
            cells += [f"{compute / 1e3 * s['flops']:.3g}", num(compute), num(comm),
                      "yes" if comm <= compute else "no"]
        if len(cells) == 8:
            rows.append([s["strategy"], *(num(s.get(k)) if k == "batch_tokens" else
                                          str(s.get(k)) for k in keys),
                         str(s["n"]), f"{r.get('fsdp_degree')}x{r.get('tp_degree')}", *cells])
    if not rows:
        return None
    return FilledTable(
        "Forward and backward per device: FLOPs and communication",
        ["strategy", *({"device_name": "GPU", "batch_tokens": "B"}.get(k, k) for k in keys),
         "N", "X×Y", "fwd FLOPs", "fwd compute ms", "fwd comm ms", "fwd hides",
         "bwd FLOPs", "bwd compute ms", "bwd comm ms", "bwd hides"], rows,
        note="FLOPs one device computes in the phase (backward twice forward), its time at the "
        "data sheet's dense bf16 C, and the phase's collectives at W (ring: all-gather and "
        "reduce-scatter (N-1)/N S/W, all-reduce twice that); FSDP+TP: the larger of the two "
        "axes' times, overlapped as fsdp_tp_calcs (b) assumes (with --mesh-axes, each axis at "
        "M W); hides: comm <= compute.",
        key=list(range(len(keys) + 2)))


def closed_forms(pts: list[Row]) -> FilledTable | None:
    """Per strategy planned, one FFN layer's FLOPs and communication in the handout's
    letters: what section 8's (a) and (b) ask as expressions, beside the numbers of phases."""
    seen = {(r["_settings"]["strategy"], ACCOUNTING[r["_settings"].get("blocks") or
                                                   "transformer"].matrices)
            for r in pts if r.get("status") == "ok"}
    if not seen:
        return None
    rows = [[strategy, str(m), *pm.closed_forms(strategy, m)]
            for strategy, m in sorted(seen, key=lambda k: ((*_ORDER, k[0]).index(k[0]), k[1]))]
    tp = ("tp", 3) in seen  # the equations are the SwiGLU FFN's
    return FilledTable(
        "One FFN layer in closed form: FLOPs and communication per device",
        ["strategy", "m", "fwd FLOPs", "bwd FLOPs", "fwd comm (s)", "bwd comm (s)"], rows,
        note="m weight matrices of D x F (the 2026 handout's SwiGLU FFN 3, the 2025 xxl 2), "
        "B tokens, N devices (fsdp-tp: X FSDP x Y TP), W egress bytes/s, weights and "
        "activations in bf16 (2 bytes); ring collectives, matmuls alone (2 FLOPs a "
        "multiply-add), backward twice forward." + (
            f" TP's backward (tp_calcs (a)): {pm.TP_BACKWARD}." if tp else ""),
        key=[0, 1])


def inequalities(pts: list[Row]) -> FilledTable | None:
    """Per strategy, the closed-form condition and the largest degree per GPU."""
    seen: dict[tuple, list[str]] = {}
    for r in pts:
        if r.get("status") != "ok":
            continue
        s = r["_settings"]
        # fsdp-tp's two axes overlap, as the handout's max has them, in the whole model's
        # bound and the FFN's alike; the FFN's shared-links bound (its (d)) stands beside
        both = s["strategy"] == "fsdp-tp"
        shared = r.get("n_max_ffn_shared")
        seen[(s["strategy"], s["device_name"], s["size"], s["batch_tokens"])] = [
            s["strategy"], r.get("inequality") or "", s["device_name"],
            f"{_model(r)} B={s['batch_tokens']:,}",
            num(r.get("n_max")) + (" (overlapped)" if both else ""),
            num(r.get("n_max_ffn")) + (f" (overlapped; {num(shared)} shared links)"
                                       if both and shared is not None else ""),
        ]
    if not seen:
        return None
    rows = [seen[k] for k in sorted(seen, key=lambda k: ((*_ORDER, k[0]).index(k[0]), k[1:]))]
    return FilledTable("When communication stops hiding: the closed forms",
                 ["strategy", "condition (single FFN layer)", "GPU", "model, batch",
                  "N max, whole model", "N max, FFN"], rows,
                 note="C dense bf16 FLOP/s, W egress bytes/s per device, B batch tokens, "
                 "F d_ff; X, Y the FSDP and TP degrees (docs/experiments/plan.md).",
                 key=[0, 2, 3])


# The all-reduce algorithms, each (name, seconds of S bytes over N devices at W bytes/s).
ALL_REDUCES = (
    ("ring (reduce-scatter + all-gather)", pm.all_reduce_two_step_s),
    ("alternate ring (whole inputs passed on)", pm.all_reduce_alternate_ring_s),
    ("through one root", pm.all_reduce_naive_s),
    ("binary tree, unpipelined", pm.all_reduce_tree_s),
)


def all_reduces(pts: list[Row]) -> FilledTable | None:
    """DP's all-reduce of the bf16 gradients (S = 2 bytes a parameter) at each degree and
    GPU, by each algorithm of ALL_REDUCES: the handout's ring and its alternate ring side by
    side."""
    seen: dict[tuple, list[str]] = {}
    for r in pts:
        s = r["_settings"]
        if r.get("status") != "ok" or s["strategy"] != "dp" or s["n"] < 2 or not r.get("params"):
            continue
        size = pm.E * r["params"]
        seen[(s["device_name"], s["size"], s["n"])] = [
            s["device_name"], _model(r), str(s["n"]),
            *(num(algorithm(size, s["n"], s["egress"]) * 1e3) for _, algorithm in ALL_REDUCES)]
    if not seen:
        return None
    return FilledTable("All-reduce of the gradients by algorithm (ms; S = 2 bytes a parameter)",
                 ["GPU", "model", "N", *(name for name, _ in ALL_REDUCES)],
                 [seen[k] for k in sorted(seen)],
                 note="ring: 2(N-1)/N S/W; alternate ring: (N-1) S/W, every step sends a whole "
                 "input; through one root: 2(N-1) S/W; binary tree: 2 ceil(log2 N) S/W "
                 "(parallel/plan_math.py).", key=[0, 1, 2])


def mesh(pts: list[Row]) -> FilledTable | None:
    """FSDP+TP points with --mesh-axes: the Scaling Book's compute-bound batch (plan_math.
    mesh_batch_per_device) for their split."""
    body = []
    for r in pts:
        s = r["_settings"]
        if r.get("status") != "ok" or r.get("mesh_batch_per_device_min") is None:
            continue
        mx, my = s["mesh_axes"].split(",")
        body.append([s["device_name"], _model(r), f"{r['fsdp_degree']}x{r['tp_degree']}", mx, my,
                     num(s["flops"] / s["egress"]), num(r["mesh_batch_per_device_min"]),
                     num(r["mesh_batch_min"]), num(bool(r["mesh_tp_hides"]))])
    if not body:
        return None
    return FilledTable("FSDP + TP on a mesh (forward, one FFN layer, the Scaling Book's accounting)",
                 ["GPU", "model", "X×Y", "M_X", "M_Y", "C/W", "batch per device above",
                  "batch above", "TP hides"], body,
                 note="T_FSDP = 2mDF/(Y W M_X), T_TP = 4BD/(X W M_Y), T_math = 2mBDF/(N C), m "
                 "the FFN's matrices (xxl 2, SwiGLU 3), the axes overlapped: compute-bound iff "
                 "B/N > (C/W)/(Y M_X) and mF/(2Y) > (C/W)/M_Y "
                 "(Austin et al. 2025, part 5; parallel/plan_math.py). Batches in tokens.",
                 key=[0, 1, 2])


def _worth(total: Any, device: Any) -> str:  # 2025: "How many H100 80GB GPUs worth"
    return "" if total is None or not device else f"{total / device:,.1f}"


def _whole(r: Any) -> str:
    n = r.get("n_max_whole")
    if n is None:
        return ""
    return f"{n:,} ({r.get('n_max_whole_split')})" if r.get("strategy") == "fsdp-tp" else f"{n:,}"


def _fit(r: Any) -> str:
    """fsdp's smallest degree that fits, or none and the largest batch some degree fits."""
    if r.get("strategy") != "fsdp" or "fsdp_fit_n" not in r:
        return ""
    if r["fsdp_fit_n"] is not None:
        return f"{r['fsdp_fit_n']:,}"
    most = r.get("fsdp_fit_tokens_max")
    return ("none" if most is None else "none (no batch)" if most == 0 else
            f"none (B <= {most:,})")


def _split(r: Any) -> str:
    return f"{r.get('fsdp_degree')}x{r.get('tp_degree')}" if r.get("strategy") == "fsdp-tp" else ""


TIME = Table(
    "Step time and communication per device (bf16, ring collectives)",
    (
        *POINT,
        Column("X×Y", cell=_split, optional=True),
        *column_table("""
            compute ms                 compute_ms        num
            all-gather ms              allgather_ms      num
            reduce-scatter ms          reducescatter_ms  num
            all-reduce ms              allreduce_ms      num
            step ms                    step_ms           num
            hides                      hides             yes_no
            N max                      n_max             num
        """),
        Column("N max, whole", cell=_whole, optional=True),
        *column_table("""
            N max (FFN)                n_max_ffn         num
            N max (FFN, shared links)  n_max_ffn_shared  num     optional
        """),
    ),
    note="compute: forward + backward FLOPs / (N C). all-gather, reduce-scatter: (N-1)/N S/W; "
    "all-reduce: 2(N-1)/N S/W, summed over the step (fsdp-tp with --mesh-axes M_X,M_Y: FSDP's "
    "at M_X W, TP's at M_Y W). step: max(compute, comm) per phase, forward plus backward; "
    "fsdp-tp's comm in a phase is the larger of its two axes', overlapped. hides: "
    "communication no longer than compute in both phases. N max: the largest degree that "
    "still hides, for the whole model (and for one FFN layer, SwiGLU or xxl's two matrices; "
    "for fsdp-tp with the two axes' collectives overlapped, and sharing the links), each "
    "axis's degree a real number, as the handout takes them; N max, whole: the largest that "
    "hides with whole degrees, the FSDP (DP) degree dividing the batch's sequences and TP's "
    "the heads, each under its axis's bound (fsdp-tp: its split), the largest this plan can "
    "run.",
)
MEMORY = Table(
    "Memory per device (GiB)",
    (
        *POINT,
        Column("params", cell=lambda r: gib(r.get("mem_params_bytes"))),
        Column("grads", cell=lambda r: gib(r.get("mem_grads_bytes"))),
        Column("optimizer", cell=lambda r: gib(r.get("mem_opt_state_bytes"))),
        Column("gathered", cell=lambda r: gib(r.get("mem_gathered_bytes"))),
        Column("activations", cell=lambda r: gib(r.get("mem_act_bytes"))),
        Column("act. ckpt", cell=lambda r: gib(r.get("mem_act_ckpt_bytes"))),
        Column("total", cell=lambda r: gib(r.get("mem_total_bytes"))),
        Column("total ckpt", cell=lambda r: gib(r.get("mem_total_ckpt_bytes"))),
        Column("GPU", cell=lambda r: gib(r.get("memory_bytes"))),
        Column("GPUs' worth", cell=lambda r: _worth(r.get("mem_total_bytes"), r.get("memory_bytes"))),
        Column("fits", "fits", "yes_no"),
        Column("fits ckpt", "fits_ckpt", "yes_no"),
        Column("seqs that fit", "fit_seqs"),
        Column("seqs ckpt", "fit_seqs_ckpt"),
        Column("N_FSDP to fit", cell=_fit, optional=True),
    ),
    note="params 2, grads 2, optimizer 12 bytes a parameter (bf16 weights and gradients, fp32 "
    "AdamW state; xxl: 4, 4, 8, the 2025 handout's fp32 master weights, gradients and state), "
    "sharded N ways by FSDP (each tensor padded to a multiple of N), Y ways by TP. gathered: "
    "two FSDP units in bf16 (xxl: none). activations: the tokens one device sees x (L (16D + 8F "
    "+ 4H) + 4D + 6V) bytes (xxl: L (2D + 2F), and under FSDP the handout's half of all B "
    "tokens' sharded N ways, half whole), with TP's split; ckpt: 2D a token a layer plus one "
    "layer recomputed. GPUs' worth: total over the device's memory, both in GiB; a GPU data "
    "sheet's GB read as GiB (an H100's 80GB is 80 GiB, 79.6 usable), the TPU v5p's 95GB as "
    "95 x 10^9 bytes, as the 2025 handout's (b) compares; with a GPU's GB read as 10^9 bytes "
    "it holds 7.4 % less and the GPUs' worth is 7.4 % more. seqs that fit: whole sequences "
    "per device that fit beside the rest. N_FSDP to fit (fsdp): the smallest degree whose "
    "memory per device, (S + sBa)/N + G + (1 - s)Ba, fits the device, S the state's bytes, a "
    "a token's activations, s their share FSDP shards (xxl 1/2) and G the gathered units, "
    "padding left out; none where the activations kept whole, (1 - s)Ba, exceed it alone, with "
    "the largest batch B (tokens) some degree fits.",
)
