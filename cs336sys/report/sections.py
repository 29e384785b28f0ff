"""Report sections: the tables and plots each experiment calls for, from its view's rows.

A table shows one line per measured point: the latest row stored for the same GPU and the
same settings (a re-run replaces an earlier one; `n` counts them). Metric cells of a point
that did not finish say why (OOM, error, skipped) instead of a number. An experiment's own
section lives with it (experiments/<kind>_section.py or its module), the declared tables
are drawn by tables.py, a section is put together by experiment_section.py; this module
holds the containers and shared helpers.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cs336sys.measure.sampling import drifted
from cs336sys.report.plots import Bars, Plot, Ranked, Series, Strips
from cs336sys.sweep.stopping import INTERRUPTED, TERMINATED

Row = dict[str, Any]
# Settings that say how a point was measured, not which point it is: more timed steps, or
# the same steps in more interleaved rounds, measure the same point (and rows stored before
# a command had --rounds are the points of rows stored after). The warm-up is not one of
# them: it changes what is measured (the warm-up study compares points that differ in it).
QUIET = frozenset({"device", "seed", "steps", "iters", "rounds", "snapshot"})
# Model dimensions that a size preset fixes: worth naming only when overridden.
BY_SIZE = ("d_model", "d_ff", "num_layers", "num_heads", "vocab_size")
# Settings whose unset value is a value: `model` unset is cs336sys's TransformerLM.
_UNSET_IS_A_VALUE = frozenset({"model"})
_CODE_SPAN = re.compile(r"`([^`\n]+)`")


def code_spans(note: str) -> list[tuple[str, bool]]:
    """A section note in pieces, (text, is_code): the spans its author put in backticks (a
    command to copy) are code in every format, the rest plain text; a lone backtick is text."""
    pieces, at = [], 0
    for m in _CODE_SPAN.finditer(note):
        if m.start() > at:
            pieces.append((note[at:m.start()], False))
        pieces.append((m.group(1), True))
        at = m.end()
    if at < len(note):
        pieces.append((note[at:], False))
    return pieces


@dataclass
class FilledTable:
    """A table with its cells written, as a report shows it: title, headers, rows of text.
    What an experiment declares (which columns, from which settings and metrics) is
    sweep.declaration.Table; report/tables.py fills one into this."""

    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    # Settings that are the same in every row, lifted out of the columns into one line
    # above the table ("ctx=512, batch=4"), so a wide table keeps only what tells rows apart.
    constant: str = ""
    # The columns that tell rows apart (GPU, settings): a table cut to fit a terminal repeats
    # them in every part. Empty: the first column.
    key: list[int] = field(default_factory=list)


@dataclass
class Figure:
    title: str
    name: str  # file name stem, unique in the report
    plot: Plot | Bars | Strips | Ranked | None = None  # drawn by render.build, all at once
    png: bytes = b""
    note: str = ""  # under the plot: what it leaves out ("showing 8 of 13 series; ...")


@dataclass
class Failure:
    """A point that was not measured, or measured wrong: why, in a line, and the full text
    (an error's traceback)."""

    status: str  # wrong | oom | error | skipped
    point: str  # the settings that tell it apart
    why: str  # the first line of runs.error
    detail: str = ""  # the rest of it: an error's traceback

    def tail(self, lines: int = 12, width: int = 110) -> list[str]:
        """For a printed page, which has no room for the whole traceback: `lines` lines from
        its last exception's (a Triton CompilationError under inductor's summary line, then
        the kernel source it points into), else its last lines, each cut to `width`."""
        every = [line.rstrip() for line in self.detail.splitlines() if line.strip()]
        last = max((i for i, line in enumerate(every) if _RAISED.match(line)), default=None)
        kept = every[last:last + lines] if last is not None else every[-lines:]
        return [line if len(line) <= width else line[:width - 3] + "..." for line in kept]


# A traceback's exception line: `triton.compiler.errors.CompilationError: at 33:20:`
_RAISED = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Interrupt|Exit|Warning)\b")


