"""Where the correctness checks' tolerances come from (docs/yours.md, "Checked before timed").

    python benchmarks/check_tolerances.py [--steps 8]

attention: the largest |x - ref| - 0.01·|ref| of our implementations against float64, per
dtype, at B1 H4 d64 causal, sequence 256 and 1024 (the check allows atol 1e-2 in fp32 and
fp16, 5e-2 in bf16). ddp: after `--steps` AdamW steps on 2 Gloo ranks, each of our DDP
variants against single-process training of the same steps, the worst per-tensor
|p - p_ref| / |p_ref - p_0| in fp32 and under bf16 autocast, and a DDP that never averages
its gradients (the check allows 1e-3 in fp32, 0.1 in bf16).
"""

from __future__ import annotations

import argparse

import torch

from cs336sys.attention import registry
from cs336sys.attention.reference import attention_reference
from cs336sys.experiments.training_check import training_check, training_reference
from cs336sys.experiments.training_step import cross_entropy, make_batch, make_model
from cs336sys.models.adamw import AdamW
from cs336sys.models.config import from_preset
from cs336sys.parallel import launch

SHAPE = dict(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, context_length=32)
BATCH = 4


def attention_excess(dtype: torch.dtype, seq: int, impl: str) -> float:
    q, k, v, do = (torch.randn(1, 4, seq, 64, dtype=dtype) for _ in range(4))
    got = [t.clone().requires_grad_() for t in (q, k, v)]
    out = registry.get(impl)(*got, is_causal=True)
    out.backward(do)
    ref_o, ref_grads = attention_reference(q, k, v, True, do=do, dtype=torch.float64)
    pairs = zip((out, *(t.grad for t in got)), (ref_o, *ref_grads), strict=True)
    return max(float(((x.detach().double() - r).abs() - 0.01 * r.abs()).max()) for x, r in pairs)


def ranks(ctx, impl: str, precision: str, steps: int) -> dict:
    from cs336sys.parallel.ddp import make_ddp

    model = make_model(from_preset("tiny", **SHAPE), "cpu", 1000 * ctx.rank)
    wrapper = make_ddp(impl if impl != "no-sync" else "naive", model)
    opt = AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
    x, y = make_batch(0, BATCH, SHAPE["context_length"], SHAPE["vocab_size"])
    mine = slice(ctx.rank * BATCH // 2, (ctx.rank + 1) * BATCH // 2)
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = cross_entropy(wrapper(x[mine]), y[mine])
        loss.backward()
        if impl != "no-sync":
            wrapper.finish_gradient_synchronization()
        opt.step()
        opt.zero_grad()
    # numpy: a CPU tensor pickles through a shared-memory handle that dies with the rank
    return {k: v.detach().numpy().copy() for k, v in model.named_parameters()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        worst = {impl: max(attention_excess(dtype, seq, impl) for seq in (256, 1024))
                 for impl in ("naive", "sdpa", "flash-torch")}
        print(f"attention {str(dtype)[6:]:9} " + "  ".join(f"{k} {v:.1e}" for k, v in worst.items()))
    x, y = make_batch(0, BATCH, SHAPE["context_length"], SHAPE["vocab_size"])
    for precision in ("fp32", "bf16"):
        reference = training_reference(from_preset("tiny", **SHAPE), "cpu", 0, x, y,
                                       precision, args.steps, 2)
        for impl in ("naive", "flat", "bucketed", "torch", "no-sync"):
            got = launch(ranks, 2, "gloo", args=(impl, precision, args.steps))[0]
            got = {k: torch.from_numpy(v) for k, v in got.items()}
            v = training_check(got, reference, precision)
            print(f"ddp {precision} {impl:8} worst {v.metrics['check_worst']:.2g} ({v.metrics['check']})")


if __name__ == "__main__":
    main()
