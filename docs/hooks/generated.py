"""MkDocs hook: the parts of the docs that are derived from the code, generated at build time.

A page asks for a generated block with a marker line of its own:

    <!-- generated: experiment KIND -->   what experiment KIND stores: its view, settings,
                                          metrics (name, unit, meaning), tables, --compare
    <!-- generated: experiments -->       every experiment of the catalog, one line each
    <!-- generated: schema -->            the store's tables and every view's columns,
                                          read from a store created in memory
    <!-- generated: handout YEAR -->      every problem of that handout release: points,
                                          what it asks, its commands on a GPU and on a CPU
    <!-- generated: cli -->                every command and subcommand of the Typer app
                                          cs336sys.cli:app with its help, usage, arguments
                                          and options, by Typer's own docs generator (what
                                          `typer cs336sys.cli utils docs` prints)
    <!-- generated: command NAME -->       one command's reference, the same way

Everything comes from the experiments' declarations (`EXPERIMENT` in
cs336sys/experiments/<kind>.py, listed in cs336sys/experiments/catalog.py) and from the
store's own migrations and views, so a metric added to a declaration appears in the docs
with its unit and meaning, and a page can never list a column the store does not have.

A kind of the catalog with no page of its own, docs/experiments/<kind>.md, gets one generated
whole (its title, its command's reference, what it stores), and every kind the nav does not
list gets an entry under Experiments. The build fails (mkdocs build --strict, `make docs`)
when a written page lacks its marker, or when a marker is unknown. Rendering needs neither
MkDocs nor torch: tests/test_docs.py calls `expand`.
"""

from __future__ import annotations

import re
import sqlite3
from collections.abc import Iterable
from pathlib import Path

MARKER = re.compile(r"^<!-- generated: (?P<what>[a-z-]+)(?: (?P<arg>[A-Za-z0-9_.-]+))? -->$", re.M)

ROOT = Path(__file__).resolve().parents[2]


def experiments():
    """The catalog's declarations, in the order reports show them."""
    from cs336sys.experiments.catalog import EXPERIMENTS

    return EXPERIMENTS


def page_of(kind: str) -> str:
    """The docs page of an experiment kind, relative to docs/."""
    return f"experiments/{kind}.md"


def _cell(text: object) -> str:
    """Text for a markdown table cell: pipes escaped, one line."""
    return " ".join(str(text).split()).replace("|", "\\|")


def _table(header: Iterable[str], rows: Iterable[Iterable[object]]) -> str:
    header = list(header)
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _stats() -> tuple[str, ...]:
    from cs336sys.measure.stats import STATS

    return STATS


def metric_rows(experiment) -> list[tuple[str, str, str]]:
    """(name, unit, meaning) per metric; the statistics of one timed quantity
    (`<base>_mean`, `_std`, ... declared by `timing()`) are folded into one row."""
    stats = _stats()
    by_name = {m.name: m for m in experiment.metrics}
    rows, done = [], set()
    for m in experiment.metrics:
        if m.name in done:
            continue
        base, _, stat = m.name.rpartition("_")
        group = [by_name.get(f"{base}_{s}") for s in stats]
        suffix = f", {stat} of the timed samples"
        if stat in stats and all(group) and m.meaning.endswith(suffix):
            meaning = m.meaning[: -len(suffix)]
            if all(
                g.meaning == f"{meaning}, {s} of the timed samples"
                for g, s in zip(group, stats, strict=True)
            ):
                rows.append((f"`{base}_<stat>`", m.unit, meaning))
                done.update(g.name for g in group)
                continue
        rows.append((f"`{m.name}`", m.unit, m.meaning))
        done.add(m.name)
    return rows


def _module_path(experiment) -> str:
    module = experiment.run.__module__
    return module.replace(".", "/") + ".py"


