"""Adding an experiment kind is its module and its name in the catalog (docs/architecture.md,
"Adding an experiment"). Done exactly so in a copy of the package, with nothing patched,
the toy kind of tests/toy_experiment.py is a command of the CLI that measures, stores,
views, queries, filters and reports like the built-in ones, and the docs give it a page and
a nav entry."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import cs336sys

TOY = Path(__file__).with_name("toy_experiment.py")
HOOK = Path(__file__).resolve().parents[1] / "docs" / "hooks" / "generated.py"


@pytest.fixture(scope="module")
def package(tmp_path_factory) -> Path:
    """A copy of the package (and the report's templates beside it, as in a checkout) with
    the toy kind added as the docs say: its module, and its name at the end of the catalog's
    KINDS."""
    root = tmp_path_factory.mktemp("src")
    copy = root / "cs336sys"
    shutil.copytree(Path(cs336sys.__file__).parent, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(Path(cs336sys.__file__).parents[1] / "templates", root / "templates")
    shutil.copy(TOY, copy / "experiments" / "matmul.py")
    catalog = copy / "experiments" / "catalog.py"
    text = catalog.read_text()
    assert text.count('    "step",\n)') == 1
    catalog.write_text(text.replace('    "step",\n)', '    "step",\n    "matmul",\n)'))
    # a checkout, as the developer's is: --resume matches points by their commit
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(root)]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", "matmul"]):
        subprocess.run([*git, *args], check=True, capture_output=True)
    return root


def cli(package: Path, *args: str) -> subprocess.CompletedProcess:
    """`cs336sys ARGS` run from the copy (first on the path: the installed package is not read)."""
    env = {**os.environ, "PYTHONPATH": str(package)}
    env.pop("CS336SYS_DB", None)
    return subprocess.run([sys.executable, "-m", "cs336sys", *args], env=env, text=True,
                          capture_output=True, timeout=300, cwd=package)


def test_the_copy_is_the_package_read(package):
    probe = subprocess.run([sys.executable, "-c", "import cs336sys; print(cs336sys.__file__)"],
                           env={**os.environ, "PYTHONPATH": str(package)}, text=True,
                           capture_output=True, check=True, cwd=package)
    assert Path(probe.stdout.strip()).parent == package / "cs336sys"


def test_a_new_kind_is_stored_viewed_and_reported(package, tmp_path):
    db = str(tmp_path / "r.db")
    ran = cli(package, "matmul", "--n", "8,16", "--iters", "2", "--label", "toy", "--db", db)
    assert ran.returncode == 0, ran.stderr
    assert "Matmul time" in ran.stdout  # its declared table, printed

    got = cli(package, "sql", "SELECT n, iters, flops, status FROM matmul_runs ORDER BY n",
              "--json", "--db", db)
    assert got.returncode == 0, got.stderr
    assert json.loads(got.stdout) == [{"n": 8, "iters": 2, "flops": 2 * 8**3, "status": "ok"},
                                      {"n": 16, "iters": 2, "flops": 2 * 16**3, "status": "ok"}]

    out = tmp_path / "report"
    rep = cli(package, "report", "--where", "n=16", "--db", db, "--out", str(out))
    assert rep.returncode == 0, rep.stderr
    md = (out / "report.md").read_text()
    assert "## Matmul" in md and "Matmul time" in md
    # the filter kept n=16 only; the table holds the one point, its setting above it
    assert "Same in every row: n=16" in md and "n=8" not in md
    # the runs stored of each point beside a setting named n: not a second `n`
    assert "| ms | runs |" in md

    again = cli(package, "matmul", "--n", "8,16", "--iters", "2", "--resume", "--db", db)
    assert again.returncode == 0 and "skipping 2 point(s)" in again.stderr + again.stdout


def test_a_new_kind_has_help_and_refuses_bad_input_like_the_others(package, tmp_path):
    db = tmp_path / "r.db"
    bad = cli(package, "matmul", "--n", "0", "--db", str(db))
    assert bad.returncode == 2 and bad.stderr.strip() == "Error: --n: sizes must be positive"
    assert not db.exists()
    huge = cli(package, "matmul", "--iters", "9" * 30, "--db", str(db))
    assert huge.returncode == 2 and "too large" in huge.stderr and not db.exists()
    shown = cli(package, "matmul", "--help")
    assert shown.returncode == 0
    assert shown.stdout.split("\n\n")[1].strip() == "Time an n x n matmul; one row per size."
    assert "keeps the fastest time" in shown.stdout and "cs336sys matmul --n 16,32" in shown.stdout
    assert "--label" in shown.stdout and "--db" in shown.stdout  # the store's options
    listed = cli(package, "--help")
    assert listed.returncode == 0
    assert "  matmul     Time an n x n matmul; one row per size." in listed.stdout


def test_a_new_kind_gets_its_docs_page_and_nav_entry(package):
    """The docs hook run on the copy: the kind's page generated whole (nobody wrote one) and
    an entry under Experiments in the nav."""
    script = (
        "import importlib.util, json, sys; from pathlib import Path\n"
        f"spec = importlib.util.spec_from_file_location('hook', {str(HOOK)!r})\n"
        "hook = importlib.util.module_from_spec(spec); spec.loader.exec_module(hook)\n"
        f"docs = Path({str(HOOK.parents[1])!r})\n"
        "page = hook.expand(hook.generated_page('matmul'))\n"
        "nav = hook.with_experiment_pages([{'Experiments': ['experiments/index.md', "
        "{'comm': 'experiments/comm.md'}]}])\n"
        "print(json.dumps({'unwritten': hook.unwritten_pages(docs), 'page': page, 'nav': nav}))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(package)}
    got = subprocess.run([sys.executable, "-c", script], env=env, text=True,
                         capture_output=True, timeout=120, cwd=package)
    assert got.returncode == 0, got.stderr
    out = json.loads(got.stdout)
    assert out["unwritten"] == ["matmul"]
    assert out["page"].startswith("# Matmul") and "`matmul_runs`" in out["page"]
    assert "`matmul_ms`" in out["page"] and "fastest timed matmul" in out["page"]
    assert "cs336sys matmul --n 16,32" in out["page"]  # the command's reference
    entries = out["nav"][0]["Experiments"]
    assert entries.count({"comm": "experiments/comm.md"}) == 1  # listed already: not twice
    assert {"matmul": "experiments/matmul.md"} in entries
