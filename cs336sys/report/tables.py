"""An experiment's declared tables (sweep/declaration.py) as rows of text cells.

One function draws them for the report's main table of each section and for the table a
command prints when its sweep ends, so the two show the same columns in the same format. A
row is a dict of the point's settings and metrics by name (a view row in the report;
`row_of(spec, result)` after a sweep), plus `status` and `_settings` (the settings JSON).
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Callable, Iterable
from typing import Any

from cs336sys.measure.sampling import drifted
from cs336sys.measure.units import format_size
from cs336sys.report.intervals import (
    NOT_INTERLEAVED,
    NOT_INTERLEAVED_NOTE,
    ONE_INTERPRETED,
    ONE_INTERPRETED_NOTE,
    RUNS_APART,
    RUNS_APART_NOTE,
    sample_interval,
)
from cs336sys.report.sections import (
    FilledTable,
    Row,
    compared,
    mean_std,
    mib,
    num,
    pct,
    ratio_side,
    sample_count,
    sized,
    skey,
    status_or,
    text,
    with_gpu,
)
from cs336sys.sweep.declaration import Column, Ratio, Table


def row_of(spec: Any, result: Any) -> Row:
    """A finished point as a table row, keyed like its view's columns."""
    settings = spec.settings()
    return {**result.metrics, **settings, "status": result.status, "_settings": settings,
            "_samples": result.samples}


def _exact(x: Any) -> str:
    """repr() of a float: the shortest text that reads back as exactly the stored value."""
    return repr(x) if isinstance(x, float) else text(x)


def _size(x: Any) -> str:
    return "" if x is None else format_size(int(x))


_FORMATS = {
    "text": text,
    "num": num,
    "exact": _exact,
    "mib": mib,
    "pct": pct,
    "sci": lambda x: "" if x is None else f"{x:.1e}",
    "size": _size,
    "yes_no": lambda x: "" if x is None else num(bool(x)),
}


# A timed quantity whose std is more than this share of its mean is noisy: its mean is not a
# figure to quote alone, so its median is shown beside it.
NOISY = 0.10
NOISY_NOTE = ("noisy: the std is more than 10 % of the mean (spikes in the samples); the "
              "median, the 10th-90th percentiles and the interquartile range stand beside the "
              "mean.")
NOISY_NOTE_MEDIAN = ("noisy: the std is more than 10 % of the mean (spikes in the samples); the "
                     "median stands beside the mean")
NOISY_NOTE_SHORT = ("noisy: the std is more than 10 % of the mean (spikes in the samples); the "
                    "median stands beside the mean (p10, p90 and IQR are stored).")


DRIFT_NOTE = ("drift: the median of the last third of a point's samples over the first "
              "third's moved past 3 % (clocks that fall as the GPU heats, other work on the "
              "machine): its median hides a trend; measure it again, or compare on minima.")


# Fewer samples than this say too little about their spread to call it noisy.
NOISY_MIN_SAMPLES = 5


def noisy(row: Row, base: str) -> bool:
    """Whether the timed quantity `base` (its `_mean`, `_std`) of an ok row is noisy: its
    std above NOISY of its mean, over at least NOISY_MIN_SAMPLES samples (when the row says
    how many)."""
    mean, std = row.get(f"{base}_mean"), row.get(f"{base}_std")
    n = sample_count(row, base)
    if n is not None and n < NOISY_MIN_SAMPLES:
        return False
    return row.get("status") == "ok" and bool(mean) and std is not None and std / mean > NOISY


def value(column: Column, row: Row) -> Any:  # a mean_std column's key names its family
    if column.cell is not None:
        return column.cell(row)
    return row.get(f"{column.key}_mean" if column.fmt == "mean_std" else column.key)


def cell(column: Column, row: Row, spread: bool = True) -> str:
    """One cell, without the ratio columns (see `cells`). A noisy timed cell gets its median
    and, with `spread` (the report; the terminal's table stays narrow), its p10–p90 and IQR."""
    if column.fmt == "mean_std":
        text = mean_std(row, f"{column.key}_mean", f"{column.key}_std")
        median = row.get(f"{column.key}_median")
        if noisy(row, column.key) and median is not None:
            p10, p90, iqr = (row.get(f"{column.key}_{s}") for s in ("p10", "p90", "iqr"))
            extra = (f", p10–p90 {num(p10)}–{num(p90)}, IQR {num(iqr)}"
                     if spread and None not in (p10, p90, iqr) else "")  # None: stored before 0.2.1
            text += f" (median {num(median)}{extra}, noisy)"
        return text
    formatted = _FORMATS[column.fmt](value(column, row))
    return formatted if column.setting or column.before_run else status_or(row, formatted)


