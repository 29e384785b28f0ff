"""The Triton attention's kernel paths as the environment asks for them (attention/opt_in.py):
TMA loads by default (they won on an H200), CS336SYS_TRITON_TMA=0 for the pointer loads,
atomic dQ opt-in (it lost)."""

from __future__ import annotations

import importlib

import pytest

from cs336sys.attention import opt_in


@pytest.fixture
def reload(monkeypatch):
    def with_env(**env):
        for name in ("CS336SYS_TRITON_TMA", "CS336SYS_TRITON_ATOMIC_DQ"):
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return importlib.reload(opt_in)

    yield with_env
    monkeypatch.undo()
    importlib.reload(opt_in)


@pytest.mark.parametrize(("env", "tma", "atomic", "label"), [
    ({}, True, False, "default"),
    ({"CS336SYS_TRITON_TMA": "1"}, True, False, "default"),
    ({"CS336SYS_TRITON_TMA": "0"}, False, False, "pointer"),
    ({"CS336SYS_TRITON_ATOMIC_DQ": "1"}, True, True, "atomic-dq"),
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_ATOMIC_DQ": "1"}, False, True,
     "pointer+atomic-dq"),
])
def test_the_environment_gives_the_default_paths(reload, env, tma, atomic, label):
    mod = reload(**env)
    assert (mod.TMA, mod.ATOMIC_DQ) == (tma, atomic)
    assert mod.requested() == label
    assert mod.flags(label) == (tma, atomic)  # a label asks for what the environment did


def test_every_choice_names_its_loads_and_backward():
    assert {c: opt_in.flags(c) for c in opt_in.CHOICES} == {
        "default": (True, False), "pointer": (False, False), "tma": (True, False),
        "atomic-dq": (True, True), "pointer+atomic-dq": (False, True),
        "tma+atomic-dq": (True, True)}
    with pytest.raises(ValueError, match="unknown Triton opt-in 'fast'"):
        opt_in.flags("fast")
