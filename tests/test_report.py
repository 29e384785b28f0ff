"""`cs336sys report` against a fixed store (tests/report_fixture.py).

The golden markdown is regenerated with `UPDATE_GOLDEN=1 pytest -q tests/test_report.py`;
review the diff before keeping it.
"""

import base64
import hashlib
import json
import os
import re
from datetime import datetime, timezone
from pathlib import Path

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.report.plots import short
from cs336sys.report.sections import panels, with_gpu
from cs336sys.report.select import Selection, SelectionError, parse_time, parse_where
from tests.conftest import PNG_SIGNATURE, invoke
from tests.promises import REPORTS
from tests.report_fixture import HOSTILE, QUOTED, build

# What reports say and embed is the subject; pixels are not (conftest), except where marked.
pytestmark = pytest.mark.unrasterized

GOLDEN = Path(__file__).parent / "golden" / "report.md"


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return build(tmp_path_factory.mktemp("fixture") / "results.db")


def report(store, out, *args):
    return invoke("report", "--db", store, "--out", out, *args)


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.mark.slow
def test_golden_markdown(store, tmp_path):
    result = report(store, tmp_path, "--since", "2026-01-01", "--format", "md")
    assert result.exit_code == 0, result.output
    got = (tmp_path / "report.md").read_text()
    if os.environ.get("UPDATE_GOLDEN") == "1":
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(got)
    assert got == GOLDEN.read_text()
    # the images the markdown references are written beside it, as PNG files
    refs = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", got)
    assert len(refs) == 11
    for ref in refs:
        assert (tmp_path / ref).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert result.stdout.splitlines()[0] == str(tmp_path / "report.md")
    assert not (tmp_path / "report.html").exists()


@pytest.mark.slow
@pytest.mark.unrasterized(False)  # compares the pixels
def test_plots_drawn_in_forked_processes_are_the_ones_drawn_here(store, tmp_path, monkeypatch):
    """Reports draw their plots in a process per core (report/drawer.py); the other tests
    draw in their own process (conftest). Both ways give the same images, in order."""
    import sys

    from cs336sys.report.drawer import Drawer
    from tests.conftest import DRAWER_INIT

    here = report(store, tmp_path / "here", "--format", "html")
    assert here.exit_code == 0, here.output
    pools = []

    def init(self, start=True):
        DRAWER_INIT(self, start)
        pools.append(self._pool is not None)

    monkeypatch.setattr(Drawer, "__init__", init)
    forked = report(store, tmp_path / "forked", "--format", "html")
    assert forked.exit_code == 0, forked.output
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    assert pools == [cores > 1 and sys.platform.startswith("linux")]

    def images(folder):
        html = (folder / "report.html").read_text()
        return re.findall(r'src="data:image/png;base64,([^"]+)"', html)

    assert len(images(tmp_path / "here")) == 11
    # drawn pixels, not the unrasterized stand-in (this test opts out of it)
    assert all(len(base64.b64decode(i)) > len(PNG_SIGNATURE) for i in images(tmp_path / "here"))
    assert images(tmp_path / "forked") == images(tmp_path / "here")


@pytest.mark.slow
def test_html_is_self_contained_and_escapes_hostile_settings(store, tmp_path):
    result = report(store, tmp_path, "--format", "html", "--title", "<b>T</b>")
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    assert HOSTILE not in html and "<script" not in html and "<b>T</b>" not in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "&lt;b&gt;T&lt;/b&gt;" in html
    assert "it&#39;s &#34;quoted&#34;" in html
    # every plot embedded, nothing that loads from elsewhere
    # with the step, memory-parts, kernels, ddp-steps and precision plots
    assert html.count('src="data:image/png;base64,') == 11
    assert not re.search(r"(src|href)\s*=\s*[\"']?\s*(https?:)?//", html, re.I)
    assert not re.search(r"url\(|@import|<link|<script|<iframe", html, re.I)
    for title in ("Model:", "Attention:", "Memory: peaks", "Memory: saved", "Collectives:",
                  "DDP:", "Profile:", "Precision:"):
        assert f"<h2>{title}" in html
    assert "<td class=\"oom\">OOM</td>" in html and "@media print" in html
    assert not (tmp_path / "report.md").exists()


