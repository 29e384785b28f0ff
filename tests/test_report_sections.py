"""What each report section shows ("Reports show what each experiment is about").

Built through the library (report/render.py's build and write, what `cs336sys report` calls)
from the fixed store of tests/report_fixture.py, from rows made here, and from the committed
H100 store (reports/h100/results.db). Expected figures are worked out by hand from the
stored values, never read back from the code under test.
"""

import json
import re
import struct
from pathlib import Path

import pytest

from cs336sys.experiments import memory_section, model_section
from cs336sys.experiments.catalog import EXPERIMENTS, by_kind
from cs336sys.measure.device import MFU_NOTE
from cs336sys.report.experiment_section import build_section
from cs336sys.report.plots import Bars, Plot
from cs336sys.report.render import build, write
from cs336sys.report.sections import Section, latest
from cs336sys.report.select import Selection, load
from cs336sys.report.tables import point_table
from cs336sys.store.db import connect_readonly
from tests.report_fixture import F32_SUM, OPT_PEAK
from tests.report_fixture import build as build_fixture

H100_DB = Path(__file__).resolve().parent.parent / "reports" / "h100" / "results.db"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build_fixture(tmp_path_factory.mktemp("fixture") / "results.db")


@pytest.fixture(scope="module")
def rendered(store, tmp_path_factory):
    """The fixture's report, built and written as HTML and markdown."""
    out = tmp_path_factory.mktemp("out")
    conn = connect_readonly(store)
    try:
        rep = build(conn, Selection(), "fixture", [], EXPERIMENTS)
    finally:
        conn.close()
    write(rep, out, ["html", "md"])
    return rep, (out / "report.html").read_text(), (out / "report.md").read_text()


def section(rep, kind: str) -> Section:
    return next(s for s in rep.sections if s.id == kind)


def table(sec: Section, title_start: str):
    return next(t for t in sec.tables if t.title.startswith(title_start))


def column(t, header: str) -> list[str]:
    i = t.headers.index(header)
    return [row[i] for row in t.rows]


# -- precision ---------------------------------------------------------------------------------


@pytest.mark.slow
def test_precision_shows_every_digit_of_the_sum(rendered):
    rep, html, md = rendered
    t = table(section(rep, "precision"), "Accumulation")
    row = next(r for r in t.rows if "float32 sum" in r)
    assert row[t.headers.index("result")] == "10.000133514404297" == repr(F32_SUM)
    assert row[t.headers.index("error vs exact")] == repr(F32_SUM - 10.0)
    assert row[t.headers.index("addend as stored")] == "0.009999999776482582"
    assert "<td>10.000133514404297</td>" in html
    assert re.search(r"^\| float32 sum \|.*\| 10\.000133514404297 \|", md, re.M)


# -- checkpointing -----------------------------------------------------------------------------


def test_checkpointings_step_time_is_a_ratio_of_medians_with_its_interval():
    """`step time vs none` divided means: two steps a side, 6,337 and 1,843 ms against 1,865
    and 4,849, read every:1 0.82x, checkpointing faster. It divides medians and says what
    their samples can carry: too few to tell, or the interval without a verdict (memory runs
    its points one after the other)."""
    import json
    import statistics

    from cs336sys.experiments.memory_section import _step_ratio

    def row(steps):
        return {"invocation_id": "one", "_settings": {"checkpoint": "x"},
                "step_ms_mean": statistics.mean(steps), "step_ms_median": statistics.median(steps),
                "_samples": json.dumps({"step_ms": steps})}

    none, every = row([1865.0, 4849.0]), row([6337.0, 1843.0])
    assert _step_ratio(none, none) == "1.00×"
    assert _step_ratio(every, none) == "1.22× (too few samples to tell)"
    none = row([200.0, 201.0, 199.0, 200.5, 200.2, 199.8])
    every = row([320.0, 321.0, 900.0, 319.0, 320.5, 320.2])
    # one slow step: the means' 2.08x, the medians' 1.60x
    assert re.fullmatch(r"1\.60× \(1\.\d\d–\d\.\d\d, not interleaved\)", _step_ratio(every, none)), \
        _step_ratio(every, none)


def test_checkpointing_compares_activation_peaks_and_shows_the_optimizer_apart(rendered):
    """The fixture's medium group: the optimizer step (1100 MiB) sets every point's step
    peak, so the step peaks are all equal; the forward and backward peaks and the saved
    bytes are what checkpointing lowers, each against `none`."""
    rep, html, md = rendered
    t = table(section(rep, "memory"), "Checkpointing trade-off")
    assert t.headers == [
        "point", "checkpoint", "fwd peak MiB", "fwd peak vs none", "bwd peak MiB",
        "bwd peak vs none", "saved MiB", "saved vs none", "step time vs none",
        "optimizer step peak MiB", "optimizer state MiB (AdamW)", "step peak set by",
    ]
    rows = {r[1]: r for r in t.rows if r[0] == "medium T=128 B=4 train fp32"}
    assert list(rows) == ["none", "every:1", "sqrt"]  # the baseline first

    def cells(ckpt):
        return dict(zip(t.headers, rows[ckpt], strict=True))

    # fixture: fwd = 600 + 400·a, bwd = 700 + 380·a MiB, saved = 300·a MiB, step = 200·(2 - a)
    # ms, with a = 1 (none), 0.4 (every:1), 0.5 (sqrt)
    none, every, sqrt = cells("none"), cells("every:1"), cells("sqrt")
    assert (none["fwd peak MiB"], none["bwd peak MiB"], none["saved MiB"]) == ("1,000.0", "1,080.0", "300.0")
    assert [none[k] for k in ("fwd peak vs none", "bwd peak vs none", "saved vs none",
                              "step time vs none")] == ["1.00×"] * 4
    assert (every["fwd peak MiB"], every["fwd peak vs none"]) == ("760.0", "0.76×")  # 760/1000
    assert (every["bwd peak MiB"], every["bwd peak vs none"]) == ("852.0", "0.79×")  # 852/1080
    assert (every["saved MiB"], every["saved vs none"]) == ("120.0", "0.40×")
    assert every["step time vs none"] == "1.60×"  # 320 / 200 ms
    assert (sqrt["bwd peak vs none"], sqrt["saved vs none"]) == ("0.82×", "0.50×")  # 890/1080
    for c in (none, every, sqrt):  # the optimizer, apart: unchanged by checkpointing
        assert c["optimizer step peak MiB"] == f"{OPT_PEAK / 2**20:,.1f}" == "1,100.0"
        assert c["optimizer state MiB (AdamW)"] == "400.0"
        assert c["step peak set by"] == "optimizer"
    # the small group: the backward pass sets its peak
    small = [r for r in t.rows if r[0].startswith("small T=128")]
    assert [r[t.headers.index("step peak set by")] for r in small] == ["backward", "backward"]
    assert not any("lowest" in c for r in t.rows for c in r)  # every row was "lowest" at 1.00×
    assert "| medium T=128 B=4 train fp32 | every:1 | 760.0 | 0.76× | 852.0 | 0.79× |" in md


def test_checkpointing_groups_never_mix_settings_or_gpus():
    """A group is the points equal in everything but checkpoint (GPU included): a point with
    no `none` beside it is not compared with another point's `none`."""

    def row(ckpt, gpu="H100", ctx=128, fwd=100.0):
        s = {"size": "s", "seq": ctx, "batch": 1, "mode": "train",
             "precision": "fp32", "checkpoint": ckpt}
        return {**s, "_settings": s, "status": "ok", "gpu": gpu, "peak_bytes": 300 * 2**20,
                "fwd_peak_bytes": fwd * 2**20, "bwd_peak_bytes": 2 * fwd * 2**20,
                "opt_peak_bytes": 300 * 2**20, "saved_bytes": fwd * 2**20, "step_ms_mean": 10.0}

    rows = [row("none"), row("sqrt", fwd=50.0), row("sqrt", gpu="A100", fwd=70.0),
            row("sqrt", ctx=256, fwd=60.0)]
    sec = Section("memory", "m")
    memory_section.section(sec, latest(rows))
    t = table(sec, "Checkpointing trade-off")
    assert [(r[0], r[1], r[3]) for r in t.rows] == [
        ("s T=128 B=1 train fp32 [H100]", "none", "1.00×"),
        ("s T=128 B=1 train fp32 [H100]", "sqrt", "0.50×"),
    ]