def render_experiment(kind: str) -> str:
    by_kind = {e.kind: e for e in experiments()}
    if kind not in by_kind:
        raise ValueError(f"no experiment {kind!r} in the catalog (known: {', '.join(by_kind)})")
    e = by_kind[kind]
    types = e.setting_types()
    out = [
        "## What it stores",
        "",
        f"*Generated from the declaration `EXPERIMENT` in `{_module_path(e)}` when the site "
        "is built.*",
        "",
        f"- experiment (`runs.experiment`): `{e.kind}`; SQL view: `{e.view}`, one row per "
        "point, starting with the columns every view has ([the store](../store.md#views))",
        f"- report section: *{e.title}*",
    ]
    if e.compare:
        label, column, unit, *_ = e.compare_columns()
        out.append(f"- `report --compare` and `--history` set side by side: `{column}` ({label})")
    if e.oom_axis:
        out.append(f"- after an out-of-memory, larger points along `{e.oom_axis}` are stored as "
                   "`skipped`")
    if e.distributed:
        out.append("- distributed: each point runs on a process group, rank 0 stores it")
    out += ["", f"### Settings ({len(e.settings)})", "",
            "The point's settings, the view's columns after the common ones, in order (with "
            "the Spec's type): "
            + ", ".join(f"`{s}` ({types[s]})" if types.get(s) else f"`{s}`" for s in e.settings)
            + "."]
    rows = metric_rows(e)
    out += ["", f"### Metrics ({len(e.metrics)})", ""]
    if any(r[0].endswith("_<stat>`") for r in rows):
        out += ["`<stat>` stands for each statistic of the timed samples: "
                + ", ".join(f"`{s}`" for s in _stats())
                + " ([statistics](../methodology.md#statistics)).", ""]
    out.append(_table(("metric", "unit", "meaning"), rows))
    if e.renamed:
        out += ["", "Metrics stored under another name before 0.2, which their columns also read:",
                ""]
        out.append(
            _table(("stored as", "column"), ((f"`{o}`", f"`{n}`") for o, n in e.renamed.items()))
        )
    out += ["", "### Tables", "",
            "What the command prints at the end of a sweep and the report's section opens with "
            "(columns a table has no value for are left out):", ""]
    for t in e.tables:
        where = ", ".join(f"{k}={v}" for k, v in t.where.items())
        head = f"- **{t.title}**" + (f" (rows with {where})" if where else "") + ": "
        head += ", ".join(c.header for c in t.columns)
        out.append(head)
        notes = " ".join(n for n in (t.note, *(c.note for c in t.columns)) if n)
        if notes:
            out.append(f"  <br>*{_cell(notes)}*")
    return "\n".join(out) + "\n"


def render_experiments() -> str:
    rows = []
    for e in experiments():
        compare = e.compare_columns()[1] if e.compare else ""
        rows.append((f"[{e.kind}]({e.kind}.md)", e.title, f"`{e.view}`", len(e.settings),
                     len(e.metrics), f"`{compare}`" if compare else ""))
    return _table(("experiment", "report section", "view", "settings", "metrics", "compared"),
                  rows) + "\n"


def render_handout(year: str | None) -> str:
    """The problems of handout release `year`, from their declarations (cs336sys/handout)."""
    from cs336sys.handout import problems

    rows = []
    for p in problems(year):
        gpu = [r.args(True) for r in p.runs]
        cpu = [r.args(False) for r in p.runs]
        what = {"implement": f"checked by `{p.check}`", "written": "a written answer"}
        rows.append((
            f"`{p.name}`", p.points, p.section, p.asks,
            what.get(p.kind) or "<br>".join(f"`cs336sys {' '.join(a)}`" for a in gpu if a),
            "" if p.kind in what else "<br>".join(
                f"`cs336sys {' '.join(a)}`" if a else "needs a GPU" for a in cpu),
        ))
    return _table(("problem", "points", "§", "asks", "on a GPU", "on a CPU (cut down)"),
                  rows) + "\n"