@dataclass
class Section:
    id: str
    title: str
    tables: list[FilledTable] = field(default_factory=list)
    figures: list[Figure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    failures: list[Failure] = field(default_factory=list)
    # rows of the tables linked to runs (kernel_stats), by run id, for the kind's section
    linked: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    collapsed: bool = False  # an analytic section: last, folded in the HTML


def add_plot(sec: Section, title: str, name: str, plot: Plot | Bars | Strips | Ranked,
             note: str = "") -> None:
    """Add the plot to the section unless it is only lone points (see Plot.informative)."""
    if plot.informative:
        sec.figures.append(Figure(title, name, plot=plot, note=note))


def failures(rows: list[Row]) -> list[Failure]:
    """The points of `rows` that are not ok, each with why (from runs.error), in row order."""
    labels = point_labels(rows) if rows else []
    out = []
    for r, label in zip(rows, labels, strict=True):
        if r.get("status") in (None, "ok"):
            continue
        why, _, detail = (r.get("error") or "").strip().partition("\n")
        why = why.removeprefix(f"{r['status']}: ")  # shown after the status already
        out.append(Failure(r["status"], label, why or r["status"], detail.strip()))
    return out


def compared(row: Row) -> bool:
    """Whether a point may stand beside others (a baseline, a ratio, a speed-up, a plotted
    line, a comparison across runs): it is ok, and nothing says its measurement is of other
    work than its settings name (`not_compared`: a PyTorch FlashAttention that ignores
    is_causal did non-causal work at a causal point)."""
    return row.get("status") == "ok" and not row.get("not_compared")


def skey(row: Row, drop: Iterable[str] = ()) -> str:
    """The point's identity: its settings as canonical JSON, without `drop` and without the
    QUIET ones (a re-run with more steps measures the same point)."""
    skip = QUIET | set(drop)
    # None is "does not apply", as for `varying`: a setting added later with None for what
    # was measured before (the model's `model`) leaves earlier rows the same points.
    s = {k: v for k, v in row["_settings"].items() if k not in skip and v is not None}
    return json.dumps(s, sort_keys=True, default=str)


def latest(rows: list[Row]) -> list[Row]:
    """The last row per (GPU, settings), in first-seen order, with `_n` = rows of that point
    and `_earlier` = its other rows, oldest first (what a newer run leaves out, such as a
    memory timeline that only a --snapshot run drew). A point SIGTERM stopped measured
    nothing: it hides no earlier row of the point."""
    out: dict[tuple, Row] = {}
    every: dict[tuple, list[Row]] = {}
    for r in rows:  # oldest first, so the last one wins
        k = (r.get("gpu"), skey(r))
        every.setdefault(k, []).append(r)
        if k not in out or not stopped(r):
            out[k] = r
    for k, r in out.items():
        r["_n"] = len(every[k])
        r["_earlier"] = [e for e in every[k] if e is not r]
    return list(out.values())


def stopped(row: Row) -> bool:
    """Whether the row is a point a signal stopped before it was measured (SIGTERM), or
    before its last round (either signal)."""
    return row.get("status") == "error" and str(row.get("error") or "").startswith(
        (TERMINATED, INTERRUPTED))


def ratio_side(value: Any) -> bool:
    """A value a ratio can be taken of: a nonzero finite number (an inf or NaN metric read
    back from the store is none, nor is 0)."""
    return bool(value) and math.isfinite(value)


def num(x: Any, digits: int = 3) -> str:
    """A number to `digits` significant figures; '' for missing."""
    if x is None:
        return ""
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, int):
        return str(x)
    if isinstance(x, float):
        if x == 0:
            return "0"
        short = f"{x:.{digits}g}"
        if abs(x) >= 10**digits or ("e" in short and abs(x) >= 1):  # 999.6 rounds to 1e+03
            return f"{x:,.0f}"
        return short
    return str(x)


def text(x: Any) -> str:
    return "" if x is None else num(x)


WRONG = "(wrong)"  # after a measured value of a point that failed its check


def status_or(row: Row, value: str) -> str:
    """The value for an ok point; the value marked (wrong) for a point measured but failing
    its check, nothing where it measured none (a forward-only point's backward); OOM /
    error / skipped for one that did not finish."""
    st = row.get("status")
    if st == "ok":
        return value
    if st == "wrong":
        return f"{value} {WRONG}" if value else ""  # a column it never measured
    return "OOM" if st == "oom" else st or ""


def point_labels(heads: list[Row]) -> list[str]:
    """Each point named by the settings that tell it apart from the others (all its settings
    when alone, but the dimensions its size preset names), and its GPU when they are on
    several."""
    alone = set(heads[0]["_settings"]) - QUIET if heads else set()
    if "size" in alone:
        alone -= set(BY_SIZE)
    keys = varying(heads) or sorted(alone)
    many = several_gpus(heads)
    return [" ".join([f"{k}={text(r['_settings'].get(k))}" for k in keys
                      if r["_settings"].get(k) is not None]
                     + ([f"on {text(r.get('gpu'))}"] if many else []))
            for r in heads]


def samples_of(samples: Any) -> dict[str, Any]:
    """A run's samples, from their JSON where a row keeps it so; {} for none or bad JSON."""
    if isinstance(samples, (str, bytes)):
        try:
            samples = json.loads(samples)
        except ValueError:
            return {}
    return samples if isinstance(samples, dict) else {}