def test_memory_tables_name_the_users_model_beside_ours():
    """The trade-off and the optimizer-step tables of the user's model and of cs336sys's at
    the same size: each row says whose model it measured."""

    def row(model, ckpt, fwd):
        s = {"size": "tiny", "seq": 32, "batch": 2, "mode": "train", "precision": "fp32",
             "checkpoint": ckpt, "model": model}
        return {**s, "_settings": s, "status": "ok", "gpu": "cpu", "peak_bytes": 300 * 2**20,
                "fwd_peak_bytes": fwd * 2**20, "bwd_peak_bytes": 2 * fwd * 2**20,
                "opt_peak_bytes": 300 * 2**20, "saved_bytes": fwd * 2**20, "step_ms_mean": 1.0,
                "init_bytes": 2**20, "before_opt_bytes": 2**21, "after_opt_bytes": 2**21}

    sec = Section("memory", "m")
    memory_section.section(sec, latest([row(None, "none", 100.0), row(None, "every:1", 50.0),
                                        row("cs336_basics", "none", 90.0),
                                        row("cs336_basics", "every:1", 40.0)]))
    points = [r[0] for r in table(sec, "Checkpointing trade-off").rows]
    assert points == ["tiny T=32 B=2 train fp32"] * 2 + [
        "tiny T=32 B=2 train fp32 model=cs336_basics"] * 2
    around = [r[0] for r in table(sec, "Memory around the optimizer step").rows]
    assert around == ["tiny T=32 B=2 fp32 ckpt=none", "tiny T=32 B=2 fp32 ckpt=every:1",
                      "tiny T=32 B=2 fp32 ckpt=none model=cs336_basics",
                      "tiny T=32 B=2 fp32 ckpt=every:1 model=cs336_basics"]


def test_checkpointing_rows_of_two_shapes_of_one_size_name_their_shapes():
    """`--d-model 64` and `--d-model 128` at size tiny, and a store of the user's model alone:
    the trade-off's rows all read `tiny T=32 B=2 train fp32`, where the table beside it named
    `tiny (64×2, 95k)`, `tiny (128×2, 256k)` and `model=cs336_basics`."""

    def row(d_model, params, ckpt, model=None):
        s = {"size": "tiny", "d_model": d_model, "num_layers": 2, "seq": 32, "batch": 2,
             "mode": "train", "precision": "fp32", "checkpoint": ckpt, "model": model}
        return {**s, "_settings": s, "status": "ok", "gpu": "cpu", "params": params,
                "peak_bytes": 3 * 2**20, "fwd_peak_bytes": 2**20, "bwd_peak_bytes": 2**21,
                "opt_peak_bytes": 3 * 2**20, "saved_bytes": 2**20, "step_ms_mean": 1.0}

    sec = Section("memory", "m")
    memory_section.section(sec, latest([row(64, 95_000, "none"), row(64, 95_000, "every:1"),
                                        row(128, 256_000, "none"),
                                        row(128, 256_000, "every:1")]))
    assert [r[0] for r in table(sec, "Checkpointing trade-off").rows] == [
        "tiny (64×2, 95k) T=32 B=2 train fp32"] * 2 + [
        "tiny (128×2, 256k) T=32 B=2 train fp32"] * 2
    sec = Section("memory", "m")
    memory_section.section(sec, latest([row(64, 95_000, c, "cs336_basics")
                                        for c in ("none", "every:1")]))
    assert [r[0] for r in table(sec, "Checkpointing trade-off").rows] == [
        "tiny (64×2, 95k) T=32 B=2 train fp32 model=cs336_basics"] * 2


# -- attention ---------------------------------------------------------------------------------


def test_a_ratio_column_stands_only_where_its_baseline_was_measured():
    """`vs naive` of a run that measured no naive would be empty in every row (or say
    `wrong` where the check column already does): it is left out, with its note; with a
    naive point beside it, it stands."""
    from cs336sys.experiments.attention_section import TABLE

    def row(impl, ms, status="ok"):
        s = {"impl": impl, "d_head": 32, "seq": 128, "heads": 4, "batch": 4,
             "precision": "fp32", "pass": "both"}
        return {**s, "_settings": s, "status": status, "gpu": "cpu", "e2e_ms_mean": ms,
                "e2e_ms_median": ms, "e2e_ms_std": 0.1, "fwd_ms_mean": ms / 3,
                "bwd_ms_mean": 2 * ms / 3}

    theirs = [row("yours-torch", 3.0), row("flash-torch", 2.0, status="wrong")]
    alone = point_table(TABLE, theirs)
    assert "vs naive" not in alone.headers and "vs naive" not in alone.note
    beside = point_table(TABLE, [*theirs, row("naive", 6.0)])
    assert column(beside, "vs naive") == ["2.00×", "wrong", "1.00×"]
    assert "vs naive: naive's median time" in beside.note



@pytest.mark.slow
def test_interpreted_points_have_their_own_table_and_stay_off_the_plots(rendered):
    rep, html, md = rendered
    sec = section(rep, "attention")
    native = table(sec, "Latency (mean ± std)")
    interp = next(t for t in sec.tables if "interpreted" in t.title)
    assert native is not interp and "TRITON_INTERPRET=1" in interp.title
    impls = column(native, "impl")
    assert "triton (interp.)" not in impls and impls.count("naive") == 5  # 3 cuda (one OOM) + 2 cpu
    assert "impl=triton (interp.)" in interp.constant  # the same in both rows: above the table
    assert column(interp, "seq") == ["128", "256"]
    # vs naive: the native CPU naive point of the same shape, 3·0.2·s² over 3·10·s² ms
    assert column(interp, "vs naive") == ["0.02×", "0.02×"]
    assert column(interp, "TFLOP/s") == ["0.0001", "2.5e-05"]  # 1e-3 / (10·s²)
    assert column(interp, "max err") == ["7.0e-07", "7.0e-07"]
    for name in ("attention-latency", "attention-memory"):
        fig = next(f for f in sec.figures if f.name == name)
        assert isinstance(fig.plot, Plot)
        labels = {lab for series in fig.plot.panels.values() for lab in series}
        assert labels == {"impl=naive precision=bf16 heads=16", "impl=flash-triton precision=bf16 heads=16",
                          "impl=naive precision=fp32 heads=4"}  # no impl=triton (interpreted)
        assert set(fig.plot.panels) == {"d_head=32", "d_head=64"}
        assert "Left out: 2 interpreted points" in fig.note
    # the native plot's d=32 panel holds the CPU naive line only, its two points by hand
    lat = next(f for f in sec.figures if f.name == "attention-latency").plot
    assert list(lat.panels["d_head=32"].values()) == [[(128, pytest.approx(0.6)),
                                                       (256, pytest.approx(2.4))]]
    assert "Left out: 2 interpreted points" in html and "— Triton interpreted" in md


# -- capped plots ------------------------------------------------------------------------------


def _model_row(size, step, n):
    s = {"size": size, "seq": 128 * n, "batch": 4, "mode": "train",
         "precision": "fp32", "compile": False}
    smp = {"step_ms": [step, step], "warmup": {"step_ms": [3 * step]}}
    return {**s, "_settings": s, "status": "ok", "gpu": "H100", "_samples": json.dumps(smp),
            "step_ms_mean": step, "fwd_ms_mean": step / 3, "bwd_ms_mean": step / 2,
            "opt_ms_mean": step / 6, "tokens_per_s": 512 * n / step, "mfu": None}