def test_where_with_quotes_and_semicolons_is_only_a_value(store, tmp_path):
    before = sha(store)
    result = report(store, tmp_path / "a", "--where", "variant=x'; DROP TABLE runs; --", "--format", "md")
    assert result.exit_code == 0, result.output
    assert "No stored runs match this selection." in (tmp_path / "a" / "report.md").read_text()
    result = report(store, tmp_path / "b", "--where", f"variant={QUOTED}", "--format", "md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "b" / "report.md").read_text()
    assert md.count("## ") == 1 and "## Precision" in md
    # one row: its settings, the quoted value among them, on the line above the table
    body = [ln for ln in md.splitlines() if ln.startswith("Same in every row: kind=accumulate")]
    assert len(body) == 1 and "DROP TABLE runs" in body[0]
    assert "ok 1 (in 1 invocation)" in md
    assert sha(store) == before


@pytest.mark.slow
def test_filters_select_exactly_the_matching_runs(store, tmp_path):
    # typed --where: the integer 256 in the settings JSON matches the text '256'; `seq` is the
    # sequence length of every experiment that has one (attention's and memory's here)
    result = report(store, tmp_path / "a", "--where", "seq=256", "--format", "md")
    md = (tmp_path / "a" / "report.md").read_text()
    assert result.exit_code == 0 and re.findall(r"^## (\w+)", md, re.M) == ["Attention", "Memory"]
    assert "ok 4 " in md
    # its 0.2 name, context_length, is no setting any more: refused, nothing written
    result = report(store, tmp_path / "a2", "--where", "context_length=256", "--format", "md")
    assert result.exit_code == 2 and "no experiment has a setting 'context_length'" in result.output
    assert not (tmp_path / "a2").exists()
    # a commit prefix and a GPU: inv-b (commit bbbb, H100) has 4 model rows
    result = report(store, tmp_path / "b", "--commit", "bbbb", "--gpu", "NVIDIA H100 80GB HBM3",
                    "--format", "md")
    md = (tmp_path / "b" / "report.md").read_text()
    assert result.exit_code == 0
    assert "- **Runs by status:** ok 2, error 1, skipped 1 (in 1 invocation)" in md
    assert "- **Commits:** bbbb2222bbbb (dirty)" in md
    # experiments as a list; until a day means the end of that day
    result = report(store, tmp_path / "c", "--experiment", "comm,ddp", "--until", "2026-01-06",
                    "--format", "md")
    md = (tmp_path / "c" / "report.md").read_text()
    assert re.findall(r"^## (\w+)", md, re.M) == ["Collectives", "DDP"]
    result = report(store, tmp_path / "d", "--until", "2026-01-05", "--format", "md")
    md = (tmp_path / "d" / "report.md").read_text()
    assert "ok 3, oom 1 (in 1 invocation)" in md  # only inv-a's rows


def test_parse_time_against_hand_computed_instants():
    now = datetime(2026, 1, 6, 15, 30, 0, tzinfo=timezone.utc)
    assert parse_time("today", now) == "2026-01-06 00:00:00.000000"
    assert parse_time("today", now, end=True) == "2026-01-07 00:00:00.000000"
    assert parse_time("yesterday", now) == "2026-01-05 00:00:00.000000"
    assert parse_time("7d", now) == "2025-12-30 15:30:00.000000"
    assert parse_time("12h", now) == "2026-01-06 03:30:00.000000"
    assert parse_time("2026-01-02", now) == "2026-01-02 00:00:00.000000"
    assert parse_time("2026-01-02", now, end=True) == "2026-01-03 00:00:00.000000"
    assert parse_time("2026-01-02T10:00:00+02:00", now) == "2026-01-02 08:00:00.000000"
    assert parse_time("2026-01-02 10:00", now) == "2026-01-02 10:00:00.000000"
    assert parse_time("13:05", now) == "2026-01-06 13:05:00.000000"
    assert parse_time("2026-01-02T10:00Z", now) == "2026-01-02 10:00:00.000000"
    for bad in ("last week", "7x", "2026-13-01", "", "24:00", "9:60", "13:5"):
        with pytest.raises(SelectionError):
            parse_time(bad, now)


@pytest.fixture
def zone(monkeypatch):
    """zone(rule): this process's local time zone, a POSIX TZ rule (no tz database needed),
    until the test ends."""
    import time

    def put(rule: str) -> None:
        monkeypatch.setenv("TZ", rule)
        time.tzset()

    yield put
    monkeypatch.undo()
    time.tzset()


@pytest.fixture
def california(zone):
    """This process in a zone 8 hours behind UTC."""
    zone("PST+08")


def test_time_words_are_the_machines_local_time(california):
    # 4 pm in California is midnight past in UTC: "today" is still the local day, whose
    # midnight is 08:00 UTC; dates and datetimes without an offset are local too
    now = datetime(2026, 1, 7, 0, 0, 0, tzinfo=timezone.utc)  # 2026-01-06 16:00 local
    assert parse_time("today", now) == "2026-01-06 08:00:00.000000"
    assert parse_time("today", now, end=True) == "2026-01-07 08:00:00.000000"
    assert parse_time("yesterday", now) == "2026-01-05 08:00:00.000000"
    assert parse_time("09:30", now) == "2026-01-06 17:30:00.000000"
    assert parse_time("2026-01-02", now) == "2026-01-02 08:00:00.000000"
    assert parse_time("2026-01-02T10:00", now) == "2026-01-02 18:00:00.000000"
    assert parse_time("2026-01-02T10:00Z", now) == "2026-01-02 10:00:00.000000"  # as it says
    assert parse_time("12h", now) == "2026-01-06 12:00:00.000000"  # ago: no zone involved


def test_dates_take_the_offset_in_force_on_that_date(zone):
    """California's summer time (a POSIX rule): 2026-07-01 starts at 07:00 UTC, not at
    today's 08:00, which left a run at 00:30 that morning out of --since 2026-07-01 and put
    one of the next day in; `today` on the day summer time ends starts at 07:00 UTC and ends
    at 08:00. A whole day in basic format or with an offset ends at its end under --until."""
    zone("PST8PDT,M3.2.0,M11.1.0")
    now = datetime(2026, 11, 2, 0, 0, tzinfo=timezone.utc)  # 2026-11-01 16:00 local
    assert parse_time("2026-07-01", now) == "2026-07-01 07:00:00.000000"
    assert parse_time("2026-07-01", now, end=True) == "2026-07-02 07:00:00.000000"
    assert parse_time("2026-01-02", now) == "2026-01-02 08:00:00.000000"
    assert parse_time("2026-07-01T12:00", now) == "2026-07-01 19:00:00.000000"
    assert parse_time("today", now) == "2026-11-01 07:00:00.000000"
    assert parse_time("today", now, end=True) == "2026-11-02 08:00:00.000000"
    assert parse_time("yesterday", now) == "2026-10-31 07:00:00.000000"
    assert parse_time("09:00", now) == "2026-11-01 17:00:00.000000"
    assert parse_time("20260701", now, end=True) == "2026-07-02 07:00:00.000000"
    assert parse_time("2026-07-01Z", now, end=True) == "2026-07-02 00:00:00.000000"
    assert parse_time("2026-07-01+02:00", now) == "2026-06-30 22:00:00.000000"
    assert parse_time("2026-07-01+02", now, end=True) == "2026-07-01 22:00:00.000000"
    assert parse_time("2026-w27-3", now) == parse_time("2026-07-01", now)  # a week date
    # Santiago's rule: summer time starts at a midnight, which the clocks skip; the day
    # starts at 01:00 (-03), 04:00 UTC, not at 23:00 the day before
    zone("CLT4CLST3,M9.1.0/0,M4.1.0/0")
    assert parse_time("2026-09-06", now) == "2026-09-06 04:00:00.000000"
    assert parse_time("2026-09-05", now, end=True) == "2026-09-06 04:00:00.000000"
    # a time within the skipped hour: the instant the clocks jump at, 01:00 (-03)
    assert parse_time("2026-09-06T00:30", now) == "2026-09-06 04:00:00.000000"


def test_a_morning_run_is_in_todays_report_in_california(california, tmp_path, db_path):
    import sqlite3 as sq
    from datetime import timedelta

    from cs336sys.report.select import FMT

    now = datetime.now(timezone.utc)
    local_midnight = now.astimezone().replace(hour=0, minute=0, second=0, microsecond=0)
    morning = (local_midnight + timedelta(minutes=1)).astimezone(timezone.utc)
    build_rows = invoke("attention", "--impl", "naive", "--seq", "16", "--d-head", "8",
                        "--batch", "1", "--warmup", "0", "--iters", "1", "--pass", "forward",
                        "--device", "cpu", "--db", db_path)
    assert build_rows.exit_code == 0, build_rows.output
    with sq.connect(db_path) as conn:  # as if it ran just after this machine's midnight
        conn.execute("UPDATE runs SET created = ?", (morning.strftime(FMT),))
    result = report(db_path, tmp_path / "r", "--since", "today", "--format", "md")
    assert result.exit_code == 0 and "No stored runs match" not in result.stderr, result.output
    assert "## Attention" in (tmp_path / "r" / "report.md").read_text()


@pytest.mark.parametrize("args", [["--since", "today", "--until", "yesterday"],
                                  ["--since", "2026-01-05", "--until", "2026-01-04"]])
def test_an_empty_or_inverted_range_is_refused_with_the_range_named(store, tmp_path, args):
    before = sha(store)
    result = report(store, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert f"--since {args[1]} --until {args[3]} is an empty range: from " in line
    assert not (tmp_path / "out").exists() and sha(store) == before
    exported = invoke("db", "export", "--db", store, *args)
    assert exported.exit_code == 2 and "is an empty range" in exported.stderr


def test_where_values_are_bound_never_spliced():
    sql, params = Selection(where=tuple(parse_where(["size=a'b;--", "seq=16"], EXPERIMENTS))).clause()
    assert "a'b" not in sql and "size" not in sql and params == ["size", "a'b;--", "size",
                                                                 "a'b;--", "seq", 16, "seq", "16"]
    # a switch as the report prints it (`compile=no`) selects as true/false does
    for said, stored in (("no", 0), ("yes", 1), ("False", 0), ("true", 1)):
        _, params = Selection(where=tuple(parse_where([f"compile={said}"], EXPERIMENTS))).clause()
        assert params[:3] == ["compile", stored, "compile"]
    for bad in ("novalue", "=x", "a.b=1", "x') OR 1=1 --=y"):
        with pytest.raises(SelectionError):
            parse_where([bad], EXPERIMENTS)
    # spaces around `=` on either side: `impl= naive` selected nothing (the key was trimmed)
    assert parse_where([" impl = naive "], EXPERIMENTS) == parse_where(["impl=naive"],
                                                                      EXPERIMENTS)


def test_a_commit_ref_outside_a_checkout_is_refused_not_read_as_a_prefix(tmp_path, monkeypatch):
    """--commit HEAD where there is no git repository selected nothing, silently: it was taken
    as the hash prefix 'HEAD'. A hash prefix stays a prefix (commits of other machines)."""
    from cs336sys.report.select import selected

    monkeypatch.chdir(tmp_path)
    now = datetime.now(timezone.utc)
    with pytest.raises(SelectionError, match="--commit HEAD: not a commit hash or prefix, nor a "
                                             "git ref of this folder's repository"):
        selected(since=None, until=None, gpu=None, commit="HEAD", where=None,
                 catalog=EXPERIMENTS, now=now)
    sel = selected(since=None, until=None, gpu=None, commit="bbbb2222", where=None,
                   catalog=EXPERIMENTS, now=now)
    assert sel.commit == "bbbb2222"


@pytest.mark.parametrize(
    "args, message",
    [
        (["--experiment", "modle"], "--experiment: unknown value 'modle'"),
        (["--since", "last tuesday"], "cannot read time 'last tuesday'"),
        (["--where", "size"], "expected KEY=VALUE"),
        (["--where", "precison=bf16"], "no experiment has a setting 'precison'; did you mean 'precision'?"),
        # the report's tables head checkpoint `ckpt`: the setting is named
        (["--where", "ckpt=none"], "no experiment has a setting 'ckpt'; did you mean 'checkpoint'?"),
        # a 0.2 name: its new one (dtype's hint was value_dtype, context_length's none)
        (["--where", "dtype=bf16"], "no experiment has a setting 'dtype'; it is 'precision' now"),
        (["--where", "context_length=512"], "setting 'context_length'; it is 'seq' now"),
        (["--format", "pdf"], "--format: unknown value 'pdf'"),
        # a GPU's name is matched whole: a part of it selected nothing, silently
        (["--gpu", "H100"], "--gpu 'H100': no stored run is on that GPU (the name must be "
                            "whole; did you mean 'NVIDIA H100 80GB HBM3'?); stored: "),
        (["--threshold", "3"], "--threshold needs --compare A B or --history"),
        (["--gpu", ""], "--gpu: empty value; give one, or leave --gpu out"),
        (["--commit", " "], "--commit: empty value; give one, or leave --commit out"),
        (["--compare", "aaaa", "zzzz"], "'zzzz' matches no commit"),
        (["--compare", "aaaa", "cpu"], "'aaaa' is a commit but 'cpu' is a gpu"),
    ],
)
def test_bad_input_is_one_line_exit_2_and_writes_nothing(store, tmp_path, args, message):
    before = sha(store)
    result = report(store, tmp_path / "out", *args)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], lines
    assert not (tmp_path / "out").exists() and sha(store) == before


@pytest.mark.parametrize("blocker, kind", [("report.html", "folder"), ("report_files", "file")])
def test_an_output_in_the_way_is_named_and_nothing_is_written(store, tmp_path, blocker, kind):
    """The report's files land together: one that cannot land leaves `--out` as it was (no
    report.html beside it, no hidden staged file) and the line names it."""
    out = tmp_path / "out"
    out.mkdir()
    if kind == "folder":
        (out / blocker).mkdir()
    else:
        (out / blocker).touch()
    result = report(store, out, "--format", "html,md")
    assert result.exit_code == 2, result.output
    assert "cannot write there" in result.stderr and str(out / blocker) in result.stderr
    assert [p.name for p in out.iterdir()] == [blocker]


def test_missing_store_is_refused_and_not_created(db_path, tmp_path):
    result = report(db_path, tmp_path / "out")
    assert result.exit_code == 2 and "no results store" in result.stderr
    assert not db_path.exists() and not (tmp_path / "out").exists()


def test_empty_selection_says_so(store, tmp_path):
    result = report(store, tmp_path, "--since", "2030-01-01")
    assert result.exit_code == 0 and "No stored runs match" in result.stderr
    for name in ("report.md", "report.html"):
        assert "No stored runs match this selection." in (tmp_path / name).read_text()
    assert "<h2>" not in (tmp_path / "report.html").read_text()


def _row(gpu, seq, ms, **settings):
    s = {"impl": "naive", "d_head": 64, "dtype": "bf16", "seq": seq, "seed": 0, **settings}
    return {"gpu": gpu, "status": "ok", "seq": seq, "ms": ms, "_settings": s}


def test_lines_split_by_every_setting_and_gpu_and_name_only_what_differs():
    rows = [
        _row("H100", 128, 1.0), _row("H100", 256, 2.0),
        _row("A100", 128, 1.5), _row("A100", 256, 3.0),
        _row("H100", 128, 0.5, impl="triton"), _row("H100", 256, 0.7, impl="triton"),
        _row("H100", 128, 0.9, d_head=128, seed=1),  # another panel; the seed never matters
        {**_row("H100", 512, 9.0), "status": "oom"},  # on its line, without a value
        {**_row("H100", 1024, 9.0), "status": "error"},  # on no line
    ]
    got = panels(rows, "seq", "ms", facet="d_head", first=("impl",))
    assert got == {
        "d_head=64": {
            "impl=naive H100": [(128, 1.0), (256, 2.0), (512, None)],  # the plot marks the OOM
            "impl=naive A100": [(128, 1.5), (256, 3.0)],
            "impl=triton H100": [(128, 0.5), (256, 0.7)],
        },
        "d_head=128": {"impl=naive H100": [(128, 0.9)]},
    }
    # one line: named by its leading settings, not by a metric's column name
    assert panels(rows[:2], "seq", "ms", first=("impl", "dtype")) == {
        "": {"impl=naive dtype=bf16": [(128, 1.0), (256, 2.0)]}
    }


def test_a_table_names_settings_it_does_not_show_when_they_differ():
    rows = [_row("H100", 128, 1.0, attention="naive"), _row("H100", 128, 1.1, attention="flash")]
    t = with_gpu(rows, ["impl", "ms"], lambda r: [r["_settings"]["impl"], str(r["ms"])],
                 shown=("impl", "seq", "d_head", "dtype"))
    assert t.headers == ["impl", "ms", "other settings"]
    assert t.rows == [["naive", "1.0", "attention=naive"], ["naive", "1.1", "attention=flash"]]
    t = with_gpu(rows[:1] + [_row("A100", 128, 2.0, attention="naive")], ["ms"],
                 lambda r: [str(r["ms"])], shown=())
    assert t.headers == ["gpu", "ms"] and t.rows == [["H100", "1.0"], ["A100", "2.0"]]
    # a setting only one kind of row has (sdpa's backend) is not a difference between rows
    rows = [_row("H100", 128, 1.0), _row("H100", 128, 0.4, impl="sdpa", sdpa_backend="auto")]
    t = with_gpu(rows, ["impl"], lambda r: [r["_settings"]["impl"]], shown=("impl", "seq"))
    assert t.headers == ["impl"] and t.rows == [["naive"], ["sdpa"]]


def test_tick_labels_are_plain_numbers():
    assert [short(v) for v in (0, 0.25, 128, 16384, 65536, 1e5, 1.5e6, 2e9)] == [
        "0", "0.25", "128", "16384", "65536", "100k", "1.5M", "2G"
    ]


def test_noisy_points_show_the_median_and_host_bound_is_a_column_only_where_measured():
    """The printed and the report's tables: std/mean above 10 % adds the median and a note;
    the host-bound column (CUDA only) is left out where no point has it."""
    from cs336sys.experiments import model
    from cs336sys.report.tables import point_table

    def row(step, std, phases=None):
        s = {"size": "small", "seq": 512, "precision": "bf16", "batch": step}
        return {**s, "mode": "train", "status": "ok", "_settings": s, "gpu": "H100",
                "step_ms_mean": step, "step_ms_std": std, "step_ms_median": step - 1,
                "launch_bound_phases": phases}

    steady, spiky = row(20.0, 1.0), row(20.0, 5.0, "fwd,bwd")
    t = point_table(model.TABLE, [steady, spiky])
    step = t.headers.index("step ms")
    assert t.rows[0][step] == "20 ± 1"
    assert t.rows[1][step] == "20 ± 5 (median 19, noisy)"  # stored before p10/p90/IQR
    # the note says what the cell shows (it promised percentiles the cell lacked)
    assert t.note.endswith("noisy: the std is more than 10 % of the mean (spikes in the "
                           "samples); the median stands beside the mean.")
    other = {**spiky, "step_ms_p10": 18.0, "step_ms_p90": 27.5, "step_ms_iqr": 2.25, "batch": 1,
             "_settings": {**spiky["_settings"], "batch": 1}}
    assert "the median stands beside the mean (and, where stored, the 10th-90th " in \
        point_table(model.TABLE, [spiky, other]).note
    spiky.update(step_ms_p10=18.0, step_ms_p90=27.5, step_ms_iqr=2.25)
    t = point_table(model.TABLE, [steady, spiky])
    assert t.rows[1][step] == "20 ± 5 (median 19, p10–p90 18–27.5, IQR 2.25, noisy)"
    assert t.rows[1][t.headers.index("host-bound")] == "fwd,bwd"
    assert "the median, the 10th-90th percentiles and the interquartile range stand" in t.note
    assert "host-bound: the phases whose host time" in t.note
    t = point_table(model.TABLE, [steady])
    assert "host-bound" not in t.headers and "noisy" not in t.note and "host-bound" not in t.note


PAYLOADS = ["[x](javascript:alert(1))", "![i](http://a/x.png)", "\n# h", "|", "```\nfence",
            "www.example.com", "bob@example.com", "mailto:a@b.co", "<script>alert(1)</script>",
            "<http://a.b>", "&amp; &#39;", "GPU's < 5 & > 2"]


def test_markdown_report_values_are_inert(tmp_path):
    """A stored value (settings, GPU name, versions, kernel names, error text) or the title
    can start no heading, list, table row or fence, and make no link or image."""
    import re

    from cs336sys.store import Store

    db = tmp_path / "hostile.db"
    evil = " ".join(PAYLOADS)
    prov = {"host": evil, "gpu": evil, "gpu_count": 1, "torch_version": evil, "git_commit": "c1"}
    with Store(db, EXPERIMENTS) as s:
        inv = s.begin_invocation(prov, [], "model")
        s.add_run(inv, "model", "ok", {"size": evil, "seq": 8, "mode": "train"},
                  {"step_ms_mean": 1.0})
        s.add_run(inv, "model", "error", {"size": "x", "seq": 8}, error=evil)
        rid = s.add_run(inv, "profile", "ok", {"target": "model", "size": evil}, {})
        s.add_kernel_stats(rid, [{"phase": "forward", "rank": 1, "name": evil, "calls": 1,
                                  "total_ms": 1.0, "mean_ms": 1.0, "share": 1.0,
                                  "time_basis": "cpu"}])
    result = invoke("report", "--db", db, "--out", tmp_path / "out", "--format", "md",
                    "--title", evil)
    assert result.exit_code == 0, result.output
    md = (tmp_path / "out" / "report.md").read_text()
    unescaped = re.compile(r"(?<!\\)[\[\]`]")
    fence = None  # a failure's traceback, in a fence longer than any backtick run inside it
    for line in md.splitlines():
        if line.startswith("![") and line.endswith(".png)"):  # our own plots
            continue
        if fence is None and re.fullmatch(r"  `{3,}", line):
            fence = line
            continue
        if fence is not None:  # literal text; only our own closing fence ends it
            fence = None if line == fence else fence
            continue
        assert not unescaped.search(line), line
        assert "://" not in line and "www." not in line, line
        assert not line.startswith(("# h", "fence", "```")), line
        if line.startswith("#"):  # only our headings: the title and the sections
            assert line.startswith(("# ", "## ")) and "\\[x\\]" in line or line.startswith("## ")
    # table rows keep their column count: a value's pipe is escaped
    for table in re.findall(r"((?:^\|.*\|$\n?)+)", md, re.M):
        widths = {len(re.findall(r"(?<!\\)\|", row)) for row in table.strip().splitlines()}
        assert len(widths) == 1, table
    assert "\\[x\\](javascript:alert(1))" in md and "!\\[i\\](http:\\/\\/a/x.png)" in md
    assert "GPU's < 5 & > 2" in md  # plain text stays plain: no entities where none is needed
    # GitHub's own renderer (cmark-gfm with its autolinks), passing raw HTML through: no
    # link, image, script or heading of the values'; each value's text as it was stored
    import html as html_lib

    import cmarkgfm
    from cmarkgfm.cmark import Options

    page = cmarkgfm.github_flavored_markdown_to_html(md, options=Options.CMARK_OPT_UNSAFE)
    assert "<a " not in page and "<script" not in page and "<h1>h" not in page
    assert re.findall(r"<img [^>]*>", page) == re.findall(r"<img src=\"report_files/[^>]*>", page)
    text = " ".join(html_lib.unescape(re.sub(r"<!-- -->|<[^>]+>", "", page)).split())
    for payload in PAYLOADS:
        assert " ".join(payload.split()) in text, payload


@pytest.mark.promise(REPORTS)
def test_a_report_embeds_only_the_timelines_cs336sys_wrote(tmp_path, monkeypatch):
    """A stored run names its timeline PNG; a store merged from elsewhere could name any
    file here. Only a PNG directly in the point's own --snapshot folder is read: a secret
    file, a PNG outside that folder and a symlink are left out, with a note."""
    import base64
    import struct
    import zlib

    from cs336sys.store import Store

    def png(path):  # a valid 1x1 PNG
        def chunk(kind, data):
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data)))
        header = chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
        path.write_bytes(b"\x89PNG\r\n\x1a\n" + header + chunk(b"IDAT", zlib.compress(b"\x00\x00"))
                         + chunk(b"IEND", b""))
        return path

    monkeypatch.chdir(tmp_path)
    snaps, elsewhere = tmp_path / "snaps", tmp_path / "elsewhere"
    snaps.mkdir(), elsewhere.mkdir()
    secret = tmp_path / "id_rsa"
    secret.write_text("-----BEGIN OPENSSH PRIVATE KEY----- s3cr3t")
    own = png(snaps / "tiny-T64.png")
    outside = png(elsewhere / "tiny-T64.png")
    (snaps / "link.png").symlink_to(outside)
    db = tmp_path / "r.db"
    with Store(db, EXPERIMENTS) as s:
        inv = s.begin_invocation({"host": "h", "gpu": "cpu", "gpu_count": 0}, [], "memory")
        for seq, where in ((64, own), (128, secret), (256, outside), (512, snaps / "link.png")):
            s.add_run(inv, "memory", "ok",
                      {"size": "tiny", "seq": seq, "mode": "train", "snapshot": "snaps"},
                      {"peak_bytes": 2**20, "snapshot_png": str(where),
                       "snapshot_pickle": "snaps/tiny-T64.pickle" if seq == 64 else None})
        # a later run of the first point without --snapshot (another problem's) is its
        # latest: its timeline still shows, from the run that drew it
        s.add_run(inv, "memory", "ok", {"size": "tiny", "seq": 64, "mode": "train"},
                  {"peak_bytes": 2**20})
    result = invoke("report", "--db", db, "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out" / "report.html").read_text()
    assert base64.b64encode(own.read_bytes()).decode() in html
    assert "s3cr3t" not in html and base64.b64encode(secret.read_bytes()).decode()[:16] not in html
    assert "3 memory timeline(s) left out" in html
    assert html.count("<figcaption>Memory timeline:") == 1
    # the caption names the point's checkpointing too; the CUDA pickle gets its one line
    assert "T=64 B=None train None checkpoint=none (the run of " in html
    assert "snaps/tiny-T64.pickle. Drag it onto https://pytorch.org/memory_viz" in html
    # from another folder (a handout report from a subfolder of the checkout): the relative
    # --snapshot's timeline is found by its stored absolute path, the others still refused
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    result = invoke("report", "--db", db, "--out", tmp_path / "out2")
    assert result.exit_code == 0, result.output
    html = (tmp_path / "out2" / "report.html").read_text()
    assert base64.b64encode(own.read_bytes()).decode() in html
    assert "3 memory timeline(s) left out" in html


