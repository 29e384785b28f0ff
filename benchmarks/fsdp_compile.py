"""What `step --switches compile` compiles under our FSDP: the tiny model's blocks, each
forward under torch.compile, wrapped by FSDP on a one-rank Gloo group, trained a few steps;
prints dynamo's counts. The FSDP's gathering hooks are graph breaks (torch.compiler.disable),
so the code between the units is compiled: the count of graphs is above zero. (With the
hooks traced instead, as before, dynamo recompiled a unit's frame until its recompile limit:
26 graphs, 52 breaks and its warning.)

    python benchmarks/fsdp_compile.py [--steps 4]
"""

from __future__ import annotations

import argparse
import os


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    args = parser.parse_args()

    import torch
    import torch.distributed as dist
    from torch._dynamo.utils import counters

    from cs336sys.models.config import from_preset
    from cs336sys.models.transformer import TransformerLM
    from cs336sys.parallel.fsdp import FSDP

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        config = from_preset("tiny", context_length=32)
        torch.manual_seed(0)
        model = TransformerLM(config)
        for block in model.layers:
            block.forward = torch.compile(block.forward)
        fsdp = FSDP(model)
        x = torch.randint(0, config.vocab_size, (2, 32))  # (B, T)
        for _ in range(args.steps):
            fsdp(x, targets=x).backward()
            fsdp.finish_gradient_synchronization()
    finally:
        dist.destroy_process_group()
    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    frames = counters["frames"]
    print(f"{args.steps} steps: {graphs} graphs compiled, {breaks} graph breaks, "
          f"{frames['ok']} of {frames['total']} frames compiled")
    ok = graphs > 0
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
