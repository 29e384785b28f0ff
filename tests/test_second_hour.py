"""A user's second hour: what a mistyped or differently spelled option value gets back.

Each bad value is one line on stderr and exit 2 with nothing written; the line names the
option as it was typed (`--impl`, not its other name `--attention`) and, where one allowed
value is close, suggests it. Size presets are read in any case and stored as the preset
table spells them.
"""

from __future__ import annotations

import csv
import io
import json
import re
from pathlib import Path

import pytest

from tests.conftest import invoke, micro, query


@pytest.mark.parametrize(
    "args, line",
    [
        (["attention", "--impl", "trition"],
         "Error: --impl: unknown value 'trition' (did you mean 'triton'?); choose from naive,"),
        (["attention", "--attention", "trition"],
         "Error: --attention: unknown value 'trition' (did you mean 'triton'?); choose from"),
        (["attention", "--impl=naive,trition"], "Error: --impl: unknown value 'trition'"),
        (["ddp", "--impl", "fdsp"], "Error: --impl: unknown value 'fdsp' (did you mean 'fsdp'?)"),
        (["ddp", "--impl", "nope"],  # every name it takes, and the one-off form
         "Error: --impl: unknown value 'nope'; give one of naive, flat, overlap, bucketed, torch, "
         "fsdp, torch-fsdp, yours, yours-individual, yours-bucketed, yours-fsdp, or "
         "NAME=package.module:Class"),
        (["model", "--size", "smal"], "Error: --size: unknown size 'smal' (did you mean 'small'?)"),
        (["model", "--seq", "0"], "Error: --seq must be positive, got 0"),
        (["step", "--switches", "fused-adam"],
         "Error: --switches: unknown switch 'fused-adam' (did you mean 'fused-adamw'?)"),
        (["attention", "--pass", "fwd"], "Error: --pass: unknown value 'fwd' (did you mean 'forward'?)"),
        (["attention", "--pass", "sideways"], "Error: --pass: unknown value 'sideways'; choose from"),
    ],
)
def test_a_bad_value_is_named_as_typed_with_the_closest_one(db_path, args, line):
    result = invoke(*args, "--db", db_path)
    assert result.exit_code == 2, result.output
    (got,) = [x for x in result.stderr.splitlines() if not x.startswith("note:")]
    assert got.startswith(line), got
    assert not db_path.exists()


def test_size_presets_in_any_case_are_stored_as_the_table_spells_them(db_path):
    args = [*micro(warmup=0), "--seq", "8", "--mode", "forward", "--iters", "1"]
    args[args.index("tiny")] = "TINY"
    result = invoke("model", *args, "--db", db_path)
    assert result.exit_code == 0, result.output
    assert query(db_path, "SELECT size FROM model_runs") == [{"size": "tiny"}]
    lower = invoke("plan", "--size", "2.7b", "--db", db_path)
    upper = invoke("plan", "--size", "2.7B", "--db", db_path)
    assert lower.exit_code == upper.exit_code == 0, lower.output
    assert lower.stdout.replace("2.7b", "2.7B") == upper.stdout


