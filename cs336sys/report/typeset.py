"""A report as LaTeX and as Typst: each table in its own file (a booktabs `tabular`, a Typst
`#table(...)`), ready to `\\input` or `#include` in a writeup, and one document that puts
them together with the figures, section by section.

The CS336 handout suggests building the writeup's tables in code ("formatting tables in
LaTeX or Typst can be very tedious"); these are those tables, with the values the report
shows. The documents compile with pdflatex (booktabs, graphicx, adjustbox, geometry) and
`typst compile`.
"""

from __future__ import annotations

import re
import struct
from pathlib import Path
from typing import Any

from cs336sys.measure.landing import Stage
from cs336sys.report.seal import sealed
from cs336sys.report.sections import FilledTable, Section, code_spans

# Characters LaTeX reads as commands, and the report's few symbols outside ASCII that
# pdflatex's default fonts lack, as LaTeX writes them.
_LATEX = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#",
    # a line may break after an underscore: get_flashattention_autograd_function_pytorch ran
    # 86 pt into the margin as one word
    "_": r"\_\allowbreak{}",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "±": r"$\pm$", "×": r"$\times$", "≤": r"$\leq$", "≥": r"$\geq$", "→": r"$\rightarrow$",
    "µ": r"$\mu$", "−": "-", "–": "--", "—": "---", "…": r"\dots{}", "²": r"\textsuperscript{2}",
    "√": r"$\surd$", "⌈": r"$\lceil$", "⌉": r"$\rceil$", "₂": r"$_2$",
    # the default (OT1) encoding prints < > | as inverted ! and ? and a dash: p<0.001, |ref|
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
    # an option in plain text (`--label`): two hyphens are an en dash to LaTeX
    "--": "-{}-",
    # the default (OT1) roman font has no straight double quote (its " is a closing one); the
    # typewriter font's character 34 is straight in OT1 and T1 alike, and \char keeps an
    # active " (babel's shorthands) out of it
    '"': r"\texttt{\char34}",
    # pdflatex knows no glyph for these (QKᵀ, |Δ|): math mode has them
    "ᵀ": r"$^{\top}$", "Δ": r"$\Delta$", "∘": r"$\circ$", "Ψ": r"$\Psi$", "·": r"$\cdot$",
}
_LATEX_RE = re.compile("|".join(re.escape(k) for k in _LATEX))


def latex(value: str, code: bool = False) -> str:
    """`value` as LaTeX text: its special characters escaped. `code`: for a typewriter span,
    whose font has no en-dash ligature, so `--` stays as written."""
    def escaped(m: re.Match) -> str:
        return m.group(0) if code and m.group(0) == "--" else _LATEX[m.group(0)]

    return _LATEX_RE.sub(escaped, str(value))


def typst(value: str) -> str:
    """`value` as a Typst string literal (shown as written, no markup)."""
    return '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


# Inside a code span, a line may also break after a hyphen between two word characters and
# after a comma: LaTeX's typewriter font hyphenates nothing, and an indented paragraph ending
# in `cs336sys ddp --impl yours-individual --world-size 2` ran 13 pt into the margin. The
# dashes of an option (`--impl`) stay whole.
_CODE_BREAKS = re.compile(r"(?<=\w)-(?=\w)|,")


def latex_note(note: str) -> str:
    """A section note as LaTeX, its code spans typewriter (no `--` ligature, no quotes)."""
    def code(text: str) -> str:
        return r"\texttt{" + _CODE_BREAKS.sub(r"\g<0>\\allowbreak{}", latex(text, code=True)) + "}"

    return "".join(code(text) if is_code else latex(text) for text, is_code in code_spans(note))


# An option in a code span (`--iters`, `-p`): Typst breaks a line after a hyphen, in raw
# text too, and printed `--` at the end of one line and `iters 2` on the next.
_OPTION = re.compile(r"(?<!\S)(--?[A-Za-z][\w-]*)")


