"""Stored runs -> a Report (provenance, sections, comparison) -> HTML and markdown files.

Templates are Jinja2 files in the repository's top-level `templates/` folder, rendered with
autoescape on for both formats: a setting value like `<script>` is text in the HTML, and
in the markdown (where raw HTML would pass through to the reader's renderer) as well.
The HTML is one self-contained file: CSS inline, plots as base64 `data:` URIs, no script.
The markdown has the same tables; its images are PNG files in a folder beside it.
"""

from __future__ import annotations

import re
import sqlite3
import zlib
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from markupsafe import Markup, escape

import cs336sys
from cs336sys.measure.landing import staged
from cs336sys.measure.significance import THRESHOLD
from cs336sys.report import typeset
from cs336sys.report.compare import Comparison, compare_sides, method
from cs336sys.report.compare_sides import sides
from cs336sys.report.drawer import Drawer
from cs336sys.report.experiment_section import build_section
from cs336sys.report.history import History
from cs336sys.report.history import build as build_history
from cs336sys.report.seal import sealed
from cs336sys.report.sections import WRONG, FilledTable, Section, code_spans
from cs336sys.report.select import Selection, invocations, load, present
from cs336sys.sweep.stopping import EXIT_CODES


def _templates() -> Path:
    """An installed wheel ships them as cs336sys/templates/; a source checkout (and the
    editable install) has them in the repository's top-level templates/."""
    package = Path(cs336sys.__file__).resolve().parent
    shipped = package / "templates"
    return shipped if shipped.is_dir() else package.parent / "templates"


TEMPLATES = _templates()
FORMATS = ("html", "md", "tex", "typst")
DEFAULT_FORMATS = ("html", "md")
EXTENSIONS = {"html": "html", "md": "md", "tex": "tex", "typst": "typ"}  # of <stem>.<ext>
_VERSIONS = ("torch_version", "triton_version", "python_version", "cuda_version",
             "cs336sys_version")


@dataclass
class Report:
    title: str
    filters: list[str]
    provenance: list[tuple[str, str]]
    sections: list[Section] = field(default_factory=list)
    compare_kind: str | None = None
    compare_ab: tuple[str, str] | None = None
    comparison: list[FilledTable] = field(default_factory=list)
    compared: Comparison | None = None  # every compared point, for the CLI (report/compare.py)
    compare_note: str = ""  # how a change is decided
    compare_summary: str = ""  # "N points compared: X faster, Y slower, Z unchanged"
    compare_notes: list[str] = field(default_factory=list)  # environments, unmatched settings
    history: History | None = None  # with --history; its sections lead report.sections