def test_db_export_selects_by_gpu_and_commit_as_report_does(store):
    out = invoke("db", "export", "--db", store, "--format", "jsonl", "--commit", "bbbb",
                 "--gpu", "NVIDIA H100 80GB HBM3")
    assert out.exit_code == 0, out.output
    records = [json.loads(line) for line in out.stdout.splitlines()]
    everything = [json.loads(line) for line in
                  invoke("db", "export", "--db", store, "--format", "jsonl").stdout.splitlines()]
    expected = [r["run_id"] for r in everything
                if r["gpu"] == "NVIDIA H100 80GB HBM3" and r["git_commit"].startswith("bbbb")]
    assert 0 < len(expected) < len(everything)
    assert [r["run_id"] for r in records] == expected


@pytest.mark.slow
def test_the_analytic_plan_comes_after_the_measured_sections_folded(store, tmp_path):
    import shutil

    db = shutil.copy(store, tmp_path / "with-plan.db")
    planned = invoke("plan", "--size", "8b", "--hardware", "h100", "--db", db)
    assert planned.exit_code == 0, planned.output
    result = report(db, tmp_path)
    assert result.exit_code == 0, result.output
    html = (tmp_path / "report.html").read_text()
    sections = re.findall(r'<section id="([^"]+)">', html)
    assert sections[-1] == "plan" and len(sections) > 2
    plan = html[html.index('<section id="plan">'):]
    assert plan.index('<details class="analytic">') < plan.index("<table")
    assert plan.index("</table>") < plan.index("</details>")
    md = (tmp_path / "report.md").read_text()
    assert re.findall(r"^## (.+)$", md, re.M)[-1].startswith("Plan")


