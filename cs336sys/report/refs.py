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


def ancestry(commits: Iterable[str], cwd: str | Path | None = None) -> dict[str, int]:
    """The place of each of `commits` that the repository of `cwd` has in git's topological
    order, a parent before its children (oldest first); those it lacks are left out."""
    known = {c: full for c in set(commits) if (full := resolve(c, cwd))}
    if len(set(known.values())) < 2:
        return {c: 0 for c in known}
    out = _git("rev-list", "--topo-order", "--reverse", *sorted(set(known.values())), cwd=cwd)
    place = {h: i for i, h in enumerate(out.splitlines())} if out else {}
    return {c: place[full] for c, full in known.items() if full in place}
