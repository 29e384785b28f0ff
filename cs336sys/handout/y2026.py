"""The CS336 assignment 2 handout, 2026 release (26.1.4): its 27 problems in its order.

Sizes are the handout's (Table 1: small, medium, large, xl = 2560 x 32, 10B; batch 4,
context 512 unless said) on a GPU; on a CPU each run is cut down to the tiny model and
short sequences, which answers nothing the handout asks about a GPU but shows every table
and plot filled. The accounting problems (section 8) are computed by `plan` for the xl
model on an H100 (data sheet); give C and W by hand with `plan --flops --bandwidth`.
"""

from __future__ import annotations

from cs336sys.experiments.ddp_section import YOURS_COMM, memory_by_moment
from cs336sys.experiments.plan_section import all_reduces, closed_forms, inequalities, phases
from cs336sys.handout.problem import COMPUTE, IMPLEMENT, AsReported, Pivot, Problem, Run
from cs336sys.sweep.declaration import SUBCOMMANDS, Column, column_table

YEAR = "2026"
SIZES = "small,medium,large,xl,10B"
# On a CPU: the tiny model, 64 tokens, few steps (a point in about a second).
TINY = "--size tiny --seq 64 --warmup 2 --iters 3"
ATTENTION_CPU = "--seq 128,256 --d-head 16,32 --warmup 1 --iters 3"
# The model's attention of assignment 1, where the handout names it (its annotation example)
A1_ATTENTION = "yours=cs336_basics.model:scaled_dot_product_attention"
DDP_CPU = "--size tiny --seq 64 --warmup 1 --iters 2"
PROFILE_CPU = ("profile model --size tiny --seq 64,128 --mode forward,forward-backward,train "
               "--warmup 1 --iters 2")

FWD, BWD = Column("forward ms", "fwd_ms", "mean_std"), Column("backward ms", "bwd_ms", "mean_std")
OPT = Column("optimizer ms", "opt_ms", "mean_std")
STEP = Column("step ms", "step_ms", "mean_std")
E2E = Column("end-to-end ms", "e2e_ms", "mean_std")
PEAK = Column("peak MiB", "peak_bytes", "mib")
# memory_profiling (d): one residual-stream activation tensor, B·T·d single-precision floats
RESIDUAL = Pivot("Residual-stream activation tensor B·T·d, fp32 (MiB)", "memory", ("seq",),
                 (Column("residual MiB", "residual_bytes", "mib"),),
                 where={"precision": "fp32", "mode": "train"})
DDP_TIME = (STEP, Column("communication ms", "comm_ms", "mean_std", notes_if=(("yours", (
                YOURS_COMM.format(ms="communication ms", share="communication share"))),)),
            Column("communication share", "comm_fraction", "pct"),
            Column("all-reduce ms", "allreduce_ms", "mean_std", optional=True,
                   note="all-reduce ms (cs336sys's DDPs): the time one of the gradients' "
                   "all-reduces is in flight, launch to completion, hidden or not; "
                   "communication ms also holds flat's copying of every gradient into one "
                   "buffer and back."))
# optimizer_state_sharding_accounting (a): "the peak memory usage after model initialization,
# directly before the optimizer step, and directly after": the peak up to each moment (the
# live bytes are in memory_by_moment, beside it), rank 0's
DDP_MEMORY = (
    *column_table("""
        peak after init MiB    mem_init_peak_bytes            mib
        peak before step MiB   mem_before_opt_peak_bytes      mib
        peak after step MiB    mem_after_opt_peak_bytes       mib
        parameters MiB       mem_after_opt_params_bytes     mib
        gradients MiB        mem_before_opt_grads_bytes     mib
        optimizer state MiB  mem_after_opt_opt_state_bytes  mib
        peak MiB             mem_peak_bytes                 mib
    """),
    STEP,
)


def warmup_tables(after: str, phases: tuple[Column, ...], by: str, mode: str | None) -> tuple:
    """benchmarking_script's tables: `phases` after 5 warm-up steps, by size and mode; then
    the same phases of `mode` (None: of every mode, a row each) by the number of warm-up
    steps (the handout's (c) repeats (b))."""
    return (Pivot(f"{after} after 5 warm-up steps (ms, mean ± std)", "model", ("size", "mode"),
                  phases, where={"warmup": 5}),
            Pivot(f"{by} by warm-up steps (ms, mean ± std)", "model",
                  ("size", "mode") if mode is None else ("size",), phases, across="warmup",
                  where={} if mode is None else {"mode": mode}))