def _store_in_memory() -> sqlite3.Connection:
    from cs336sys.store import schema, views

    conn = sqlite3.connect(":memory:", isolation_level=None)
    schema.migrate(conn)
    views.ensure_views(conn, experiments(), complete=True)
    return conn


def render_schema() -> str:
    """The tables and views of a store created by this checkout's migrations."""
    from cs336sys.store.schema import SCHEMA_VERSION

    conn = _store_in_memory()
    out = [f"*Generated when the site is built, from a store created in memory at schema version "
           f"{SCHEMA_VERSION} (`PRAGMA user_version`).*", ""]
    tables = [r[0] for r in conn.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY rowid")]
    for name in tables:
        cols = conn.execute(f'PRAGMA table_info("{name}")').fetchall()
        out.append(
            f"- table `{name}`: " + ", ".join(f"`{c[1]}` {c[2].lower()}".rstrip() for c in cols)
        )
    out.append("")
    views = {e.view: [c[1] for c in conn.execute(f'PRAGMA table_info("{e.view}")')]
             for e in experiments()}
    conn.close()
    common = _common_prefix(list(views.values()))
    rows = [(f"`{e.view}`", f"[{e.kind}](experiments/{e.kind}.md)", len(views[e.view]))
            for e in experiments()]
    out += ["Every view starts with these columns, then the experiment's settings and metrics:",
            "",
            ", ".join(f"`{c}`" for c in common), ""]
    out.append(_table(("view", "experiment (its columns)", "columns"), rows))
    return "\n".join(out) + "\n"


def _common_prefix(lists: list[list[str]]) -> list[str]:
    """The columns every view starts with."""
    prefix = []
    for cols in zip(*lists, strict=False):
        if len(set(cols)) > 1:
            break
        prefix.append(cols[0])
    return prefix


def command_paths() -> list[tuple[str, ...]]:
    """Every command and subcommand of the app, as paths: ('model',), ('memory', 'residuals')."""
    import typer.main

    from cs336sys.cli import app

    def walk(cmd, path):
        if path:
            yield path
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, (*path, name))

    return list(walk(typer.main.get_command(app), ()))


def _reference(text: str) -> str:
    """Typer's generated markdown with its headings one level below the page's (they start
    at `#`) and without click's no-rewrap markers before the examples
    (cli.examples_verbatim), which are not text."""
    text = re.sub("^\b\n", "", text, flags=re.M)  # the marker is a backspace character
    text = re.sub(r"^(#+) ", lambda m: "#" + m[1] + " ", text, flags=re.M)
    # outside code spans, a help text's `<command>` is no HTML tag (nsys/<command>-<time>/)
    parts = text.split("`")
    text = "`".join(p if i % 2 else p.replace("<", "&lt;") for i, p in enumerate(parts))
    return text.strip() + "\n"


def render_cli() -> str:
    """The app's reference, one section per command; headings one level below the page's."""
    import typer
    import typer.main
    from typer.cli import get_docs_for_click

    from cs336sys.cli import app

    command = typer.main.get_command(app)
    text = get_docs_for_click(obj=command, ctx=typer.Context(command), name="cs336sys")
    missing = [p for p in command_paths() if f"# `cs336sys {' '.join(p)}`" not in text]
    if missing:
        raise ValueError(f"the CLI reference lacks {', '.join(' '.join(p) for p in missing)}")
    return _reference(text)


def render_command(name: str | None) -> str:
    """One command's reference (`cs336sys NAME`), its headings one level below the page's."""
    import typer
    import typer.main
    from typer.cli import get_docs_for_click

    from cs336sys.cli import app

    root = typer.main.get_command(app)
    if not name or name not in root.commands:
        raise ValueError(f"no command {name!r} (known: {', '.join(root.commands)})")
    command = root.commands[name]
    ctx = typer.Context(command, parent=typer.Context(root, info_name="cs336sys"), info_name=name)
    return _reference(get_docs_for_click(obj=command, ctx=ctx, name=name, call_prefix="cs336sys"))


