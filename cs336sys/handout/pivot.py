"""A problem's tables in the handout's shapes, from its stored rows: pivots (handout/
problem.Pivot), an experiment's own declared tables, or a function of the rows.

Nothing is measured or computed here: every cell is a stored value, formatted by the
report's own cell writer (report/tables.py), so a table here and the report's agree.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cs336sys.experiments.attention_section import impl_label
from cs336sys.experiments.ddp_setup import stored_as_fsdp
from cs336sys.handout.problem import AsReported, Pivot
from cs336sys.measure.units import format_size
from cs336sys.report.sections import (
    BY_SIZE,
    QUIET,
    FilledTable,
    Row,
    Section,
    latest,
    several_gpus,
    sized,
    text,
    varying,
)
from cs336sys.report.tables import cell, point_tables, shown, value
from cs336sys.sweep.declaration import Column, model_name, model_size

# How a setting's value reads as a column group or a row cell, where its bare value would not.
_WORDS: dict[str, Callable[[Any], str]] = {
    "compile": lambda v: "compiled" if v else "eager",
    "model": model_name,
    "warmup": lambda v: f"{v} warm-up",
    "world_size": lambda v: f"{v} processes",
    "seq": lambda v: f"seq {v}",
    "d_head": lambda v: f"d {v}",
    "bucket_mb": lambda v: "" if v is None else f"{text(v)} MiB buckets",
    "shard_optimizer": lambda v: "not sharded" if v in (None, "none") else f"sharded ({v})",
}
_HEADERS = {"d_head": "d", "bytes": "size", "world_size": "processes",
            "shard_optimizer": "optimizer state", "bucket_mb": "bucket MiB"}


def _row_cell(key: str, row: Row) -> str:
    """A row-naming cell: the size with its shape, a byte count with its unit, an attention
    implementation with the SDPA backend that ran (`sdpa[cudnn]`, as the report has it), or
    the setting's value."""
    value = row["_settings"].get(key, row.get(key))
    if key == "size":
        return model_size({**row, **row["_settings"]})
    if key == "impl" and "sdpa_backend_used" in row:  # an attention row
        return impl_label({**row, **row["_settings"]})
    if key == "bytes" and value is not None:
        return format_size(int(value))
    if key == "shard_optimizer" and value in (None, "none") and stored_as_fsdp(
            row["_settings"].get("impl", row.get("impl"))):
        return "sharded (FSDP)"  # with the parameters: no sharded optimizer on top
    if key == "shard_optimizer" and row.get("not_sharded"):
        # ddp's table flags it; the writeup read `sharded (yours)` for an optimizer every
        # rank held whole (each stepping every parameter, which the course's test passes)
        return f"{_WORDS[key](value)}: NOT SHARDED"
    if key in ("compile", "shard_optimizer", "model"):
        return _WORDS[key](value)
    return text(value)


def _order(key: str, rows: list[Row]) -> Callable[[Row], Any]:
    """Sort rows by a setting: sizes by their parameters, numbers ascending, anything else
    in first-seen order."""
    seen: dict[str, int] = {}
    for r in rows:
        seen.setdefault(repr(r["_settings"].get(key)), len(seen))

    def position(r: Row) -> Any:
        v = r["_settings"].get(key)
        if key == "size":
            return (0, r.get("params") or r["_settings"].get("d_model") or 0, seen[repr(v)])
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return (0, v, 0)
        return (1, 0, seen[repr(v)])

    return position


def _keys(p: Pivot, rows: list[Row]) -> tuple[list[str], list[str]]:
    """The settings that name a row: the pivot's, then each other setting that still tells
    two rows of one cell apart (a second precision the shape leaves out), in order, until
    none do, then any other that differs between rows; and apart, those that go with the
    column group (_with_group), which would split every row (the optimizer of a
    forward-only point)."""
    keys = list(p.rows)
    shown = [*p.rows, *([p.across] if p.across else []), *p.where]
    for extra in varying(rows, shown):
        cells: dict[str, set[str]] = {}
        for r in rows:
            s = r["_settings"]
            cell = repr((r.get("gpu"), [s.get(k) for k in keys],
                         s.get(p.across) if p.across else None))
            cells.setdefault(cell, set()).add(repr(s.get(extra)))
        if any(len(values) > 1 for values in cells.values()):
            keys.append(extra)
    # one that differs between rows without splitting a cell (seq 32 for the forward rows,
    # 64 for the others) is a key too: else neither a key nor shared, it went unsaid; but
    # one that goes with the column group (the optimizer: none forward, adamw train) split
    # each row in two, half empty: the constant line says it per group (_by_group)
    rest = varying(rows, [*shown, *keys])
    grouped = [k for k in rest if _with_group(p, k, keys, rows)]
    return keys + [k for k in rest if k not in grouped], grouped