# flash_benchmarking on a CPU: Triton runs there only in its interpreter, far too slow to time.
FLASH_ON_CPU = ("the command times the PyTorch FlashAttention-2 (flash-torch; yours-torch "
                "under --yours) in place of the Triton kernel the problem times, whose timings "
                "need a GPU (interpreted Triton times are the CPU emulator's)")


def theirs(line: str) -> str:
    """`line` measuring the user's assignment-1 model: `--model cs336_basics` after the
    command's name (`model`, `memory`, `memory residuals`, `profile model`, `ddp`)."""
    words = line.split(" ")
    name = 2 if tuple(words[:2]) in SUBCOMMANDS else 1
    return " ".join([*words[:name], "--model", "cs336_basics", *words[name:]])


def on_their_model(gpu: str, cpu: str | None = None, part: str = "",
                   your_adamw: bool = False) -> Run:
    """A run of cs336sys's model whose `--yours` runs the same on the user's model (and,
    with `your_adamw`, their AdamW in its training steps)."""
    return Run(gpu, cpu=cpu, yours=theirs(gpu), yours_cpu=theirs(cpu) if cpu else None,
               part=part, your_adamw=your_adamw)


def _ddp(impls: str, yours: str, part: str = "") -> Run:
    """A ddp run on two GPUs (the handout's xl, batch 4, context 512: ddp's CUDA defaults),
    or two CPU processes with Gloo; with `--yours`, `yours` on the user's model, as every
    DDP problem's runs before it, so that their tables compare one model."""
    return Run(f"ddp --impl {impls}", cpu=f"ddp --impl {impls} {DDP_CPU}",
               yours=theirs(f"ddp --impl {yours}"),
               yours_cpu=theirs(f"ddp --impl {yours} {DDP_CPU}"), part=part)


def _plan(strategy: str, degrees: str) -> Run:
    return Run(f"plan --size xl --strategy {strategy} --n {degrees} --batch 256 --seq 512")


def _calcs(name: str, points: int, section: str, strategy: str, degrees: str,
           asks: str) -> Problem:
    """An accounting problem of section 8: plan's figures and closed forms for a strategy."""
    return Problem(name, points, section=section, kind=COMPUTE, asks=asks,
                   runs=(_plan(strategy, degrees),),
                   tables=("plan", phases, closed_forms, inequalities))


