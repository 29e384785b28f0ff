"""`cs336sys plan`: step time, communication and memory per device of DP, FSDP, TP and
FSDP+TP, from a GPU's data sheet or from what this GPU measured. Computes on no device and
imports no torch, so it answers at once."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    catalog,
    check_db,
    fail,
    given,
    run_experiment,
    terminal_width,
)
from cs336sys.cli.options import (
    Handout,
    Label,
    Wide,
    list_option,
    option,
    options_of,
    shape_options,
)


class Beside:
    """The sweep's sink: the store's Recorder, each dp or fsdp point first given the
    metrics of the ddp run the store holds for it (experiments/plan_measured.py, ddp_match)."""

    def __init__(self, rec, conn) -> None:
        self.rec, self.conn = rec, conn

    def add(self, experiment, spec, result):
        from cs336sys.experiments.plan_measured import beside, ddp_match

        if self.conn is not None and result.status == "ok":
            run = ddp_match(self.conn, spec.settings())
            if run is not None:
                result.metrics.update(beside(result.metrics, run))
        return self.rec.add(experiment, spec, result)


@options_of(shape_options)
def plan(
    *,
    ctx: typer.Context,
    size: option("Model size preset: tiny, small, ..., xl, 10B, 8b (the CS336 2026 leaderboard "
                 "model), or xxl (the 2025 handout's blocks of two linear layers, "
                 "communication_accounting).", str) = "8b",
    batch: option("Global batch of one step in sequences of --seq tokens, as every command "
                  "counts it. [default: 256]", int | None) = None,
    tokens: option("Global batch of one step in tokens (whole sequences), instead of --batch.",
                   int | None, "--tokens") = None,
    seq: option("Tokens per sequence. [default: 4096]", int | None) = None,
    strategy: list_option("dp, fsdp, tp and/or fsdp-tp. [default: all]") = None,
    n: list_option("Degrees: devices per strategy. [default: 1,2,4,8]", "--n") = None,
    hardware: list_option("Device preset(s): a100, h100, h200, b200 (data sheets), tpu-v5p (the "
                          "2025 handout's). [default: h100 without --measured or --flops]") = None,
    flops: option("C by hand: dense FLOP/s of one device (e.g. 4.6e14), with --bandwidth.",
                  float | None, "--flops") = None,
    bandwidth: option("W by hand: egress bytes/s of one device (e.g. 1.8e11), with --flops.",
                      float | None, "--bandwidth") = None,
    memory_gib: option("With --flops: the device's memory in GiB.", float,
                       "--memory-gib") = 80.0,
    measured: option("C and W as this GPU measured them: the best stored model TFLOP/s and comm "
                     "busbw.", bool, "--measured") = False,
    gpu: option("With --measured: the stored GPU name to use (e.g. from a merged store). [default: "
                "this machine's, 'cpu' without one]", str | None) = None,
    split: option("fsdp-tp: this split XxY (FSDP degree x TP degree, e.g. 16x4) instead of the "
                  "fastest.", str | None, "--split") = None,
    mesh_axes: option("fsdp-tp: MX,MY, the mesh axes its FSDP and TP collectives use (2,1 on a "
                      "3D TPU mesh): adds the Scaling Book's compute-bound batch.", str | None,
                      "--mesh-axes") = None,
    handout: Handout = None,
    label: Label = None,
    wide: Wide = False,
    db: DbOption = DEFAULT_DB,
    **shape: Any,
) -> None:
    """Plan DP, FSDP, TP and FSDP+TP at each degree: compute and communication time per
    collective (ring formulas), whether communication hides behind compute, the largest
    degree before the step is communication-bound (closed form and number), and memory per
    device against the GPU's; one row per point (experiment `plan`). Where the store holds
    ddp runs of the same model, batch and world size, they are set beside the plan.

    Example:

        cs336sys plan --size 8b --hardware h100,b200 --strategy dp,fsdp,tp,fsdp-tp --n 2,4,8,16,64

        cs336sys plan --size xl --flops 4.6e14 --bandwidth 1.8e11 --batch 64 --seq 2048
    """
    from cs336sys.experiments import plan as exp

    # options that only shape another one: given without it, they would be ignored
    if given(ctx, "memory_gib") and flops is None and bandwidth is None:
        fail("--memory-gib is the memory of a device given by hand: give it with --flops and "
             "--bandwidth (a preset's and a measured GPU's memory are their own)")
    if gpu is not None and not measured:
        fail("--gpu picks the stored GPU whose runs --measured reads: give --measured")

    def specs(**options: Any) -> list:
        return exp.specs(hardware=_boxes(db, hardware, flops, bandwidth, memory_gib, measured,
                                         gpu), **options)

    options = dict(size=size, seq=seq, batch=batch, tokens=tokens, strategy=strategy, n=n,
                   split=split, mesh_axes=mesh_axes, handout=handout, label=label, db=db,
                   **shape)
    run_experiment(exp.EXPERIMENT, specs, options, command="plan", recorded_device="none",
                   emulation=False, quiet=True, sink=lambda rec: _beside(rec, db),
                   shown=lambda points: _show(exp, points, wide), executor=exp.arithmetic)


def _boxes(db, hardware, flops, bandwidth, memory_gib, measured, gpu) -> list:
    """The devices to plan for: presets, one given by hand, this GPU as the store measured
    it (the store checked before it is read)."""
    from cs336sys.experiments.plan_hardware import by_hand as given_by_hand
    from cs336sys.experiments.plan_hardware import hardware_presets

    by_hand = given_by_hand(flops, bandwidth, memory_gib)
    boxes: list = (list(hardware_presets(hardware))
                   if hardware or not (measured or by_hand) else [])
    boxes += [by_hand] if by_hand else []
    if measured:
        check_db(db)
        boxes.append(_measured(db, gpu))
    return boxes


@contextmanager
def _beside(rec, db) -> Iterator[Beside]:
    """The sweep's sink: the recorder, each point given the ddp run the store holds for it.
    The ddp lookup reads through a connection of its own, opened once recording has made
    the tables: opened before, on a new file that another `plan` was creating, it found no
    `runs` table."""
    conn = _reader(db)
    try:
        # Rows of arithmetic, written in a burst: WAL's NORMAL sync (this connection only)
        # survives a crash of the process; only a power cut could lose the last rows, which
        # the same command writes again. FULL's sync per row cost a second here.
        rec.store.conn.execute("PRAGMA synchronous = NORMAL")
        yield Beside(rec, conn)
    finally:
        if conn is not None:
            conn.close()


def _reader(db):
    """A read-only connection to the store for the ddp lookup (None if it cannot be read)."""
    from cs336sys.store.db import StoreError, connect_readonly

    try:
        return connect_readonly(db, catalog)
    except StoreError:
        return None


def _measured(db, gpu: str | None):
    """This GPU's Hardware from the store, or exit 2 naming the command to run first."""
    import os

    from cs336sys.experiments.plan_hardware import Hardware
    from cs336sys.experiments.plan_measured import NoMeasurement, measured
    from cs336sys.measure.provenance import smi_gpus
    from cs336sys.store.db import StoreError, connect_readonly

    if gpu is None:
        found = smi_gpus()
        gpu = found[0] if found else "cpu"
    if not db.exists():
        fail(f"--measured: no results store at {db}; run `cs336sys model --precision bf16` and "
             "`cs336sys comm --op all-reduce,all-gather,reduce-scatter` on this GPU first")
    try:
        conn = connect_readonly(db, catalog)
    except StoreError as exc:
        fail(exc)
    try:
        host = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if gpu == "cpu" else None
        m = measured(conn, gpu, host_memory=host)
    except NoMeasurement as exc:
        fail(exc)
    finally:
        conn.close()
    return Hardware(m.gpu, m.flops, m.egress, m.memory_bytes, m.source)


def _show(exp, points, wide: bool) -> None:
    """The time and memory tables, the closed forms, the plan beside measured runs: each cut
    to the terminal's width as a measuring command's are, or in one piece with `wide`."""
    from cs336sys.experiments.plan_section import MEASURED, formula_tables, measured_rows
    from cs336sys.report.tables import as_text, point_tables, row_of

    rows = [row_of(p.spec, p.result) for p in points]
    ok = [r for r in rows if r["status"] == "ok"]
    tables = point_tables(exp.EXPERIMENT.tables, ok, lift=0 if wide else 1)
    extra = formula_tables(ok) + point_tables([MEASURED], measured_rows(ok), lift=0)
    typer.echo(as_text(tables + extra, width=None if wide else terminal_width()))
    for source in dict.fromkeys(p.spec.source for p in points):
        typer.echo(f"source: {source}")
    for p in points:
        if p.result.status != "ok":  # stored too, with the reason
            typer.echo(f"{p.spec.device_name} {p.spec.strategy} N={p.spec.n}: {p.result.error}",
                       err=True)