RENDERERS = {
    "experiment": lambda arg: render_experiment(arg),
    "experiments": lambda arg: render_experiments(),
    "schema": lambda arg: render_schema(),
    "cli": lambda arg: render_cli(),
    "command": render_command,
    "handout": render_handout,
}


def expand(markdown: str, where: str = "a page") -> str:
    """Replace every marker line with its generated block; an unknown marker is an error."""

    def one(match: re.Match) -> str:
        what, arg = match["what"], match["arg"]
        if what not in RENDERERS:
            raise ValueError(f"{where}: unknown marker {match[0]!r} "
                             f"(known: {', '.join(RENDERERS)})")
        if what == "experiment" and not arg:
            raise ValueError(f"{where}: {match[0]!r} names no experiment")
        return RENDERERS[what](arg)

    return MARKER.sub(one, markdown)


def missing_pages(docs_dir: Path) -> list[str]:
    """Experiments of the catalog whose page is written but lacks its marker."""
    missing = []
    for e in experiments():
        page = docs_dir / page_of(e.kind)
        marker = f"<!-- generated: experiment {e.kind} -->"
        if page.is_file() and marker not in page.read_text(encoding="utf-8").splitlines():
            missing.append(e.kind)
    return missing


def unwritten_pages(docs_dir: Path) -> list[str]:
    """Experiments of the catalog with no page of their own: theirs is generated whole."""
    return [e.kind for e in experiments() if not (docs_dir / page_of(e.kind)).is_file()]


def generated_page(kind: str) -> str:
    """The page of a kind nobody wrote one for: its title, its command's reference (where it
    declares one) and what it stores."""
    from cs336sys.cli.declared import command_name

    (e,) = [e for e in experiments() if e.kind == kind]
    command = f"<!-- generated: command {command_name(kind)} -->\n\n" if e.command else ""
    return f"# {e.title}\n\n{command}<!-- generated: experiment {kind} -->\n"


def with_experiment_pages(nav: list) -> list:
    """`nav` with an entry under Experiments for every kind of the catalog it does not list,
    so a new kind's page is in the site without an edit of mkdocs.yml."""
    for section in nav:
        if isinstance(section, dict) and "Experiments" in section:
            entries = section["Experiments"]
            listed = {v if isinstance(v, str) else next(iter(v.values())) for v in entries}
            entries += [{e.kind: page_of(e.kind)} for e in experiments()
                        if page_of(e.kind) not in listed]
    return nav


# -- MkDocs events ------------------------------------------------------------------------------


def on_config(config):
    """Every kind of the catalog in the nav, under Experiments."""
    config["nav"] = with_experiment_pages(config["nav"])
    return config


def on_files(files, config):
    """Fail the build when an experiment's written page lacks its marker; generate the page of
    a kind that has none; publish the committed reports' images and HTML under reports/ so
    pages can show and link them."""
    from mkdocs.exceptions import PluginError
    from mkdocs.structure.files import File

    docs_dir = Path(config["docs_dir"])
    missing = missing_pages(docs_dir)
    if missing:
        raise PluginError(
            "experiments whose docs page lacks its marker: "
            + ", ".join(f"docs/{page_of(k)} (<!-- generated: experiment {k} -->)" for k in missing)
        )
    for kind in unwritten_pages(docs_dir):
        files.append(File.generated(config, page_of(kind), content=generated_page(kind)))
    reports = ROOT / "reports"
    for path in sorted(reports.rglob("*")):
        if path.is_file() and path.suffix in {".png", ".html"}:
            uri = path.relative_to(ROOT).as_posix()
            files.append(File.generated(config, uri, abs_src_path=str(path)))
    return files


def on_page_markdown(markdown, page, config, files):
    from mkdocs.exceptions import PluginError

    try:
        return expand(markdown, where=page.file.src_uri)
    except ValueError as exc:
        raise PluginError(str(exc)) from exc