def _with_group(p: Pivot, key: str, keys: list[str], rows: list[Row]) -> bool:
    """Whether `key`'s value goes with the column group and differs within a row: as a row
    key it would split each row into one line per group."""
    if not p.across:
        return False
    per_group: dict[str, set[str]] = {}
    per_row: dict[str, set[str]] = {}
    for r in rows:
        s = r["_settings"]
        per_group.setdefault(repr(s.get(p.across)), set()).add(repr(s.get(key)))
        per_row.setdefault(repr((r.get("gpu"), [s.get(k) for k in keys])), set()).add(
            repr(s.get(key)))
    return (all(len(v) == 1 for v in per_group.values())
            and any(len(v) > 1 for v in per_row.values()))


def _by_group(p: Pivot, grouped: list[str], rows: list[Row]) -> str:
    """`optimizer=none (forward), adamw (train)`: the settings that go with the column group
    (`_keys`'s second list), each group's value."""
    said = []
    for k in grouped:
        values = {}
        for r in sorted(rows, key=_order(p.across, rows)):
            values.setdefault(_group(p, r["_settings"].get(p.across), rows), _row_cell(k, r))
        said.append(f"{_HEADERS.get(k, k)}=" + ", ".join(f"{v} ({g})" for g, v in values.items()))
    return ", ".join(said)


def _group(p: Pivot, value: Any, rows: list[Row]) -> str:
    """A column group's name: the rows' own cell where they agree on it (`sdpa[cudnn]`),
    else the setting's value in words."""
    if p.across in _WORDS:
        return _WORDS[p.across](value)
    named = {_row_cell(p.across, r) for r in rows if r["_settings"].get(p.across) == value}
    return named.pop() if len(named) == 1 else text(value)


def _qualifiers(p: Pivot, keys: list[str], rows: list[Row]) -> list[str]:
    """The keys past the pivot's own set on the rows of one column group alone (the SDPA
    backend, the Triton opt-in kernels): they name a column group, not a row, or every row
    of another implementation left its cells empty on a line of its own."""
    if not p.across:
        return []
    out = []
    for k in keys[len(p.rows):]:
        # a switch counts where it is on: torch_compile's --compile run of the user's
        # attention alone set compile, and a column read `eager` above ours compiled
        owners = {repr(r["_settings"].get(p.across)) for r in rows
                  if r["_settings"].get(k) not in (None, False)}
        if len(owners) == 1:
            out.append(k)
    return out


def _column(p: Pivot, qualifiers: list[str]) -> Callable[[Row], tuple]:
    """A row's column group: its `across` value and those of the `qualifiers`."""
    return lambda r: (r["_settings"].get(p.across) if p.across else None,
                      *(r["_settings"].get(q) for q in qualifiers))


def _group_names(p: Pivot, groups: list[tuple], qualifiers: list[str], rows: list[Row]
                 ) -> list[str]:
    """Each column group's name (`sdpa[flash]`), with its qualifiers' values where two
    groups would read alike (`sdpa[flash] (sdpa_backend=auto)`)."""
    column = _column(p, qualifiers)
    members = [[r for r in rows if column(r) == g] for g in groups]
    names = [_group(p, g[0], m) for g, m in zip(groups, members, strict=True)]
    out = []
    for name, g, m in zip(names, groups, members, strict=True):
        said = [f"{_HEADERS.get(q, q)}={_row_cell(q, m[0])}"
                for q, v in zip(qualifiers, g[1:], strict=True) if v is not None]
        out.append(f"{name} ({', '.join(said)})" if said and names.count(name) > 1 else name)
    return out


def _constant(shows: list[str], named: set[str], rows: list[Row]) -> str:
    """`size=xl (1600×48, 2.0B), batch=4`: the settings of `shows` (those the experiment's
    own table shows) that every row shares and no row key, column group or `where` of the
    table names. Without it a pivot hid the model and the shape it was measured at."""
    same = [k for k in shows if k not in named and k not in QUIET
            and rows[0]["_settings"].get(k) is not None
            and len({repr(r["_settings"].get(k)) for r in rows}) == 1]
    if "size" in same or "size" in named:  # its cell has the shape
        same = [k for k in same if k not in BY_SIZE]
    return ", ".join(f"{_HEADERS.get(k, k)}={_row_cell(k, rows[0])}" for k in same)


