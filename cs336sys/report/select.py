"""Which stored runs a report covers: time range, experiment, GPU, commit and settings filters.

Every user value reaches SQLite as a bound parameter (`?`), never spliced into the SQL text:
`--where "size=x'; DROP TABLE runs; --"` is just a value that matches no row. Setting keys
go into a JSON path (`'$.' || ?`), so they are checked to be plain identifiers first.
Times are compared as text in the store's own format ('YYYY-MM-DD HH:MM:SS.ffffff', UTC),
which sorts like the instants it names.
"""

from __future__ import annotations

import dataclasses
import json
import re
import sqlite3
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta, timezone
from typing import Any

from cs336sys.measure.units import parse_size
from cs336sys.report import refs
from cs336sys.store.db import NONFINITE
from cs336sys.store.schema import RENAMED_SETTINGS
from cs336sys.store.views import typed
from cs336sys.sweep.declaration import experiment_of
from cs336sys.sweep.points import closest
from cs336sys.sweep.stopping import EXIT_CODES

FMT = "%Y-%m-%d %H:%M:%S.%f"
_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AGO = re.compile(r"^(\d+)\s*([dhw])$")
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})$")
_HEX = re.compile(r"[0-9a-fA-F]{1,40}")  # a commit hash or its prefix, as stored


def views_of(catalog: Sequence[Any]) -> dict[str, str]:
    """Experiment kind -> its view, as `catalog` (experiments/catalog.py) declares them."""
    return {e.kind: e.view for e in catalog}


class SelectionError(ValueError):
    """A filter the user gave cannot be understood; the message names it."""


def parse_time(text: str, now: datetime, end: bool = False) -> str:
    """`today`, `yesterday`, `HH:MM` (today), `7d`/`12h`/`2w` (ago), an ISO date or datetime
    -> the store's format (UTC).

    Words, clock times, dates and datetimes without an offset are the machine's local time,
    with the offset in force on that date (summer time or not): `--since today` at 4 pm in
    California covers that morning, which the UTC day does not, and `2026-07-01` there starts
    at 07:00 UTC in July, 08:00 in January. A datetime with an offset (`Z`, `+02:00`) is taken
    as it says. With end=True (for --until) a whole day (`today`, `2026-01-05`, `20260105`,
    `2026-01-05Z`) means the end of that day, so `--since 2026-01-05 --until 2026-01-05` is
    that one day.
    """
    s = text.strip().lower()
    today = now.astimezone().date()  # the machine's local day
    days = timedelta(days=1) if end else timedelta(0)
    if s == "today":
        return _utc(_local(datetime.combine(today + days, time())))
    if s == "yesterday":
        return _utc(_local(datetime.combine(today - timedelta(days=1) + days, time())))
    m = _CLOCK.match(s)
    if m:
        hour, minute = int(m.group(1)), int(m.group(2))
        if hour > 23 or minute > 59:
            raise SelectionError(f"time {text!r}: no such time of day")
        return _utc(_local(datetime.combine(today, time(hour, minute))))
    m = _AGO.match(s)
    if m:
        n, unit = int(m.group(1)), m.group(2)
        try:
            delta = {"d": timedelta(days=n), "h": timedelta(hours=n), "w": timedelta(weeks=n)}[unit]
            return _utc(now - delta)
        except OverflowError:
            raise SelectionError(f"time {text!r} is further back than dates go") from None
    try:
        day = _whole_day(s)
        if day is not None:  # a whole day, local
            return _utc(_local(datetime.combine(day + days, time())))
        m = _DAY_IN.fullmatch(s)
        day = _whole_day(m.group(1)) if m else None
        if day is not None:  # a whole day in the offset it carries
            zone = datetime.fromisoformat("2000-01-01T00:00" + m.group(2).replace(
                "z", "+00:00")).tzinfo
            return _utc(datetime.combine(day + days, time(), zone))
        t = datetime.fromisoformat(text.strip().replace("Z", "+00:00").replace("z", "+00:00"))
        return _utc(t if t.tzinfo is not None else _local(t))
    except SelectionError:
        raise
    except (ValueError, OverflowError):
        raise SelectionError(
            f"cannot read time {text!r}: use today, yesterday, 13:30, 7d, 12h, 2026-01-05 or "
            "2026-01-05T13:00 (local time unless it carries an offset such as Z)"
        ) from None