def test_the_warmup_plot_says_which_series_it_leaves_out():
    rows = [_model_row("small", 10.0 + n, n) for n in range(1, 14)]  # 13 points
    sec = Section("model", "m")
    model_section.section(sec, latest(rows))
    warm = table(sec, "Warm-up effect")
    assert len(warm.rows) == 13
    fig = next(f for f in sec.figures if f.name == "model-warmup")
    assert len(fig.plot.panels[""]) == 8
    left = [f"small T={128 * n} B=4 train fp32" for n in range(9, 14)]
    assert fig.note == ("Showing 8 of 13 series (the table above has every point); left out: "
                        + ", ".join(left) + ".")
    # at most 8 series: nothing is left out, nothing is said
    sec = Section("model", "m")
    model_section.section(sec, latest(rows[:8]))
    assert next(f for f in sec.figures if f.name == "model-warmup").note == ""


def test_points_that_differ_in_an_unnamed_setting_get_labels_of_their_own():
    """Two optimizers (or two --d-model overrides) at one size read as one label: the
    warm-up table listed `small T=128 B=4 train fp32` twice and the plot kept one line of
    the two."""
    rows = []
    for optimizer, d_model, step in (("adamw", 64, 10.0), ("torch-adamw", 64, 20.0),
                                     ("adamw", 128, 30.0)):
        row = _model_row("small", step, 1)
        row["_settings"] = {**row["_settings"], "optimizer": optimizer, "d_model": d_model}
        rows.append(row)
    sec = Section("model", "m")
    model_section.section(sec, latest(rows))
    labels = [r[0] for r in table(sec, "Warm-up effect").rows]
    assert labels == ["small T=128 B=4 train fp32 d_model=64 optimizer=adamw",
                      "small T=128 B=4 train fp32 d_model=64 optimizer=torch-adamw",
                      "small T=128 B=4 train fp32 d_model=128 optimizer=adamw"]
    plot = next(f for f in sec.figures if f.name == "model-warmup").plot
    assert sorted(plot.panels[""]) == sorted(labels)
    # a setting that goes with one already named (the optimizer with the mode: none
    # forward, adamw train) is not said again
    rows = []
    for mode, optimizer in (("forward", "none"), ("train", "adamw")):
        row = _model_row("small", 10.0, 1)
        row["_settings"] = {**row["_settings"], "mode": mode, "optimizer": optimizer}
        rows.append(row)
    sec = Section("model", "m")
    model_section.section(sec, latest(rows))
    assert [r[0] for r in table(sec, "Warm-up effect").rows] == [
        "small T=128 B=4 forward fp32", "small T=128 B=4 train fp32"]


def test_the_warmup_effect_has_the_point_without_warm_up():
    """benchmarking_script (c): without warm-up the first step is a timed one, in the table
    and the plot beside the points that warmed up; a point that warmed up and kept no
    warm-up samples (an older store) is left out, not read as one without."""
    def row(warmup, warm, timed):
        s = {"size": "small", "seq": 128, "batch": 4, "mode": "train", "precision": "fp32",
             "compile": False, "warmup": warmup}
        smp = {"step_ms": timed, **({"warmup": {"step_ms": warm}} if warm is not None else {})}
        return {**s, "_settings": s, "status": "ok", "gpu": "H100", "_samples": json.dumps(smp),
                "step_ms_mean": sum(timed) / len(timed)}

    rows = [row(0, [], [40.0, 10.0, 10.0]), row(1, [30.0], [10.0, 10.0, 10.0]),
            row(5, None, [10.0, 10.0, 10.0])]
    sec = Section("model", "m")
    model_section.section(sec, latest(rows))
    assert table(sec, "Warm-up effect").rows == [
        ["small T=128 B=4 train fp32 warmup=0", "40", "20", "2.00×"],
        ["small T=128 B=4 train fp32 warmup=1", "30", "10", "3.00×"]]
    plot = next(f for f in sec.figures if f.name == "model-warmup").plot
    lines = plot.panels[""]
    assert lines["small T=128 B=4 train fp32 warmup=0"] == [(1, 40.0), (2, 10.0), (3, 10.0)]
    assert len(lines["small T=128 B=4 train fp32 warmup=1"]) == 4
    assert plot.logy is False  # 4x: the timed steps stand apart on a linear axis
    # a first step 76x the timed ones (an H100's compile): on a linear axis every timed step
    # lay in one band at the bottom; a log axis keeps them apart
    sec = Section("model", "m")
    model_section.section(sec, latest([row(0, [], [3659.0, 48.0, 50.0]),
                                       row(1, [1402.0], [49.0, 51.0, 50.0])]))
    assert next(f for f in sec.figures if f.name == "model-warmup").plot.logy is True


def test_the_bucket_plot_is_in_mib_and_names_the_series_it_leaves_out(rendered):
    rep, html, _ = rendered
    fig = next(f for f in section(rep, "ddp").figures if f.name == "ddp-buckets")
    assert fig.plot.xlabel == "bucket size (MiB)"
    assert list(fig.plot.panels[""]) == ["impl=bucketed"]
    # the torch DDP points (bucket 25 MiB) each have one bucket size: in the table only
    assert fig.note.startswith("Showing 1 of 3 series (those with one bucket size are in the "
                               "table); left out: impl=torch")
    assert "bucket size (MB)" not in html


def test_every_capped_plot_of_the_fixture_says_so_in_its_caption(rendered):
    """Each figure whose plot leaves something out has a note; the HTML caption and the
    markdown carry it."""
    rep, html, md = rendered
    notes = [f.note for s in rep.sections for f in s.figures if f.note]
    assert len(notes) >= 3  # attention latency and memory, ddp buckets
    for note in notes:
        assert note in md or note.replace("'", "&#39;") in html
    assert html.count("<figcaption>") == sum(len(s.figures) for s in rep.sections)


# -- model -------------------------------------------------------------------------------------


def test_the_model_chart_stacks_the_phases_per_size_and_precision(rendered):
    """The fixture's train points (latest per point): small fp32 at B (120 ms), small bf16
    at B (51 ms), small bf16 compiled at A (40 ms); phases 0.3 / 0.6 / 0.1 of the step."""
    rep, html, md = rendered
    fig = next(f for f in section(rep, "model").figures if f.name == "model-steps")
    bars = fig.plot
    assert isinstance(bars, Bars) and bars.parts == ("forward", "backward", "optimizer")
    assert [(b.group, b.label) for b in bars.bars] == [
        ("small", "fp32"), ("small", "bf16"), ("small", "bf16 compiled")]
    fp32, bf16, _ = bars.bars
    assert fp32.parts == pytest.approx((36.0, 72.0, 12.0)) and fp32.total == 120.0
    assert fp32.side == pytest.approx(512 / 120 * 1e3) and fp32.side_note == ""  # no fp32 peak
    assert bf16.side_note == f"{100 * 0.001 * 512 / 51 / 989:.1f}%"
    png = fig.png
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", png[16:24])
    assert width > height and width <= 1240  # beside each other, within the page
    assert 'alt="Step time by phase, tokens/s and MFU"' in html
    assert "![Step time by phase, tokens/s and MFU](report_files/model-steps.png)" in md


def test_the_users_model_beside_ours_is_named_on_its_bar():
    """Unset `model` is cs336sys's model, not "does not apply": a bar of the user's model
    beside ours says whose it is (it said only `fp32 checkpoint=every:1`)."""
    from cs336sys.report.sections import Section

    def row(model, attention, ckpt):
        s = {"size": "tiny", "seq": 32, "batch": 2, "mode": "train", "precision": "fp32",
             "model": model, "attention": attention, "checkpoint": ckpt, "warmup": 1}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": 100.0, "fwd_ms_mean": 30.0,
                "bwd_ms_mean": 60.0, "opt_ms_mean": 10.0, "tokens_per_s": 640.0}

    sec = Section("model", "Model")
    model_section.section(sec, [row(None, "naive", "none"),
                                row("cs336_basics", None, "every:1")])
    (fig,) = [f for f in sec.figures if f.name.startswith("model-steps")]
    assert [b.label for b in fig.plot.bars] == [
        "fp32 checkpoint=none", "fp32 checkpoint=every:1 model=cs336_basics"]