PROBLEMS = (
    Problem(
        "benchmarking_script", 4, section="2.1.3",
        asks="Forward, backward and optimizer step of every size (5 warm-up, 10 timed steps, "
        "mean ± std); the same after 0, 1 and 2 warm-up steps.",
        runs=(
            on_their_model(f"model --size {SIZES} --mode forward,forward-backward,train "
                           "--warmup 5 --iters 10",
                           cpu="model --size tiny --seq 64 --mode forward,forward-backward,train "
                           "--warmup 5 --iters 3", part="(b)"),
            on_their_model(f"model --size {SIZES} --mode train --warmup 0,1,2 --iters 10",
                           cpu="model --size tiny --seq 64 --mode train --warmup 0,1,2 --iters 3",
                           part="(c)"),
        ),
        tables=warmup_tables("Time per phase", (FWD, BWD, OPT), "Training step", "train"),
    ),
    Problem(
        "nsys_profile", 5, section="2.1.4",
        asks="Profile forward, backward and optimizer step of two sizes at three context "
        "lengths above 128: the forward's time, the kernels that take the most, the share "
        "beside the matmuls, the attention's parts.",
        # forward-backward: nsys_profile (b)'s "both forward and backward passes", whose
        # every-phase table in train mode holds the optimizer's kernels too
        # (d): "one complete training step with your implementation of AdamW"
        runs=(on_their_model("profile model --size small,large --seq 256,512,1024 --mode "
                             "forward,forward-backward,train", PROFILE_CPU, your_adamw=True),),
        tables=(AsReported("profile"),),
    ),
    Problem(
        "mixed_precision_accumulation", 1, section="2.1.5",
        asks="The handout's four loops adding 0.01 a thousand times: float32, float16, and "
        "float16 values into a float32 sum (cast or not).",
        # every value spelled out: a status checks the values a command gives (a run of one
        # variant, or of 0.5 three times, read `measured`)
        runs=(Run("precision accumulate --variant fp32,fp16,fp16-into-fp32,fp16-upcast "
                  "--value 0.01 --additions 1000", anywhere=True),),
        tables=("precision",),
    ),
    Problem(
        "benchmarking_mixed_precision", 2, section="2.1.5",
        asks="(a) the dtypes the ToyModel's parts get under fp16 autocast; (c) forward and "
        "backward of every size with and without bf16 autocast.",
        runs=(
            Run("precision autocast --precision fp16,bf16", part="(a)"),
            on_their_model(f"model --size {SIZES} --mode forward-backward --precision fp32,bf16",
                           cpu=f"model {TINY} --mode forward-backward --precision fp32,bf16",
                           part="(c)"),
        ),
        tables=("precision",
                Pivot("Forward and backward, full and mixed precision (ms, mean ± std)", "model",
                      ("size",), (FWD, BWD), across="precision",
                      where={"mode": "forward-backward"})),
    ),
    Problem(
        "memory_profiling", 4, section="2.1.6",
        asks="Peak memory of the xl model, forward pass and full training step, at context "
        "128 and 2048, in fp32 and bf16, with the memory timelines; one block's residuals.",
        runs=(
            on_their_model("memory --size xl --seq 128,2048 --mode forward,train --precision "
                           "fp32,bf16 --snapshot reports/handout/memory_profiling",
                           cpu="memory --size tiny --seq 64,128 --mode forward,train --precision "
                           "fp32,bf16 --warmup 0 --iters 1 --snapshot "
                           "reports/handout/memory_profiling", part="(a)-(c)"),
            # the block of the profiled step: section 2.1.2's batch 4 (residuals' default is 1)
            on_their_model("memory residuals --size xl --seq 2048 --batch 4",
                           cpu="memory residuals --size tiny --seq 128 --batch 4 --no-compile",
                           part="(f)"),
        ),
        tables=(
            Pivot("Peak memory by context length (MiB), fp32", "memory", ("seq",), (PEAK,),
                  across="mode", where={"precision": "fp32"}),
            Pivot("Peak memory, full and mixed precision (MiB)", "memory", ("seq", "mode"),
                  (PEAK,), across="precision"),
            RESIDUAL,
            "memory-residuals",
        ),
    ),
    Problem(
        "gradient_checkpointing", 4, section="3.2.1",
        asks="(b) Peak memory of the xl model at batch 4, context 2048, with one level of "
        "checkpointing: the best block size and the next smaller and larger.",
        runs=(on_their_model("memory --size xl --seq 2048 --batch 4 --mode train --checkpoint "
                             "none,every:1,every:2,every:4,sqrt,every:8,every:16",
                             cpu="memory --size tiny --seq 128 --mode train --warmup 0 --iters 1 "
                             "--checkpoint none,every:1,every:2,every:4", part="(b)"),),
        # the whole step's peak is often the optimizer step's, the same for every policy: the
        # backward peak and the bytes saved for backward are what a block size changes
        tables=(Pivot("Peak memory of a training step by checkpointing", "memory",
                      ("checkpoint",), (PEAK, *column_table("""
                          backward peak MiB        bwd_peak_bytes  mib
                          saved for backward MiB   saved_bytes     mib
                          optimizer step peak MiB  opt_peak_bytes  mib
                      """), STEP), where={"mode": "train"},
                      note="Where the optimizer step sets the step's peak, every policy has "
                      "the same peak: the backward peak and the bytes saved for backward "
                      "tell the block sizes apart. every:1, a checkpoint per block, is the "
                      "smallest block size cs336sys checkpoints: where it is the best, the next "
                      "smaller would checkpoint a block's attention and feed-forward apart, "
                      "which it does not measure."),),
    ),
    Problem(
        "pytorch_attention", 2, section="4.1.1",
        asks="Your attention (assignment 1's under --yours; else naive attention) at batch 8 "
        "without heads, d 16..128 x seq 256..16384, 100 calls: forward, backward, memory held "
        "before backward, and where it runs out of memory.",
        runs=(Run("attention --preset pytorch-attention --attention naive",
                  cpu=f"attention --preset pytorch-attention --attention naive {ATTENTION_CPU}",
                  yours=f"attention --preset pytorch-attention --attention {A1_ATTENTION}",
                  yours_cpu=f"attention --preset pytorch-attention --attention {A1_ATTENTION} "
                  f"{ATTENTION_CPU}"),),
        # naive or yours (the implementation joins the rows where the store holds both)
        tables=(
            *(Pivot(title, "attention", ("d_head",), (value,), across="seq")
              for title, value in (
                  ("Forward (ms, mean ± std), by head dimension and sequence length", FWD),
                  ("Backward (ms, mean ± std)", BWD),
                  ("Memory held before backward (MiB)",
                   Column("MiB", "mem_before_bwd_bytes", "mib")))),
            Pivot("Memory measured against the accounting (MiB)", "attention",
                  ("d_head", "seq"), (*column_table("""
                      before backward     mem_before_bwd_bytes  mib
                      saved for backward  saved_bytes           mib
                      peak                peak_bytes            mib  optional
                  """), Column("accounted peak", "est_peak_bytes", "mib", before_run=True)),
                  note="accounted peak: q, k, v, the output and their gradients, and three "
                  "T x T matrices (scores, probabilities and their gradient), +10 %: the "
                  "estimate a point is skipped on only when it exceeds the device's free "
                  "memory; an out-of-memory point is measured and stored as OOM."),
        ),
    ),
    Problem(
        "torch_compile", 2, section="4.2",
        asks="(a) Compiled against eager naive attention at pytorch_attention's sizes; (b) the "
        "whole model compiled against eager, forward and full training step.",
        runs=(
            # (3 interleaved rounds: the preset's one round, pytorch_attention's 100 calls,
            # leaves the compiled / eager ratio no verdict)
            # on a CPU too at pytorch_attention's cut-down sizes: "with the same configuration"
            Run("attention --preset pytorch-attention --attention naive,compiled --rounds 3",
                cpu="attention --preset pytorch-attention --attention naive,compiled "
                f"{ATTENTION_CPU}",
                yours=f"attention --preset pytorch-attention --attention {A1_ATTENTION}",
                yours_cpu=f"attention --preset pytorch-attention --attention {A1_ATTENTION} "
                f"{ATTENTION_CPU}", part="(a)"),
            Run(f"attention --preset pytorch-attention --attention {A1_ATTENTION} --compile",
                yours_cpu=f"attention --preset pytorch-attention --attention {A1_ATTENTION} "
                f"--compile {ATTENTION_CPU}", part="(a)",
                yours=f"attention --preset pytorch-attention --attention {A1_ATTENTION} "
                "--compile", yours_only=True),
            on_their_model(f"model --size {SIZES} --mode forward,train",
                           cpu=f"model {TINY} --mode forward,train", part="(b)"),
            on_their_model(f"model --size {SIZES} --mode forward,train --compile",
                           cpu=f"model {TINY} --mode forward,train --compile", part="(b)"),
        ),
        tables=(
            Pivot("Attention, eager and compiled (ms, mean ± std)", "attention",
                  ("d_head", "seq"), (FWD, BWD), across="impl"),
            Pivot("The model, eager and compiled (ms, mean ± std)", "model", ("size", "mode"),
                  (FWD, BWD, STEP), across="compile"),
        ),
    ),
    Problem(
        "flash_forward", 15, section="4.2.2", kind=IMPLEMENT,
        asks="FlashAttention-2's forward as a PyTorch autograd.Function, then as a Triton "
        "kernel (get_flashattention_autograd_function_pytorch and _triton).",
        # both masks, as the course's tests run the Triton kernel (is_causal False and True)
        check=("cs336sys attention --attention yours-torch,yours-triton --pass forward --seq 128",
               "cs336sys attention --attention yours-torch,yours-triton --pass forward --seq 128 "
               "--no-causal"),
    ),
    Problem(
        "flash_backward", 5, section="4.2.2", kind=IMPLEMENT,
        asks="Its backward in PyTorch (torch.compile), from Q, K, V, O, dO and L.",
        check=("cs336sys attention --attention yours-torch,yours-triton --seq 128",
               "cs336sys attention --attention yours-torch,yours-triton --seq 128 --no-causal"),
    ),
    Problem(
        "flash_benchmarking", 5, section="4.2.2",
        asks="Forward, backward and end-to-end latency of the Triton FlashAttention-2 against "
        "PyTorch attention: batch 1, causal, seq 128..65536, d 16..128, bf16 and fp32 "
        "(do_bench).",
        runs=(Run("attention --preset flash-benchmarking --timer do-bench",
                  cpu=f"attention --preset flash-benchmarking --attention naive,flash-torch "
                  f"--precision fp32 {ATTENTION_CPU}",
                  yours="attention --preset flash-benchmarking --attention naive,yours-triton "
                  "--timer do-bench",
                  yours_cpu=f"attention --preset flash-benchmarking --attention naive,yours-torch "
                  f"--precision fp32 {ATTENTION_CPU}", cpu_note=FLASH_ON_CPU),),
        tables=(Pivot("Latency by implementation (ms, mean ± std)", "attention",
                      ("precision", "d_head", "seq"), (FWD, BWD, E2E), across="impl"),),
    ),
    Problem(
        "distributed_communication_single_node", 5, section="5.1.1",
        asks="All-reduce of float32 tensors of 1 MB, 10 MB, 100 MB and 1 GB over 2, 4 and 6 "
        "processes.",
        runs=(Run("comm --op all-reduce --bytes 1MB,10MB,100MB,1GB --world-size 2,4,6",
                  cpu="comm --op all-reduce --bytes 1MB,10MB --world-size 2 --warmup 1 "
                  "--iters 5"),),
        tables=(Pivot("All-reduce time (ms, mean over iterations) by size and processes",
                      "comm", ("backend", "bytes"),
                      (Column("ms", "time_ms_mean", "num"),), across="world_size"),
                "comm"),
    ),
    Problem(
        "naive_ddp", 5, section="5.2", kind=IMPLEMENT,
        asks="A DDP that all-reduces each parameter's gradient after the backward (get_ddp).",
        check="cs336sys ddp --impl yours --world-size 2",
    ),
    Problem(
        "naive_ddp_benchmarking", 3, section="5.2",
        asks="Time per training step and the share spent communicating, one node x 2 GPUs, xl.",
        runs=(_ddp("naive", "naive"),),
        tables=(Pivot("DDP step (ms, mean ± std)", "ddp", ("impl",), DDP_TIME),),
    ),
    Problem(
        "minimal_ddp_flat_benchmarking", 2, section="5.3.1",
        asks="The same with one all-reduce of the flattened gradients, beside the naive one.",
        runs=(_ddp("naive,flat", "naive,flat"),),
        tables=(Pivot("DDP step (ms, mean ± std)", "ddp", ("impl",), DDP_TIME),),
    ),
    Problem(
        "ddp_overlap_individual_parameters", 5, section="5.3.2", kind=IMPLEMENT,
        asks="A DDP class that overlaps each gradient's all-reduce with the backward.",
        check="cs336sys ddp --impl yours --world-size 2",
    ),
    Problem(
        "ddp_overlap_individual_parameters_benchmarking", 1, section="5.3.2",
        asks="(a) The overlapped DDP's step beside the naive and flat ones (2 GPUs, xl); (b) "
        "Nsight screenshots of the overlap: `--nsys` on the command writes the report.",
        runs=(_ddp("naive,flat,overlap", "naive,flat,yours", part="(a)"),),
        tables=(Pivot("DDP step (ms, mean ± std)", "ddp", ("impl",), DDP_TIME),),
    ),
    Problem(
        "optimizer_state_sharding", 15, section="6", kind=IMPLEMENT,
        asks="A sharded optimizer wrapping any optimizer class (get_sharded_optimizer).",
        check="cs336sys ddp --impl overlap --shard-optimizer yours --world-size 2",
    ),
    Problem(
        "optimizer_state_sharding_accounting", 5, section="6",
        asks="(a) Peak memory after init, before and after the optimizer step, by part, with "
        "and without sharding; (b) the step time of each (2 GPUs, xl).",
        runs=(_ddp("overlap --shard-optimizer", "overlap --shard-optimizer yours"),),
        tables=(Pivot("Memory of rank 0 and step time, with and without sharding", "ddp",
                      ("impl", "shard_optimizer"), DDP_MEMORY), memory_by_moment),
    ),
    Problem(
        "fsdp", 15, section="7", kind=IMPLEMENT,
        asks="An FSDP wrapper that shards Linear and Embedding weights (get_fsdp).",
        # on the user's model: the course's FSDP wraps cs336_basics.model's Linear and
        # Embedding, of which cs336sys's model has none; in fp32 and with fp16 as the
        # compute dtype, as the course's test_fsdp.py runs it (an fp16 gradient left on an
        # fp32 master weight passed fp32 alone)
        check="cs336sys " + theirs("ddp --impl yours-fsdp --world-size 2 --precision fp32,fp16"),
    ),
    Problem(
        "fsdp_accounting", 5, section="7",
        asks="(a) The memory FSDP saves against DDP and optimizer sharding; (b) whether the "
        "all-gathers finish in time: `--nsys` on the command writes the Nsight report.",
        runs=(_ddp("overlap,fsdp --shard-optimizer", "overlap,yours-fsdp --shard-optimizer yours"),),
        tables=(Pivot("Memory of rank 0 and step time, replicated and sharded", "ddp",
                      ("impl", "shard_optimizer"), DDP_MEMORY), memory_by_moment,
                # (b)'s timings: a forward that waits on its all-gathers is longer than the
                # replicas', which gather nothing
                Pivot("(b) Forward time beside the all-gathers", "ddp", ("impl", "shard_optimizer"),
                      column_table("""
                          forward ms           fwd_ms             mean_std
                          step ms              step_ms            mean_std
                          communication ms     comm_ms            mean_std
                          all-gathers/step     allgather_calls    num
                          all-gathered MiB     allgather_bytes    mib
                      """), note="forward ms: each rank's forward with the loss, the slowest "
                      "rank's; where the FSDP's is no longer than the replicated DDP's, its "
                      "all-gathers finished in time (prefetched behind the previous layers). "
                      "communication ms: for an FSDP, the time any of its collectives was in "
                      "flight, hidden or not; for the DDP, what the step waited for. "
                      "`--nsys` on the command shows each gather against the kernels.")),
    ),
    Problem(
        "alternate_ring_all_reduce", 1, section="8.1", kind=COMPUTE,
        asks="The time of the alternate ring all-reduce in S, N and W.",
        runs=(_plan("dp", "2,4,8,16"),),
        tables=(all_reduces,),
    ),
    _calcs("data_parallel_calcs", 3, "8.2", "dp", "1,2,4,8,16,64,256",
           "DP's backward FLOPs and communication, and the largest N_DP before it is "
           "communication-bound."),
    _calcs("fsdp_calcs", 3, "8.3", "fsdp", "1,2,4,8,16,64,256",
           "FSDP's forward and backward FLOPs and communication, and the largest N_FSDP."),
    _calcs("tp_calcs", 4, "8.4", "tp", "1,2,4,8,16,32",
           "TP's backward pass, its FLOPs and communication, and the largest N_TP."),
    _calcs("fsdp_tp_calcs", 6, "8.5", "fsdp-tp", "4,16,64,256",
           "FSDP + TP: forward FLOPs and communication, the largest N with the two axes "
           "overlapped and not."),
    Problem(
        "leaderboard", 10, section="9",
        asks="A full training step of the 8B model (batch 2, context 32,768, bf16, causal, two "
        "GPUs): on one GPU scaled (8 of 34 layers, context 8192), each optimisation alone "
        "and all; then as the leaderboard runs it, on two ranks.",
        runs=(Run("step", cpu="step --size tiny --seq 64 --warmup 1 --iters 2"),
              Run("step --preset leaderboard --switches none,fused-adamw+flash",
                  cpu="step --preset leaderboard --size tiny --seq 64 --precision fp32 "
                  "--switches none --warmup 1 --iters 2",
                  # the user's FSDP on the user's model: the course's shards cs336_basics'
                  # layers, none of cs336sys's (whose flash switch --model leaves out)
                  yours="step --preset leaderboard --model cs336_basics --ddp yours-fsdp "
                  "--switches none,fused-adamw",
                  yours_cpu="step --preset leaderboard --model cs336_basics --ddp yours-fsdp "
                  "--size tiny --seq 64 --precision fp32 --switches none --warmup 1 --iters 2")),
        tables=("step",),
    ),
)
