"""The README's commands for the user's code, as written there, on the example repository
and on a variant whose PyTorch FlashAttention ignores is_causal (as the handout allows):
each exits 0 and every row it stores is ok and passes its check. Sized down for a CPU by
options appended after the README's own (the last value of an option wins)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from tests.conftest import invoke, query
from tests.user_repos import course_repo, edit

README = Path(__file__).resolve().parents[1] / "README.md"
SMALLER = {
    "attention": ["--d-head", "16", "--batch", "1", "--warmup", "1", "--iters", "2"],
    "ddp": ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-layers", "1",
            "--num-heads", "2", "--vocab-size", "64", "--seq", "16", "--batch", "4",
            "--warmup", "1", "--iters", "2", "--bucket-mb", "1", "--device", "cpu"],
    "model": ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-layers", "1",
              "--num-heads", "2", "--vocab-size", "64", "--seq", "16", "--batch", "2",
              "--warmup", "1", "--iters", "2"],
}


def readme_commands() -> list[list[str]]:
    """The commands of the README's block on the user's code (the one after "Your
    FlashAttention-2"), without the leading `cs336sys`."""
    text = README.read_text(encoding="utf-8")
    block = re.search(r"Your FlashAttention-2.*?```sh\n(.*?)```", text, re.S).group(1)
    return [shlex.split(line)[1:] for line in block.splitlines() if line.startswith("cs336sys ")]


def test_the_readme_names_the_commands_this_test_runs():
    assert [c[0] for c in readme_commands()] == ["attention", "ddp", "model"]


@pytest.mark.slow  # every command of the block, ranks included
@pytest.mark.parametrize("variant", ["example", "ignores-is-causal"])
def test_the_readmes_commands_pass_on_the_example_repository(tmp_path, monkeypatch, variant):
    repo = course_repo(tmp_path)
    if variant == "ignores-is-causal":
        flash = "cs336_systems/flash_attention.py"
        edit(repo, flash, "                if is_causal:\n", "                if False:\n")
        edit(repo, flash, "        if ctx.is_causal:\n", "        if False:\n", commit="no mask")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    commands = readme_commands() if variant == "example" else readme_commands()[:1]
    for command in commands:
        result = invoke(*command, *SMALLER[command[0]], "--db", db)
        assert result.exit_code == 0, (command, result.output)
    rows = query(db, "SELECT experiment, status, error FROM runs")
    assert rows and all(r["status"] == "ok" for r in rows), rows
    views = ["attention_runs", "ddp_runs", "model_runs"][:len(commands)]
    checked = [r for v in views for r in query(db, f'SELECT "check" FROM {v}')
               if r["check"] is not None]
    assert checked and {r["check"] for r in checked} == {"pass"}
