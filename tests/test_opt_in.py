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
        for name in opt_in.VARIABLES:
            monkeypatch.delenv(name, raising=False)
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        return importlib.reload(opt_in)

    yield with_env
    monkeypatch.undo()
    importlib.reload(opt_in)


# Paths: (tma, heavy_first, lazy_rescale, warp_specialize, atomic_dq, reduce_dq)
@pytest.mark.parametrize(("env", "paths", "label"), [
    ({}, (True, False, False, False, False, False), "default"),
    ({"CS336SYS_TRITON_TMA": "1"}, (True, False, False, False, False, False), "default"),
    ({"CS336SYS_TRITON_TMA": "0"}, (False, False, False, False, False, False), "pointer"),
    ({"CS336SYS_TRITON_ATOMIC_DQ": "1"}, (True, False, False, False, True, False), "atomic-dq"),
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_ATOMIC_DQ": "1"},
     (False, False, False, False, True, False), "pointer+atomic-dq"),
    ({"CS336SYS_TRITON_REDUCE_DQ": "1"}, (True, False, False, False, True, True), "reduce-dq"),
    # TMA reductions need the TMA build: without it, the atomic dQ they add, by pointers
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_REDUCE_DQ": "1"},
     (False, False, False, False, True, False), "pointer+atomic-dq"),
    ({"CS336SYS_TRITON_HEAVY_FIRST": "1"}, (True, True, False, False, False, False), "heavy-first"),
    ({"CS336SYS_TRITON_LAZY_RESCALE": "1"},
     (True, False, True, False, False, False), "lazy-rescale"),
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_HEAVY_FIRST": "1",
      "CS336SYS_TRITON_LAZY_RESCALE": "1", "CS336SYS_TRITON_ATOMIC_DQ": "1"},
     (False, True, True, False, True, False), "pointer+heavy-first+lazy-rescale+atomic-dq"),
    ({"CS336SYS_TRITON_WARP_SPECIALIZE": "1"},
     (True, False, False, True, False, False), "warp-specialize"),
    # the warp-specialised loop needs the TMA build, and takes the place of lazy rescaling
    ({"CS336SYS_TRITON_TMA": "0", "CS336SYS_TRITON_WARP_SPECIALIZE": "1"},
     (False, False, False, False, False, False), "pointer"),
    ({"CS336SYS_TRITON_WARP_SPECIALIZE": "1", "CS336SYS_TRITON_LAZY_RESCALE": "1"},
     (True, False, False, True, False, False), "warp-specialize"),
])
def test_the_environment_gives_the_default_paths(reload, env, paths, label):
    mod = reload(**env)
    assert (mod.TMA, mod.HEAVY_FIRST, mod.LAZY_RESCALE, mod.WARP_SPECIALIZE, mod.ATOMIC_DQ,
            mod.REDUCE_DQ) == paths
    assert mod.requested() == label
    assert mod.flags(label) == paths  # a label asks for what the environment did


def test_every_choice_names_its_loads_schedule_forward_loop_and_backward():
    """Each label is a part or none of each group (loads, schedule, forward loop, dQ sum), in
    that order; TMA reductions and the warp-specialised loop need the TMA loads."""
    chosen = {c: opt_in.flags(c) for c in opt_in.CHOICES}
    # less pointer with reduce-dq or warp-specialize (2 x 3 + 2 x 1 x 2 labels)
    assert len(chosen) == 3 * 2 * 3 * 3 - 10
    assert chosen["default"] == chosen["tma"] == (True, False, False, False, False, False)
    assert chosen["pointer"] == (False, False, False, False, False, False)
    assert chosen["atomic-dq"] == chosen["tma+atomic-dq"] == (True, False, False, False, True,
                                                             False)
    assert chosen["pointer+atomic-dq"] == (False, False, False, False, True, False)
    assert chosen["reduce-dq"] == chosen["tma+reduce-dq"] == (True, False, False, False, True, True)
    assert chosen["heavy-first"] == (True, True, False, False, False, False)
    assert chosen["lazy-rescale"] == (True, False, True, False, False, False)
    assert chosen["pointer+heavy-first+atomic-dq"] == (False, True, False, False, True, False)
    assert chosen["tma+heavy-first+lazy-rescale+reduce-dq"] == (True, True, True, False, True, True)
    assert chosen["heavy-first+warp-specialize+reduce-dq"] == (True, True, False, True, True,
                                                               True)
    assert "pointer+reduce-dq" not in chosen and "heavy-first+tma" not in chosen
    assert "pointer+warp-specialize" not in chosen
    assert "lazy-rescale+warp-specialize" not in chosen  # one forward loop or the other
    with pytest.raises(ValueError, match="unknown Triton opt-in 'fast'; give default, or a part"):
        opt_in.flags("fast")
