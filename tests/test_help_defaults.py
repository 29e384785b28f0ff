"""Every `[default: X on CUDA, Y on CPU]` an option's help gives is the default the command
runs: `ddp --help` said a global batch of 8 on CUDA, where ddp runs 4 (the handout's)."""

from __future__ import annotations

import re

import pytest
import typer

from cs336sys.cli import app
from cs336sys.experiments import attention, comm, ddp, model, step


def _text(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)


# command -> {"cuda": defaults, "cpu": defaults}, keyed as the options' parameters are
DEFAULTS = {
    "model": model.DEFAULTS,
    "ddp": ddp.DEFAULTS,
    "step": step.DEFAULTS,
    "comm": {device: {("bytes" if k == "size" else k): v for k, v in d.items()}
             for device, d in comm.DEFAULTS.items()},
    "attention": {"cuda": attention.DEFAULTS,
                  "cpu": {**attention.DEFAULTS, **attention.CPU_DEFAULTS}},
}
SAID = re.compile(r"\[default: (.+?) on CUDA, (.+?) on CPU\]")


@pytest.mark.parametrize("name", sorted(DEFAULTS))
def test_the_help_gives_the_defaults_the_command_runs(name):
    command = typer.main.get_command(app).commands[name]
    checked = 0
    for param in command.params:
        said = SAID.search(" ".join((param.help or "").split()))
        if not said or param.name not in DEFAULTS[name]["cuda"]:
            continue
        for device, value in zip(("cuda", "cpu"), said.groups(), strict=True):
            assert value == _text(DEFAULTS[name][device][param.name]), (name, param.name, device)
        checked += 1
    assert checked >= 3, name  # the sizes, lengths and step counts at least