_DAY_IN = re.compile(r"(.+?)(z|[+-]\d{2}(?::?\d{2})?)")  # an ISO date and an offset after it


def _whole_day(text: str) -> date | None:
    """The day an ISO date names (`2026-01-05`, `20260105`, `2026-W02-1`), None for text that
    is not a date alone."""
    try:
        return date.fromisoformat(text.upper())  # the week's W in any case
    except ValueError:
        return None


def _local(naive: datetime) -> datetime:
    """A wall-clock time of this machine's zone, with the offset in force at that time (the
    zone's rules, not today's offset: summer time starts and ends). A time the clocks show
    twice is its first instant; one they skip (a midnight where summer time starts at 00:00,
    as in Santiago) the instant they jump at, so that a day starts when its first hour does."""
    try:
        both = [naive.replace(fold=fold).astimezone() for fold in (0, 1)]
        shown = [t for t in both if t.astimezone().replace(tzinfo=None) == naive]
        if shown:
            return min(shown)
        # skipped: the first wall-clock minute after it that the clocks show (gaps are whole
        # quarter hours, at most a few hours), its instant the one they jump at
        later = naive.replace(second=0, microsecond=0)
        for _ in range(24 * 60):
            later += timedelta(minutes=1)
            t = later.astimezone()
            if t.astimezone().replace(tzinfo=None) == later:
                return t
        return max(both)
    except (OverflowError, OSError, ValueError):
        raise SelectionError(f"time {naive.isoformat()} is beyond the dates the store can hold"
                             ) from None


def _utc(t: datetime) -> str:
    """An aware time in the store's format (UTC, naive text)."""
    try:
        return t.astimezone(timezone.utc).strftime(FMT)
    except OverflowError:
        raise SelectionError(f"time {t.isoformat()} is beyond the dates the store can hold") from None


def time_range(since: str | None, until: str | None, now: datetime) -> tuple[str | None, str | None]:
    """--since and --until read by parse_time; an empty or inverted range is an error that
    names both ends as the store compares them (UTC) and as typed."""
    def read(option: str, text: str | None, end: bool = False) -> str | None:
        try:
            return parse_time(text, now, end=end) if text is not None else None
        except SelectionError as exc:
            raise SelectionError(f"{option}: {exc}") from None

    start, stop = read("--since", since), read("--until", until, end=True)
    if start is not None and stop is not None and start >= stop:
        raise SelectionError(
            f"--since {since} --until {until} is an empty range: from {start[:19]} to "
            f"{stop[:19]} UTC (--until must come after --since)"
        )
    return start, stop


# --where keys that are the invocation's, not a setting of the point (`--label`).
INVOCATION_KEYS = ("label", "host", "command")


def known_keys(catalog: Sequence[Any]) -> set[str]:
    """What --where may name: any declared experiment's settings, and INVOCATION_KEYS."""
    return {k for e in catalog for k in e.settings} | set(INVOCATION_KEYS)


def parse_where(items: list[str], catalog: Sequence[Any]) -> list[tuple[str, str]]:
    """`KEY=VALUE` on settings or INVOCATION_KEYS; the key must be one of known_keys() (a
    typo would otherwise select nothing, silently) and a plain identifier (it enters a
    JSON path)."""
    out = []
    known, sized = known_keys(catalog), _sized(catalog)
    for item in items:
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()  # `impl= naive` selected nothing
        if not sep or not _KEY.match(key):
            raise SelectionError(f"--where {item!r}: expected KEY=VALUE with KEY a setting name")
        if key not in known:
            valid = sorted(known - set(INVOCATION_KEYS))
            renamed = RENAMED_SETTINGS.get(key)
            near = _headed(catalog).get(key) or closest(key, sorted(known))
            hint = (f"; it is {renamed!r} now (rows stored under the old name read as that)"
                    if renamed else f"; did you mean {near!r}?" if near else "")
            raise SelectionError(f"--where {item!r}: no experiment has a setting {key!r}{hint} "
                                 f"(the settings: {', '.join(valid)}; of the invocation: "
                                 f"{', '.join(INVOCATION_KEYS)})")
        try:
            _typed(value)
        except ValueError as exc:
            raise SelectionError(f"--where {item!r}: {exc}") from None
        out.append((key, _in_bytes(value) if key in sized else value))
    return out