def pivot(p: Pivot, rows: list[Row], shows: list[str] = (), flags: list[Column] = ()
          ) -> FilledTable | None:
    """The Pivot over `rows` (one experiment's view rows of the problem; the latest of each
    point), or None where no row matches. A setting that tells rows apart beyond `rows` and
    `across` (a second GPU, a dimension overridden) joins the row keys; those of `shows`
    (the settings the experiment's table shows) that every row shares are the table's
    `constant` line."""
    rows = sized(latest([r for r in rows
                          if all(r["_settings"].get(k) == v for k, v in p.where.items())]))
    if not rows:
        return None
    # an optional column no row has a value for is left out (rows stored before it was)
    values = [c for c in p.values if not c.optional or any(value(c, r) is not None for r in rows)]
    keys, grouped = _keys(p, rows)
    qualifiers = _qualifiers(p, keys, rows)
    keys = [k for k in keys if k not in qualifiers]
    column = _column(p, qualifiers)
    gpus = several_gpus(rows)
    for key in reversed(keys):  # a stable sort per key, the first key last
        rows.sort(key=_order(key, rows))
    groups = [column(rows[0])]
    if p.across:
        groups = list(dict.fromkeys(column(r) for r in sorted(rows, key=_order(p.across, rows))))
    table: dict[tuple, dict[Any, Row]] = {}
    for r in rows:
        name = tuple(_row_cell(k, r) for k in keys) + ((text(r.get("gpu")),) if gpus else ())
        table.setdefault(name, {})[column(r)] = r
    headers = [_HEADERS.get(k, k) for k in keys] + (["GPU"] if gpus else [])
    for group in _group_names(p, groups, qualifiers, rows) if p.across else [""]:
        for c in values:
            headers.append(c.header if not group else
                           group if len(values) == 1 else f"{group}: {c.header}")
    flagged: list[Column] = []

    # a flag says a point's times do not hold (attention's `impossible`): marked once a
    # point, on its first timed cell; a table of memory alone has none to mark
    timed = next((c for c in values if c.fmt == "mean_std"), None)

    def marked(c: Column, r: Row) -> str:
        why = [(f, f.cell(r)) for f in flags
               if c is timed and r.get("status") == "ok" and f.cell(r)]
        flagged.extend(f for f, _ in why if f not in flagged)
        return cell(c, r, spread=False) + "".join(f" ({f.header}: {w})" for f, w in why)

    body = [[*name, *(marked(c, by[g]) if g in by else "" for g in groups for c in values)]
            for name, by in table.items()]
    named = {*keys, *qualifiers, *([p.across] if p.across else []), *p.where}
    constant = ", ".join(c for c in (_constant(list(shows), named, rows),
                                     _by_group(p, grouped, rows)) if c)
    # a value column's sentences for a word in the table (`yours` of the user's rows) too
    said = [sentence for c in values for word, sentence in c.notes_if
            if any(word in str(x) for row in body for x in row)]
    note = " ".join(n for n in (p.note, *(c.note for c in values), *said,
                                *(f.note for f in flagged)) if n)
    return FilledTable(p.title, headers, body, note=note, constant=constant)


def tables(entry: Pivot | str | AsReported | Callable, rows: dict[str, list[Row]],
           catalog: Any, sections: dict[str, Section] | None = None) -> list[FilledTable]:
    """A problem's table entry over its rows by experiment: a Pivot, an experiment kind (its
    declared tables, settings every row shares lifted out), AsReported (the tables of its
    report section, as built in `sections` by kind), or a function of all the rows that
    returns a FilledTable or None (plan's closed forms)."""
    if isinstance(entry, Pivot):
        declared = next(e for e in catalog if e.kind == entry.experiment).tables
        # a pivot shows no flag column (Column.flag): it marks the point's cells
        flags = [c for c in declared[0].columns if c.flag]
        found = pivot(entry, rows.get(entry.experiment, []), shown(declared[0]), flags)
        return [found] if found else []
    if isinstance(entry, AsReported):
        built = (sections or {}).get(entry.experiment)
        return built.tables if built is not None else []
    if callable(entry):
        found = entry(latest([r for kind_rows in rows.values() for r in kind_rows]))
        return [found] if found else []
    experiment = next(e for e in catalog if e.kind == entry)
    return point_tables(experiment.tables, latest(rows.get(entry, [])), lift=1)