def _typst_code(text: str) -> str:
    """A code span as raw text, each option in a box of its own: unbroken."""
    return "".join(f"#box(raw({typst(part)}))" if i % 2 else f"#raw({typst(part)})"
                   for i, part in enumerate(_OPTION.split(text)) if part)


def typst_note(note: str) -> str:
    """A section note as a Typst paragraph, its code spans raw text."""
    return "#par[" + "".join(_typst_code(text) if code else f"#{typst(text)}"
                             for text, code in code_spans(note)) + "]"


_NUMERIC = re.compile(r"^(OOM|error|skipped|wrong|[-+]?inf\b|nan\b|[-+]?[\d,.]+)")


def _right(column: list[str]) -> bool:
    """Right-align a column whose every filled cell starts with a number (or OOM)."""
    filled = [c for c in column if c]
    return bool(filled) and all(_NUMERIC.match(c) for c in filled)


# A header or cell longer than these is set on several lines, broken at spaces: a pivot's "0
# warm-up: optimizer ms" on one line made its 13-column table so wide that fitting it to the
# page shrank it to a sliver, in LaTeX and Typst alike; a noisy point's "0.893 ± 0.17 (drift
# +22%) (median 0.876, p10-p90 0.722–0.99, IQR 0.235, noisy)" did the same to its row.
HEADER_CHARS, CELL_CHARS = 14, 28
CONSTANT_CHARS = 70  # a table's line of shared settings, on lines of at most this