def _sized(catalog: Sequence[Any]) -> set[str]:
    """The settings the tables print as sizes (comm's `bytes`: `1MB`)."""
    return {c.key for e in catalog for t in e.tables for c in t.columns
            if getattr(c, "setting", False) and getattr(c, "fmt", None) == "size"
            and isinstance(c.key, str)}


def _in_bytes(value: str) -> str:
    """A size as the command took it and the table prints it (`1MB`, `1MiB`) as the bytes
    stored; anything else as typed."""
    try:
        return str(parse_size(value))
    except ValueError:
        return value


def also_headers(where: Sequence[str], catalog: Sequence[Any]) -> list[str]:
    """`size is also the header of the setting bytes`: the --where keys that are a setting
    of one experiment and the column header of another's (what a selection that matched
    nothing may have meant)."""
    known, headed = known_keys(catalog), _headed(catalog)
    keys = dict.fromkeys(w.partition("=")[0].strip() for w in where)
    return [f"{k} is also the header of the setting {headed[k]}" for k in keys
            if k in known and k in headed]


@dataclass(frozen=True)
class Selection:
    since: str | None = None
    until: str | None = None
    experiments: tuple[str, ...] = ()
    gpu: str | None = None
    commit: str | None = None  # a prefix of cs336sys's commit or of the user's (report/refs.py)
    dirty: bool | None = None  # with `commit`: only runs of a dirty (or a clean) checkout of it
    commits: tuple[str, ...] | None = None  # exactly these commits (`--since REF`), either column
    invocation: str | None = None
    label: str | None = None  # the invocation's --label, exactly
    handout: str | None = None  # runs of this handout release, or of none recorded
    where: tuple[tuple[str, str], ...] = field(default_factory=tuple)

    def clause(self) -> tuple[str, list[Any]]:
        """SQL condition over `runs r` joined with `invocations i`, and its parameters."""
        conds: list[str] = []
        params: list[Any] = []
        if self.since:
            conds.append("r.created >= ?")
            params.append(self.since)
        if self.until:
            conds.append("r.created < ?")
            params.append(self.until)
        if self.experiments:
            conds.append(f"r.experiment IN ({', '.join('?' * len(self.experiments))})")
            params.extend(self.experiments)
        if self.gpu:
            conds.append("i.gpu = ?")
            params.append(self.gpu)
        if self.commit:
            # A prefix, as people type short hashes; LIKE wildcards in the value are escaped.
            # The commit of cs336sys's code or of the user's code measured (cs336sys.yours).
            if self.dirty is None:
                conds.append("(i.git_commit LIKE ? ESCAPE '\\' OR i.user_commit LIKE ? ESCAPE '\\')")
                params.extend([like_prefix(self.commit)] * 2)
            else:  # the dirty flag of the checkout the commit matched
                conds.append("((i.git_commit LIKE ? ESCAPE '\\' AND coalesce(i.git_dirty, 0) = ?) "
                             "OR (i.user_commit LIKE ? ESCAPE '\\' AND coalesce(i.user_dirty, 0) = ?))")
                params.extend([like_prefix(self.commit), int(self.dirty)] * 2)
        if self.commits is not None:
            marks = ", ".join("?" * len(self.commits)) or "NULL"
            conds.append(f"(i.git_commit IN ({marks}) OR i.user_commit IN ({marks}))")
            params.extend([*self.commits, *self.commits])
        if self.invocation:
            conds.append("r.invocation_id LIKE ? ESCAPE '\\'")
            params.append(like_prefix(self.invocation))
        if self.label is not None:
            conds.append("i.label = ?")
            params.append(self.label)
        if self.handout is not None:
            cond, values = of_handout(self.handout)
            conds.append(cond)
            params.extend(values)
        for key, value in self.where:
            if key in INVOCATION_KEYS:  # the invocation's own column; never a setting name
                conds.append(f"lower(i.{key}) = lower(?)")  # in any case, as a setting
                params.append(value)
                continue
            # Typed values (16, true) and text both match: the JSON value or its text form, in
            # any case, as the commands read a size (`--size 8B` stores 8b)
            conds.append(
                "(json_extract(r.settings, '$.' || ?) = ? "
                "OR lower(CAST(json_extract(r.settings, '$.' || ?) AS TEXT)) = lower(?))"
            )
            params.extend([key, _typed(value), key, value])
        return (" AND ".join(conds) or "1"), params