def timed_samples(samples: Any, name: str) -> list[float]:
    """The timed samples of the metric `name` in a run's samples JSON (report/compare.py's
    docstring for the layouts); [] when there are none."""
    samples = samples_of(samples)
    if _numbers(samples.get(name)):
        return [float(v) for v in samples[name]]
    ranks = samples.get("ranks")
    if isinstance(ranks, list) and ranks and all(isinstance(r, dict) for r in ranks):
        base = name.removesuffix("_ms")
        per = [r.get(base, r.get(name)) for r in ranks]
        if all(_numbers(p) for p in per) and len({len(p) for p in per}) == 1:
            return [float(max(step)) for step in zip(*per, strict=True)]
    per = [v for k, v in samples.items() if re.fullmatch(r"rank\d+", k)]
    if per and all(_numbers(p) for p in per) and len({len(p) for p in per}) == 1:
        return [sum(step) / len(step) for step in zip(*per, strict=True)]
    return []


def _numbers(v: Any) -> bool:
    return (
        isinstance(v, list)
        and bool(v)
        and all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v)
    )


def median_or_mean(row: Row, base: str) -> float | None:
    """The point's median of `base` (`step_ms`), what ratios compare; its mean where a row
    was stored without one."""
    return row.get(f"{base}_median") or row.get(f"{base}_mean")


def sample_count(row: Row, base: str | None = None) -> int | None:
    """How many timed samples a row's statistics of `base` come from: the count stored
    with them (`<base>_n`), else (rows stored before counts were) the raw samples' count,
    else its `iters` setting, which a point past its time budget may not have reached (one
    sample of 100 asked: `60 (n=1)`, not `60 ± 0`)."""
    n = row.get(f"{base}_n") if base else None
    if n is None and base:
        n = len(timed_samples(row.get("_samples"), base)) or None
    if n is None:
        n = row.get("iters")
    return n if isinstance(n, int) and not isinstance(n, bool) else None


def mean_std(row: Row, mean: str, std: str, digits: int = 3) -> str:
    """`mean ± std`; one sample has no spread, so it reads `value (n=1)`, not `± 0`. A count
    other than the `iters` the point asked for (do_bench's own, or more for --min-time) is
    written beside it, `(n=14)`; a drift past 3 % between the first and last third of the
    samples too, `(drift +5%)`."""
    m, s = row.get(mean), row.get(std)
    if m is None:
        return status_or(row, "")
    base = mean.removesuffix("_mean")
    n = sample_count(row, base)
    if n == 1:
        return status_or(row, f"{num(m, digits)} (n=1)")
    text = num(m, digits) + ("" if s is None else f" ± {num(s, 2)}")
    if n is not None and n != row.get("iters") and row.get("iters") is not None:
        text += f" (n={n})"
    drift = row.get(f"{base}_drift")
    if drifted(drift):
        text += f" (drift {drift:+.0%})"
    return status_or(row, text)


def mib(x: Any) -> str:
    """MiB to one decimal; under 0.1, two significant figures (a point's 33 KB read `0.0`
    beside another's `0.1`, and the comparison asked for could not be read)."""
    return "" if x is None else _one_decimal(x / 2**20)


def gib(x: Any) -> str:
    """GiB as `mib` gives MiB (a tiny model's plan read 0.0 in every memory column)."""
    return "" if x is None else _one_decimal(x / 2**30)


def _one_decimal(v: float) -> str:
    return f"{v:,.1f}" if v == 0 or abs(v) >= 0.095 else f"{v:.2g}"


def pct(x: Any) -> str:
    return "" if x is None else f"{100 * x:.1f}%"


def varying(rows: list[Row], shown: Iterable[str] = ()) -> list[str]:
    """Setting keys (QUIET and `shown` aside) whose value differs between rows, sorted.

    Unset (None) is "does not apply", not a value: sdpa_backend, set for sdpa rows only,
    does not differ between naive and sdpa rows; the impl column tells them apart. But for
    `model`: the user's model beside cs336sys's (unset) differs from it.
    """
    skip = QUIET | set(shown)
    keys = sorted({k for r in rows for k in r["_settings"]} - skip)

    def differs(k: str, within: str | None = None) -> bool:
        seen: dict[Any, set[str]] = {}
        for r in rows:
            s = r["_settings"]
            if s.get(k) is not None or k in _UNSET_IS_A_VALUE:
                seen.setdefault(s.get(within) if within else None, set()).add(
                    json.dumps(s.get(k), default=str)
                )
        return any(len(v) > 1 for v in seen.values())

    return [k for k in keys if differs(k, "size" if k in BY_SIZE else None)]


_SHAPE = ("size", "d_model", "num_layers", "num_heads", "d_ff", "vocab_size", "model")


