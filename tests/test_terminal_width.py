"""Every command's output fits the terminal ($COLUMNS, 80 off a terminal): prose is filled
to the width, never broken inside a word or a backquoted command; a table wider than that is
cut between columns into parts that each start with the columns telling its rows apart, and
a cell too long for any part is set on several lines. Only a `  $ cs336sys ...` line, a
command to copy whole, may be longer (docs/getting-started.md)."""

from __future__ import annotations

import pytest

from cs336sys.report.tables import blocks, fill
from tests.conftest import invoke
from tests.test_compare import Builder, noisy

# The verdicts' tables are the subject, not the report's pixels (conftest).
pytestmark = pytest.mark.unrasterized


def too_wide(text: str, width: int) -> list[str]:
    """The lines of `text` wider than `width`, but for the command lines to copy whole."""
    whole = ("  $ cs336sys ", "  $ TRITON_INTERPRET=1 cs336sys ")
    return [x for x in text.splitlines() if len(x) > width and not x.startswith(whole)]


def run(width: int, *args):
    r = invoke(*args, env={"COLUMNS": str(width)})
    assert r.exit_code == 0, r.output
    return r


def test_fill_breaks_at_spaces_never_inside_a_backquoted_command():
    text = "Run it again with `cs336sys model --size tiny --seq 64` and the runs are compared."
    lines = fill(text, 30, then="  ").splitlines()
    assert "  `cs336sys model --size tiny --seq 64`" in lines  # longer than 30, whole
    assert all(len(x) <= 30 for x in lines if "`" not in x)
    assert " ".join(x.strip() for x in lines) == text
    assert fill(text, None) == text


def test_a_cell_too_long_for_any_part_is_set_on_several_lines_beside_whole_keys():
    """plan's closed forms: one cell of 180 columns beside 57 of key columns was a row no cut
    between columns could shorten."""
    sentence = "compute-bound iff B/N >= (N-1)/N * C/W, i.e. N <= 1 + B*W/C " * 3
    rows = [["dp", "H100 SXM 80GB", sentence], ["tp", "H100 SXM 80GB", "short"]]
    (block,) = blocks(["strategy", "GPU", "condition"], rows, 60, key=[0, 1])
    lines = block.splitlines()
    assert max(map(len, lines)) <= 60 and len(lines) > 5
    assert lines[2].startswith("dp          H100 SXM 80GB  compute-bound")  # the keys whole
    at = lines[0].index("condition")
    assert " ".join(x[at:] for x in lines[2:-1]).split() == sentence.split()
    # key columns wider than the terminal: filling the rest would not make it fit
    wide_keys = [["x" * 70, "a b c d e f g h"]]
    assert blocks(["key", "value"], wide_keys, 60, key=[0]) == blocks(["key", "value"],
                                                                       wide_keys, None, [0])


def test_a_lone_rows_parts_repeat_no_metric_as_if_it_told_rows_apart():
    """One point, its settings on the line above: no column tells rows apart, and each part
    after the first began again with `fwd ms`, a metric read as a key. Several rows without
    a key still lead each part with the first column, so a row can be followed across."""
    headers = ["fwd ms", "bwd ms", "opt ms", "step ms", "tokens/s", "TFLOP/s", "MFU"]
    cells = ["911 ± 161", "853 ± 231", "2,722 ± 3,129", "4,486 ± 3,199", "28.5", "0.00303", ""]
    parts = blocks(headers, [cells], 60, key=[])
    assert len(parts) == 2 and [p.split()[0] for p in parts] == ["fwd", "tokens/s"]
    assert all(max(map(len, p.splitlines())) <= 60 for p in parts)
    two = blocks(headers, [cells, cells], 60, key=[])
    assert len(two) > 1 and all(p.startswith("fwd ms") for p in two)


@pytest.fixture(scope="module")
def one_run_a_side(tmp_path_factory):
    """Commits A, B and C, one run each, B 30% slower than A and C as fast again: every
    change undecided on one run a side (the compare's and the history's caveat)."""
    b = Builder(tmp_path_factory.mktemp("width") / "results.db")
    for i, (commit, center) in enumerate(zip(("a1" * 20, "b2" * 20, "c3" * 20), (100, 130, 100),
                                             strict=True)):
        inv, day = f"inv-{i}", f"2026-03-0{i + 1}"
        b.invocation(inv, commit, f"{day} 10:00:00.000000")
        b.model(inv, f"{day} 10:01:00.000000", "fp32", noisy(center, 10, i))
    return b.close()