def test_one_size_name_over_two_shapes_is_two_groups_named_by_shape():
    """`tiny` at d_model 512 and at 256 (or the 2025 and 2026 xl) made two bars labelled
    fp32 under one group `tiny`: two models read as one. Each group says its shape."""
    from cs336sys.report.sections import Section

    def row(d_model, params, precision):
        s = {"size": "tiny", "seq": 32, "batch": 2, "mode": "train", "precision": precision,
             "d_model": d_model, "num_layers": 4}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": 100.0, "fwd_ms_mean": 30.0,
                "bwd_ms_mean": 60.0, "opt_ms_mean": 10.0, "tokens_per_s": 640.0,
                "params": params}

    sec = Section("model", "Model")
    model_section.section(sec, [row(512, 23e6, "fp32"), row(256, 10e6, "fp32"),
                                row(512, 23e6, "bf16")])
    (fig,) = [f for f in sec.figures if f.name.startswith("model-steps")]
    assert [(b.group, b.label) for b in fig.plot.bars] == [
        ("tiny\n(256×4, 10M)", "fp32"), ("tiny\n(512×4, 23M)", "fp32"),
        ("tiny\n(512×4, 23M)", "bf16")]


def test_bars_that_differ_in_a_number_are_in_its_order():
    """benchmarking_script's warm-up study run after the 5-warm-up point: the bars read
    warmup=0, 1, 2, 5, not warmup=5, 0, 1, 2 (the order they were stored in)."""
    def row(warmup):
        s = {"size": "tiny", "seq": 64, "batch": 4, "mode": "train", "precision": "fp32",
             "warmup": warmup}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": 100.0, "fwd_ms_mean": 30.0,
                "bwd_ms_mean": 60.0, "opt_ms_mean": 10.0, "tokens_per_s": 640.0}

    sec = Section("model", "Model")
    model_section.section(sec, [row(5), row(0), row(1), row(2)])
    (fig,) = [f for f in sec.figures if f.name.startswith("model-steps")]
    assert [b.label for b in fig.plot.bars] == [f"fp32 warmup={w}" for w in (0, 1, 2, 5)]


def test_one_size_over_several_contexts_gets_its_chart_too():
    """A laptop's sweep (`make demo`: tiny fp32, seq 32 and 64, forward and train) made a
    chart per mode, context and batch, each of one bar, and a chart of one bar is dropped:
    the report had no step-time chart. One chart per mode holds them, a bar per context."""
    def row(mode, seq):
        s = {"size": "tiny", "seq": seq, "batch": 2, "mode": mode, "precision": "fp32"}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": seq * 1.0,
                "fwd_ms_mean": seq / 2, "bwd_ms_mean": seq / 2, "tokens_per_s": 640.0}

    sec = Section("model", "Model")
    model_section.section(sec, [row(m, t) for m in ("forward", "train") for t in (32, 64)])
    charts = [f for f in sec.figures if f.name.startswith("model-steps")]
    # no MFU on a CPU: the caption does not promise it
    assert [f.title for f in charts] == [f"Step time by phase, tokens/s: mode={m}"
                                         for m in ("train", "forward")]
    assert [b.label for b in charts[0].plot.bars] == ["fp32 seq=32", "fp32 seq=64"]
    assert all(f.plot.informative for f in charts)
    # no MFU on a CPU (its peak is unknown): no note explaining one under the chart
    assert all("MFU:" not in f.note for f in charts)


def test_the_h100_sweep_gets_a_chart_per_mode_sizes_in_order():
    """The committed H100 store: train, then forward-backward, then forward; sizes small to
    2.7B by parameter count; naive fp32 and bf16 at every size, SDPA and Triton bf16 at small
    and xl (the attention sweep of the model command)."""
    conn = connect_readonly(H100_DB)
    try:
        rows = load(conn, Selection(experiments=("model",)), EXPERIMENTS)["model"]
    finally:
        conn.close()
    sec = build_section(by_kind()["model"], rows)
    charts = [f for f in sec.figures if isinstance(f.plot, Bars)]
    assert [f.title for f in charts] == [f"Step time by phase, tokens/s and MFU: mode={m}"
                                         for m in ("train", "forward-backward", "forward")]
    train = [(b.group, b.label) for b in charts[0].plot.bars]
    assert [g for g, _ in train] == ["small"] * 4 + ["medium"] * 2 + ["large"] * 2 + ["xl"] * 4 + ["2.7B"] * 2
    assert train[:4] == [("small", "fp32 naive"), ("small", "bf16 naive"), ("small", "bf16 sdpa"),
                         ("small", "bf16 triton")]
    # 2.7B fp32 train: 327 + 680 + 94.8 ms of a 1,102 ms step, MFU 57.7 % (the table's figures)
    big = next(b for b in charts[0].plot.bars if (b.group, b.label) == ("2.7B", "fp32 naive"))
    assert [round(p) for p in big.parts] == [327, 680, 95] and round(big.total) == 1102
    assert big.side_note == "57.7%"
    assert all(f.note == MFU_NOTE for f in charts)  # nothing capped


# -- tables ------------------------------------------------------------------------------------


def test_settings_the_same_in_every_row_go_above_the_table(rendered):
    rep, html, md = rendered
    t = table(section(rep, "model"), "Time per phase")
    assert t.constant == "seq=128, batch=4, mode=train, warmup=2, ckpt=none, attention=naive, optimizer=adamw"
    assert t.headers[:3] == ["size", "precision", "compile"]
    assert "seq" not in t.headers and "mode" not in t.headers
    assert f'<p class="constant">Same in every row: {t.constant}</p>' in html
    assert f"Same in every row: {t.constant}" in md
    # the command's own printout keeps every column
    model = by_kind()["model"].tables[0]
    two = [_model_row("small", 10.0, 1), _model_row("medium", 20.0, 1)]
    printed = point_table(model, two, status=True)
    assert printed.constant == "" and "seq" in printed.headers
    lifted = point_table(model, two, lift=2)
    assert lifted.constant == "seq=128, batch=4, mode=train, precision=fp32, compile=no"
    assert lifted.headers[0] == "size" and [r[0] for r in lifted.rows] == ["small", "medium"]


def test_table_headers_say_mib_for_binary_bytes_and_gb_only_for_decimal():
    """Byte columns are MiB (2^20); 'GB/s' only where the value is 10^9 bytes per second
    (comm's algbw and busbw, computed as bytes / s / 1e9); no bare MB anywhere."""
    headers = [c.header for e in EXPERIMENTS for t in e.tables for c in t.columns]
    decimal = [h for h in headers if re.search(r"\b[KMGT]B\b", h)]
    assert sorted(decimal) == ["algbw GB/s", "busbw GB/s"]
    assert any("MiB" in h for h in headers)


def test_memory_draws_its_accounted_parts_beside_the_measured_peak_and_step_time():
    """Even at one sequence length (the line plot needs two): per point, the analytic parts
    stacked, the measured peak as the total, the step time beside it."""
    from cs336sys.experiments import memory_section
    from cs336sys.report.sections import Section

    def row(ckpt, peak, act, ms):
        s = {"size": "tiny", "seq": 128, "batch": 2, "mode": "train", "precision": "fp32",
             "checkpoint": ckpt}
        return {**s, "_settings": s, "status": "ok", "peak_bytes": peak * 2**20,
                "param_bytes": 10 * 2**20, "grad_bytes": 10 * 2**20, "optim_bytes": 20 * 2**20,
                "act_bytes_analytic": act * 2**20, "step_ms_mean": ms}

    sec = Section("memory", "Memory")
    memory_section.section(sec, [row("none", 100, 55, 10.0), row("every:1", 60, 12, 13.0)])
    (fig,) = [f for f in sec.figures if f.name == "memory-parts"]
    bars = fig.plot.bars
    assert [b.label for b in bars] == ["T=128 train none", "T=128 train every:1"]
    assert [b.parts for b in bars] == [(10.0, 10.0, 20.0, 55.0), (10.0, 10.0, 20.0, 12.0)]
    assert [(b.total, b.side) for b in bars] == [(100.0, 10.0), (60.0, 13.0)]
    assert fig.plot.rest == "not in the accounting"
    assert all(f.name != "memory-peak" for f in sec.figures)  # one seq: no line to draw


