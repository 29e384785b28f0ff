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


@pytest.mark.parametrize(("env", "tma", "atomic", "reduce", "label"), [
    ({}, True, False, False, "default"),
    ({"CS336SYS_TRITON_TMA": "1"}, True, False, False, "default"),
    ({"CS336SYS_TRITON_TMA": "0"}, False, False, False, "pointer"),
    ({"CS336SYS_TRITON_ATOMIC_DQ": "1"}, True, True, False, "atomic-dq"),
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_ATOMIC_DQ": "1"}, False, True, False,
     "pointer+atomic-dq"),
    ({"CS336SYS_TRITON_REDUCE_DQ": "1"}, True, True, True, "reduce-dq"),
    # TMA reductions need the TMA build: without it, the atomic dQ they add, by pointers
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_REDUCE_DQ": "1"}, False, True, False,
     "pointer+atomic-dq"),
])
def test_the_environment_gives_the_default_paths(reload, env, tma, atomic, reduce, label):
    mod = reload(**env)
    assert (mod.TMA, mod.ATOMIC_DQ, mod.REDUCE_DQ) == (tma, atomic, reduce)
    assert mod.requested() == label
    assert mod.flags(label) == (tma, atomic, reduce)  # a label asks for what the environment did


def test_every_choice_names_its_loads_and_backward():
    assert {c: opt_in.flags(c) for c in opt_in.CHOICES} == {
        "default": (True, False, False), "pointer": (False, False, False),
        "tma": (True, False, False), "atomic-dq": (True, True, False),
        "pointer+atomic-dq": (False, True, False), "tma+atomic-dq": (True, True, False),
        "reduce-dq": (True, True, True)}
    with pytest.raises(ValueError, match="unknown Triton opt-in 'fast'"):
        opt_in.flags("fast")