def test_sql_schema_lists_the_views_and_describes_a_views_columns(db_path, monkeypatch):
    from cs336sys.experiments import model
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store
    from cs336sys.store.views import column_meanings

    Store(db_path, EXPERIMENTS).close()
    listing = invoke("sql", "--schema", "--db", db_path)
    assert listing.exit_code == 0, listing.output
    names = {line.split()[0] for line in listing.stdout.splitlines()[2:]}
    assert {e.view for e in EXPERIMENTS} | {"runs", "invocations", "kernel_stats"} <= names
    # at 80 columns every meaning fits, on several lines where long (one ran to 210)
    monkeypatch.setenv("COLUMNS", "80")
    narrow = invoke("sql", "--schema", "model_runs", "--db", db_path).stdout.splitlines()
    assert max(map(len, narrow)) <= 80 and any(line.startswith(" ") for line in narrow)
    monkeypatch.setenv("COLUMNS", "1000")  # a line a column
    one = invoke("sql", "--schema", "model_runs", "--db", db_path)
    assert one.exit_code == 0, one.output
    described = {line.split()[0]: line for line in one.stdout.splitlines()[2:]}
    view_columns = [r["name"] for r in query(db_path, "PRAGMA table_info(model_runs)")]
    assert list(described) == view_columns  # every column, in the view's order
    median = model.EXPERIMENT.metric("step_ms_median")
    assert described["step_ms_median"].split(None, 2)[1:] == ["ms", median.meaning]
    assert "setting (int)" in described["seq"] and "GPU" in described["gpu"]
    # a Spec around a point (memory's, profile's) types the point's settings too
    for kind in ("memory", "profile"):
        meanings = column_meanings(next(e for e in EXPERIMENTS if e.kind == kind))
        assert meanings["seq"] == ("", "setting (int)")
        assert meanings["model"] == ("", "setting (str | None)")
    bad = invoke("sql", "--schema", "model_run", "--db", db_path)
    assert bad.exit_code == 2 and "did you mean 'model_runs'?" in bad.stderr
    # --json and --csv print the same rows (they printed the table)
    as_json = json.loads(invoke("sql", "--schema", "model_runs", "--json", "--db",
                                db_path).stdout)
    assert [r["column"] for r in as_json] == view_columns
    assert as_json[view_columns.index("step_ms_median")]["meaning"] == median.meaning
    as_csv = invoke("sql", "--schema", "--csv", "--db", db_path).stdout
    listed = list(csv.DictReader(io.StringIO(as_csv)))
    assert {r["name"] for r in listed} == names
    assert {r["what"] for r in listed if r["name"] == "model_runs"} == {"experiment model"}


def test_every_help_example_is_one_line_that_its_command_parses(monkeypatch):
    """At 60 columns no example is wrapped between an option and its value or run into the
    next one: each line of the help that starts with `cs336sys` is parsed by the command's
    own parser (click's UsageError on an unknown option or a missing value)."""
    import shlex

    import typer.main

    from cs336sys.cli import app
    from tests.test_cli import _command_paths

    monkeypatch.setenv("COLUMNS", "60")
    root = typer.main.get_command(app)
    examples = 0
    for path in _command_paths():
        result = invoke(*path, "--help")
        assert result.exit_code == 0, path
        for line in result.stdout.splitlines():
            if not line.strip().startswith("cs336sys "):
                continue
            argv = shlex.split(line.strip())[1:]
            cmd, rest, names = root, list(argv), []
            while rest and not rest[0].startswith("-") and hasattr(cmd, "commands"):
                names.append(rest[0])
                cmd = cmd.commands[rest.pop(0)]
            cmd.make_context(" ".join(names), rest)  # raises on a broken example
            examples += 1
    assert examples >= 30


def test_the_printed_table_fits_the_terminal_and_wide_keeps_every_column(db_path, monkeypatch):
    """Cut to fit, every part of a table is led by the settings that tell its rows apart:
    the parts after the first were led by the first column only, so that two rows of one
    batch size and two sequence lengths read as the same point twice."""
    monkeypatch.setenv("COLUMNS", "60")
    args = ["model", *micro(warmup=0, batch=1), "--batch", "1,2", "--seq", "8,16", "--mode",
            "forward", "--iters", "2"]
    narrow = invoke(*args, "--db", db_path)
    assert narrow.exit_code == 0, narrow.output
    lines = narrow.stdout.splitlines()
    assert max(map(len, lines)) <= 60  # tables, the shared settings and the notes
    at = next(i for i, x in enumerate(lines) if x.startswith("Same in every row: "))
    same = " ".join(lines[at:at + 3])
    assert "size=tiny" in same and "mode=forward" in same and "status=ok" in same
    starts = [i for i, x in enumerate(lines) if lines[i + 1:i + 2] and lines[i + 1].startswith("---")]
    headers = [lines[i].split() for i in starts]
    assert len(headers) > 1  # cut between columns, each part led by the columns telling rows apart
    for i in starts:
        assert lines[i].split()[:2] == ["seq", "batch"], lines[i]
        keys = [tuple(row.split()[:2]) for row in lines[i + 2:i + 6]]
        assert sorted(keys) == [("16", "1"), ("16", "2"), ("8", "1"), ("8", "2")], lines[i:i + 6]
    wide = invoke(*args, "--wide", "--db", db_path)
    assert wide.exit_code == 0, wide.output
    assert "Same in every row" not in wide.stdout
    (header,) = [x for x in wide.stdout.splitlines() if x.startswith("size ")]
    cut = {h for part in headers for h in part}
    assert cut - {"ms", "±"} <= set(header.split())  # the same columns, in one piece
    assert len(header) > 60