def sized(rows: list[Row]) -> list[Row]:
    """Rows without a parameter count (a point that failed or was skipped before it counted
    them) given that of a row of the same model and shape: the size cell then reads alike
    (`tiny (512×4, 23M)`, not `tiny (512×4)` beside it), and one size is one row of a table
    and one value of its "Same in every row" line, not two."""
    def shape(r: Row) -> tuple:
        settings = r.get("_settings") or {}
        return tuple(repr(settings.get(k)) for k in _SHAPE)

    known = {shape(r): r["params"] for r in rows if r.get("params")}
    return [{**r, "params": known[shape(r)]} if not r.get("params") and shape(r) in known
            else r for r in rows]


def several_gpus(rows: Iterable[Row]) -> bool:
    """Whether `rows` come from more than one GPU: where a table or title must name it."""
    return len({r.get("gpu") for r in rows}) > 1


def with_gpu(
    rows: list[Row], headers: list[str], cells: Callable[[Row], list[str]], shown: Iterable[str]
) -> FilledTable:
    """A table, with a leading GPU column only when the rows come from more than one GPU,
    and a trailing "other settings" column naming the settings outside `shown` that differ
    between rows (e.g. `attention=flash-torch`), so two lines never look like one point."""
    many = several_gpus(rows)
    extra = varying(rows, shown)
    body = [
        ([text(r.get("gpu"))] if many else [])
        + cells(r)
        + ([" ".join(f"{k}={text(r['_settings'][k])}" for k in extra
                     if r["_settings"].get(k) is not None)] if extra else [])
        for r in rows
    ]
    return FilledTable("", (["gpu"] if many else []) + headers + (["other settings"] if extra else []),
                 body)


def left_out(kept: Sequence[str], every: Sequence[str], what: str = "series", most: int = 10) -> str:
    """The note under a capped plot: how many of `every` it shows and which it leaves out
    (the first `most` by name, then a count); '' when nothing is left out."""
    missing = [k for k in every if k not in set(kept)]
    if not missing:
        return ""
    names = ", ".join(missing[:most])
    if len(missing) > most:
        names += f" and {len(missing) - most} more"
    return f"Showing {len(every) - len(missing)} of {len(every)} {what}; left out: {names}."


def panels(
    rows: list[Row],
    x: str,
    y: str,
    facet: str | None = None,
    scale: float = 1.0,
    first: Sequence[str] = (),
    named: Mapping[str, Callable[[Row], str]] | None = None,
) -> dict[str, Series]:
    """The ok rows as lines of (x, y): one line per point identity without `x` (GPU included),
    in one panel per value of `facet` (one panel titled "" without it). An out-of-memory
    point is (x, None) on its line: the plot marks the size that failed.

    A line's label names only what tells it apart from the other lines (`impl=triton
    dtype=bf16`, plus the GPU when there are several), `first` keys leading; the same line
    has the same label in every panel. `named` gives a key's value as its table shows it
    (`impl=sdpa[cudnn]`: the backend that ran, where the setting says auto).
    """
    groups: dict[tuple, list[Row]] = {}
    for r in rows:
        measured = compared(r) and r.get(y) is not None
        if r.get(x) is not None and (measured or r.get("status") == "oom"):
            groups.setdefault((r.get("gpu"), skey(r, drop=(x,))), []).append(r)
    heads = [g[0] for g in groups.values()]
    keys = varying(heads, shown=(x, facet) if facet else (x,))
    keys = [k for k in first if k in keys] + [k for k in keys if k not in first]
    if not keys:  # one line: name it by its leading settings
        keys = [k for k in first if heads and k in heads[0]["_settings"]]
    many_gpus = several_gpus(heads)
    out: dict[str, Series] = {}
    for g in sorted(groups.values(), key=lambda g: _order(g[0]["_settings"].get(facet))):
        s = g[0]["_settings"]
        label = " ".join([f"{k}={(named or {})[k](g[0]) if k in (named or {}) else text(s[k])}"
                          for k in keys if s.get(k) is not None]
                         + ([text(g[0].get("gpu"))] if many_gpus else [])) or y
        panel = f"{facet}={text(s.get(facet))}" if facet else ""
        out.setdefault(panel, {})[label] = [
            (r[x], None if r.get("status") == "oom" else r[y] * scale) for r in g]
    return out


def series(rows: list[Row], x: str, y: str, scale: float = 1.0, first: Sequence[str] = ()) -> Series:
    """panels() without facets: the one panel's lines ({} when no row has both x and y)."""
    return panels(rows, x, y, scale=scale, first=first).get("", {})


def _order(v: Any) -> tuple:
    """Numbers before text, numbers by value: panels d=16, 32, 64, 128 in that order."""
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))