def test_report_compare_fits_the_terminal(one_run_a_side, tmp_path, monkeypatch):
    """The caveat was one line of 248 columns and the table 86 wide at 80, its one point
    named by all its settings, 70 columns (set on several lines now)."""
    monkeypatch.chdir(tmp_path)  # the paths written are short: a path is never cut
    out = run(80, "report", "--compare", "a1a1", "b2b2", "--format", "md", "--out", "r",
              "--db", one_run_a_side).stdout
    assert too_wide(out, 80) == []
    heads = [x for x in out.splitlines() if x.startswith("experiment")]
    assert len(heads) == 2 and all(x.split()[:3] == ["experiment", "point", "metric"]
                                   for x in heads)
    said = " ".join(out.split())
    assert "One run a side: the samples of one run see the scatter within it, not the" in said
    assert "one run a side" in said and "p<0.001 (1 vs 1 run)" in said


def test_report_history_fits_the_terminal(one_run_a_side, tmp_path, monkeypatch):
    """Its summary line was 99 columns, its caveat 248."""
    monkeypatch.chdir(tmp_path)
    out = run(60, "report", "--history", "--format", "md", "--out", "r",
              "--db", one_run_a_side).stdout
    assert too_wide(out, 60) == []
    said = " ".join(out.split())
    assert "History: 1 point measured at two commits or more; 0 steps detected" in said
    assert "One run a side: the samples of one run see" in said


def test_handout_run_dry_run_fits_the_terminal(db_path):
    """`N command(s), cut down for a CPU: ...` was 100 columns, each `[i/N] problem:
    cs336sys ...` line up to 173 and each `dry run: ...` line 92: the command now stands on
    a `$` line of its own, under its problem."""
    out = run(80, "handout", "run", "--all", "--dry-run", "--db", db_path).stdout
    assert too_wide(out, 80) == []
    lines = out.splitlines()
    heads = [i for i, x in enumerate(lines) if x.startswith("[")]
    assert heads and all(lines[i + 1].startswith("  $ cs336sys ") for i in heads)
    assert not db_path.exists()


def test_precision_autocast_fits_the_terminal(db_path):
    """The `native` cell of fp16 on a CPU (`no (cpu AVX2; no AVX512-FP16 or AMX-FP16: fp16
    math runs via float32)`) made its part 83 wide at 80."""
    out = run(60, "precision", "autocast", "--precision", "fp16,bf16", "--device", "cpu",
              "--db", db_path).stdout
    assert too_wide(out, 60) == []
    head = next(i for i, x in enumerate(out.splitlines()) if x.split()[-1:] == ["native"])
    assert out.splitlines()[head + 2].startswith("fp16 ")


def test_memory_residuals_fits_the_terminal(db_path):
    """The `top operations (share)` row was 136 wide at 80, beside 47 columns of settings."""
    out = run(80, "memory", "residuals", "--size", "tiny", "--d-model", "64", "--d-ff", "128",
              "--num-heads", "4", "--seq", "32", "--batch", "1", "--no-compile", "--device",
              "cpu", "--db", db_path).stdout
    assert too_wide(out, 80) == []
    assert "top operations (share)" in out and "MulBackward0" in out


def test_plan_fits_the_terminal(db_path):
    """The closed forms' condition row was up to 235 wide at 80."""
    out = run(80, "plan", "--size", "xl", "--db", db_path).stdout
    assert too_wide(out, 80) == []
    said = " ".join(out.split())
    assert "compute-bound iff B/N >= (N-1)/N * C/W, i.e. N <= 1 + B*W/C" in said


def test_handout_listing_fits_the_terminal(db_path):
    """flash_forward's check stood in backquotes in its status, a line of 84 at 80; it is a
    `$` line now, as every other command of the listing."""
    out = run(80, "handout", "--db", db_path).stdout
    assert too_wide(out, 80) == []
    assert ("  $ TRITON_INTERPRET=1 cs336sys attention --attention yours-torch,yours-triton "
            f"--pass forward --seq 128 --label flash_forward --db {db_path}") in out.splitlines()