def test_a_one_point_table_lifts_its_settings_too(db_path, monkeypatch):
    """The README's first `model` on a CPU is one point: its table came in parts at 80
    columns, each repeating the ten setting columns in front of one metric."""
    monkeypatch.setenv("COLUMNS", "80")
    one = invoke("model", *micro(warmup=0, batch=1), "--seq", "8", "--iters", "2", "--db", db_path)
    assert one.exit_code == 0, one.output
    lines = one.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("Same in every row: "))
    assert "size=tiny" in " ".join(lines[at:at + 3])
    headers = [lines[i] for i in range(len(lines) - 1) if lines[i + 1].startswith("---")]
    assert headers and not any(h.startswith("size ") for h in headers), headers


def test_one_sample_reads_n_1_and_noisy_needs_five():
    from cs336sys.report.sections import mean_std
    from cs336sys.report.tables import noisy

    one = {"status": "ok", "iters": 1, "t_mean": 72.8, "t_std": 0.0}
    assert mean_std(one, "t_mean", "t_std") == "72.8 (n=1)"
    spiky = {"status": "ok", "t_mean": 10.0, "t_std": 5.0}
    assert [noisy({**spiky, "iters": n}, "t") for n in (2, 4, 5, 20)] == [False, False, True, True]
    assert noisy(spiky, "t")  # a row that does not say how many samples it has
    assert mean_std({**spiky, "iters": 3}, "t_mean", "t_std") == "10 ± 5"
    # rows stored before counts were: the raw samples say how many there are, not `iters`
    # (0.1 kept one sample of a 100-iteration point past its time budget: `60 ± 0`)
    old = {"status": "ok", "iters": 100, "e2e_ms_mean": 60.0, "e2e_ms_std": 0.0}
    assert mean_std({**old, "_samples": {"e2e_ms": [60.0]}}, "e2e_ms_mean", "e2e_ms_std") \
        == "60 (n=1)"
    two = {**old, "e2e_ms_std": 1.1, "_samples": '{"e2e_ms": [59.0, 61.0]}'}  # as stored
    assert mean_std(two, "e2e_ms_mean", "e2e_ms_std") == "60 ± 1.1 (n=2)"
    assert mean_std(old, "e2e_ms_mean", "e2e_ms_std") == "60 ± 0"  # nothing says otherwise


def test_a_size_range_as_nccl_tests_takes_it():
    from cs336sys.measure.units import parse_sizes

    assert parse_sizes("8B:1KB:x2") == [8, 16, 32, 64, 128, 256, 512]
    assert parse_sizes("1MB:4MB") == [10**6, 2 * 10**6, 4 * 10**6]  # x2 unless given
    assert parse_sizes("1KiB:1MiB:x32") == [2**10, 2**15, 2**20]
    assert parse_sizes("64MB") == [64 * 10**6]
    # the docs' nccl-tests `-b 8 -e 1G -f 2`: its G is 2^30, 28 sizes up to 1,073,741,824
    # (the docs wrote 8B:1GB:x2, which stops at 512 MiB)
    page = (Path(__file__).parents[1] / "docs" / "experiments" / "comm.md").read_text()
    (example,) = re.findall(r"--bytes (\S+) .*# a range, as nccl-tests' -b 8 -e 1G -f 2", page)
    assert parse_sizes(example) == [8 * 2**k for k in range(28)]
    for bad, said in (("1GB:1MB", "ends"), ("1KB:1MB:x1", "more than 1"),
                      ("1B:1TB:x1.1", "more than 64 sizes"), ("1KB:zz", "not a size")):
        with pytest.raises(ValueError, match=said):
            parse_sizes(bad)


