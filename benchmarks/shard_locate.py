"""What placing an FSDP's shards by their values (experiments/shard_locate.py) can rely on.

    python benchmarks/shard_locate.py [--sizes 1e6,2e7,1e8]

First, for random weights (std 0.02, truncated at 3 std, as TransformerLM's Linear layers
draw), the share of values that occur once among n of them: what can be placed at all
(MAX_LOCATED). Then a 22M-parameter cs336sys TransformerLM (d 512, d_ff 1344, 4 layers,
vocab 10000): the share of each Linear weight's first half (rank 0's shard of two) found
in the model exactly, and how much of what was found lies in that weight, for the shard as
it is and rounded through bf16 and fp16 (a master copy that came through 16 bits), the
figures LOCATED_SHARE stands on.
"""

from __future__ import annotations

import argparse
import time


def once(n: int) -> tuple[float, float]:
    """The share of n random weights whose value occurs once, and the seconds sorting took."""
    import torch

    std = 0.02
    x = torch.nn.init.trunc_normal_(torch.empty(n), std=std, a=-3 * std, b=3 * std)
    t0 = time.perf_counter()
    values, _ = x.sort()
    same = values[1:] == values[:-1]
    alone = torch.ones(n, dtype=torch.bool)
    alone[1:] &= ~same
    alone[:-1] &= ~same
    return float(alone.float().mean()), time.perf_counter() - t0


def placed() -> list[tuple[str, float, float]]:
    """(how the shard was kept, share found, share of the found in its own weight), summed
    over the model's Linear weights."""
    import torch

    from cs336sys.experiments import shard_locate
    from cs336sys.models.config import ModelConfig
    from cs336sys.models.transformer import TransformerLM

    torch.manual_seed(0)
    config = ModelConfig(d_model=512, d_ff=1344, num_layers=4, num_heads=8, vocab_size=10000,
                         context_length=64)
    weights = {k: v.detach() for k, v in TransformerLM(config).named_parameters()}
    print(f"model: {sum(w.numel() for w in weights.values()) / 1e6:.1f}M parameters")
    whole = shard_locate.WholeModel(weights)
    shard_locate.LOCATED_SHARE = 0.0  # every value found, however few
    out = []
    for kept, cast in (("fp32", None), ("bf16-rounded", torch.bfloat16),
                       ("fp16-rounded", torch.float16)):
        found = inside = total = 0
        for name, w in weights.items():
            if w.dim() != 2:
                continue
            shard = w[: w.shape[0] // 2]
            shard = shard.to(cast).float() if cast is not None else shard
            total += shard.numel()
            at = whole.locate(shard)
            if at is None:
                continue
            lo, hi = whole.offsets[name]
            found += at.at.numel()
            inside += int(((at.where >= lo) & (at.where < hi)).sum())
        out.append((kept, found / total, inside / found if found else 0.0))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="1e6,2e7,1e8")
    sizes = [int(float(s)) for s in parser.parse_args().sizes.split(",")]
    for n in sizes:
        share, s = once(n)
        print(f"{n / 1e6:g}M values: {share:.1%} occur once (sorted in {s:.1f} s)")
    for kept, found, inside in placed():
        print(f"shards {kept}: {found:.1%} of values found, {inside:.1%} of those in their "
              "own weight")


if __name__ == "__main__":
    main()
