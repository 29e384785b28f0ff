"""The command line of `cs336sys ddp`: its options, help, examples and how a point is named
on the progress bar, declared as a `Command` (sweep/declaration.py) that the kind's
`EXPERIMENT` carries and the CLI builds (cli/declared.py)."""

from __future__ import annotations

from cs336sys.experiments.ddp_section import label
from cs336sys.sweep.declaration import Command
from cs336sys.sweep.options import list_option, option


def options(
    impl: list_option("naive, flat, overlap, bucketed, torch (replicas), fsdp and/or torch-fsdp "
                      "(sharded); yours: yours, yours-individual, yours-bucketed, yours-fsdp (your "
                      "adapters file) or NAME=package.module:Class (an FSDP when NAME has fsdp in "
                      "it). "
                      "[default: the five replica impls]") = None,
    shard_optimizer: list_option("Also run each replica impl with its AdamW state sharded: ours "
                                 "(cs336sys.parallel.ShardedOptimizer; what the bare flag means), "
                                 "yours "
                                 "(your adapters' get_sharded_optimizer) or "
                                 "yours=package.module:Class.",
                                 "--shard-optimizer") = None,
    zero: option("Also run each replica impl with torch's "
                 "ZeroRedundancyOptimizer.", bool, "--zero") = False,
    optimizer: option("The AdamW every rank steps, sharded or not: adamw (ours), torch-adamw, "
                      "or your own: yours-adamw (your adapters' get_adamw_cls) or "
                      "NAME=package.module:Class, checked against torch's AdamW first. "
                      "[default: adamw]", str | None) = None,
    bucket_mb: list_option("Bucket caps in MiB, for bucketed. [default: 1,10,100,1000]") = None,
    size: list_option("Model size preset(s). [default: xl on CUDA, tiny on CPU]") = None,
    seq: list_option("Sequence length(s). [default: 512 on CUDA, 128 on CPU]") = None,
    batch: list_option("Sequences per step over all ranks (the global batch), split evenly. "
                       "[default: 4 on CUDA, 4 on CPU]") = None,
    world_size: list_option("Ranks. [default: 2]") = None,
    backend: option("gloo or nccl. [default: nccl on CUDA, else gloo]", str | None) = None,
    precision: list_option("fp32, bf16 (autocast; an FSDP's compute dtype) and/or fp16 (an "
                           "FSDP's compute dtype only). [default: fp32]") = None,
    warmup: option("Untimed steps per point. [default: 3 on CUDA, 2 on CPU]", int | None) = None,
    iters: option("Timed steps per point. [default: 10 on CUDA, 5 on CPU]", int | None) = None,
    device: option("auto, cpu or cuda (picks the default backend).", str) = "auto",
    seed: option("Seed for weights and data.", int) = 0,
) -> None:
    """The options of `ddp` beyond the model's (cli/options.py, model_options)."""


HELP = (
    "Each variant wraps the same Transformer LM: naive (an all-reduce per gradient), flat (one "
    "all-reduce of all gradients), overlap (async per-gradient all-reduce from backward hooks), "
    "bucketed (async all-reduce per bucket, swept over --bucket-mb) and torch "
    "(DistributedDataParallel) keep full replicas; fsdp (cs336sys.parallel.FSDP) and torch-fsdp "
    "(FSDP2) shard weights, gradients and optimizer state. comm_ms is the time a step waits on "
    "gradient communication (fsdp: the time any of its collectives is in flight); comm_fraction "
    "its share of the step. Each point also stores this rank's memory after init and around the "
    "optimizer step (parameters, gradients, optimizer state, beside the analytic expectation) and "
    "the bytes of each kind of collective in one step."
)

EXAMPLES = (
    "cs336sys ddp --impl bucketed,torch --bucket-mb 1,10,100 --world-size 2",
    "cs336sys ddp --impl torch,fsdp,torch-fsdp --shard-optimizer --zero",
    "cs336sys ddp --impl flat --size tiny,small --seq 128,256 --batch 4,8",
    "cs336sys ddp --impl yours,bucketed --shard-optimizer yours --world-size 2",
    "torchrun --nproc-per-node 8 -m cs336sys ddp --size xl --batch 32",
)


COMMAND = Command(
    options=options,
    help=HELP,
    examples=EXAMPLES,
    groups=("model", "nsys"),
    drop=("attention", "checkpoint", "blocks"),
    describe=lambda spec: label(spec.settings()),
    ranks=True,
)