def selected(*, since: str | None, until: str | None, gpu: str | None, commit: str | None,
             where: list[str] | None, catalog: Sequence[Any], now: datetime,
             experiments: Sequence[str] = ()) -> Selection:
    """The runs that report's and db export's filters select. --since is a time, or a git ref
    of this folder's repository: that commit and the later ones up to HEAD, cs336sys's or the
    user's code's; --commit a prefix or a git ref. SelectionError names a bad filter."""
    for name, value in (("--gpu", gpu), ("--commit", commit)):
        if value is not None and not value.strip():  # empty never quietly means "all"
            raise SelectionError(f"{name}: empty value; give one, or leave {name} out")
    since_commits = None
    if since is not None:
        try:
            parse_time(since, now)
        except SelectionError as exc:
            since_commits = refs.since(since)
            if since_commits is None:
                raise SelectionError(
                    f"--since: {exc}; nor is it a git ref of this folder's repository") from None
    start, stop = time_range(None if since_commits else since, until, now)
    resolved = refs.resolve(commit) if commit else None
    if commit and resolved is None and not _HEX.fullmatch(commit):
        raise SelectionError(f"--commit {commit}: not a commit hash or prefix, nor a git ref "
                             "of this folder's repository")
    return Selection(
        since=start,
        until=stop,
        experiments=tuple(experiments),
        gpu=gpu,
        commit=(resolved or commit) if commit else None,
        commits=tuple(since_commits) if since_commits is not None else None,
        where=tuple(parse_where(where or [], catalog)),
    )


def check_gpu(conn: sqlite3.Connection, gpu: str | None) -> None:
    """SelectionError where --gpu names no GPU of the store: the name is matched whole (as
    --compare takes one), so `H100` selected nothing, silently; the stored names are given."""
    if gpu is None:
        return
    stored = [g for (g,) in conn.execute(
        "SELECT DISTINCT gpu FROM invocations WHERE gpu IS NOT NULL ORDER BY gpu")]
    if gpu not in stored:
        near = [g for g in stored if gpu.lower() in g.lower()]
        raise SelectionError(f"--gpu {gpu!r}: no stored run is on that GPU (the name must be "
                             f"whole{f'; did you mean {near[0]!r}?' if near else ''}); "
                             f"stored: {', '.join(stored) or 'none'}")


def of_handout(release: str) -> tuple[str, list[str]]:
    """SQL condition on `invocations i`: a run of the handout `release`, as `handout run`
    records it (CS336SYS_HANDOUT in the invocation's env), or of none recorded (a run by
    hand, or stored before it was): a problem's 2025 runs are not the 2026 one's."""
    return "coalesce(json_extract(i.env, '$.CS336SYS_HANDOUT'), ?) = ?", [release, release]


def like_prefix(value: str) -> str:
    """`value` as a LIKE pattern for the strings that start with it (wildcards escaped)."""
    return value.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _headed(catalog: Sequence[Any]) -> dict[str, str]:
    """The setting under each column header that differs from its name (`ckpt`:
    `checkpoint`), as the report's tables print them."""
    return {c.header: c.key for e in catalog for t in e.tables for c in t.columns
            if getattr(c, "setting", False) and isinstance(c.key, str) and c.key != c.header}


def _typed(value: str) -> Any:
    """As the settings JSON holds it: numbers as numbers, true/false as SQLite's 1/0, and
    yes/no too, as the report's tables print a switch (`compile=no`)."""
    low = value.strip().lower()
    if low in ("true", "false", "yes", "no"):
        return 1 if low in ("true", "yes") else 0
    return typed(value)


