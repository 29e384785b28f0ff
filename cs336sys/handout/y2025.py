"""The CS336 assignment 2 handout, spring 2025 release: its 21 problems in its order.

Its size table is the 2025 one (small, medium, large, xl = GPT-2 XL 1600 x 48, 2.7B), so
every run that names a size carries `--handout 2025`. Where a problem is the 2026 one word
for word, it is taken from handout/y2026.py with the 2025 sizes; the distributed part adds
bucketed DDP and ends with the TPU accounting problem.
"""

from __future__ import annotations

import dataclasses

from cs336sys.experiments.ddp_section import memory_by_moment
from cs336sys.experiments.plan_section import inequalities, mesh
from cs336sys.handout import y2026
from cs336sys.handout.problem import COMPUTE, IMPLEMENT, AsReported, Pivot, Problem, Run
from cs336sys.handout.y2026 import (
    BWD,
    DDP_CPU,
    DDP_MEMORY,
    DDP_TIME,
    FWD,
    PEAK,
    PROFILE_CPU,
    RESIDUAL,
    TINY,
    on_their_model,
    theirs,
    warmup_tables,
)
from cs336sys.sweep.declaration import Column

YEAR = "2025"
SIZES = "small,medium,large,xl,2.7B"
OLD = "--handout 2025"


_2026 = {p.name: p for p in y2026.PROBLEMS}


def _same(name: str, section: str, **changes: object) -> Problem:
    """The 2026 problem `name`, as 2025 numbered it (and with `changes`)."""
    return dataclasses.replace(_2026[name], section=section, **changes)


def _ddp(impls: str, yours: str, part: str = "") -> Run:
    """ddp on two GPUs with the 2025 xl (1600 x 48), or two CPU processes with Gloo; with
    `--yours`, on the user's model (y2026._ddp)."""
    return Run(f"ddp --impl {impls} {OLD}", cpu=f"ddp --impl {impls} {DDP_CPU}",
               yours=theirs(f"ddp --impl {yours} {OLD}"),
               yours_cpu=theirs(f"ddp --impl {yours} {DDP_CPU}"), part=part)


