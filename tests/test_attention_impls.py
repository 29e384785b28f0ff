"""The registry's unfused implementations (naive, sdpa, compiled) against the float64 reference.

The same contract as the FlashAttention-2 tests (tests/test_flash_torch.py): O, dQ, dK and
dV from autograd in float64 (tests/attention_ref.py, no code shared with the kernels), causal
and not, 3-D (batch, seq, d) and 4-D (batch, heads, seq, d) inputs, sequence lengths that
are not multiples of any tile, queries and keys of different lengths, and bfloat16/float16
within twice PyTorch's own error for the same formula in that dtype.
"""

from __future__ import annotations

import pytest
import torch

from cs336sys.attention import registry
from tests.attention_ref import assert_close, make_inputs, reference, torch_error

SHAPES = {
    "3d": ((2, 37, 32), (2, 37, 32)),
    "4d": ((2, 3, 50, 16), (2, 3, 50, 16)),
    "fewer-queries": ((1, 2, 23, 32), (1, 2, 61, 32)),
    "more-queries": ((1, 2, 61, 32), (1, 2, 23, 32)),
}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def check(impl, shape_q, shape_kv, dtype, is_causal):
    q, k, v, do = make_inputs(shape_q, shape_kv, dtype, seed=3)
    ref = reference(q, k, v, do, is_causal)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    o = registry.get(impl)(*leaves, is_causal=is_causal)
    assert o.shape == q.shape and o.dtype == dtype
    o.backward(do)
    got = {"o": o, "dq": leaves[0].grad, "dk": leaves[1].grad, "dv": leaves[2].grad}
    err = None if dtype == torch.float32 else torch_error(q, k, v, do, is_causal, ref)
    assert_close(got, ref, dtype, err)


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
@pytest.mark.parametrize("dtype", DTYPES.values(), ids=DTYPES.keys())
@pytest.mark.parametrize("impl", ["naive", "sdpa"])
def test_matches_float64_reference(impl, dtype, shape, is_causal):
    check(impl, *shape, dtype, is_causal)


# Each case is an inductor build on a CPU (seconds): each layout, dtype and mask once, not
# every combination (naive and sdpa above take every one).
@pytest.mark.slow
@pytest.mark.parametrize(
    "shape, dtype, is_causal",
    [(SHAPES["3d"], torch.float32, True), (SHAPES["fewer-queries"], torch.float32, False),
     (SHAPES["4d"], torch.bfloat16, True)],
    ids=["3d-fp32-causal", "fewer-queries-fp32-full", "4d-bf16-causal"],
)
def test_compiled_matches_float64_reference(shape, dtype, is_causal):
    check("compiled", *shape, dtype, is_causal)
