"""The documentation: README.md stays short, every experiment has its page in docs/, the
generated parts of the site render (docs/hooks/generated.py, what `make docs` runs), and
code, tests and docs cite only pages that exist. Fast and offline: MkDocs itself is not
needed (`make docs` builds the site strictly; CI runs it after `make test`)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.measure.stats import STATS

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


@pytest.fixture(scope="module")
def hook():
    spec = importlib.util.spec_from_file_location("docs_generated", DOCS / "hooks" / "generated.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_readme_is_short_and_says_how_to_test():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 250
    assert "make test" in text
    assert "make docs" in text


def test_readme_links_exist():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text)
    assert links
    for link in links:
        if "://" not in link:
            assert (ROOT / link).exists(), link


def test_every_experiment_has_its_page_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for e in EXPERIMENTS:
        page = DOCS / "experiments" / f"{e.kind}.md"
        assert page.is_file(), f"docs/experiments/{e.kind}.md is missing"
        lines = page.read_text(encoding="utf-8").splitlines()
        assert f"<!-- generated: experiment {e.kind} -->" in lines, page
        assert f"experiments/{e.kind}.md" in nav, f"{e.kind} is not in mkdocs.yml's nav"


def test_the_hook_finds_no_missing_page(hook):
    assert hook.missing_pages(DOCS) == []


def test_experiment_pages_list_every_declared_metric(hook):
    for e in EXPERIMENTS:
        page = DOCS / "experiments" / f"{e.kind}.md"
        text = hook.expand(page.read_text(encoding="utf-8"), where=str(page))
        assert not hook.MARKER.search(text)
        assert f"`{e.view}`" in text
        words = " ".join(text.replace("\\|", "|").split())
        for m in e.metrics:
            base, _, stat = m.name.rpartition("_")
            folded = stat in STATS and f"`{base}_<stat>`" in text
            assert f"`{m.name}`" in text or folded, (e.kind, m.name)
            assert " ".join(m.meaning.split(",")[0].split()) in words, (e.kind, m.name)
        for s in e.settings:
            assert f"`{s}`" in text, (e.kind, s)


def test_every_page_with_a_marker_renders(hook):
    pages = [p for p in DOCS.rglob("*.md") if hook.MARKER.search(p.read_text(encoding="utf-8"))]
    assert len(pages) >= len(EXPERIMENTS) + 3  # the experiments, their index, the store, the CLI
    for page in pages:
        assert not hook.MARKER.search(hook.expand(page.read_text(encoding="utf-8"), str(page)))


def test_an_unknown_marker_fails(hook):
    with pytest.raises(ValueError, match="unknown marker"):
        hook.expand("<!-- generated: nothing -->\n")
    with pytest.raises(ValueError, match="no experiment"):
        hook.expand("<!-- generated: experiment no-such-kind -->\n")


def test_the_cli_reference_has_every_command(hook):
    text = hook.render_cli()
    for path in hook.command_paths():
        name = re.escape(" ".join(("cs336sys", *path)))
        assert re.search(rf"^#{{3,}} `{name}`$", text, re.M), path
    assert "--help" in text and "Example" in text
    # click's no-rewrap marker (a backspace) drew a box before every example, and a help
    # text's nsys/<command>-<time>/ read as tags: "in nsys/-/"
    assert "\b" not in text
    assert "nsys/&lt;command>-&lt;time>/" in text and "nsys/<command>" not in text


def test_the_store_page_lists_every_view(hook):
    text = hook.render_schema()
    for e in EXPERIMENTS:
        assert f"`{e.view}`" in text
    for table in ("invocations", "runs", "kernel_stats"):
        assert f"table `{table}`" in text


# Where code, tests and benchmarks cite the docs, the page exists; nothing cites the design
# document (not in this repository) or a README heading (the README is a short introduction).
CITED = re.compile(r"docs/[\w/.-]+\.md")
SOURCES = [*(ROOT / "cs336sys").rglob("*.py"), *(ROOT / "tests").rglob("*.py"),
           *(ROOT / "benchmarks").glob("*.py"), ROOT / "Makefile", *DOCS.rglob("*.md"),
           ROOT / "README.md", ROOT / "mkdocs.yml"]


def test_cited_docs_pages_exist():
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        for cited in CITED.findall(text):
            assert (ROOT / cited).is_file(), f"{path.relative_to(ROOT)} cites {cited}"


def test_nothing_cites_files_or_headings_outside_the_docs():
    design = "DESIGN" + ".md"  # spelled apart so that this file does not match itself
    for path in SOURCES:
        text = path.read_text(encoding="utf-8")
        assert design not in text, path.relative_to(ROOT)
        assert not re.search(r"README[,]? \"", text), path.relative_to(ROOT)


def test_the_store_page_names_every_status_a_run_can_have():
    """A query filtering on the statuses docs/store.md lists must miss no stored point (it
    left out `wrong`, the status of a user's code that failed its check)."""
    from cs336sys.store.db import STATUSES

    runs = next(line for line in (DOCS / "store.md").read_text().split("\n- ")
                if line.startswith("`runs`"))
    assert [s for s in STATUSES if f"`{s}`" not in runs] == []


def _sql_queries() -> list[tuple[str, list[str]]]:
    """Every `cs336sys sql` command in a code block of the docs and README, and in the
    Makefile: (where, its arguments after `sql`, without --db)."""
    import shlex

    found = []
    sources = [*sorted(DOCS.rglob("*.md")), ROOT / "README.md", ROOT / "Makefile"]
    for path in sources:
        text = path.read_text()
        blocks = re.findall(r"```\w*\n(.*?)```", text, re.S) if path.suffix == ".md" else [text]
        for block in blocks:
            block = block.replace("\\\n", " ").replace("$(CLI)", "cs336sys")
            for start in (m.start() for m in re.finditer(r"cs336sys sql\b", block)):
                try:
                    words = shlex.split(block[start:], comments=True)
                except ValueError:  # a quote left open past the block: not a command
                    continue
                args = words[2:]
                end = next((i for i, w in enumerate(args)
                            if w in ("cs336sys", "|", "&&", ">", ";")), None)
                args = args[:end]
                while "--db" in args:
                    i = args.index("--db")
                    del args[i:i + 2]
                found.append((path.name, args))
    return found


def test_every_documented_query_runs_on_a_store(tmp_path):
    """A documented query read a column renamed since (`context_length`, `dtype`): copied, it
    failed with 'no such column'. Each runs on a store of today's schema."""
    from tests.conftest import invoke
    from tests.report_fixture import build

    store = build(tmp_path / "s.db")
    queries = _sql_queries()
    assert len(queries) >= 5  # the parser finds them
    for where, args in queries:
        if not args or any(a.isupper() and len(a) > 2 for a in args if a.isalpha()):
            continue  # a placeholder (`QUERY`), not a query to copy
        r = invoke("sql", *args, "--db", store)
        assert r.exit_code == 0, (where, args, r.output)