def _ratios(ratio: Ratio, rows: list[Row]) -> list[str]:
    """Each row's metric against its baseline's: the baseline is the ok row of the same
    point (settings but `vary` equal, same GPU) whose settings match `against`, and a row
    that matches `against` is its own. Where several baselines differ only in settings the
    ratio varies over (step's `none` of two --optimizer), the first is taken and the cell
    names it, `1.39× against optimizer=adamw`. With
    `ratio.samples`, the cell carries the ratio's interval and what it says, `2.27× faster
    (1.65–2.58)`, and `ratio.impossible` may flag it."""
    baselines = [_is_baseline(ratio, r) for r in rows]
    base: dict[tuple, list[Row]] = {}
    for r, baseline in zip(rows, baselines, strict=True):
        if baseline:
            base.setdefault((r.get("gpu"), skey(r, drop=ratio.vary)), []).append(r)
    out = []
    for r, baseline in zip(rows, baselines, strict=True):
        if r.get("status") == "wrong":  # a wrong point is never a speed-up, nor a baseline
            out.append("wrong")
            continue
        if r.get("status") == "ok" and not compared(r):
            out.append("not compared")
            continue
        # a baseline is its own (two `none` steps of different optimizers: each 1.00×)
        candidates = [r] if baseline else base.get((r.get("gpu"), skey(r, drop=ratio.vary)), [])
        ref_row = candidates[0] if candidates else None
        ref, mine = (ratio.metric(ref_row) if ref_row else None), ratio.metric(r)
        value = (ref / mine if ratio.speedup else mine / ref) if ratio_side(ref) and \
            ratio_side(mine) else None
        # two decimals, or two significant digits below 0.01 (an interpreted kernel's 0.0017×
        # read 0.00×)
        text = "" if value is None else f"{value:.2f}×" if value >= 0.01 else f"{value:.2g}×"
        if value is not None and ref_row is not r:
            text += sample_interval(ratio.samples, ref_row, r, ratio.speedup)
            if len(candidates) > 1:
                text += " against " + which(ref_row, candidates, ratio.vary)
            why = ratio.impossible(ref_row, r) if ratio.impossible else None
            if why:
                text += f" IMPOSSIBLE: {why}"
        out.append(status_or(r, text))
    return out


def _is_baseline(ratio: Ratio, row: Row) -> bool:
    """Whether `row` can be a baseline of `ratio` (see `_ratios`)."""
    return compared(row) and all(row["_settings"].get(k) == v for k, v in ratio.against.items()) \
        and ratio_side(ratio.metric(row))


def _shown(column: Column, rows: list[Row]) -> bool:
    """An optional column where a row has a value for it; a ratio column where a row is its
    baseline: `vs naive` of a run without naive would be empty in every row, with its note
    saying what it is not."""
    # a setting's own value: the model column names cs336sys's model where it is unset
    raw = (lambda r: (r.get("_settings") or {}).get(column.key, r.get(column.key))) \
        if column.setting and column.key else (lambda r: value(column, r))
    if column.optional and not any(raw(r) is not None for r in rows):
        return False
    return column.ratio is None or column.cell is not None or any(
        _is_baseline(column.ratio, r) for r in rows)


def which(chosen: Row, candidates: list[Row], vary: tuple[str, ...]) -> str:
    """`optimizer=adamw`: the settings that tell the chosen baseline from the others."""
    settings = [c["_settings"] for c in candidates]
    keys = [k for k in vary if len({str(s.get(k)) for s in settings}) > 1]
    return " ".join(f"{k}={chosen['_settings'].get(k)}" for k in keys)


def matching(declared: Table, rows: Iterable[Row]) -> list[Row]:
    """The rows the declared table is about (its `where` on the settings)."""
    return [r for r in rows if all(r["_settings"].get(k) == v for k, v in declared.where.items())]


def shown(declared: Table) -> list[str]:
    """The settings the table's columns show."""
    out = []
    for c in declared.columns:
        if c.setting:
            out += ([c.key] if c.key else []) + list(c.covers)
    return out