def present(conn: sqlite3.Connection, sel: Selection) -> list[str]:
    """The experiments with selected runs, sorted."""
    where, params = sel.clause()
    return sorted(
        e for (e,) in conn.execute(
            "SELECT DISTINCT r.experiment FROM runs r LEFT JOIN invocations i "
            f"ON i.id = r.invocation_id WHERE {where}", params,
        )
    )


def load(
    conn: sqlite3.Connection, sel: Selection, catalog: Sequence[Any], found: list[str] | None = None
) -> dict[str, list[dict[str, Any]]]:
    """Rows of each experiment's view (plus settings and samples JSON), oldest first;
    `found` is present(conn, sel) when the caller has it already."""
    where, params = sel.clause()
    views = views_of(catalog)
    out: dict[str, list[dict[str, Any]]] = {}
    for exp in present(conn, sel) if found is None else found:
        view = views.get(exp)
        if view is None:
            continue  # an experiment this version has no view for
        sql = (
            f'SELECT v.*, r.settings AS _settings, r.samples AS _samples, '
            f"json_extract(r.metrics, '$.{NONFINITE}') AS _nonfinite FROM \"{view}\" v "
            "JOIN runs r ON r.id = v.run_id LEFT JOIN invocations i ON i.id = r.invocation_id "
            f"WHERE {where} ORDER BY r.created, r.id"
        )
        cur = conn.execute(sql, params)
        names = [d[0] for d in cur.description]
        rows = []
        for values in cur:
            row = dict(zip(names, values, strict=True))
            row["_settings"] = json.loads(row["_settings"] or "{}")
            # a metric that came out inf or NaN: null in its column, its value kept apart
            for name, value in json.loads(row.pop("_nonfinite") or "{}").items():
                if name in row and row[name] is None:
                    row[name] = float(value)
            rows.append(row)
        out[exp] = rows
    return out


def invocations(conn: sqlite3.Connection, sel: Selection) -> list[dict[str, Any]]:
    """The invocations behind the selected runs, with their run counts by status; then those
    that stored no run and never ended normally (`_n` 0), as `unstored` selects them."""
    where, params = sel.clause()
    cur = conn.execute(
        "SELECT i.*, r.status AS _status, count(*) AS _n FROM runs r "
        f"LEFT JOIN invocations i ON i.id = r.invocation_id WHERE {where} "
        "GROUP BY r.invocation_id, r.status ORDER BY i.started, i.id",
        params,
    )
    names = [d[0] for d in cur.description]
    return [dict(zip(names, v, strict=True)) for v in cur] + unstored(conn, sel)


def unstored(conn: sqlite3.Connection, sel: Selection) -> list[dict[str, Any]]:
    """The invocations that stored no run and never ended normally (killed or stopped before
    their first point, or still running it) that the selection takes, by their start time,
    command and their own columns: a sweep with every point missing. None where the
    selection names a setting (no run of theirs has one)."""
    if any(key not in INVOCATION_KEYS for key, _ in sel.where):
        return []
    own = dataclasses.replace(sel, since=None, until=None, experiments=(), invocation=None)
    where, params = own.clause()
    conds = [where, "NOT EXISTS (SELECT 1 FROM runs r WHERE r.invocation_id = i.id)",
             f"(i.finished IS NULL OR i.exit_status IN {EXIT_CODES})"]
    for cond, value in (("i.started >= ?", sel.since), ("i.started < ?", sel.until),
                        ("i.id LIKE ? ESCAPE '\\'",
                         sel.invocation and like_prefix(sel.invocation))):
        if value:
            conds.append(cond)
            params.append(value)
    cur = conn.execute(f"SELECT i.*, NULL AS _status, 0 AS _n FROM invocations i "
                       f"WHERE {' AND '.join(conds)} ORDER BY i.started, i.id", params)
    names = [d[0] for d in cur.description]
    found = [dict(zip(names, v, strict=True)) for v in cur]
    if not sel.experiments:
        return found
    return [i for i in found if experiment_of(i.get("command") or "") in sel.experiments]
