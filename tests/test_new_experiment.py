"""Adding an experiment kind takes its module, one line in the catalog and its command
(docs/architecture.md, "Adding an experiment"): with only those, a toy kind is measured,
stored, viewed, queried, filtered and reported like the built-in ones."""

from __future__ import annotations

import pytest

from tests import toy_experiment
from tests.conftest import invoke, query


@pytest.fixture
def with_matmul(monkeypatch):
    """The two steps beyond the module: the catalog line and the command's registration."""
    from cs336sys import cli
    from cs336sys.experiments import catalog

    monkeypatch.setattr(catalog, "EXPERIMENTS", (*catalog.EXPERIMENTS, toy_experiment.EXPERIMENT))
    monkeypatch.setattr(cli.app, "registered_commands", list(cli.app.registered_commands))
    cli.app.command("matmul")(toy_experiment.command)


def test_a_new_kind_is_stored_viewed_and_reported(with_matmul, db_path, tmp_path):
    ran = invoke("matmul", "--n", "8,16", "--iters", "2", "--label", "toy", "--db", db_path)
    assert ran.exit_code == 0, ran.output
    assert "Matmul time" in ran.stdout  # its declared table, printed

    rows = query(db_path, "SELECT n, iters, flops, status FROM matmul_runs ORDER BY n")
    assert rows == [{"n": 8, "iters": 2, "flops": 2 * 8**3, "status": "ok"},
                    {"n": 16, "iters": 2, "flops": 2 * 16**3, "status": "ok"}]
    sql = invoke("sql", "SELECT n FROM matmul_runs WHERE n = ?", "-p", "16", "--json",
                 "--db", db_path)
    assert sql.exit_code == 0 and '"n": 16' in sql.stdout

    out = tmp_path / "report"
    rep = invoke("report", "--where", "n=16", "--db", db_path, "--out", out)
    assert rep.exit_code == 0, rep.output
    md = (out / "report.md").read_text()
    assert "## Matmul" in md and "Matmul time" in md
    # the filter kept n=16 only; the table lists the one point
    assert "| 16 |" in md.replace("  ", " ") and "| 8 |" not in md.replace("  ", " ")

    again = invoke("matmul", "--n", "8,16", "--iters", "2", "--resume", "--db", db_path)
    assert again.exit_code == 0 and "skipping 2 point(s)" in again.output


def test_a_new_kind_refuses_bad_input_like_the_others(with_matmul, db_path):
    bad = invoke("matmul", "--n", "0", "--db", db_path)
    assert bad.exit_code == 2 and bad.output.strip() == "Error: --n: sizes must be positive"
    assert not db_path.exists()
    assert invoke("matmul", "--help").exit_code == 0