def _status(row: Row, most: int = 28) -> str:
    """The status, and for a point that is not ok the start of why (the whole reason is
    printed under the table): `oom: CUDA out of memory. Tri…`."""
    status, why = text(row.get("status")), str(row.get("error") or "").strip()
    if status == "ok" or not why:
        return status
    # without the file and line and the exception's class that start an error's first line
    first = re.sub(r"^(\S+:\d+: )?(\w+(Error|Exception): )?", "", why.splitlines()[0]) or why
    first = first.removeprefix(f"{status}: ")
    return f"{status}: {first[:most - 1]}…" if len(first) > most else f"{status}: {first}"


_STATUS = Column("status", cell=_status, setting=True)


def point_table(declared: Table, rows: list[Row], counts: bool = False,
                status: bool = False, keep: Callable[[Row], bool] | None = None,
                lift: int = 0) -> FilledTable:
    """The declared table over `rows`: a GPU column when they come from several GPUs, an
    "other settings" column naming what else tells them apart, with `counts` the number
    of stored runs per point (`_n`, see sections.latest) and with `status` a status column
    after the settings and noisy cells without their percentiles (the command's printout,
    kept narrow for a terminal).

    `keep` shows only the rows it accepts, while ratio columns still find their baseline
    among all rows (interpreted Triton points against native naive). In a table of `lift`
    rows or more (0: never), setting columns whose cell is the same in every row leave the
    table for its `constant` line, so a wide table keeps only the columns that tell its rows
    apart: 1 (a point's ten settings beside its metrics cut a terminal's one row into parts,
    and pushed a report's `check` off a 1280-px screen)."""
    rows = matching(declared, rows)
    columns = [c for c in declared.columns if _shown(c, rows)]
    if status:
        at = max((i + 1 for i, c in enumerate(columns) if c.setting), default=0)
        columns.insert(at, _STATUS)
    ratios = {i: _ratios(c.ratio, rows) for i, c in enumerate(columns) if c.ratio is not None}
    index = {id(r): i for i, r in enumerate(rows)}
    if keep is not None:
        rows = [r for r in rows if keep(r)]

    def cells(r: Row) -> list[str]:
        out = [ratios[i][index[id(r)]] if i in ratios else cell(c, r, spread=not status)
               for i, c in enumerate(columns)]
        return out + ([str(r["_n"])] if counts else [])

    # how often the point was stored: `n`, or `runs` beside a column of that name (a
    # setting `n`, a matrix size, read `| n | ... | n |`)
    stored = "runs" if any(c.header.lower() == "n" or c.key == "n" for c in columns) else "n"
    heads = [c.header for c in columns] + ([stored] if counts else [])
    t = with_gpu(rows, heads, cells, shown=shown(declared))
    notes = [declared.note, *(c.note for c in columns if c.note)]
    at = len(t.headers) - len(heads) - (t.headers[-1] == "other settings")  # gpu column
    notes += [sentence for i, c in enumerate(columns) for word, sentence in c.notes_if
              if any(word in row[at + i] for row in t.rows)]
    for mark, note in ((RUNS_APART, RUNS_APART_NOTE), (NOT_INTERLEAVED, NOT_INTERLEAVED_NOTE),
                       (ONE_INTERPRETED, ONE_INTERPRETED_NOTE)):
        if any(mark in row[at + i] for i, c in enumerate(columns) if c.ratio for row in t.rows):
            notes.append(note)
    if counts and any(r.get("_n", 1) > 1 for r in rows):  # its figures are one run's
        notes.append(f"{stored}: how often the point was stored; its row shows the latest "
                     "run (`report --compare`, `cs336sys sql` read the others).")
    spread = [None not in (r.get(f"{c.key}_{s}") for s in ("p10", "p90", "iqr"))
              for c in columns if c.fmt == "mean_std" for r in rows if noisy(r, c.key)]
    # the note says what the noisy cells show: rows stored before 0.2.1 lack the spread
    if spread and status:
        notes.append(NOISY_NOTE_SHORT)
    elif spread and all(spread):
        notes.append(NOISY_NOTE)
    elif spread:
        notes.append(NOISY_NOTE_MEDIAN + (" (and, where stored, the 10th-90th percentiles and "
                                          "the interquartile range)." if any(spread) else "."))
    if any(drifted(r.get(f"{c.key}_drift")) for c in columns if c.fmt == "mean_std" for r in rows):
        notes.append(DRIFT_NOTE)
    t.title, t.note = declared.title, " ".join(n for n in notes if n)
    # gpu, the settings (not the status) and "other settings" tell the rows apart
    identifies = ([True] * at + [c.setting and c is not _STATUS for c in columns]
                  + [False] * counts + [True] * (len(t.headers) - at - len(heads)))
    if lift and len(t.rows) >= lift:
        same = [at + i for i, c in enumerate(columns) if c.setting
                and len({row[at + i] for row in t.rows}) == 1]
        t.constant = ", ".join(f"{t.headers[i]}={t.rows[0][i]}" for i in same if t.rows[0][i])
        t.headers = [h for i, h in enumerate(t.headers) if i not in same]
        t.rows = [[c for i, c in enumerate(row) if i not in same] for row in t.rows]
        identifies = [k for i, k in enumerate(identifies) if i not in same]
    t.key = [i for i, k in enumerate(identifies) if k]
    return t


