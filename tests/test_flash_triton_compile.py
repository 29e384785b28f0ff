"""FlashAttention2Triton under torch.compile: the kernels run as custom ops (flash_triton.py).

Traced as they were, inductor compiled the Triton kernels again, and on an H200 that compile
failed (`cs336sys step --switches all`). These tests compile with fullgraph=True, which
fails at any graph break, and compare O and the gradients with the float64 reference; the
graph dynamo captured must call the two ops and no Triton kernel of its own. Without CUDA
the ops run the kernels in Triton's interpreter.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("triton")

from cs336sys.attention import flash_triton
from cs336sys.attention.flash_triton import FlashAttention2Triton
from tests.attention_ref import assert_close, make_inputs, reference
from tests.test_flash_triton import DEVICE

pytestmark = pytest.mark.slow  # inductor's C++ compile of the graph around the ops


def _attend(q, k, v):
    # A projection before and a reduction after, so inductor has work around the ops.
    o = FlashAttention2Triton.apply(q * 1.0, k, v, True)  # (B, H, T, D)
    return o.sum(dim=1)


def _inductor_keeping(graphs: list):
    """Inductor as torch.compile's backend, keeping each graph dynamo hands it."""
    from torch._inductor.compile_fx import compile_fx

    def backend(gm, example_inputs):
        graphs.append(gm)
        return compile_fx(gm, example_inputs)

    return backend


def test_compiled_fullgraph_matches_float64_and_calls_the_ops():
    q, k, v, _ = make_inputs((1, 2, 37, 32), (1, 2, 37, 32), torch.float32, seed=3,
                             device=DEVICE)
    do = torch.randn(1, 37, 32, dtype=torch.float32, device=DEVICE)  # grad of the head sum
    graphs = []
    compiled = torch.compile(_attend, fullgraph=True, backend=_inductor_keeping(graphs))
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    o = compiled(qg, kg, vg)
    o.backward(do)

    ref = reference(q, k, v, do[:, None].expand(-1, 2, -1, -1), True)
    got = {"o": o, "dq": qg.grad, "dk": kg.grad, "dv": vg.grad}
    want = {n: ref[n].to(DEVICE) for n in ("dq", "dk", "dv")}
    assert_close(got, {"o": ref["o"].to(DEVICE).sum(dim=1), **want}, torch.float32)

    (gm,) = graphs  # one graph: the Function, its forward and backward bodies inside
    code = gm.print_readable(print_output=False)
    assert "torch.ops.cs336sys.flash_attention_forward" in code
    assert "torch.ops.cs336sys.flash_attention_backward" in code
    assert "triton_kernel_wrapper" not in code  # no kernel of ours handed to inductor


def test_compiled_no_grad_forward_runs_the_forward_op():
    q, k, v, _ = make_inputs((2, 45, 16), (2, 45, 16), torch.float32, seed=5, device=DEVICE)
    graphs = []
    compiled = torch.compile(flash_triton.flash_attention_triton, fullgraph=True,
                             backend=_inductor_keeping(graphs))
    with torch.no_grad():
        o = compiled(q, k, v, True)
    want = reference(q, k, v, torch.zeros_like(q), True)["o"].to(DEVICE)
    assert_close({"o": o}, {"o": want}, torch.float32)
    (gm,) = graphs
    assert "torch.ops.cs336sys.flash_attention_forward" in gm.print_readable(print_output=False)