def test_profile_draws_each_points_top_kernels_by_phase():
    from cs336sys.experiments import profile
    from cs336sys.report.sections import Section

    s = {"target": "model", "size": "small", "seq": 128, "mode": "train", "precision": "bf16"}
    row = {**s, "_settings": s, "status": "ok", "run_id": "r1"}
    kernels = [{"phase": "forward", "rank": 1, "name": "gemm", "calls": 4, "total_ms": 6.0,
                "mean_ms": 1.5, "share": 0.6, "time_basis": "cuda"},
               {"phase": "backward", "rank": 1, "name": "gemm", "calls": 8, "total_ms": 15.0,
                "mean_ms": 1.9, "share": 0.7, "time_basis": "cuda"}]
    sec = Section("profile", "Profile", linked={"r1": kernels})
    profile.section(sec, [row])
    (fig,) = sec.figures
    assert fig.name == "profile-top-0"
    assert fig.plot.items == (("gemm", 6.0, "forward"), ("gemm", 15.0, "backward"))
    assert fig.plot.draw()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_ddp_table_shows_the_backward_its_note_points_to():
    """The note says what launching overlap's reductions costs the backward is in bwd ms;
    no table showed bwd ms (an optional timed column was read by its bare key, `bwd_ms`,
    which no row has: always left out). Shown where a row has it, left out where none."""
    from cs336sys.experiments import ddp_section
    from cs336sys.report.tables import point_tables

    s = {"impl": "overlap", "world_size": 2, "size": "tiny"}
    row = {**s, "_settings": s, "status": "ok", "step_ms_mean": 100.0, "step_ms_std": 1.0,
           "comm_ms_mean": 5.0, "comm_ms_std": 0.5}
    (without,) = point_tables((ddp_section.TABLE,), [row])
    (timed,) = point_tables((ddp_section.TABLE,), [{**row, "bwd_ms_mean": 60.0,
                                                     "bwd_ms_std": 2.0}])
    assert "bwd ms" not in without.headers and "bwd ms" in timed.headers
    assert timed.rows[0][timed.headers.index("bwd ms")] == "60 ± 2"
    # the user's DDP: what its comm ms holds is said where it is a row, and only there
    assert "of your code" not in timed.note
    theirs = {**row, "impl": "yours", "_settings": {**s, "impl": "yours"}}
    (mixed,) = point_tables((ddp_section.TABLE,), [row, theirs])
    assert "comm ms of your code (yours...): the time in its finish_gradient_synchronization " \
        "alone" in mixed.note


def test_ddp_draws_each_step_split_into_waiting_on_communication_and_the_rest():
    from cs336sys.experiments import ddp_section
    from cs336sys.report.sections import Section

    def row(impl, step, comm, tokens, bucket=None, sharding="none"):
        s = {"impl": impl, "world_size": 2, "bucket_mb": bucket, "shard_optimizer": sharding,
             "size": "tiny", "seq": 64}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": step, "comm_ms_mean": comm,
                "tokens_per_s": tokens}

    sec = Section("ddp", "DDP")
    ddp_section.section(sec, [row("flat", 100.0, 30.0, 50.0),
                              row("bucketed", 80.0, 10.0, 60.0, bucket=25),
                              row("torch", 90.0, 20.0, 55.0, sharding="zero"),
                              row("fsdp", 120.0, 50.0, 40.0)])
    (fig,) = [f for f in sec.figures if f.name == "ddp-steps"]
    # fsdp's is the time with a collective in flight, hidden or not: a part of its own (it
    # read as waiting, 46 % of its step, beside the others' exposed waiting)
    # torch's, backward less backward without the reduction, is a part of its own too (it
    # read as "waiting on communication" beside the wrappers' exposed wait)
    assert [(b.group, b.label, b.parts, b.total, b.side) for b in fig.plot.bars] == [
        ("2 ranks", "flat", (70.0, 30.0, None, None), 100.0, 50.0),
        ("2 ranks", "bucketed 25MiB", (70.0, 10.0, None, None), 80.0, 60.0),
        ("2 ranks", "torch +ZeRO", (70.0, None, None, 20.0), 90.0, 55.0),
        ("2 ranks", "fsdp", (70.0, None, 50.0, None), 120.0, 40.0),
    ]
    assert fig.plot.parts[1:] == ("waiting on communication", "fsdp: a collective in flight",
                                  "torch: backward beyond its no-reduction backward")
    # each bar as the table names its row (a bar read `overlap opt ours`, the row
    # `overlap +sharded opt`; `torch`, the row `torch 25MiB`)
    t = point_table(ddp_section.TABLE, [row("flat", 100.0, 30.0, 50.0),
                                        row("bucketed", 80.0, 10.0, 60.0, bucket=25),
                                        row("torch", 90.0, 20.0, 55.0, sharding="zero"),
                                        row("fsdp", 120.0, 50.0, 40.0)])
    assert [b.label for b in fig.plot.bars] == [line[0] for line in t.rows]
    # torch's comm ms below 0 (not clipped in the row): no wait, and the bar is the step
    # (a wait of -60.7 drawn stacked made a 941 ms bar 1001 ms tall)
    sec = Section("ddp", "DDP")
    ddp_section.section(sec, [row("torch", 941.0, -60.7, 50.0), row("flat", 100.0, 30.0, 50.0)])
    (fig,) = [f for f in sec.figures if f.name == "ddp-steps"]
    assert fig.plot.bars[0].parts == (941.0, None, None, 0.0)


def test_precision_draws_each_accumulation_error_on_a_log_axis():
    """The four variants of adding 0.01 a thousand times, run for real: each nonzero error a
    bar of exactly the stored |result - target| (fp32 and fp16 over two decades apart)."""
    from cs336sys.experiments import precision
    from cs336sys.report.sections import Section
    from cs336sys.report.tables import row_of

    specs = precision.accumulate_specs(device="cpu")
    rows = [row_of(s, precision.run(s)) for s in specs]
    sec = Section("precision", "Precision")
    precision.section(sec, rows)
    (fig,) = sec.figures
    drawn = {name.split(" ")[0]: value for name, value, _ in fig.plot.items}
    assert drawn == {r["variant"]: r["abs_error"] for r in rows if r["abs_error"]}
    assert fig.plot.logx and max(drawn.values()) / min(drawn.values()) > 100  # decades apart
    assert fig.plot.draw()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_lone_point_is_named_by_its_settings_but_the_dimensions_of_its_size():
    """A comparison of one point named it by every setting, d_ff=1344 ... vocab_size=10000
    included, which its size preset already says."""
    from cs336sys.report.sections import point_labels

    s = {"size": "tiny", "d_model": 512, "d_ff": 1344, "num_layers": 4, "num_heads": 16,
         "vocab_size": 10000, "seq": 32, "precision": "fp32", "seed": 0}
    assert point_labels([{"_settings": s}]) == ["precision=fp32 seq=32 size=tiny"]
    shape = {k: v for k, v in s.items() if k != "size"}  # no preset: the shape is the name
    assert point_labels([{"_settings": shape}]) == [
        "d_ff=1344 d_model=512 num_heads=16 num_layers=4 precision=fp32 seq=32 vocab_size=10000"]


def test_a_ratio_below_a_hundredth_keeps_two_significant_digits():
    """An interpreted Triton kernel against naive read `0.00×` in the attention table."""
    from cs336sys.report.tables import _ratios
    from cs336sys.sweep.declaration import Ratio

    def row(impl, ms):
        s = {"impl": impl, "seq": 64}
        return {"_settings": s, "status": "ok", "ms": ms}

    ratio = Ratio(lambda r: r.get("ms"), {"impl": "naive"}, ("impl",))
    rows = [row("naive", 1.0), row("slow", 600.0), row("half", 2.0)]
    assert _ratios(ratio, rows) == ["1.00×", "0.0017×", "0.50×"]
    # a time that came out NaN or inf (kept apart by the store, read back) has no ratio, nor
    # is it a baseline: `nan×` and `inf×` were printed
    nan = float("nan")
    assert _ratios(ratio, [row("naive", 1.0), row("slow", nan), row("x", float("inf"))]) == [
        "1.00×", "", ""]
    assert _ratios(ratio, [row("naive", nan), row("half", 2.0)]) == ["", ""]