def wrapped(text: str, most: int) -> list[str]:
    """`text` in lines of at most `most` characters where its words allow (a longer word is
    a line of its own), first line first."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= most:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [text]


def latex_table(t: FilledTable) -> str:
    """A booktabs tabular of the table (the title and note are the document's), each long
    header or cell on lines of its own in the column's alignment."""
    columns = list(zip(*t.rows, strict=True)) if t.rows else [() for _ in t.headers]
    spec = "".join("r" if _right(list(c)) else "l" for c in columns)

    def lines(text: str, most: int, align: str, anchor: str) -> str:
        parts = [latex(x) for x in wrapped(text, most)]
        if len(parts) == 1:
            return parts[0]
        return (rf"\begin{{tabular}}[{anchor}]{{@{{}}{align}@{{}}}}" + r" \\ ".join(parts)
                + r"\end{tabular}")

    out = [f"\\begin{{tabular}}{{{spec}}}", r"\toprule"]
    if t.constant:  # in the file, which is \input alone: its one row says what was measured
        out += [rf"\multicolumn{{{len(t.headers)}}}{{l}}{{"
                + lines(constant_line(t), CONSTANT_CHARS, "l", "t") + r"} \\", r"\midrule"]
    out += [" & ".join(lines(h, HEADER_CHARS, a, "b") for h, a in zip(t.headers, spec, strict=True))
            + r" \\", r"\midrule"]
    out += [" & ".join(lines(c, CELL_CHARS, a, "t") for c, a in zip(row, spec, strict=True))
            + r" \\" for row in t.rows]
    out += [r"\bottomrule", r"\end{tabular}", ""]
    return "\n".join(out)


def typst_table(t: FilledTable) -> str:
    """A Typst `#table(...)` of the table, its header row repeated across pages, each long
    header or cell on lines of its own."""
    columns = list(zip(*t.rows, strict=True)) if t.rows else [() for _ in t.headers]
    align = ", ".join("right" if _right(list(c)) else "left" for c in columns)

    def head(h: str) -> str:
        return "[" + "#linebreak()".join(f"*#{typst(x)}*" for x in wrapped(h, HEADER_CHARS)) + "]"

    def cell(c: str) -> str:
        parts = wrapped(c, CELL_CHARS)
        if len(parts) == 1:
            return typst(c)
        return "[" + "#linebreak()".join(f"#{typst(x)}" for x in parts) + "]"

    # the settings every row shares head the table, in its file (#include'd alone), on lines
    # of CONSTANT_CHARS as in LaTeX: whole, 150 characters scaled a one-row table to 65 %
    constant = ([f"table.cell(colspan: {len(t.headers)}, align: left, ["
                 + "#linebreak()".join(f"#{typst(x)}" for x in wrapped(constant_line(t),
                                                                        CONSTANT_CHARS))
                 + "])"] if t.constant else [])
    out = ["#table(", f"  columns: {len(t.headers)},", f"  align: ({align},),",
           "  stroke: none,", "  table.hline(),",
           "  table.header(" + ", ".join([*constant, *(head(h) for h in t.headers)]) + "),",
           "  table.hline(stroke: 0.5pt),"]
    out += ["  " + ", ".join(cell(c) for c in row) + "," for row in t.rows]
    out += ["  table.hline(),", ")", ""]
    return "\n".join(out)


def constant_line(t: FilledTable) -> str:
    """`Same in every row: size=tiny, seq=32`: the settings lifted out of the columns."""
    return f"Same in every row: {t.constant}"


def _sentences(section: Any, t: FilledTable) -> tuple[str, str]:
    """The table's caption and the line under it (the settings every row shares are in the
    table's own file: constant_line)."""
    return t.title or section.title, t.note


# The first line of every LaTeX and Typst file cs336sys writes: a later run replaces a file
# that starts with it and refuses any other unless --force (cli/outputs.py).
MARK = {"tex": "% generated by cs336sys\n", "typ": "// generated by cs336sys\n"}


def _table_path(out: Path, stem: str, ext: str, section: Section, i: int) -> Path:
    return out / f"{stem}_tables" / f"{section.id}-{i}.{ext}"


def table_paths(report: Any, out: Path, fmt: str, stem: str) -> list[Path]:
    """The table files `write` writes for `fmt`, in its order."""
    ext = "tex" if fmt == "tex" else "typ"
    return [_table_path(out, stem, ext, section, i) for section in _sections(report)
            for i in range(1, len(section.tables) + 1)]


def write(report: Any, out: Path, fmt: str, stem: str, images: dict[str, str],
          stage: Stage) -> list[Path]:
    """The report as `fmt` ("tex" or "typst") in `out`: `<stem>.tex` / `<stem>.typ`, and
    each table in `<stem>_tables/` as `<section>-<n>.tex` / `.typ`, written through `stage`
    (render.write's: they land with the rest). `images` maps a figure's name to its PNG's
    path relative to `out` (written by the caller). Returns the paths."""
    ext = "tex" if fmt == "tex" else "typ"
    written: list[Path] = []
    body: list[str] = []
    for section in _sections(report):
        body.append(rf"\section{{{latex(section.title)}}}" if ext == "tex"
                    else f"#heading(level: 1, {typst(section.title)})")
        for note in section.notes:  # ragged right: a note's long commands need no stretch
            body.append("{\\raggedright " + latex_note(note) + "\\par}\n" if ext == "tex"
                        else typst_note(note))
        for i, t in enumerate(section.tables, start=1):
            path = _table_path(out, stem, ext, section, i)
            table = MARK[ext] + (latex_table(t) if ext == "tex" else typst_table(t))
            stage.path(path).write_text(sealed(table, ext), encoding="utf-8")
            written.append(path)
            caption, under = _sentences(section, t)
            rel = f"{path.parent.name}/{path.name}"
            if ext == "tex":
                body += [r"\begin{table}[htbp]\centering", rf"\caption{{{latex(caption)}}}",
                         r"\begin{adjustbox}{max width=\textwidth}", rf"\input{{{rel}}}",
                         r"\end{adjustbox}",
                         *([rf"\par\smallskip{{\footnotesize {latex(under)}}}"] if under else []),
                         r"\end{table}", ""]
            else:
                body += [f"#figure(fit(include {typst(rel)}), caption: {typst(caption)}, "
                         "kind: table)", *([f"#text(size: 8pt, {typst(under)})"] if under else []),
                         ""]
        for fig in section.figures:
            if fig.name not in images:
                continue
            if ext == "tex":
                body += [r"\begin{figure}[htbp]\centering",
                         # a profile's 33 kernels: a figure taller than the page ran
                         # into its footer ("Float too large for page")
                         r"\includegraphics[width=\linewidth,height=0.75\textheight,"
                         rf"keepaspectratio]{{{images[fig.name]}}}",
                         rf"\caption{{{latex(fig.title)}}}", r"\end{figure}", ""]
            else:
                size = "height: 75%" if _tall(fig.png) else "width: 100%"
                body.append(f"#figure(image({typst(images[fig.name])}, {size}), "
                            f"caption: {typst(fig.title)})")
        if section.failures:  # as the HTML and markdown list them, a traceback's end too
            if ext == "tex":
                body += [r"\paragraph{Not measured, or measured wrong}", r"\begin{itemize}",
                         *(rf"\item \textbf{{{latex(f.status)}}} {latex(f'{f.point}: {f.why}')}"
                           + "".join(rf"\\{{\scriptsize\ttfamily {latex(line, code=True)}}}"
                                     for line in f.tail()) for f in section.failures),
                         r"\end{itemize}", ""]
            else:
                body += ["#strong[Not measured, or measured wrong]",
                         *(f"- #strong({typst(f.status)}) #{typst(f'{f.point}: {f.why}')}"
                           + (f" #text(size: 7pt, raw(block: true, {typst(chr(10).join(f.tail()))}))"
                              if f.detail else "") for f in section.failures), ""]
    head = _head(report, ext)
    document = out / f"{stem}.{ext}"
    tail = "\n\\end{document}\n" if ext == "tex" else "\n"
    stage.path(document).write_text(sealed(head + "\n".join(body) + tail, ext), encoding="utf-8")
    return [document, *written]


def _tall(png: bytes | None) -> bool:
    """Whether a PNG at the text's width would be taller than 3/4 of the page's text (about
    6.5 by 9 inches): Typst has no largest height, so such a figure is set by its height."""
    if not png or len(png) < 24:
        return False
    width, height = struct.unpack(">II", png[16:24])  # IHDR, after the 8-byte signature
    return height > 1.04 * width


def _sections(report: Any) -> list[Section]:
    """The report's sections, after a comparison's own (its verdicts, summary and notes),
    which the HTML and markdown templates write apart from the sections."""
    if not report.compare_ab:
        return list(report.sections)
    a, b = report.compare_ab
    notes = [report.compare_note, report.compare_summary, *report.compare_notes]
    if not report.comparison:
        notes.append("No point was measured on both sides.")
    return [Section("compare", f"Comparison: {a} (A) against {b} (B), by {report.compare_kind}",
                    tables=list(report.comparison), notes=[n for n in notes if n]),
            *report.sections]


def _head(report: Any, ext: str) -> str:
    """The document's preamble, title and provenance list."""
    facts = [f"{k}: {v}" for k, v in report.provenance]
    if ext == "tex":
        items = "".join(rf"\item {latex(f)}" + "\n" for f in facts)
        return (MARK["tex"] + "\\documentclass[10pt]{article}\n"
                "\\usepackage[margin=2cm]{geometry}\n\\usepackage{booktabs}\n"
                "\\usepackage{graphicx}\n\\usepackage{adjustbox}\n"
                # typewriter spaces do not stretch: a command in a note ran into the margin
                "\\emergencystretch=3em\n"
                f"\\title{{{latex(report.title)}}}\n\\date{{}}\n"
                "\\begin{document}\n\\maketitle\n"
                + (f"\\begin{{itemize}}\n{items}\\end{{itemize}}\n" if facts else ""))
    items = "".join(f"- #{typst(f)}\n" for f in facts)
    return (MARK["typ"] + "#set page(margin: 2cm)\n#set text(size: 10pt)\n"
            # a table wider than the page is scaled down to it, as LaTeX's adjustbox does
            "#let fit(body) = layout(size => {\n"
            "  let natural = measure(body).width\n"
            "  if natural > size.width { scale(size.width / natural * 100%, reflow: true, body) }"
            " else { body }\n})\n"
            f"#align(center, text(size: 16pt, {typst(report.title)}))\n\n{items}\n")
