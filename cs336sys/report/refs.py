"""Git refs typed where the report takes a commit (`--compare HEAD~1 HEAD`, `--commit main`,
`--since v1.0`), resolved in the repository of the current folder: the user's own, when they
measure their code from it, or cs336sys's checkout. A stored run matches a commit through
either column that records one: `git_commit` (cs336sys's code) or `user_commit` (the user's
code it measured, cs336sys.yours).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from cs336sys.measure.provenance import command_output


def _git(*args: str, cwd: str | Path | None = None) -> str | None:
    return command_output(["git", *args], cwd)


def resolve(ref: str, cwd: str | Path | None = None) -> str | None:
    """The full hash of the commit `ref` names (HEAD~1, a branch, a tag, a hash prefix) in
    the git repository of `cwd` (the current folder); None when it names none there. Text
    that git would read as an option is never passed to it."""
    if not ref or ref.startswith("-"):
        return None
    return _git("rev-parse", "--verify", "--quiet", "--end-of-options", f"{ref}^{{commit}}", cwd=cwd)


def since(ref: str, cwd: str | Path | None = None) -> list[str] | None:
    """The commits from `ref` to HEAD (`ref` itself and those HEAD has that `ref` has not),
    full hashes, newest first; None when `ref` is no commit here."""
    commit = resolve(ref, cwd)
    if commit is None:
        return None
    later = _git("rev-list", "HEAD", f"^{commit}", cwd=cwd)
    return [*(later.splitlines() if later else []), commit]


def describe(commit: str, cwd: str | Path | None = None) -> tuple[str, str] | None:
    """(its committer date as YYYY-MM-DD, its subject line) of `commit` in the repository of
    `cwd`; None when git or the commit is not there."""
    if not commit or commit.startswith("-"):
        return None
    out = _git("show", "-s", "--format=%cs%x09%s", "--end-of-options", commit, cwd=cwd)
    if not out or "\t" not in out:
        return None
    date, subject = out.splitlines()[0].split("\t", 1)
    return date, subject


def ancestors(commits: Iterable[str], cwd: str | Path | None = None) -> dict[str, set[str]]:
    """For each of `commits` that the repository of `cwd` has, those of `commits` that are
    its ancestors (git's history: a commit's parents, theirs, ...); those it lacks are left
    out. Commits on branches apart are ancestors of neither."""
    known = {c: full for c in set(commits) if (full := resolve(c, cwd))}
    bit = {full: 1 << i for i, full in enumerate(sorted(set(known.values())))}
    out = _git("rev-list", "--parents", "--topo-order", "--reverse", *bit, cwd=cwd) if bit else ""
    below: dict[str, int] = {}  # each commit's ancestors among `commits`, as a bit mask
    for line in (out or "").splitlines():  # parents before their children
        commit, *parents = line.split()
        below[commit] = 0
        for parent in parents:
            below[commit] |= below.get(parent, 0) | bit.get(parent, 0)
    return {c: {other for other, of in known.items() if below.get(full, 0) & bit[of]}
            for c, full in known.items()}