def test_comm_closes_with_the_average_bus_bandwidth(db_path):
    result = invoke("comm", "--bytes", "1KB:16KB:x4", "--world-size", "2", "--warmup", "0",
                    "--iters", "2", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    stored = query(db_path, "SELECT bytes, busbw_gbps, time_ms_mean FROM comm_runs")
    assert [r["bytes"] for r in stored] == [1000, 4000, 16000]
    mean = sum(r["busbw_gbps"] for r in stored) / 3
    (line,) = [x for x in result.stdout.splitlines() if x.startswith("Avg bus bandwidth")]
    assert line == f"Avg bus bandwidth: {mean:.3g} GB/s (all-reduce gloo 2 ranks fp32, 3 sizes)"
    # the time as every experiment's: mean ± std in ms, the median where it is noisy
    assert "time ms" in result.stdout
    from cs336sys.report.sections import num

    first = next(x for x in result.stdout.splitlines() if x.startswith("1KB "))
    assert f"{num(stored[0]['time_ms_mean'])} ± " in first, first


def test_compare_names_what_differs_between_the_sides(db_path, tmp_path, monkeypatch):
    """B ran with OMP_NUM_THREADS=1 (stored with its invocation): the comparison says so
    beside its verdicts. An experiment both sides ran without a common point lists the
    settings that differ, where it only said none was measured on both sides."""
    args = ["model", *micro(warmup=0), "--mode", "forward", "--iters", "2", "--db", db_path]
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert invoke(*args, "--seq", "8", "--label", "a").exit_code == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert invoke(*args, "--seq", "8,16", "--label", "b").exit_code == 0
    monkeypatch.delenv("OMP_NUM_THREADS")
    result = invoke("report", "--compare", "a", "b", "--format", "md", "--out", tmp_path / "r",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    assert "OMP_NUM_THREADS: A unset, B 1" in result.stdout
    md = (tmp_path / "r" / "report.md").read_text()
    assert "- **Note:** OMP_NUM_THREADS: A unset, B 1" in md
    assert "different machines" not in result.stdout  # the same host, CPU and versions
    # a third label at seq 32 (batch 2 and 3, a list option given twice): nothing in common
    assert invoke(*args, "--seq", "32", "--batch", "3", "--label", "c").exit_code == 0
    result = invoke("report", "--compare", "a", "c", "--format", "md", "--out", tmp_path / "s",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    assert ("model: no point measured on both sides; the settings that differ: seq: A 8, "
            "B 32; batch: A 2, B 2, 3") in " ".join(result.stdout.split())  # filled to width


def test_no_common_point_names_the_gpu_not_the_timed_steps():
    """Two commits on two GPUs, the same point with 10 and 30 timed steps: the steps never
    tell points apart, the GPU does; the note blamed `iters` and kept quiet on the GPU."""
    from cs336sys.report.compare import unmatched
    from cs336sys.report.compare_sides import Sides

    def row(gpu: str, iters: int) -> dict:
        return {"gpu": gpu, "_settings": {"size": "xl", "iters": iters, "precision": "bf16"}}

    s = Sides("commit", {"model": [row("H100", 10)]}, {"model": [row("A100", 30)]}, {}, [])
    assert unmatched(s, "model") == (
        "model: no point measured on both sides; the settings that differ: gpu: A H100, B A100 "
        "(points are compared on one GPU; `--compare GPU_A GPU_B` compares two)")
    s.b["model"] = [row("H100", 30) | {"_settings": {"size": "xl", "iters": 30,
                                                      "precision": "fp32"}}]
    assert unmatched(s, "model") == ("model: no point measured on both sides; the settings that "
                                     "differ: precision: A bf16, B fp32")


def test_a_part_slower_than_its_whole_is_flagged_as_impossible():
    """As seen on a busy CPU: sdpa's backward median 42.7 ms, its forward+backward 0.41 ms."""
    from cs336sys.experiments import attention
    from cs336sys.report.tables import point_table

    def row(bwd, e2e, impl):
        s = {"impl": impl, "d_head": 64, "seq": 128, "heads": 1, "batch": 1,
             "precision": "fp32", "pass": "both"}
        stats = {}
        for name, (p10, median, p90) in (("fwd_ms", (0.1, 0.12, 0.2)), ("bwd_ms", bwd),
                                         ("e2e_ms", e2e)):
            stats.update({f"{name}_p10": p10, f"{name}_median": median, f"{name}_p90": p90,
                          f"{name}_mean": median, f"{name}_std": 0.0})
        return {**s, **stats, "status": "ok", "_settings": s}

    busy = row((40.0, 42.7, 45.0), (0.38, 0.41, 0.5), "sdpa")
    close = row((0.3, 0.35, 0.6), (0.33, 0.41, 0.5), "naive")  # overlapping spreads: noise
    t = point_table(attention.TABLE, [busy, close])
    at = t.headers.index("impossible")
    assert [r[at] for r in t.rows] == ["bwd > e2e", ""]
    assert "impossible: a part" in t.note
    assert "impossible" not in point_table(attention.TABLE, [close]).headers


def test_coincident_series_stay_visible_and_an_oom_is_marked_where_it_failed(monkeypatch):
    """Two series on the same points (triton under sdpa in reports/h100) get their own hollow
    marker shapes and sizes; an out-of-memory point is a red cross at its size, in the
    legend as 'out of memory'."""
    from matplotlib.figure import Figure

    from cs336sys.report.plots import Plot
    from cs336sys.report.sections import series

    drawn = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda self, *a, **k: (drawn.append(self),
                                                                  save(self, *a, **k)))

    def row(impl, seq, ms, status="ok"):
        s = {"impl": impl, "seq": seq, "d_head": 64}
        return {**s, "status": status, "e2e": ms, "gpu": "H100", "_settings": s}

    rows = [row(i, t, 1.0 * t) for i in ("sdpa", "triton") for t in (1024, 2048)]
    rows += [row("naive", 1024, 3.0), row("naive", 2048, None, "oom")]
    lines = series(rows, "seq", "e2e", first=("impl",))
    assert lines["impl=naive"] == [(1024, 3.0), (2048, None)]
    Plot.lines(lines, "seq", "ms", "t").draw()
    (ax,) = [a for a in drawn[0].axes if a.get_visible()]
    by_label = {line.get_label(): line for line in ax.lines}
    sdpa, triton = by_label["impl=sdpa"], by_label["impl=triton"]
    assert list(sdpa.get_xdata()) == list(triton.get_xdata())  # the same points
    assert sdpa.get_marker() != triton.get_marker()
    assert sdpa.get_markersize() > triton.get_markersize()
    assert sdpa.get_markerfacecolor() == "none"
    oom = by_label["out of memory"]
    assert list(oom.get_xdata()) == [2048] and oom.get_marker() == "X"
    legend = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert "out of memory" in legend


def test_the_average_bus_bandwidth_counts_each_size_of_a_sweep_once():
    """Two sweeps of one collective that differ in --warmup: the report's line averaged their
    rows together, 1MB counted twice in "3 sizes" of two, while its plot kept them apart."""
    from cs336sys.experiments.comm import average_lines

    def row(size, busbw, warmup):
        s = {"op": "all-reduce", "placement": None, "backend": "gloo", "world_size": 2,
             "precision": "fp32", "bytes": size, "warmup": warmup, "iters": 3}
        return {**s, "_settings": s, "status": "ok", "busbw_gbps": busbw}

    rows = [row(10**6, 0.8, 1), row(4 * 10**6, 0.6, 1), row(10**6, 0.3, 2)]
    assert average_lines(rows) == [
        "Avg bus bandwidth: 0.7 GB/s (all-reduce gloo 2 ranks fp32 warmup=1, 2 sizes)",
        "Avg bus bandwidth: 0.3 GB/s (all-reduce gloo 2 ranks fp32 warmup=2, 1 size)"]
    assert average_lines(rows[:2]) == [
        "Avg bus bandwidth: 0.7 GB/s (all-reduce gloo 2 ranks fp32, 2 sizes)"]