def point_tables(tables: Iterable[Table], rows: list[Row], counts: bool = False,
                 status: bool = False, keep: Callable[[Row], bool] | None = None,
                 lift: int = 0) -> list[FilledTable]:
    """Every declared table that has rows (see point_table for `keep` and `lift`)."""
    out = []
    rows = sized(rows)
    for declared in tables:
        t = point_table(declared, rows, counts, status, keep, lift)
        if t.rows:
            out.append(t)
    return out


def declared_tables(experiment: Any, rows: list[Row], counts: bool = False,
                    status: bool = False, lift: int = 0) -> list[FilledTable]:
    """An experiment's declared tables over `rows`, those its `apart` names (interpreted
    Triton points) in tables of their own after the others, titled so: in the report and in
    the command's printout alike (a step's 13.8 s emulated step printed as a figure)."""
    which, suffix = experiment.apart or (lambda r: False, "")
    out = point_tables(experiment.tables, rows, counts, status, lambda r: not which(r), lift)
    for t in point_tables(experiment.tables, rows, counts, status, which, lift):
        t.title += suffix
        out.append(t)
    return out


def as_text(tables: list[FilledTable], width: int | None = None) -> str:
    """Tables as aligned text for a terminal: the title above each, then the settings every
    row shares (`constant`), the table, its note. With `width`, a table wider than that is
    cut between columns, never inside a cell, into parts that each fit, every part starting
    with the columns that tell its rows apart (`key`: impl and seq, not impl alone); a
    column too wide for any part has its cells set on several lines (`blocks`), and the
    prose is filled to the width (`fill`)."""
    parts = []
    for t in tables:
        lines = [fill(t.title, width)] if t.title else []
        if t.constant:
            lines.append(fill(f"Same in every row: {t.constant}", width))
        lines.append("\n\n".join(blocks(t.headers, t.rows, width, t.key)))
        if t.note:
            lines.append(fill(t.note, width))
        parts.append("\n".join(lines))
    return "\n\n".join(parts)


# A space inside a backquoted span, while the text around it is filled: not a place to break.
_HELD = "\0"


def _hold(text: str) -> str:
    return re.sub(r"`[^`]*`", lambda m: m.group(0).replace(" ", _HELD), text)


def fill(text: str, width: int | None, indent: str = "", then: str | None = None) -> str:
    """`text` in lines of at most `width` columns, each of its lines a paragraph, broken at
    spaces only: never inside a word nor inside a backquoted span (a command, copied whole),
    which stand on a line of their own where they are longer than that. `indent` leads the
    first line, `then` (else `indent`) the others; without `width`, the text as it is."""
    if width is None:
        return indent + text
    filled = [textwrap.fill(line, width, initial_indent=indent,
                            subsequent_indent=indent if then is None else then,
                            break_on_hyphens=False, break_long_words=False)
              for line in _hold(text).split("\n")]
    return "\n".join(filled).replace(_HELD, " ")


# A table's headers and rows (of text cells, a cell of several lines as several rows) as text.
Render = Callable[[list[str], list[list[str]]], str]


def _render(headers: list[str], rows: list[list[str]]) -> str:
    from tabulate import tabulate

    return tabulate(rows, headers=headers, tablefmt="simple", disable_numparse=True)


def _widest(block: str) -> int:
    return max(map(len, block.splitlines()), default=0)


