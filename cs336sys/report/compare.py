"""`--compare A B`: the same points measured two ways, side by side with the ratio B/A.

A and B are two git commits (prefixes allowed), two invocation ids (prefixes allowed) or two
GPU names; which one is found by matching the invocations table, in that order. Points match
when experiment and settings are equal. A change is flagged only when it exceeds the noise:
the two runs' min–max ranges do not overlap (each mean lies outside the other's spread) and
the means differ by more than 5%. Where a metric has no min/max (peak memory), the 5% rule
alone decides. This is the usual "ranges disjoint and effect above threshold" test used for
benchmark regressions (e.g. pyperf's `compare_to` and asv's `continuous` both refuse to call
a change significant while the samples overlap).
"""

from __future__ import annotations

import dataclasses
import sqlite3
from typing import Any

from cs336sys.bench.declaration import catalog
from cs336sys.report.sections import QUIET, Row, Table, num, skey, text, varying
from cs336sys.report.select import Selection, SelectionError, load

THRESHOLD = 0.05


def metrics() -> dict[str, tuple[str, str, str | None, str | None]]:
    """experiment -> (metric label, mean column, min column, max column): the metric each
    experiment declares for comparison (bench/declaration.py, `compare`)."""
    out = {}
    for e in catalog():
        if e.compare is not None:
            label, mean, _unit, lo, hi = e.compare_columns()
            out[e.kind] = (label, mean, lo, hi)
    return out


def resolve(conn: sqlite3.Connection, a: str, b: str) -> str:
    """Which invocations column both A and B name: 'commit', 'invocation' or 'gpu'."""
    probes = {
        "commit": "SELECT 1 FROM invocations WHERE git_commit LIKE ? ESCAPE '\\' LIMIT 1",
        "invocation": "SELECT 1 FROM invocations WHERE id LIKE ? ESCAPE '\\' LIMIT 1",
        "gpu": "SELECT 1 FROM invocations WHERE gpu = ? LIMIT 1",
    }

    def kinds(token: str) -> list[str]:
        pat = token.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
        return [k for k, q in probes.items()
                if conn.execute(q, (token if k == "gpu" else pat,)).fetchone()]  # fmt: skip

    ka, kb = kinds(a), kinds(b)
    if not ka:
        raise SelectionError(f"--compare: {a!r} matches no commit, invocation id or GPU")
    if not kb:
        raise SelectionError(f"--compare: {b!r} matches no commit, invocation id or GPU")
    common = [k for k in ka if k in kb]
    if not common:
        raise SelectionError(f"--compare: {a!r} is a {ka[0]} but {b!r} is a {kb[0]}")
    return common[0]


def _side(sel: Selection, kind: str, token: str) -> Selection:
    field = {"commit": "commit", "invocation": "invocation", "gpu": "gpu"}[kind]
    return dataclasses.replace(sel, **{field: token})


def _aggregate(rows: list[Row], metric: tuple) -> dict[str, dict[str, Any]]:
    """Per point: mean of the runs' means, lowest min, highest max (ok runs only)."""
    _, mean, lo, hi = metric
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r["status"] != "ok" or r.get(mean) is None:
            continue
        p = out.setdefault(skey(r), {"means": [], "lo": None, "hi": None, "row": r})
        p["means"].append(r[mean])
        for col, which, pick in ((lo, "lo", min), (hi, "hi", max)):
            if col and r.get(col) is not None:
                p[which] = r[col] if p[which] is None else pick(p[which], r[col])
    for p in out.values():
        p["mean"] = sum(p["means"]) / len(p["means"])
    return out


def changed(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """More than 5% apart and outside each other's min–max (when both ranges are known)."""
    if a["mean"] == 0 or abs(b["mean"] / a["mean"] - 1) <= THRESHOLD:
        return False
    if None in (a["lo"], a["hi"], b["lo"], b["hi"]):
        return True
    return b["lo"] > a["hi"] or b["hi"] < a["lo"]


def label(row: Row, keys: list[str]) -> str:
    return " ".join(f"{k}={text(row['_settings'].get(k))}" for k in keys)


def compare(conn: sqlite3.Connection, sel: Selection, a: str, b: str) -> tuple[str, list[Table]]:
    """('commit' | 'invocation' | 'gpu', one table per experiment with matching points)."""
    kind = resolve(conn, a, b)
    rows_a, rows_b = load(conn, _side(sel, kind, a)), load(conn, _side(sel, kind, b))
    tables = []
    declared = metrics()
    for exp in sorted(set(rows_a) & set(rows_b)):
        if exp not in declared:
            continue
        pa, pb = _aggregate(rows_a[exp], declared[exp]), _aggregate(rows_b[exp], declared[exp])
        both = sorted(set(pa) & set(pb))
        # Name a point by what tells it apart from the others (all its settings if alone).
        heads = [pa[k]["row"] for k in both]
        keys = varying(heads) or sorted(set(heads[0]["_settings"]) - QUIET) if heads else []
        body = []
        for key in both:
            x, y = pa[key], pb[key]
            ratio = y["mean"] / x["mean"] if x["mean"] else float("nan")
            flag = f"changed {100 * (ratio - 1):+.0f}%" if changed(x, y) else ""
            body.append([label(x["row"], keys), num(x["mean"]), num(y["mean"]), f"{ratio:.3f}",
                         _range(x), _range(y), flag])  # fmt: skip
        if body:
            metric = declared[exp][0]
            tables.append(Table(f"{exp}: {metric}", ["point", f"A {metric}", f"B {metric}", "B/A",
                                                     "A min–max", "B min–max", "flag"], body))  # fmt: skip
    return kind, tables


def _range(p: dict[str, Any]) -> str:
    return "" if p["lo"] is None or p["hi"] is None else f"{num(p['lo'])}–{num(p['hi'])}"