def test_the_header_says_a_sweep_stopped_before_its_first_point(tmp_path):
    """A sweep killed before it stored a point has no run, and the header reached
    invocations through their runs alone: `ok 6 (in 1 invocation)` of 2, no word of it.
    One that ended normally with nothing stored (every point resumed) is left out, as is one
    outside the selection's time or experiments."""
    import sqlite3

    from cs336sys.report.render import STOPPED_EARLY, provenance
    from cs336sys.report.select import Selection, invocations

    db = build(tmp_path / "r.db")
    conn = sqlite3.connect(db)
    for i, finished, started in (("killed", None, "2026-01-07 09:00:00.000000"),
                                 ("resumed", "2026-01-07 09:01:00", "2026-01-07 09:00:30.0")):
        conn.execute("INSERT INTO invocations (id, command, started, finished, gpu, gpu_count, "
                     "git_commit, git_dirty) VALUES (?, 'model', ?, ?, 'cpu', 0, 'c', 0)",
                     (i, started, finished))
    conn.commit()
    conn.row_factory = sqlite3.Row
    got = invocations(conn, Selection())
    assert [(i["id"], i["_n"]) for i in got if i["_n"] == 0] == [("killed", 0)]
    assert dict(provenance(got, {}))[STOPPED_EARLY].startswith(
        "1 invocation never finished (killed, crashed, or still running) before storing a point")
    # the runs' count names the invocations that stored them (it read "(in 2 invocations)")
    assert dict(provenance(got, {}))["Runs by status"].endswith(
        " (in 3 invocations; 1 invocation stored none)")
    assert not [i for i in invocations(conn, Selection(until="2026-01-07")) if i["_n"] == 0]
    assert not [i for i in invocations(conn, Selection(experiments=("ddp",))) if i["_n"] == 0]
    # a command of two words runs the experiment of its first: `profile model`, profile
    conn.execute("INSERT INTO invocations (id, command, started, gpu, gpu_count, git_commit, "
                 "git_dirty) VALUES ('prof', 'profile model', '2026-01-07 10:00', 'cpu', 0, "
                 "'c', 0)")
    assert [i["id"] for i in invocations(conn, Selection(experiments=("profile",)))
            if i["_n"] == 0] == ["prof"]
    # `memory residuals` stores memory-residuals, not memory (its first word)
    conn.execute("UPDATE invocations SET command = 'memory residuals' WHERE id = 'prof'")
    assert [i["id"] for i in invocations(conn, Selection(experiments=("memory-residuals",)))
            if i["_n"] == 0] == ["prof"]
    assert not [i for i in invocations(conn, Selection(experiments=("memory",))) if not i["_n"]]
    assert not [i for i in invocations(conn, Selection(where=(("seq", "128"),))) if not i["_n"]]