PROBLEMS = (
    Problem(
        "benchmarking_script", 4, section="1.1.3",
        asks="Forward and backward of every size (5 warm-up, 10 timed steps, mean ± std); the "
        "same without warm-up, and with 1 or 2 steps.",
        runs=(
            on_their_model(f"model --size {SIZES} --mode forward,forward-backward --warmup "
                           f"0,1,2,5 --iters 10 {OLD}",
                           cpu="model --size tiny --seq 64 --mode forward,forward-backward "
                           "--warmup 0,1,2,5 --iters 3"),
        ),
        # (c) repeats (b), whose runs time the forward alone and forward with backward
        tables=warmup_tables("Forward and backward", (FWD, BWD), "Each mode", None),
    ),
    Problem(
        "nsys_profile", 5, section="1.1.4",
        asks="Profile forward, backward and optimizer step of every size at context 128, 256, "
        "512 and 1024: the forward's time, the top kernels, the non-matmul share, the "
        "attention's parts.",
        runs=(on_their_model(f"profile model --size {SIZES} --seq 128,256,512,1024 --mode "
                             f"forward,forward-backward,train {OLD}", PROFILE_CPU,
                             your_adamw=True),),
        tables=(AsReported("profile"),),
    ),
    _same("mixed_precision_accumulation", "1.1.5"),
    _same("benchmarking_mixed_precision", "1.1.5", runs=(
        Run("precision autocast --precision fp16,bf16", part="(a)"),
        on_their_model(f"model --size {SIZES} --mode forward-backward --precision fp32,bf16 {OLD}",
                       cpu=f"model {TINY} --mode forward-backward --precision fp32,bf16",
                       part="(c)"),
    )),
    Problem(
        "memory_profiling", 4, section="1.1.6",
        asks="Peak memory of the 2.7B model, forward pass and full training step, at context "
        "128, 256 and 512, in fp32 and bf16, with the memory timelines.",
        runs=(on_their_model("memory --size 2.7B --seq 128,256,512 --mode forward,train "
                             f"--precision fp32,bf16 --snapshot reports/handout/memory_profiling "
                             f"{OLD}", cpu="memory --size tiny --seq 64,128 --mode forward,train "
                             "--precision fp32,bf16 --warmup 0 --iters 1 --snapshot "
                             "reports/handout/memory_profiling"),),
        tables=(
            Pivot("Peak memory by context length (MiB), fp32", "memory", ("seq",), (PEAK,),
                  across="mode", where={"precision": "fp32"}),
            Pivot("Peak memory, full and mixed precision (MiB)", "memory", ("seq", "mode"),
                  (PEAK,), across="precision"),
            RESIDUAL,
        ),
    ),
    _same("pytorch_attention", "1.2.1"),
    _same("torch_compile", "1.3", runs=(
        *_2026["torch_compile"].runs[:2],
        on_their_model(f"model --size {SIZES} --mode forward,forward-backward,train {OLD}",
                       cpu=f"model {TINY} --mode forward,train", part="(b)"),
        on_their_model(f"model --size {SIZES} --mode forward,forward-backward,train --compile "
                       f"{OLD}", cpu=f"model {TINY} --mode forward,train --compile", part="(b)"),
    )),
    _same("flash_forward", "1.3.2"),
    _same("flash_backward", "1.3.2"),
    _same("flash_benchmarking", "1.3.2"),
    _same("distributed_communication_single_node", "2.1.1", asks=(
        "All-reduce of float32 tensors of 1 MB, 10 MB, 100 MB and 1 GB over 2, 4 and 6 "
        "processes, Gloo on CPU and NCCL on GPU."), runs=(
        Run("comm --op all-reduce --bytes 1MB,10MB,100MB,1GB --world-size 2,4,6 "
            "--backend gloo,nccl",
            cpu="comm --op all-reduce --bytes 1MB,10MB --world-size 2 --warmup 1 --iters 5",
            cpu_note="its Gloo + CPU half runs on a CPU at the handout's sizes too, with "
            "`cs336sys comm --op all-reduce --bytes 1MB,10MB,100MB,1GB --world-size 2,4,6 "
            "--backend gloo --warmup 5 --label "
            "distributed_communication_single_node` (the label makes it count for this "
            "problem); NCCL + GPU needs a GPU"),
    )),
    Problem(  # a script: no adapters function, no course test (get_ddp_individual_parameters
        # is 2.3.2's overlapping class, checked there)
        "naive_ddp", 5, section="2.2", kind=IMPLEMENT,
        asks="A script that all-reduces each parameter's gradient after the backward and "
        "checks its weights against single-process training. cs336sys's `ddp --impl naive` is "
        "that algorithm; a DDP class of yours (finish_gradient_synchronization()) is checked "
        "by `cs336sys ddp --impl yours=package.module:Class`.",
    ),
    _same("naive_ddp_benchmarking", "2.2", runs=(_ddp("naive", "naive"),)),
    _same("minimal_ddp_flat_benchmarking", "2.3.1",
          runs=(_ddp("naive,flat", "naive,flat"),)),
    Problem(
        "ddp_overlap_individual_parameters", 5, section="2.3.2", kind=IMPLEMENT,
        asks="A DDP class that overlaps each gradient's all-reduce with the backward "
        "(get_ddp_individual_parameters).",
        check="cs336sys ddp --impl yours-individual --world-size 2",
    ),
    _same("ddp_overlap_individual_parameters_benchmarking", "2.3.2",
          runs=(_ddp("naive,flat,overlap", "naive,flat,yours-individual", part="(a)"),)),
    Problem(
        "ddp_overlap_bucketed", 8, section="2.3.3", kind=IMPLEMENT,
        asks="A DDP class that all-reduces gradients in buckets of at most bucket_size_mb "
        "(get_ddp_bucketed).",
        check="cs336sys ddp --impl yours-bucketed --bucket-mb 1,100 --world-size 2",
    ),
    Problem(
        "ddp_bucketed_benchmarking", 3, section="2.3.3",
        asks="(a) The bucketed DDP's step with buckets of 1, 10, 100 and 1000 MB (2 GPUs, xl), "
        "beside the unbucketed ones; (b) a model of its overhead (written).",
        runs=(_ddp("naive,flat,overlap,bucketed --bucket-mb 1,10,100,1000",
                   "naive,flat,yours-individual,yours-bucketed --bucket-mb 1,10,100,1000",
                   part="(a)"),),
        # (b)'s model takes the number of buckets: a cap of 1 MiB on the tiny model's 1 MiB
        # matrices is one bucket per parameter, the overlapped DDP's
        tables=(Pivot("DDP step by bucket size (ms, mean ± std)", "ddp", ("impl", "bucket_mb"),
                      (*DDP_TIME, Column("buckets", "buckets", "num"),
                       Column("all-reduces/step", "allreduce_calls", "num"))),),
    ),
    Problem(
        "communication_accounting", 10, section="2.4", kind=COMPUTE,
        asks="The XXL model (d 16384, ff 53248, 126 two-matrix blocks, fp32 state, bf16 "
        "activations) on TPU v5p: its memory on one device and sharded N_FSDP ways, and the "
        "batch at which FSDP 16 x TP 4 on a 3D mesh (M_X = 2, M_Y = 1) is compute-bound.",
        # FSDP alone at each degree; FSDP x TP 16x4 only where it is 64 devices; (a)'s
        # "how many H100 80GB GPUs worth" on one H100
        runs=(Run("plan --size xxl --hardware tpu-v5p --strategy fsdp --n 1,16,32,64 "
                  "--batch 64 --seq 512"),
              Run("plan --size xxl --hardware h100 --strategy fsdp --n 1 --batch 64 --seq 512",
                  part="(a)"),
              Run("plan --size xxl --hardware tpu-v5p --strategy fsdp-tp --n 64 --split 16x4 "
                  "--mesh-axes 2,1 --batch 64 --seq 512")),
        tables=("plan", inequalities, mesh),
    ),
    _same("optimizer_state_sharding", "3"),
    _same("optimizer_state_sharding_accounting", "3", runs=(
        _ddp("overlap --shard-optimizer", "overlap --shard-optimizer yours"),),
        tables=(Pivot("Memory of rank 0 and step time, with and without sharding", "ddp",
                      ("impl", "shard_optimizer"), DDP_MEMORY), memory_by_moment)),
)
