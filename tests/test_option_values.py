"""A user's values are never taken for options: nothing rewrites the command line (the 0.2
spellings are gone, refused like any unknown option), and the names an error quotes skip
values. Generated over every value-taking option of every command; and end to end, the two
cases a hostile run found (`--label --steps`, `sql -p --dtype`)."""

from __future__ import annotations

import pytest

from cs336sys.cli.vocabulary import typed_spellings, value_options, with_bare_values
from tests.conftest import invoke, query
from tests.promises import INPUT
from tests.test_hostile import _commands

# The 0.2 spellings and a command that had each.
OLD_SPELLINGS = [("model", "--context-length"), ("model", "--batch-size"), ("model", "--steps"),
                 ("ddp", "--global-batch"), ("attention", "--dtype"), ("comm", "--size"),
                 ("plan", "--model")]


def test_no_value_is_taken_for_the_name_an_option_was_typed_under():
    """`--label --impl`: `--impl` is the label, not the name `--attention` was typed under."""
    taken, tried = [], 0
    for path, command in _commands():
        values = value_options(command)
        other_names = [n for p in command.params for n in (*p.opts, *p.secondary_opts)
                       if len(p.opts) + len(p.secondary_opts) > 1]
        for name, nargs in values.items():
            for other in other_names:
                tried += 1
                if typed_spellings(command, [name, *[other] * nargs]).get(name) not in (None, name):
                    taken.append((path, name, other))
    assert tried > 100 and not taken, taken


@pytest.mark.promise(INPUT)
@pytest.mark.parametrize("command, old", OLD_SPELLINGS)
def test_the_old_spellings_are_refused_and_nothing_is_written(tmp_path, command, old):
    db = tmp_path / "r.db"
    result = invoke(command, old, "16", "--db", db)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"Error: No such option: {old}")
    assert len(result.stderr.strip().splitlines()) == 1
    assert not db.exists()


@pytest.mark.promise(INPUT)
def test_a_label_and_a_bound_value_that_look_like_options_are_kept(tmp_path):
    db = tmp_path / "r.db"
    result = invoke("plan", "--size", "tiny", "--strategy", "dp", "--n", "2", "--label", "--steps",
                    "--db", db)
    assert result.exit_code == 0, result.output
    assert query(db, "SELECT label FROM invocations") == [{"label": "--steps"}]
    result = invoke("sql", "SELECT ? AS v", "-p", "--dtype", "--db", db)
    assert result.exit_code == 0 and "--dtype" in result.stdout and "--precision" not in result.stdout


def test_a_bare_option_gets_the_value_it_means_and_no_value_is_changed():
    """ddp's `--shard-optimizer` alone means ours; a value that looks like it stays a value."""
    commands = dict(_commands())
    ddp = commands[("ddp",)]
    assert with_bare_values(["--shard-optimizer", "--zero"], ["ddp"], ddp) == [
        "--shard-optimizer", "ours", "--zero"]
    assert with_bare_values(["--shard-optimizer"], ["ddp"], ddp) == ["--shard-optimizer", "ours"]
    assert with_bare_values(["--shard-optimizer", "yours"], ["ddp"], ddp) == [
        "--shard-optimizer", "yours"]
    changed, tried = [], 0
    for path, command in commands.items():
        for name, nargs in value_options(command).items():
            if name == "--shard-optimizer":
                continue
            given = [name, *["--shard-optimizer"] * nargs]
            tried += 1
            if with_bare_values(given, path, command) != given:
                changed.append((path, given))
    assert tried > 100 and not changed, changed
