"""A user's values are never rewritten as if they were options: the old-spelling layer
(cli/vocabulary.py) rewrites option names only. Generated over every value-taking option of
every command and every old spelling that command knows; and end to end, the two cases a
hostile run found (`--label --steps`, `sql -p --dtype`)."""

from __future__ import annotations

import pytest

from cs336sys.cli.vocabulary import aliases_for, bare_values_for, rewrite, value_options
from tests.conftest import invoke, query
from tests.promises import INPUT
from tests.test_hostile import _commands


def test_no_value_of_any_option_is_rewritten():
    broke, tried = [], 0
    for path, command in _commands():
        aliases, bare = aliases_for(path), bare_values_for(path)
        olds = [*aliases, *bare, "-p", "--"]
        for name, nargs in value_options(command).items():
            if name in bare:  # its value is optional: a token starting with - is the next option
                continue
            for old in olds:
                if old == "--":
                    continue  # ends the options: the one token click itself never takes as a value
                given = [name, *[old] * nargs]
                tried += 1
                if rewrite(given, aliases, warn=False, bare=bare,
                           values=value_options(command)) != [aliases.get(name, name), *given[1:]]:
                    broke.append((path, given))
    assert tried > 100 and not broke, broke


def test_old_spellings_are_still_rewritten_where_they_are_options():
    from cs336sys.cli.vocabulary import ALIASES

    old, new = next(iter(ALIASES.items()))
    assert rewrite([old, "5", "--label", old], ALIASES, warn=False,
                   values={new: 1, "--label": 1}) == [new, "5", "--label", old]


@pytest.mark.promise(INPUT)
def test_a_label_and_a_bound_value_that_look_like_options_are_kept(tmp_path):
    db = tmp_path / "r.db"
    result = invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--label", "--steps",
                    "--db", db)
    assert result.exit_code == 0, result.output
    assert query(db, "SELECT label FROM invocations") == [{"label": "--steps"}]
    result = invoke("sql", "SELECT ? AS v", "-p", "--dtype", "--db", db)
    assert result.exit_code == 0 and "--dtype" in result.stdout and "--precision" not in result.stdout