def test_a_baseline_row_is_its_own_baseline():
    """Two `none` steps that differ in a setting the ratio varies over (step --optimizer
    torch-adamw beside the user's): each is 1.00×; the torch-adamw one read `0.90× slower`,
    measured against the other."""
    from cs336sys.report.tables import _ratios
    from cs336sys.sweep.declaration import Ratio

    def row(switches, optimizer, ms):
        s = {"switches": switches, "optimizer": optimizer, "seq": 16}
        return {"_settings": s, "status": "ok", "ms": ms}

    ratio = Ratio(lambda r: r.get("ms"), {"switches": "none"}, ("switches", "optimizer"))
    rows = [row("none", "yours", 100.0), row("fused-adamw", "adamw-foreach", 80.0),
            row("none", "torch-adamw", 110.0)]
    # the fused point could be read against either `none`: the cell names the one it took
    assert _ratios(ratio, rows) == ["1.00×", "1.25× against optimizer=yours", "1.00×"]
    assert _ratios(ratio, rows[:2]) == ["1.00×", "1.25×"]


def test_a_notes_code_spans_are_code_and_the_rest_plain_text():
    from cs336sys.report.render import _html_note, _md_note
    from cs336sys.report.sections import code_spans
    from cs336sys.report.typeset import latex_note, typst_note

    note = "Run `cs336sys model --seq 64` then `a<b` for [x]; a lone ` stays"
    assert code_spans(note) == [("Run ", False), ("cs336sys model --seq 64", True),
                                (" then ", False), ("a<b", True),
                                (" for [x]; a lone ` stays", False)]
    assert _md_note(note) == r"Run `cs336sys model --seq 64` then `a<b` for \[x\]; a lone \` stays"
    assert _html_note(note) == ("Run <code>cs336sys model --seq 64</code> then <code>a&lt;b</code>"
                                " for [x]; a lone ` stays")
    assert latex_note("`a_b` c") == r"\texttt{a\_\allowbreak{}b} c"  # may break after _
    # ... and after a hyphen inside a word or a comma, never inside an option's dashes: an
    # indented note ending in this command ran 13 pt into the margin of the 2025 writeup
    assert latex_note("`ddp --impl yours-individual,x`") == (
        r"\texttt{ddp --impl yours-\allowbreak{}individual,\allowbreak{}x}")
    # an option in plain text: LaTeX read its two hyphens as an en dash (–label)
    assert latex_note("give --label PROBLEM, 1.65–2.58") == r"give -{}-label PROBLEM, 1.65--2.58"
    assert typst_note('`x` "y"') == '#par[#raw("x")#" \\"y\\""]'


def test_a_log_axis_under_two_decades_labels_more_than_one_tick():
    """Attention latencies of 0.37 to 1.94 ms on a log axis showed one label, `1`."""
    from matplotlib.ticker import LogLocator

    from cs336sys.report.plots import log_subs

    def inside(lo, hi):
        ticks = LogLocator(10, subs=log_subs(hi / lo)).tick_values(lo, hi)
        return [round(float(t), 3) for t in ticks if lo <= t <= hi]

    assert inside(0.37, 1.94) == [0.5, 1.0]
    assert inside(0.9, 2.5) == [0.9, 1.0, 2.0]
    assert len(inside(1.1, 2.9)) >= 2  # no power of ten inside


def test_each_html_header_is_aligned_as_its_column():
    """Headers over words (kernel names, other settings) are left-aligned as their cells; a
    lone sample's `440 (n=1)` is a number, right-aligned with its header."""
    from cs336sys.report.render import _cell_class, _html_heads
    from cs336sys.report.sections import FilledTable

    t = FilledTable("", ["phase", "name", "calls", "step ms", "other settings"],
                    [["forward", "aten::mm", "1,938", "440 (n=1)", "optimizer=adamw"],
                     ["backward", "(other)", "58", "", ""]])
    assert _html_heads(t) == ('<th class="t">phase</th><th class="t">name</th><th>calls</th>'
                              '<th>step ms</th><th class="t">other settings</th>')
    assert _cell_class("440 (n=1)") == ""


def test_a_size_names_its_parameters_below_a_million_too():
    """The tests' micro model (d 64, 2 layers, vocabulary 256) read `tiny (64×2, 0M)`."""
    from cs336sys.models.config import ModelConfig, param_count
    from cs336sys.sweep.declaration import model_size

    micro = param_count(ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4,
                                    vocab_size=256, context_length=16))

    def row(params):
        return {"size": "tiny", "d_model": 64, "num_layers": 2, "params": params}

    assert micro == 115_008 and model_size(row(micro)) == "tiny (64×2, 115k)"
    assert model_size(row(22_700_000)) == "tiny (64×2, 23M)"
    assert model_size(row(3_400_000_000)) == "tiny (64×2, 3.4B)"


def test_one_blocks_points_of_one_size_name_tell_their_width_apart():
    """`memory residuals` rows have no layers: their size column read `tiny` for d_model 512
    and 256 (the column covers d_model, so nothing else showed it), two rows of one name."""
    from cs336sys.experiments.memory_residuals import TABLE
    from cs336sys.report.tables import as_text, point_table

    rows = [{"status": "ok", "size": "tiny", "d_model": d, "seq": 32, "batch": 2,
             "precision": "fp32", "compile": 0, "saved_bytes": b, "_settings": {}}
            for d, b in ((512, 2_800_000), (256, 2_200_000))]
    text = as_text([point_table(TABLE, rows)], width=200)
    assert "tiny (d_model 512)" in text and "tiny (d_model 256)" in text


def test_memory_around_the_step_shows_the_held_parts_beside_the_accounting():
    """Each part as held after the step, by inspection, beside the accounting's bytes; a row
    stored before the parts were measured keeps the accounting alone; the user's AdamW is
    named on its row (two rows read alike)."""
    MiB = 2**20

    def row(optimizer, held):
        s = {"size": "tiny", "seq": 32, "batch": 2, "mode": "train", "precision": "fp32",
             "checkpoint": "none", "optimizer": optimizer}
        r = {"_settings": s, "size": "tiny", "status": "ok", "init_bytes": MiB,
             "before_opt_bytes": 4 * MiB, "after_opt_bytes": 4 * MiB, "param_bytes": MiB,
             "grad_bytes": MiB, "optim_bytes": 2 * MiB, "peak_bytes": 5 * MiB}
        if held:
            r.update(after_opt_params_bytes=MiB, after_opt_grads_bytes=MiB,
                     after_opt_opt_state_bytes=3 * MiB)
        return r

    wrong = {**row("yours-nobias", True), "status": "wrong"}
    t = memory_section.around_the_step([row("adamw", False), row("yours", True), wrong])
    assert t.headers[4:7] == ["parameters", "gradients", "optimizer state"]
    old, mine, failed = t.rows
    assert old[4:7] == ["(1.0)", "(1.0)", "(2.0)"]
    assert mine[4:7] == ["1.0 (1.0)", "1.0 (1.0)", "3.0 (2.0)"]
    assert mine[0].endswith("optimizer=yours") and "optimizer" not in old[0]
    # a user's AdamW that failed its check: shown, its values marked, as the peaks table does
    assert failed[6] == "3.0 (2.0) (wrong)" and failed[7] == "5.0 (wrong)"
    # the same point on two GPUs: a GPU column (two rows read as one), none for one GPU
    h100 = {**row("adamw", True), "gpu": "NVIDIA H100 80GB HBM3"}
    t = memory_section.around_the_step([{**row("adamw", True), "gpu": "cpu"}, h100])
    assert t.headers[:2] == ["gpu", "point"] and [r[0] for r in t.rows] == ["cpu", h100["gpu"]]
    assert memory_section.around_the_step([h100]).headers[0] == "point"