def test_the_header_says_which_invocations_stopped_before_their_end():
    """A sweep stopped by Ctrl-C (exit 130) or killed (never finished) read as complete:
    `Runs by status: ok 4`. The header says so, and how to measure the rest."""
    from cs336sys.report.render import STOPPED_EARLY, provenance

    def inv(i, exit_status, finished="2026-12-06 10:00:00.000000"):
        return {"id": i, "_status": "ok", "_n": 2, "gpu": "cpu", "gpu_count": 0,
                "git_commit": "c", "git_dirty": 0, "exit_status": exit_status,
                "finished": finished}

    assert STOPPED_EARLY not in dict(provenance([inv("a", 0), inv("b", 1)], {}))
    facts = dict(provenance([inv("a", 0), inv("b", 130), inv("c", 143), inv("d", None, None)],
                            {}))
    assert facts[STOPPED_EARLY] == (
        "2 invocations stopped by Ctrl-C, SIGTERM or SIGHUP; 1 invocation never finished (killed, "
        "crashed, or still running): their sweeps may lack points; the same command with --resume "
        "measures the rest")
    assert dict(provenance([inv("b", 130)], {}))[STOPPED_EARLY].startswith(
        "1 invocation stopped by Ctrl-C, SIGTERM or SIGHUP: its sweep may lack points")
    # a commit measured clean and dirty is two: the whole commit read `(dirty)`
    dirty = {**inv("e", 0), "git_dirty": 1, "git_commit": "aaaa2222bbbb3333"}
    clean = {**inv("f", 0), "git_commit": "aaaa2222bbbb3333"}
    assert dict(provenance([dirty, clean], {}))["Commits"] == "aaaa2222bbbb, aaaa2222bbbb (dirty)"