def blocks(headers: list[str], rows: list[list[str]], width: int | None, key: list[int],
           render: Render = _render) -> list[str]:
    """The table as one text block (`render`), or as several of at most `width` columns (of
    text), each led by the `key` columns (the first column where there are none and several
    rows; a lone row's parts need no column repeated to be read together). Key
    columns too wide to leave the others room get their cells set on several lines first
    (`_keys_fitted`), and a part still wider than `width`, one column too long beside the
    key columns (a cell of whole sentences), that column's (`_narrowed`)."""
    whole = render(headers, rows)
    if width is None or _widest(whole) <= width:
        return [whole]
    key = [i for i in key if i < len(headers)] or ([0] if len(rows) > 1 else [])
    if key:
        headers, rows = _keys_fitted(headers, rows, key, width, render)

    def part(columns: list[int]) -> tuple[list[str], list[list[str]]]:
        return [headers[i] for i in columns], [[r[i] for i in columns] for r in rows]

    groups: list[list[int]] = [[]]
    for i in (i for i in range(len(headers)) if i not in key):
        if groups[-1] and _widest(render(*part([*key, *groups[-1], i]))) > width:
            groups.append([])
        groups[-1].append(i)
    return [_narrowed(*part(key + g), width, render, len(key)) for g in groups]


def _keys_fitted(headers: list[str], rows: list[list[str]], key: list[int], width: int,
                 render: Render) -> tuple[list[str], list[list[str]]]:
    """The table, its key columns' cells filled to at most half of `width` (as far as their
    words allow) where whole they leave the other columns less than a quarter of it and
    filled they leave more: a comparison's one point, named by all its settings, takes 52
    of 80 columns whole, which leaves a single column to each part beside it. Ten settings
    of one word each stay as they are, as no filling leaves the others room. A table of key
    columns only has the whole width."""
    others = len(headers) > len(key)
    h, r = [headers[i] for i in key], [[row[i] for i in key] for row in rows]
    room = width - width // 4 if others else width
    if _widest(render(h, r)) <= room:
        return headers, rows
    h, r = _filled(h, r, width // 2 if others else width, render, list(range(len(key))))
    if _widest(render(h, r)) > room:
        return headers, rows
    at = {i: j for j, i in enumerate(key)}
    return ([h[at[i]] if i in at else x for i, x in enumerate(headers)],
            [[kr[at[i]] if i in at else x for i, x in enumerate(row)]
             for row, kr in zip(rows, r, strict=True)])


def _narrowed(headers: list[str], rows: list[list[str]], width: int, render: Render,
              keys: int) -> str:
    """The block, the cells of its columns after the first `keys` filled to fewer columns
    until it fits `width` (as far as their words allow): a cut between columns cannot
    shorten a row whose one cell is wider than the terminal. Where the key columns alone
    are wider than `width`, the block stays as it is: no filling makes it fit."""
    block = render(headers, rows)
    if _widest(block) <= width or (keys and _widest(
            render(headers[:keys], [r[:keys] for r in rows])) > width):
        return block
    return render(*_filled(headers, rows, width, render, list(range(keys, len(headers)))))


def _filled(headers: list[str], rows: list[list[str]], width: int, render: Render,
            columns: list[int]) -> tuple[list[str], list[list[str]]]:
    """The table, the widest of `columns` filled to fewer columns, again, until it renders
    within `width` or none is wider than its longest word (or backquoted span)."""
    texts = {i: [headers[i], *(r[i] for r in rows)] for i in columns}
    word = {i: max((len(w) for x in t for w in _hold(x).split()), default=0)
            for i, t in texts.items()}
    wide = {i: max(map(_widest, t)) for i, t in texts.items()}
    over = _widest(render(headers, rows)) - width
    while over > 0:
        shrinkable = [i for i in columns if wide[i] > word[i]]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda i: wide[i])
        filled = [fill(x, max(word[i], wide[i] - over)) for x in texts[i]]  # whole texts
        if max(map(_widest, filled)) >= wide[i]:  # a space that is no place to break (NBSP)
            word[i] = wide[i]
            continue
        wide[i] = max(map(_widest, filled))
        headers = [filled[0] if j == i else h for j, h in enumerate(headers)]
        rows = [[filled[1 + k] if j == i else c for j, c in enumerate(r)]
                for k, r in enumerate(rows)]
        over = _widest(render(headers, rows)) - width
    return headers, rows
