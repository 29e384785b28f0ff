"""Every integer option of every command passes through the one guard (cli/__init__.py,
`_bounded`): a value past 2^62 is refused in one line as it is parsed, exit 2, nothing
written. The options are read from the app, so that a new one cannot miss the guard."""

from __future__ import annotations

import pytest

from cs336sys.cli import _takes_an_int
from tests.conftest import invoke
from tests.promises import INPUT
from tests.test_hostile import ARGUMENTS, _commands

THIRTY = "9" * 30


def _int_options():
    return [(" ".join(path), param) for path, command in _commands()
            for param in command.params if _takes_an_int(param)]


def test_the_guard_covers_the_integer_options_the_audit_found():
    names = {(path, param.name) for path, param in _int_options()}
    assert {("precision autocast", "in_features"), ("precision autocast", "out_features"),
            ("model", "d_model"), ("attention", "iters")} <= names
    assert len(names) > 40


@pytest.mark.promise(INPUT)
@pytest.mark.parametrize("sign", ["", "-"], ids=["huge", "huge-negative"])
def test_every_integer_option_refuses_thirty_digits(tmp_path, monkeypatch, sign):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    broke = []
    for path, param in _int_options():
        db = tmp_path / "store.db"
        result = invoke(*path.split(), f"{param.opts[0]}={sign}{THIRTY}", *ARGUMENTS.get(path, []),
                        "--db", db)
        lines = result.stderr.strip().splitlines()
        expected = f"Error: {param.opts[0]}: {sign}{THIRTY} is too large (at most 2^62)"
        if result.exit_code != 2 or lines != [expected]:
            broke.append((path, param.opts[0], result.exit_code, result.output[-200:]))
        if list(tmp_path.iterdir()):
            broke.append((path, param.opts[0], "wrote", [p.name for p in tmp_path.iterdir()]))
    assert not broke, "\n".join(map(str, broke))