def test_a_point_sigterm_stopped_hides_no_measurement_of_it():
    """A re-run stopped by SIGTERM stores its interrupted point as `error` ("terminated by
    signal 15"): it replaced the ok row of the same point in reports and the writeup. It
    shows only where nothing else of the point is stored; a real error still replaces."""
    from cs336sys.report.sections import latest

    def row(status, error=None):
        return {"gpu": "cpu", "status": status, "error": error, "_settings": {"seq": 8}}

    ok, term = row("ok"), row("error", "terminated by signal 15 (SIGTERM)")
    (shown,) = latest([ok, term])
    assert shown is ok and shown["_n"] == 2 and shown["_earlier"] == [term]
    assert latest([term, ok]) == [ok]
    assert latest([term]) == [term]
    broken = row("error", "RuntimeError: boom")
    assert latest([ok, broken]) == [broken]


def test_runs_of_an_experiment_this_version_does_not_know_are_said(tmp_path):
    """A store holding runs of an experiment kind no declaration names (a newer cs336sys's)
    counted them in the report's header and showed them in no section, nor said why."""
    from cs336sys.store import Store

    db = tmp_path / "r.db"
    with Store(db, EXPERIMENTS) as s:
        inv = s.begin_invocation({"gpu": "cpu"}, ["cs336sys", "futurething"], "futurething")
        for seq in (1, 2):
            s.add_run(inv, "futurething", "ok", {"seq": seq}, {"x_ms": 1.0})
        s.finish_invocation(inv, 0)
    result = report(db, tmp_path, "--format", "md")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "report.md").read_text()
    assert "## Experiments this cs336sys does not know" in md
    assert "has no section for (2 of `futurething`): stored by a newer version, or by hand" in md