def test_latex_escapes_what_pdflatex_would_misprint_or_refuse():
    """In pdflatex's default encoding < > | print as inverted ! and ? and a dash, and it has no
    glyph for QKᵀ's ᵀ or |Δ| (the writeup of nsys_profile did not compile): each is written
    as LaTeX says it. Every character outside ASCII in cs336sys's sources is one LaTeX is
    told how to write, so a new one in a table or note cannot slip through."""
    import re
    from pathlib import Path

    from cs336sys.report.typeset import _LATEX, latex

    assert latex("p<0.001 |Δ| QKᵀ a·b") == (r"p\textless{}0.001 \textbar{}$\Delta$\textbar{} "
                                             r"QK$^{\top}$ a$\cdot$b")
    known = set(_LATEX) | {"§"}  # § is in pdflatex's UTF-8 input as it is
    package = Path(__file__).resolve().parents[1] / "cs336sys"
    found = {c for f in package.rglob("*.py") for c in re.findall(r"[^\x00-\x7f]", f.read_text())}
    assert found <= known, sorted(found - known)


@pytest.mark.parametrize("fmt, ext", [("tex", "tex"), ("typst", "typ")])
def test_latex_and_typst_carry_the_comparison_and_the_points_that_failed(tmp_path, fmt, ext):
    """Both wrote the sections' tables and figures only: a comparison's verdicts, summary and
    caveat, and a section's list of points not measured, were in the HTML and markdown alone."""
    from cs336sys.report.render import Report, write
    from cs336sys.report.sections import Failure, FilledTable, Section

    verdicts = FilledTable("model: step ms", ["point", "B/A", "verdict", "p"],
                           [["seq=16", "1.616", "1.62x slower", "p=0.008 (1 vs 1 run)"]])
    rep = Report("r", [], [], sections=[Section("model", "Model", failures=[
        Failure("oom", "seq=4096", "out of memory: CUDA out of memory")])],
        compare_kind="commit", compare_ab=("HEAD~1", "HEAD"), comparison=[verdicts],
        compare_note="How a change is decided.", compare_summary="1 point compared: 1 slower",
        compare_notes=["One run a side: the test sees the scatter within a run."])
    paths = write(rep, tmp_path, [fmt], stem="r")
    text = (tmp_path / f"r.{ext}").read_text()
    for said in ("Comparison: HEAD", "1 point compared: 1 slower", "One run a side",
                 "Not measured, or measured wrong", "seq=4096", "out of memory"):
        assert said in text, said
    assert any(p.name == "compare-1." + ext for p in paths)  # the verdicts' own table file


def test_long_headers_stack_so_a_wide_table_stays_legible(tmp_path):
    """The writeup's table by warm-up steps has 13 columns headed like "0 warm-up: optimizer
    ms". On one line each, LaTeX's adjustbox shrank it to a sliver and Typst ran the headers
    into each other; a noisy point's annotated cell widened its table the same way. Long
    headers and cells now break at spaces, in the column's alignment, and the Typst document
    scales a table wider than the page down to it, as adjustbox does."""
    from cs336sys.report.render import Report, write
    from cs336sys.report.sections import FilledTable, Section
    from cs336sys.report.typeset import latex_table, typst_table, wrapped

    assert wrapped("0 warm-up: optimizer ms", 14) == ["0 warm-up:", "optimizer ms"]
    assert wrapped("optimizer ms", 14) == ["optimizer ms"] and wrapped("", 14) == [""]
    assert wrapped("check_optimizer_err of x", 14) == ["check_optimizer_err", "of x"]
    wide = FilledTable("by warm-up steps", ["size", *(f"{w} warm-up: {phase} ms" for w in (0, 1, 2, 5)
                                                      for phase in ("forward", "backward", "optimizer"))],
                       [["tiny (512×4, 23M)", "0.893 ± 0.17 (drift +22%) (median 0.876, noisy)",
                         *["74.6 ± 23"] * 11]])
    assert (r"\begin{tabular}[b]{@{}r@{}}0 warm-up: \\ forward ms\end{tabular}"
            in latex_table(wide))
    assert '[*#"0 warm-up:"*#linebreak()*#"forward ms"*]' in typst_table(wide)
    # a long cell too, top-aligned in its row: the row's height, not the table's width
    assert (r"\begin{tabular}[t]{@{}r@{}}0.893 $\pm$ 0.17 (drift +22\%) \\ (median 0.876, "
            r"noisy)\end{tabular}" in latex_table(wide))
    assert '[#"0.893 ± 0.17 (drift +22%)"#linebreak()#"(median 0.876, noisy)"]' in typst_table(wide)
    write(Report("r", [], [], sections=[Section("model", "Model", tables=[wide])]), tmp_path,
          ["typst"], stem="r")
    document = (tmp_path / "r.typ").read_text()
    assert "#let fit(body)" in document and 'fit(include "r_tables/model-1.typ")' in document
    import typst  # a dev requirement (pyproject.toml)

    assert typst.compile(str(tmp_path / "r.typ"))[:4] == b"%PDF"


def test_ddp_memory_by_moment_marks_a_point_whose_check_failed():
    """A user's DDP that failed its check keeps its memory rows, each value marked, as the
    point's other tables mark them."""
    from cs336sys.experiments.ddp_section import memory_by_moment

    MiB = 2**20
    memory = {"init": MiB, "init_params": MiB, "before_opt": 4 * MiB, "before_opt_params": MiB,
              "before_opt_grads": MiB, "before_opt_opt_state": 2 * MiB, "after_opt": 4 * MiB,
              "after_opt_params": MiB, "after_opt_grads": MiB, "after_opt_opt_state": 2 * MiB,
              "after_opt_peak": 5 * MiB}
    s = {"impl": "yours", "world_size": 2, "size": "tiny"}
    row = {"_settings": s, **s, "status": "wrong", "mem_before_opt_params_bytes": MiB,
           "mem_per_rank": json.dumps([memory]), "expected_params_bytes": MiB,
           "expected_grads_bytes": MiB, "expected_opt_state_bytes": 2 * MiB}
    t = memory_by_moment([row])
    after = next(r for r in t.rows if "after the step" in r)
    # live, the peak up to that moment (the handout's "peak ... after the step"), the parts
    assert after[-5:] == ["4.0 (wrong)", "5.0 (wrong)", "1.0 (1.0) (wrong)", "1.0 (1.0) (wrong)",
                          "2.0 (2.0) (wrong)"]


def test_an_attention_line_names_the_backend_that_ran_as_its_table_does():
    """The latency plot's legend read `impl=sdpa` (and `sdpa_backend=auto`) where the table
    beside it read `sdpa[cudnn]`: the backend that ran, which the setting leaves to torch."""
    from cs336sys.experiments import attention_section

    def row(impl, seq, backend=None):
        s = {"impl": impl, "seq": seq, "d_head": 64, "precision": "bf16"}
        return {**s, "_settings": s, "status": "ok", "gpu": "H100", "e2e_ms_mean": seq / 1e3,
                "fwd_ms_mean": None, "mem_before_bwd_bytes": seq * 2**20,
                "sdpa_backend_used": backend, "interpreted": 0}

    sec = Section("attention", "Attention")
    attention_section.section(sec, [row("sdpa", t, "cudnn") for t in (1024, 2048)]
                              + [row("naive", t) for t in (1024, 2048)])
    latency = next(f for f in sec.figures if f.name == "attention-latency")
    assert sorted(latency.plot.panels["d_head=64"]) == ["impl=naive", "impl=sdpa[cudnn]"]


def test_the_attention_latency_plot_draws_the_medians_its_table_compares():
    """One slow first call: naive's mean 5.7 ms drew it under sdpa's 18.4 where the table
    beside it, of medians (0.83 and 0.67 ms), read sdpa 1.22x faster."""
    from cs336sys.experiments import attention_section

    def row(impl, mean, median, seq=128):
        s = {"impl": impl, "seq": seq, "d_head": 64, "precision": "fp32"}
        return {**s, "_settings": s, "status": "ok", "gpu": "cpu", "e2e_ms_mean": mean,
                "e2e_ms_median": median, "fwd_ms_mean": None, "mem_before_bwd_bytes": 2**20,
                "interpreted": 0}

    sec = Section("attention", "Attention")
    attention_section.section(sec, [row("naive", 5.72, 0.825), row("sdpa", 18.4, 0.674),
                                    row("naive", 3.0, 3.0, 256), row("sdpa", 2.0, 2.0, 256)])
    latency = next(f for f in sec.figures if f.name == "attention-latency")
    lines = latency.plot.panels["d_head=64"]
    assert {k: [y for _, y in v] for k, v in lines.items()} == {"impl=naive": [0.825, 3.0],
                                                                "impl=sdpa": [0.674, 2.0]}
    assert latency.plot.ylabel.startswith("median ")


