"""Which runs are A and which are B in `--compare A B`: the invocations column both name
(label, GPU, commit or invocation id, in that order), a commit as one checkout (clean or
dirty), and each side's rows and invocations within the selection."""

from __future__ import annotations

import dataclasses
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from cs336sys.report.refs import resolve as resolve_ref
from cs336sys.report.sections import Row
from cs336sys.report.select import (
    Selection,
    SelectionError,
    invocations,
    like_prefix,
    load,
    present,
)


def resolve(conn: sqlite3.Connection, a: str, b: str) -> tuple[str, str, str]:
    """Which invocations column both A and B name, and A and B as that column holds them:
    'label' (the --label of an invocation, exactly), 'gpu' (exactly), 'commit' or
    'invocation' (a prefix). Exact names come first: a label such as "a" is also the prefix
    of some hex commit or invocation id. A commit is cs336sys's (git_commit) or the user's
    (user_commit), named by a prefix or a git ref of the current folder's repository
    (HEAD~1, a branch, a tag: report/refs.py), which becomes its full hash."""
    # the store is at the current schema (connect_readonly migrates a copy of an older one)
    probes = {
        "label": "SELECT 1 FROM invocations WHERE label = ? LIMIT 1",
        "gpu": "SELECT 1 FROM invocations WHERE gpu = ? LIMIT 1",
        "commit": "SELECT 1 FROM invocations WHERE (git_commit LIKE ? ESCAPE '\\' "
                  "OR user_commit LIKE ? ESCAPE '\\') LIMIT 1",
        "invocation": "SELECT 1 FROM invocations WHERE id LIKE ? ESCAPE '\\' LIMIT 1",
    }

    commits: dict[str, str] = {}  # token -> the commit it matched: a ref's hash, or itself

    def matches(k: str, value: str) -> bool:
        if k in ("commit", "invocation") and value != value.lower():
            # hashes and ids are stored in lower case, as git prints them; LIKE ignores case,
            # and the label `B` also read as the invocation `ba47a07d...`
            return False
        pat = value if k in ("gpu", "label") else like_prefix(value)
        # one `?` per place the value goes: a numbered `?1` with a sequence is an error from
        # Python 3.14 (a DeprecationWarning before)
        return conn.execute(probes[k], (pat,) * probes[k].count("?")).fetchone() is not None

    def kinds(token: str) -> list[str]:
        found = []
        for k in probes:
            if k != "commit":
                if matches(k, token):
                    found.append(k)
                continue
            bare = token.removesuffix(DIRTY)  # `abc1234-dirty`, as --history names it
            for value in dict.fromkeys(v for v in (resolve_ref(bare), bare) if v):
                if matches(k, value):
                    commits[token] = value
                    found.append(k)
                    break
        return found

    ka, kb = kinds(a), kinds(b)
    if not ka:
        raise SelectionError(f"--compare: {a!r} matches no commit, invocation id, label or GPU")
    if not kb:
        raise SelectionError(f"--compare: {b!r} matches no commit, invocation id, label or GPU")
    common = [k for k in ka if k in kb]
    if not common:
        cased = [lab for token in (a, b) for (lab,) in conn.execute(
            "SELECT DISTINCT label FROM invocations WHERE lower(label) = lower(?) AND "
            "label != ?", (token, token))]
        raise SelectionError(
            f"--compare: {a!r} is {_a(ka[0])} but {b!r} is {_a(kb[0])}"
            + (f"; labels match exactly: as stored, {', '.join(map(repr, cased))}"
               if cased else ""))
    kind = common[0]
    for token in (a, b):
        _one(conn, kind, commits.get(token, token), token)
    if kind == "commit":
        return kind, commits[a], commits[b]
    return kind, a, b


def _a(kind: str) -> str:
    return f"an {kind}" if kind[0] in "aeiou" else f"a {kind}"


def _one(conn: sqlite3.Connection, kind: str, value: str, typed: str) -> None:
    """A prefix that names two commits or two invocations is refused, as git refuses a short
    hash it cannot tell apart: `--compare a b` pooled every invocation whose id starts with
    `a` (an attention and a model run) into side A, where the labels were `A` and `B`."""
    if kind not in ("commit", "invocation"):
        return
    pat = like_prefix(value)
    query = ("SELECT DISTINCT id FROM invocations WHERE id LIKE ? ESCAPE '\\' ORDER BY id"
             if kind == "invocation" else
             "SELECT DISTINCT c FROM (SELECT git_commit AS c FROM invocations UNION "
             "SELECT user_commit FROM invocations) WHERE c LIKE ? ESCAPE '\\' ORDER BY c")
    found = [v for (v,) in conn.execute(query, (pat,))]
    if len(found) < 2:
        return
    cased = [lab for (lab,) in conn.execute(
        "SELECT DISTINCT label FROM invocations WHERE lower(label) = lower(?)", (typed,))]
    raise SelectionError(
        f"--compare: {typed!r} is the start of {len(found)} {kind}s "
        f"({', '.join(v[:12] for v in found[:4])}{', ...' if len(found) > 4 else ''}); give "
        f"more of it" + (f", or the label as stored ({', '.join(map(repr, cased))}: labels "
                         f"match exactly)" if cased else ""))