def kernel_stats(conn: sqlite3.Connection,
                 run_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
    """The kernel_stats rows of `run_ids`, by run id (phase, then rank order)."""
    out: dict[str, list[dict[str, Any]]] = {}
    for i in range(0, len(run_ids), 500):  # SQLite caps the number of parameters
        chunk = run_ids[i : i + 500]
        cur = conn.execute(
            f"SELECT * FROM kernel_stats WHERE run_id IN ({', '.join('?' * len(chunk))}) "
            "ORDER BY run_id, CASE phase WHEN 'forward' THEN 0 WHEN 'backward' THEN 1 "
            "WHEN 'optimizer' THEN 2 ELSE 3 END, rank",
            chunk,
        )
        names = [d[0] for d in cur.description]
        for v in cur:
            row = dict(zip(names, v, strict=True))
            out.setdefault(row["run_id"], []).append(row)
    return out


STOPPED_EARLY = "Stopped early"


def _invocations(n: int) -> str:
    return f"{n} invocation{'s' * (n != 1)}"


def provenance(invs: list[dict[str, Any]], rows: dict[str, list]) -> list[tuple[str, str]]:
    gpus: Counter = Counter()
    commits: set[tuple[str, bool]] = set()  # (commit, dirty): a dirty checkout measured other code
    versions: dict[str, set] = {k: set() for k in _VERSIONS}
    status: Counter = Counter()
    ids = set()
    yours: set[tuple] = set()  # (repo, commit, adapters, dirty)
    ended: Counter = Counter()  # invocations that did not run to their end, by how
    stored = set()  # the invocations that stored a selected run
    for inv in invs:
        status[inv["_status"]] += inv["_n"]
        if inv["_n"]:
            stored.add(inv["id"])
        if inv["id"] in ids:
            continue
        ids.add(inv["id"])
        nothing = " before storing a point" if inv["_n"] == 0 else ""
        if inv.get("exit_status") in EXIT_CODES:
            ended["stopped by Ctrl-C, SIGTERM or SIGHUP" + nothing] += 1
        elif inv.get("id") is not None and inv.get("finished") is None:
            ended["never finished (killed, crashed, or still running)" + nothing] += 1
        if inv.get("user_repo"):
            k = (inv["user_repo"], inv.get("user_commit") or "", inv.get("adapters") or "")
            yours.add((*k, bool(inv.get("user_dirty"))))
        name = "CPU, no GPU" if str(inv["gpu"]) == "cpu" else str(inv["gpu"])  # not "GPU cpu"
        gpus[f"{name} ×{inv['gpu_count']}" if inv["gpu_count"] else name] += 1
        c = inv["git_commit"] or "(no git)"
        commits.add((c, bool(inv["git_dirty"])))
        for k in _VERSIONS:
            if inv.get(k):
                versions[k].add(inv[k])
    created = [r["created"] for rs in rows.values() for r in rs if r["created"]]
    out = [
        ("GPUs", ", ".join(f"{g} ({n} invocation{'s' * (n != 1)})" for g, n in sorted(gpus.items()))),
        ("Commits", ", ".join(c[:12] + (" (dirty)" if d else "") for c, d in sorted(commits))),
        ("Versions", "; ".join(f"{k.removesuffix('_version')} {', '.join(sorted(v))}"
                               for k, v in versions.items() if v)),
        ("Time range (UTC)", f"{min(created)[:19]} – {max(created)[:19]}" if created else ""),
        *([("Your code", "; ".join(
            # outside git, or before the first commit: the files' sha256s identify the code
            f"{repo}{f' at {commit[:12]}' if commit else ', not committed'}"
            f"{' (dirty)' if dirty else ''}"
            + (f", adapters {Path(adapters).name}" if adapters else "")
            for repo, commit, adapters, dirty in sorted(yours)))] if yours else []),
        ("Runs by status", ", ".join(f"{s} {status[s]}" for s in ("ok", "wrong", "oom", "error", "skipped")
                                     if status[s]) + f" (in {_invocations(len(stored))}"
         + (f"; {_invocations(len(ids - stored))} stored none" if ids - stored else "") + ")"
         if stored else f"none ({_invocations(len(ids))} stored none)" if ids else "none selected"),
    ]
    if ended:  # their sweeps may lack points: said, so a half-run does not read as whole
        out.append((STOPPED_EARLY, "; ".join(f"{_invocations(n)} {how}"
                                             for how, n in ended.items())
                    + (": its sweep may lack points" if sum(ended.values()) == 1 else
                       ": their sweeps may lack points")
                    + "; the same command with --resume measures the rest"))
    return out


def build(
    conn: sqlite3.Connection,
    sel: Selection,
    title: str,
    filters: list[str],
    catalog: Sequence[Any],
    compare_ab: tuple[str, str] | None = None,
    history: bool = False,
    threshold: float = THRESHOLD,
) -> Report:
    """Read the selection and build every section, one per experiment of `catalog` (every
    declaration: experiments/catalog.py) with runs, in its order; raises SelectionError for
    bad --compare. With compare_ab the report covers only the runs of A and of B
    (report/compare.py); with history it starts with the history sections (history.py)."""
    both = sides(conn, sel, *compare_ab, catalog) if compare_ab else None
    found = sorted(both.rows) if both else present(conn, sel)
    draws = any(e.draws for e in catalog if e.kind in found)
    with Drawer(start=draws) as drawer:
        rows = both.rows if both else load(conn, sel, catalog, found)
        invs = both.invocations if both else invocations(conn, sel)
        report = Report(title, filters, provenance(invs, rows))
        # in the declared order, the analytic ones (plan) after every measured one
        for experiment in sorted(catalog, key=lambda e: e.analytic):
            if rows.get(experiment.kind):
                linked = kernel_stats(conn, [r["run_id"] for r in rows[experiment.kind]])
                if both:  # each side's latest rows: together, B's would hide A's
                    report.sections.extend(_side_sections(experiment, both, linked))
                else:
                    report.sections.append(build_section(experiment, rows[experiment.kind],
                                                         linked))
        if strangers := sorted(set(found) - {e.kind for e in catalog}):  # counted above too
            report.sections.append(Section("unknown", "Experiments this cs336sys does not know",
                                           notes=[_strangers(conn, sel, strangers)]))
        if both and compare_ab:
            report.compared = compare_sides(both, *both.names, catalog, threshold=threshold)
            report.compare_kind, report.comparison = both.kind, report.compared.tables
            report.compare_ab, report.compare_note = both.names, method(threshold)
            report.compare_summary = report.compared.summary()
            # the caveat the terminal prints above the summary heads the report's notes
            report.compare_notes = [*report.compared.caveats(), *report.compared.notes]
            if report.compared.figures:
                report.sections.insert(0, Section(
                    "compare-samples", "Comparison: the samples of each point, A and B",
                    figures=report.compared.figures))
        if history and rows:
            # its plots are drawn there, not by the Drawer
            report.history = build_history(rows, catalog, threshold=threshold,
                                           invocations={i["id"]: i for i in invs})
            report.sections[:0] = report.history.sections
        figures = [f for s in report.sections for f in s.figures if f.plot is not None]
        for fig, png in zip(figures, drawer.draw([f.plot for f in figures]), strict=True):
            fig.png = png
    return report


def _strangers(conn: sqlite3.Connection, sel: Selection, kinds: list[str]) -> str:
    """What the selection holds of experiment kinds no declaration of this version names
    (stored by a newer cs336sys, or by hand): kept in the store, shown by no section."""
    where, params = sel.clause()
    counts = dict(conn.execute(
        "SELECT r.experiment, count(*) FROM runs r LEFT JOIN invocations i ON i.id = "
        f"r.invocation_id WHERE {where} AND r.experiment IN ({', '.join('?' * len(kinds))}) "
        "GROUP BY r.experiment", [*params, *kinds]))
    listed = ", ".join(f"{counts.get(k, 0)} of `{k}`" for k in kinds)
    return (f"The selection holds runs of experiments this version of cs336sys has no section "
            f"for ({listed}): stored by a newer version, or by hand. They are kept in the "
            f"store; `cs336sys sql` reads them.")


def _side_sections(experiment: Any, both: Any, linked: dict) -> list[Section]:
    """An experiment's sections in a comparison: A's points, then B's, each titled with its
    side, its anchors and image names made unique by the side."""
    out = []
    for side, name, rows in (("a", both.names[0], both.a), ("b", both.names[1], both.b)):
        if rows.get(experiment.kind):
            sec = build_section(experiment, rows[experiment.kind], linked)
            sec.id, sec.title = f"{sec.id}-{side}", f"{sec.title}: {side.upper()}, {name}"
            for fig in sec.figures:
                fig.name = f"{fig.name}-{side}"
            out.append(sec)
    return out


def data_uri(png: bytes) -> str:
    """A PNG as a data: URI, so the HTML report is one self-contained file."""
    import base64

    return "data:image/png;base64," + base64.b64encode(png).decode()


def _env(markdown: bool = False):
    from jinja2 import Environment, FileSystemLoader, StrictUndefined

    env = Environment(
        loader=FileSystemLoader(TEMPLATES),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        # In markdown every value written is made inert (md_inert); Markup is already.
        finalize=(lambda v: v if isinstance(v, Markup) else md_inert(v)) if markdown else None,
    )
    env.filters["md_row"] = _md_row
    env.filters["md_detail"] = _md_detail
    env.filters["html_cells"] = _html_cells
    env.filters["html_heads"] = _html_heads
    env.filters["note"] = _md_note if markdown else _html_note
    env.filters["data_uri"] = data_uri
    env.globals["DENSE"] = DENSE
    return env


# Columns past which an HTML table is set in smaller type (`table.dense`): a two-GPU store's
# model, attention and memory tables (17 to 19 columns) were 1,301 to 1,434 px wide.
DENSE = 14


# What a value could do in markdown, and what undoes it (CommonMark, GitHub's autolinks):
# a newline could start a heading, list, quote or fence; a pipe a table cell; brackets a
# link or image; backticks a code span or fence; a `<` a tag, comment or <http://...>
# autolink; an `&` an entity; a bare http://, www. or e-mail address an autolink. Each is
# backslash-escaped (or folded) where it could act and left alone elsewhere, so that the
# file reads as plain text (`GPU's`, `a < b`, `a & b`). GitHub links an e-mail address
# whatever its escapes, so an empty HTML comment (shown as nothing) follows its `@`.
_MD_ESCAPES = str.maketrans({"\\": "\\\\", "`": "\\`", "[": "\\[", "]": "\\]", "|": "\\|",
                             "\n": " ", "\r": " "})
_HTML = re.compile(r"<(?=[A-Za-z/!?])|&(?=#?[A-Za-z0-9]+;)")
_EMAIL_AT = re.compile(r"(?<=[A-Za-z0-9._+-])@(?=[A-Za-z0-9])")


def md_inert(value: object) -> Markup:
    """`value` as markdown text that renders as itself and nothing more: markdown's HTML,
    link, image, code, table and line-starting syntax escaped or folded."""
    text = _HTML.sub(lambda m: "\\" + m.group(0), str(value).translate(_MD_ESCAPES))
    text = _EMAIL_AT.sub("@<!-- -->", text)
    return Markup(text.replace("://", ":\\/\\/").replace("www.", "www\\."))


# A table row in one filter call, not a macro call per cell: for 10,000 runs this halves the
# time spent in the templates.
def _md_row(cells: list[str]) -> Markup:
    return Markup("| " + " | ".join(md_inert(c) for c in cells) + " |")


def _md_detail(detail: str) -> Markup:
    """A failure's traceback under its list item, as a code block fenced longer than any run
    of backticks in it: the markdown kept the summary line alone, which names no cause."""
    fence = "`" * max(3, 1 + max((len(r) for r in re.findall(r"`+", detail)), default=0))
    return Markup("\n".join(f"  {line}".rstrip() for line in
                             [fence, *detail.splitlines(), fence]))


def _md_note(note: str) -> Markup:
    """A section note: its code spans kept as code, the rest made inert."""
    return Markup("".join(f"`{text}`" if code else md_inert(text)
                          for text, code in code_spans(note)))


def _html_note(note: str) -> Markup:
    return Markup("".join(f"<code>{escape(text)}</code>" if code else str(escape(text))
                          for text, code in code_spans(note)))


def _html_cells(cells: list[str]) -> Markup:
    return Markup("".join(_html_cell(c) for c in cells))


def _html_cell(cell: str) -> str:
    """A cell; a number with a note after it (`1.47 ± 0.023 (n=64)`, `0.019 ± 0.005 (wrong)`)
    may wrap before its note alone, the number itself kept whole: kept on one line, two such
    columns made the H100 store's attention table 1,428 px wide."""
    css = _cell_class(cell)
    if " (" in cell and css in ("", ' class="wrong"'):
        number, _, rest = cell.partition(" (")
        kept = str(escape(number)).replace(" ", "\u00a0")  # no break inside `1.47 ± 0.023`
        return f'<td class="{"wrong " if css else ""}n">{kept} ({escape(rest)}</td>'
    return f"<td{css}>{escape(cell)}</td>"


def _html_heads(t: FilledTable) -> Markup:
    """The header row, each header aligned as its column's cells: left over a column of
    words (kernel names, other settings), right over numbers."""
    words = [bool(col) and all(_cell_class(c).startswith(' class="t') for c in col)
             for col in ([c for c in column if c] for column in zip(*t.rows, strict=True))]
    left = ' class="t"'
    return Markup("".join(f"<th{left if i < len(words) and words[i] else ''}>{escape(h)}</th>"
                          for i, h in enumerate(t.headers)))


def _cell_class(cell: str) -> str:
    """Cells that say a point did not finish, and flagged comparisons, stand out; numbers
    are right-aligned (the default), text such as kernel names left-aligned."""
    if cell == "wrong" or cell.endswith(WRONG):  # measured, but failed its check: red
        return ' class="wrong"'
    if cell in ("OOM", "error", "skipped"):
        return ' class="oom"'
    if cell.endswith(" in B"):  # compare.py's FAILED: ok in A, `oom in B`
        return ' class="worse"'
    verdict = _VERDICT.match(cell)  # compare.py's "1.23x slower": regressions red, gains green
    if verdict:
        return ' class="worse"' if verdict.group(1) in ("slower", "bigger") else ' class="better"'
    if not cell or _NUMBER.match(cell):
        return ""
    # A long word (a kernel name) may break anywhere, so it never widens a table past the page.
    return ' class="t long"' if max(map(len, cell.split()), default=0) > _LONG else ' class="t"'


_LONG = 32


_VERDICT = re.compile(r"^[\d.]+x (slower|bigger|faster|smaller)$")

# 1,234  0.5 ± 0.01  1.2e-05  2.35×  21.0%  98–102  0.4 (0.4)  440 (n=1): what num(),
# mean_std(), pct() and the ratio, range, measured-(expected) and lone-sample cells write.
_NUMBER = re.compile(
    r"^[-+]?[\d,.]+(e[-+]?\d+)?( ± [\d,.e+-]+)?[×%]?(–[\d,.e+-]+)?( \((n=)?[\d,.e+-]+\))?$"
)


def _images(report: Report, out: Path, stem: str) -> list[tuple[Any, Path]]:
    """Each figure with the PNG file the markdown, LaTeX and Typst show it from."""
    return [(fig, out / f"{stem}_files" / f"{fig.name}.png")
            for sec in report.sections for fig in sec.figures]


def files(report: Report, out: Path, formats: list[str], stem: str = "report") -> list[Path]:
    """Every file `write` writes for `formats`: a command checks each one that is there
    before it writes any (cli/outputs.py)."""
    paths = [out / f"{stem}.{EXTENSIONS[f]}" for f in FORMATS if f in formats]
    if any(f in formats for f in ("md", "tex", "typst")):
        paths += [path for _, path in _images(report, out, stem)]
    for fmt in ("tex", "typst"):
        if fmt in formats:
            paths += typeset.table_paths(report, out, fmt, stem)
    return paths


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# A PNG text chunk's type and text, Software=cs336sys (matplotlib writes the same for memory
# --snapshot's timelines), by which a later run knows a PNG for its own (cli/outputs.py).
SOFTWARE_TEXT = b"tEXtSoftware\x00cs336sys"
_SOFTWARE_CHUNK = ((len(SOFTWARE_TEXT) - 4).to_bytes(4, "big") + SOFTWARE_TEXT
                   + zlib.crc32(SOFTWARE_TEXT).to_bytes(4, "big"))


def signed(png: bytes) -> bytes:
    """`png` with the Software=cs336sys text chunk right after its header chunk, where a
    reader of the file's first bytes finds it; anything else as it is."""
    if not png.startswith(PNG_SIGNATURE) or png[12:16] != b"IHDR":
        return png
    end = 8 + 12 + int.from_bytes(png[8:12], "big")  # length, type, data, CRC
    return png[:end] + _SOFTWARE_CHUNK + png[end:]


def write(report: Report, out: Path, formats: list[str], stem: str = "report",
          landed: Callable[[list[Path]], Any] | None = None) -> list[Path]:
    """Render the report into `out`; returns the paths written (the images and, for tex and
    typst, each table's own file included: report/typeset.py). The files land together
    once all are rendered (measure/landing.py): a Ctrl-C or an error part-way leaves the
    folder as it was; `landed` is told their paths as they land."""
    env, md_env = _env(), _env(markdown=True)
    written = []
    with staged(landed) as stage:
        if "html" in formats:
            path = out / f"{stem}.html"
            html = env.get_template("report.html.j2").render(r=report)
            stage.path(path).write_text(sealed(html, "html"), encoding="utf-8")
            written.append(path)
        images: dict[str, str] = {}
        pngs = []
        if any(f in formats for f in ("md", "tex", "typst")):
            for fig, path in _images(report, out, stem):
                stage.path(path).write_bytes(signed(fig.png))
                images[fig.name] = f"{path.parent.name}/{path.name}"
                pngs.append(path)
        if "md" in formats:
            path = out / f"{stem}.md"
            md = md_env.get_template("report.md.j2").render(r=report, images=images)
            stage.path(path).write_text(sealed(md, "md"), encoding="utf-8")
            written.append(path)
        written += pngs
        for fmt in ("tex", "typst"):
            if fmt in formats:
                written += typeset.write(report, out, fmt, stem, images, stage)
    return written