def test_the_runs_count_is_not_headed_as_a_setting_named_n():
    """plan's device count is the setting `n`, headed `N`: beside it the count of stored runs
    read `| N | ... | n |`. The count is `runs` beside any column of that name."""
    from cs336sys.sweep.declaration import Column, Table

    declared = Table("t", (Column("N", "n", setting=True), Column("ms", "ms", "num")))
    rows = [{"status": "ok", "n": n, "ms": 1.0, "_n": 2, "_settings": {"n": n}} for n in (2, 4)]
    assert point_table(declared, rows, counts=True).headers == ["N", "ms", "runs"]


def test_a_column_of_numbers_with_an_overflow_stays_right_aligned():
    """An inf (an fp16 sum past 65504, read back from the store) left a column of numbers
    aligned as text in the LaTeX and Typst tables."""
    from cs336sys.report.typeset import _right

    assert _right(["1.5", "inf", "-inf", "nan", "3"]) and not _right(["info", "2"])


def test_a_wrong_point_leaves_the_columns_it_never_measured_empty():
    """A forward-only point that failed read `wrong` under backward, end to end and memory
    before backward, which it never measured; an ok one leaves them empty."""
    from cs336sys.report.sections import WRONG, status_or

    assert status_or({"status": "wrong"}, "") == ""
    assert status_or({"status": "wrong"}, "1.5") == f"1.5 {WRONG}"
    assert status_or({"status": "oom"}, "") == "OOM"


def test_mib_cells_keep_a_small_figure_readable():
    """flash_benchmarking's `mem before bwd MiB` read 0.0 for your kernel's 33 KB beside
    naive's 0.1: under 0.1 MiB a cell keeps two significant figures."""
    from cs336sys.report.sections import mib

    assert [mib(b) for b in (None, 0, 33_000, 2**20 // 10, 2**20, 2**30)] == [
        "", "0.0", "0.031", "0.1", "1.0", "1,024.0"]


def test_the_model_column_names_cs336syss_model_beside_yours_and_is_gone_without():
    """The ddp tables never said the user's model ran (`Same in every row` named no model),
    and beside it cs336sys's model read as a blank cell."""
    from cs336sys.experiments import ddp_section
    from cs336sys.report.tables import point_tables

    def row(model):
        s = {"impl": "naive", "world_size": 2, "size": "tiny", "model": model}
        return {**s, "_settings": s, "status": "ok", "step_ms_mean": 100.0, "comm_ms_mean": 5.0}

    (theirs,) = point_tables((ddp_section.TABLE,), [row("cs336_basics")])
    assert theirs.rows[0][theirs.headers.index("model")] == "cs336_basics"
    (both,) = point_tables((ddp_section.TABLE,), [row("cs336_basics"), row(None)])
    at = both.headers.index("model")
    assert sorted(r[at] for r in both.rows) == ["cs336_basics", "cs336sys's"]
    (ours,) = point_tables((ddp_section.TABLE,), [row(None)])
    assert "model" not in ours.headers


def test_a_number_that_rounds_up_to_the_next_power_of_ten_reads_as_a_number():
    """Three significant figures of 999.6 are 1e+03 in Python's g format: a step read
    "379 ± 1e+02" in a report."""
    from cs336sys.report.sections import num

    assert [num(x) for x in (999.6, -999.7, 99.96, 0.9996, 1234.5, 379.0, 1.23e-5)] == [
        "1,000", "-1,000", "100", "1", "1,234", "379", "1.23e-05"]


def test_ddp_names_its_sequence_and_batch_and_tells_its_bars_apart():
    """handout: "a description of your benchmarking setup": ddp's section never said the
    sequence or batch, and two points that differed only in --seq were two bars both
    labelled `naive` under `2 ranks`."""
    from cs336sys.experiments import ddp_section

    headers = [c.header for c in ddp_section.TABLE.columns]
    assert {"seq", "batch"} <= set(headers)
    rows = []
    for seq in (32, 16):
        s = {"impl": "naive", "world_size": 2, "seq": seq, "batch": 4, "size": "tiny"}
        rows.append({**s, "_settings": s, "status": "ok", "step_ms_mean": 10.0,
                     "comm_ms_mean": 2.0, "tokens_per_s": 100.0})
    rows.append({**rows[0], "_settings": {**rows[0]["_settings"], "world_size": 4},
                 "world_size": 4})
    bars = ddp_section._steps(rows).bars
    assert [(b.group, b.label) for b in bars] == [
        ("2 ranks", "naive seq=32"), ("2 ranks", "naive seq=16"), ("4 ranks", "naive")]


def test_gib_keeps_two_figures_under_a_tenth_as_mib_does():
    """A tiny model's plan read 0.0 in every memory column."""
    from cs336sys.report.sections import gib, mib

    assert [gib(x) for x in (0, 45_000_000, 2**30 * 0.1, 2**30 * 80)] == [
        "0.0", "0.042", "0.1", "80.0"]
    assert mib(45_000) == "0.043" and gib(None) == mib(None) == ""


def test_ddp_shows_what_rank_0_holds_beside_its_parameters_gradients_and_state():
    """An FSDP that never freed its gathered weights passed with the same params, grads and
    state MiB as one that does; the live bytes beyond those three hold the gathered copy."""
    from cs336sys.experiments import ddp_section

    (other,) = [c for c in ddp_section.TABLE.columns if c.header == "other MiB"]
    frees = {"mem_before_opt_bytes": 1_687_048, "mem_before_opt_params_bytes": 421_120,
             "mem_before_opt_grads_bytes": 421_120, "mem_before_opt_opt_state_bytes": 842_240}
    keeps = {**frees, "mem_before_opt_bytes": 2_526_728}
    assert other.cell(frees) == 2_568 and other.cell(keeps) == 842_248  # the whole weights
    assert other.cell({**frees, "mem_before_opt_grads_bytes": None}) is None


def test_a_skipped_row_reads_its_size_as_the_measured_rows_of_its_shape():
    """A skipped point stores no parameter count: its size read `tiny (512×4)` beside the
    others' `tiny (512×4, 23M)`, and the size became a column of its own in every part of
    the ddp table instead of one value of the "Same in every row" line."""
    from cs336sys.experiments import ddp_section
    from cs336sys.report.tables import point_tables

    shape = {"size": "tiny", "d_model": 512, "num_layers": 4, "world_size": 2, "seq": 16,
             "batch": 2, "precision": "fp32"}
    ok = {**shape, "impl": "flat", "_settings": {**shape, "impl": "flat"}, "status": "ok",
          "params": 23_000_000, "step_ms_mean": 10.0, "step_ms_std": 1.0}
    skipped = {**shape, "impl": "yours-fsdp", "_settings": {**shape, "impl": "yours-fsdp"},
               "status": "skipped", "error": "skipped: not implemented"}
    (table,) = point_tables([ddp_section.TABLE], [ok, skipped], lift=1)
    assert "size=tiny (512×4, 23M)" in table.constant and "size" not in table.headers


def test_the_ddp_step_note_explains_the_implementations_it_shows():
    """A 2025 writeup, which has no FSDP problem, explained FSDP's and torch-fsdp's
    communication time under a plot of the DDP variants alone."""
    from cs336sys.experiments.ddp_section import _steps_note

    plain = _steps_note({"naive", "flat", "bucketed"})
    assert "fsdp" not in plain and "torch" not in plain
    assert plain.endswith("Beside it, tokens per second across the ranks.")
    both = _steps_note({"yours-fsdp", "torch-fsdp"})
    assert "for fsdp, the time with one of its gathers" in both
    assert "for torch-fsdp, how much longer backward took" in both