DIRTY = "-dirty"  # a commit side's suffix: the runs of a checkout of it with changes


def _side(sel: Selection, kind: str, token: str) -> Selection:
    return dataclasses.replace(sel, **{kind: token})  # the fields are named like the kinds


def _checkout(conn: sqlite3.Connection, side: Selection, typed: str) -> tuple[Selection, str]:
    """A commit side as one checkout: `X-dirty` its runs with uncommitted changes, `X` its
    clean runs, or the dirty ones where it has no clean run (then named `X-dirty`). A side
    pooled both, and the dirty runs measured other code under the commit's name."""
    if typed.endswith(DIRTY):
        return dataclasses.replace(side, dirty=True), typed
    clean, dirty = (dataclasses.replace(side, dirty=d) for d in (False, True))
    if present(conn, clean) or not present(conn, dirty):
        return clean, typed
    return dirty, typed + DIRTY


def _left_out(conn: sqlite3.Connection, side: Selection) -> str:
    """Why a side that names stored runs has none: `X-dirty` of a commit measured clean only,
    or the other filters."""
    if side.commit is not None and side.dirty and not present(
            conn, Selection(commit=side.commit, dirty=True)):
        return "with uncommitted changes: every run of its commit was of a clean checkout"
    return "in this selection (the other filters leave none of its runs)"


@dataclass
class Sides:
    """The runs of A and of B within a selection, and both together for the report."""

    kind: str  # 'commit', 'invocation' or 'gpu'
    a: dict[str, list[Row]]
    b: dict[str, list[Row]]
    rows: dict[str, list[Row]]  # A's and B's, each run once, oldest first
    invocations: list[dict[str, Any]]  # of A's and B's runs, by status (select.invocations)
    names: tuple[str, str] = ("A", "B")  # as typed, with the commit a git ref resolved to
    inv_a: list[dict[str, Any]] = field(default_factory=list)  # A's invocations alone
    inv_b: list[dict[str, Any]] = field(default_factory=list)


def sides(conn: sqlite3.Connection, sel: Selection, a: str, b: str, catalog: Sequence[Any]) -> Sides:
    """Load A's and B's runs; raises SelectionError when A or B names nothing."""
    typed = (a, b)
    kind, a, b = resolve(conn, a, b)
    sa, sb = _side(sel, kind, a), _side(sel, kind, b)
    if kind == "commit":
        (sa, ta), (sb, tb) = (_checkout(conn, s, t) for s, t in ((sa, typed[0]), (sb, typed[1])))
        typed = (ta, tb)
    per_side = [present(conn, sa), present(conn, sb)]  # each side's experiments
    for found, side, token in zip(per_side, (sa, sb), typed, strict=True):
        if not found:  # stored (resolve found it), but not in this selection
            raise SelectionError(f"--compare: {token!r} has no run {_left_out(conn, side)}")
    found = sorted({*per_side[0], *per_side[1]})
    rows_a, rows_b = load(conn, sa, catalog, found), load(conn, sb, catalog, found)
    ids_a, ids_b = ({r["run_id"] for rs in side.values() for r in rs} for side in (rows_a, rows_b))
    if ids_a & ids_b:  # two spellings of one commit or invocation, `X X-dirty` with no clean X
        said = "the same runs" if ids_a == ids_b else f"{len(ids_a & ids_b)} runs on both sides"
        raise SelectionError(f"--compare: {typed[0]!r} and {typed[1]!r} select {said}")
    rows: dict[str, list[Row]] = {}
    for exp in found:
        seen: dict[str, Row] = {}
        for r in (*rows_a.get(exp, []), *rows_b.get(exp, [])):
            seen.setdefault(r["run_id"], r)
        if seen:
            rows[exp] = sorted(seen.values(), key=lambda r: (r["created"] or "", r["run_id"]))
    inv_a, inv_b = invocations(conn, sa), invocations(conn, sb)
    invs = {(i["id"], i["_status"]): i for i in (*inv_a, *inv_b)}
    ordered = sorted(invs.values(), key=lambda i: (i["started"] or "", i["id"] or ""))
    names = tuple(t if t == r or r.startswith(t.removesuffix(DIRTY)) else f"{t} ({r[:10]})"
                  for t, r in zip(typed, (a, b), strict=True))
    return Sides(kind, rows_a, rows_b, rows, ordered, names, inv_a, inv_b)  # type: ignore[arg-type]
