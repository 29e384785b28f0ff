"""`cs336sys plan`: step time, communication and memory per device of DP, FSDP, TP and
FSDP+TP at each degree, for a whole Transformer LM on a given GPU. Nothing runs on a device:
a point is arithmetic (parallel/plan_math.py has the collectives and the single-FFN
derivation; this module applies them to every layer, the embedding and the LM head).

Conventions (docs/experiments/plan.md explains every column):

- B is the global batch in tokens of one forward and backward (no gradient accumulation),
  whole sequences of `seq` tokens. DP and FSDP give each device B/N tokens; TP gives every
  device all B; FSDP+TP (N = X*Y) gives each TP group of Y devices B/X.
- FLOPs are models/flops.py's (PaLM: matmuls only, backward = 2 x forward, attention's
  T x T scores counted in full); every strategy splits them evenly over the N devices.
- bf16 mixed precision (Rajbhandari et al. 2020, ZeRO, section 3.1): bf16 weights (2 bytes
  a parameter) and gradients (2), and AdamW's fp32 master weights, first and second
  moments (12): 16 bytes a parameter, what DP keeps whole on every device. Collectives move
  bf16 (2 bytes an element).
- DP all-reduces every gradient once in backward. FSDP (ZeRO-3, every tensor sharded,
  each padded to a multiple of N elements) all-gathers the weights in forward and again in
  backward and reduce-scatters the gradients. TP (Megatron-LM, Shoeybi et al. 2019) splits
  q, k, v and w1, w3 by columns, o and w2 by rows, the embedding and LM head by vocabulary,
  and keeps the RMSNorm gains whole: per layer two all-reduces of the B x D activations in
  forward (after o and after w2) and two in backward (the gradients of the inputs of q, k, v
  and of w1, w3), plus one for the embedding in forward and one for the LM head's input in
  backward. The loss's all-reduces (a max and a sum per token) are left out: 8 bytes a token.
  FSDP+TP shards each TP shard over X devices and picks the split X*Y = N, Y dividing the
  heads and X the sequences, with the shortest step.
- Communication hides when in forward and in backward it takes no longer than that phase's
  compute (every collective overlapped). Step time = max(forward compute, forward comm) +
  max(backward compute, backward comm); the optimizer step is left out.
- Activations (what autograd saves, bf16, counted tensor by tensor as Korthikanti et al.
  2022, "Reducing Activation Recomputation in Large Transformer Models", section 4.1, do for
  GPT), per token and layer of this model (RMSNorm, RoPE, SwiGLU, no dropout; attention by
  FlashAttention-2, which keeps a logsumexp per head, 4 bytes, instead of the T x T scores):
  attention 2D (norm input) + 2D (q, k, v input) + 6D (q, k, v) + 2D (o input) + 4H;
  SwiGLU 2D (norm input) + 2D (w1, w3 input) + 8F (w1 out, w3 out, silu, product):
  16D + 8F + 4H bytes. Under TP the inputs of the norms and of the split matmuls are whole
  on every device (no sequence parallelism: Korthikanti's Table 2, "tensor parallel"), the
  rest is divided by Y: 8D + (8D + 8F + 4H) / Y. The head: the final norm's and the LM
  head's inputs 4D, and the logits in bf16 with their fp32 log-softmax, 6V (6V / Y under
  TP). Full checkpointing of each layer keeps its input, 2D a token a layer, and recomputes
  one layer at a time in backward.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cs336sys.experiments import plan_section
from cs336sys.experiments.plan_degrees import (
    check_splittable,
    mesh_of,
    problem,
    split_of,
    splits,
    tp_units,
    whole_split,
)
from cs336sys.experiments.plan_hardware import Hardware, listed_hardware
from cs336sys.experiments.plan_model import (
    ACCOUNTING,
    XXL,
    fsdp_fit,
    gathered_bytes,
    sharded,
    token_bytes,
)
from cs336sys.measure.clock import now
from cs336sys.models.config import ModelConfig, ModelShape, from_preset, preset_name, presets
from cs336sys.parallel import plan_math as pm
from cs336sys.sweep.declaration import Experiment, Metric, metric_table
from cs336sys.sweep.points import (
    SpecError,
    check_size,
    choices,
    one_value_options,
    positive_ints,
    positive_sizes,
    shape_error,
    unknown,
)
from cs336sys.sweep.result import Result

STRATEGIES = pm.STRATEGIES
E = pm.E  # bytes per bf16 element


@dataclass(frozen=True)
class PlanSpec(ModelShape):
    batch_tokens: int  # B: global batch of one step, in tokens
    strategy: str
    n: int  # degree
    hardware: str  # a HARDWARE key, or "measured"
    device_name: str  # the device's name (not `gpu`: the views have the invocation's)
    flops: float  # C
    egress: float  # W
    memory_bytes: int
    source: str
    blocks: str = "transformer"  # what the model is made of (plan_model.py): or ffn2 (XXL)
    split: str | None = None  # fsdp-tp: the split XxY given by hand (--split), else the best
    mesh_axes: str | None = None  # "MX,MY": the Scaling Book's mesh axes (--mesh-axes)

    @property
    def mesh(self) -> tuple[float, float]:
        """(M_X, M_Y): the mesh axes the FSDP and TP collectives run over, each at W (1, 1
        without --mesh-axes)."""
        if not self.mesh_axes:
            return 1.0, 1.0
        mx, my = (float(a) for a in self.mesh_axes.split(","))
        return mx, my

    def config(self) -> ModelConfig:
        return ModelConfig(d_model=self.d_model, d_ff=self.d_ff, num_layers=self.num_layers,
                           num_heads=self.num_heads, vocab_size=self.vocab_size,
                           context_length=self.seq, max_context_length=max(self.seq, 65_536))


@one_value_options
def specs(
    *,
    size: str = "8b",
    seq: int | None = None,
    batch: int | None = None,
    tokens: int | None = None,
    strategy: Iterable[str] | None = None,
    n: Iterable[Any] | None = None,
    hardware: Iterable[Hardware | str] | str | None = None,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_layers: int | None = None,
    num_heads: int | None = None,
    vocab_size: int | None = None,
    split: str | None = None,
    mesh_axes: str | None = None,
) -> list[PlanSpec]:
    """The points of a plan: every hardware x strategy x degree. The global batch is `batch`
    sequences of `seq` tokens, or `tokens` (whole sequences). `size` "xxl" is the 2025
    handout's two-matrix blocks (plan_model.py). `split` fixes FSDP+TP's split ("16x4"),
    `mesh_axes` ("2,1") adds the Scaling Book's mesh accounting to its points. SpecError
    names a bad option:
    an unknown size or strategy, a non-positive value, both batch and tokens, tokens that are
    not whole sequences, a TP degree that does not divide the heads, a DP or FSDP degree that
    does not divide the batch's sequences."""
    blocks = "ffn2" if size.strip().lower() == "xxl" else "transformer"
    if blocks != "ffn2" and size.strip().lower() not in {p.lower() for p in presets()}:
        raise unknown("--size", size, [*presets(), "xxl"], "size")
    size = "xxl" if blocks == "ffn2" else preset_name(size)
    split = None if split is None else "x".join(map(str, split_of(split)))
    mesh_axes = None if mesh_axes is None else mesh_of(mesh_axes)
    positive_sizes(seq=seq, batch=batch, tokens=tokens)
    given = positive_sizes(d_model=d_model, d_ff=d_ff, num_layers=num_layers,
                           num_heads=num_heads, vocab_size=vocab_size)
    if batch is not None and tokens is not None:
        raise SpecError("--batch counts sequences and --tokens tokens: give one of them")
    seq = seq or 4096
    if tokens is not None and tokens % seq:
        raise SpecError(f"--tokens {tokens} is not a whole number of --seq {seq} token sequences")
    batch = tokens if tokens is not None else (batch or 256) * seq  # 1M tokens at 4096
    check_size(batch, "--batch x --seq")
    for name, value in (("--batch x --seq", batch), ("--d-ff", given.get("d_ff")),
                        ("--num-heads", given.get("num_heads"))):
        check_splittable(name, value)
    unused = [k for k in ("num_heads", "vocab_size") if given.get(k) is not None]
    if blocks == "ffn2" and unused:  # it would be stored and ignored
        raise SpecError(f"--{unused[0].replace('_', '-')}: the 2025 handout's xxl is blocks of "
                        "two matrices, with no heads and no vocabulary")
    try:
        if blocks == "ffn2":  # not a Transformer: no heads to check, no vocabulary
            cfg = ModelConfig(**{**XXL, **{k: v for k, v in given.items() if v is not None}},
                              context_length=seq, max_context_length=max(seq, 65_536))
        else:
            cfg = from_preset(size, **given, context_length=seq,
                              max_context_length=max(seq, 65_536))
    except ValueError as exc:
        raise shape_error(exc) from None
    strategies = choices(strategy, STRATEGIES, "--strategy", default=list(STRATEGIES))
    if "fsdp-tp" not in strategies and (split or mesh_axes):  # it would be ignored
        raise SpecError(f"{'--split' if split else '--mesh-axes'} is a setting of fsdp-tp, "
                        f"which --strategy {','.join(strategies)} leaves out")
    degrees = positive_ints(n, "--n", default=[1, 2, 4, 8])
    units = cfg.d_ff if blocks == "ffn2" else cfg.num_heads
    for d in degrees:  # a degree no strategy asked for can take is a typo
        why = [problem(s, d, units, batch // seq, split,
                       "d_ff columns" if blocks == "ffn2" else "heads") for s in strategies]
        if all(why):
            raise SpecError(f"--n {d}: {why[0]}" if len(why) == 1 else
                            f"--n {d} fits none of the strategies: {'; '.join(why)}")
    return [
        PlanSpec(**ModelShape.of(size, cfg), batch_tokens=batch,
                 strategy=s, n=d, hardware=key, device_name=hw.name, flops=hw.flops, egress=hw.egress,
                 memory_bytes=hw.memory_bytes, source=hw.source, blocks=blocks,
                 split=split if s == "fsdp-tp" else None,
                 mesh_axes=mesh_axes if s == "fsdp-tp" else None)
        for key, hw in listed_hardware(hardware) for s in strategies for d in degrees
    ]


# -- the whole model ----------------------------------------------------------------------------


def evaluate(spec: PlanSpec, x: int, y: int) -> dict[str, Any]:
    """Every metric of the point for the split x (FSDP or DP degree) * y (TP degree)."""
    cfg, model = spec.config(), ACCOUNTING[spec.blocks or "transformer"]
    n, c, w, b = spec.n, spec.flops, spec.egress, spec.batch_tokens
    fwd_flops = model.forward_flops(cfg, b // spec.seq, spec.seq)
    comp_f, comp_b = fwd_flops / (n * c), 2 * fwd_flops / (n * c)
    local = model.tensors(cfg, y)
    tp_bytes = E * sum(local)  # weights of one TP shard (the whole model when y = 1)
    acts = E * (b // x) * cfg.d_model  # one all-reduce of the activations a device sees
    tp_reduces = model.tp_reduces(cfg)  # per phase
    ag = rs = ar = 0.0  # seconds per step of each kind of collective
    # --mesh-axes M_X,M_Y: the FSDP collectives run over M_X mesh axes, TP's over M_Y, each
    # at W (How to Scale Your Model, part 5), as the mesh table counts them
    mx, my = spec.mesh
    comm_f = comm_b = 0.0
    moved = 0  # bytes: S of every collective of the step, summed (as ddp's comm_bytes)
    sent = 0.0  # bytes a device sends in them, ring algorithms (as ddp's sent_bytes)
    if spec.strategy == "dp" and n > 1:
        ar = comm_b = pm.all_reduce_s(tp_bytes, n, w)
        moved, sent = tp_bytes, pm.sent_bytes("all_reduce", tp_bytes, n)
    elif spec.strategy in ("fsdp", "fsdp-tp") and x > 1:
        ag1 = pm.all_gather_s(tp_bytes, x, w * mx)
        rs = pm.reduce_scatter_s(tp_bytes, x, w * mx)
        ag = 2 * ag1
        comm_f, comm_b = ag1, ag1 + rs
        moved = 3 * tp_bytes  # two all-gathers and a reduce-scatter of the shard's S
        sent = 3 * pm.sent_bytes("all_gather", tp_bytes, x)
    if spec.strategy in ("tp", "fsdp-tp") and y > 1:
        tp = tp_reduces * pm.all_reduce_s(acts, y, w * my)
        ar = 2 * tp
        # FSDP+TP: the two axes' collectives overlap, as fsdp_tp_calcs (b) and (c) assume (the
        # time is the larger); sharing the links, (d), they add: N max (FFN, shared links)
        comm_f, comm_b = max(comm_f, tp), max(comm_b, tp)
        moved += 2 * tp_reduces * acts
        sent += 2 * tp_reduces * pm.sent_bytes("all_reduce", acts, y)
    hides = comm_f <= comp_f and comm_b <= comp_b
    # memory per device
    shard = sharded(local, x) if spec.strategy in ("fsdp", "fsdp-tp") else sum(local)
    mem = {k: per * shard for k, per in model.bytes_per_param}
    fsdp = x > 1 and spec.strategy != "dp"
    gathered = gathered_bytes(model, local) if fsdp else 0
    per_token, per_token_ckpt = token_bytes(model, cfg, y)
    tokens = b // x  # tokens one device's forward sees
    static = sum(mem.values()) + gathered
    # the tokens whose activations a device keeps: FSDP shards this share of all b tokens'
    # activations over the x devices and every device keeps the rest whole (share 1: each
    # keeps those of its own b/x tokens)
    share = model.fsdp_activation_share if fsdp else 1
    kept_tokens = share * tokens + (1 - share) * b
    act, act_ckpt = kept_tokens * per_token, kept_tokens * per_token_ckpt
    per_seq, per_seq_ckpt = act / (tokens / spec.seq), act_ckpt / (tokens / spec.seq)
    cap = spec.memory_bytes
    return dict(
        fsdp_degree=x if spec.strategy != "tp" else 1, tp_degree=y,
        tokens_per_device=tokens, flops_per_step=3 * fwd_flops,
        compute_fwd_ms=comp_f * 1e3, compute_bwd_ms=comp_b * 1e3, compute_ms=(comp_f + comp_b) * 1e3,
        comm_fwd_ms=comm_f * 1e3, comm_bwd_ms=comm_b * 1e3, comm_ms=(comm_f + comm_b) * 1e3,
        allgather_ms=ag * 1e3, reducescatter_ms=rs * 1e3, allreduce_ms=ar * 1e3,
        comm_bytes=moved, sent_bytes=sent,
        step_ms=(max(comp_f, comm_f) + max(comp_b, comm_b)) * 1e3,
        step_serial_ms=(comp_f + comp_b + comm_f + comm_b) * 1e3,
        hides=hides, comm_bound=not hides,
        mem_params_bytes=mem["params"], mem_grads_bytes=mem["grads"],
        mem_opt_state_bytes=mem["opt_state"], mem_gathered_bytes=gathered,
        mem_act_bytes=act, mem_act_ckpt_bytes=act_ckpt,
        mem_total_bytes=static + act, mem_total_ckpt_bytes=static + act_ckpt,
        fits=static + act <= cap, fits_ckpt=static + act_ckpt <= cap,
        # whole sequences per device (per TP group) that fit beside the static bytes
        fit_seqs=max(0, math.floor((cap - static) / per_seq)),
        fit_seqs_ckpt=max(0, math.floor((cap - static) / per_seq_ckpt)),
    )


def n_max(spec: PlanSpec) -> float:
    """The largest degree at which the whole model's step still hides its communication:
    the product of the two axes' bounds (axis_bounds)."""
    x, y = axis_bounds(spec)
    return x * y


def axis_bounds(spec: PlanSpec) -> tuple[float, float]:
    """The largest FSDP (or DP) degree X and TP degree Y at which each axis's collectives
    still hide behind compute, from the same per-phase comparison as `evaluate`, solved
    for the degree (real numbers, as fsdp_tp_calcs (c) takes them; the padding of FSDP
    shards and TP's rounding of the vocabulary left out; 1 on an axis the strategy lacks).
    The axis's bound holds whatever the other's degree is, so N max is their product:
    DP, FSDP  N <= 1 + F_fwd W / (C P e)  (forward and backward give the same bound);
    TP        N <= 1 + F_fwd W / (C (2L+1) 2 B D e)  (forward binds);
    FSDP+TP   the two axes overlapped, as in `evaluate` (fsdp_tp_calcs (b), (c)): each axis
              hides alone, so N <= (1 + M_X F_fwd W / (C P e)) (1 + M_Y F_fwd W / (C (2L+1)
              2 B D e)), M_X, M_Y the mesh axes of --mesh-axes (1 without); the links shared,
              (d), is N max (FFN, shared links)."""
    cfg, model = spec.config(), ACCOUNTING[spec.blocks or "transformer"]
    fwd = model.forward_flops(cfg, spec.batch_tokens // spec.seq, spec.seq) / spec.flops
    weights = E * sum(model.tensors(cfg)) / spec.egress
    acts = model.tp_reduces(cfg) * 2 * E * spec.batch_tokens * cfg.d_model / spec.egress
    if spec.strategy in ("dp", "fsdp"):
        return 1 + fwd / weights, 1.0
    if spec.strategy == "tp":
        return 1.0, 1 + fwd / acts
    mx, my = spec.mesh
    return 1 + mx * fwd / weights, 1 + my * fwd / acts


def arithmetic(experiment: Experiment, specs: list, skip: Any, emit: Any) -> None:
    """run_sweep's executor for points that are arithmetic (sweep/runner.py, Executor):
    one after another, in this process, without the guard of `local`, which after every
    point collects garbage and empties the CUDA cache (importing torch to do so): a plan
    point holds no memory to give back, and an exception in it is a bug to see."""
    for spec in specs:
        started, t0 = now(), time.perf_counter()
        result = skip(spec) or experiment.run(spec)
        result.started, result.duration_s = started, time.perf_counter() - t0
        emit(spec, result)


def run(spec: PlanSpec) -> Result:
    """The point's metrics; `skipped` (with the reason) where the strategy cannot take the
    degree while another strategy of the same sweep can (TP at 64 devices of 32 heads)."""
    cfg = spec.config()
    sequences = spec.batch_tokens // spec.seq
    why = problem(spec.strategy, spec.n, tp_units(spec), sequences, spec.split,
                  "d_ff columns" if spec.blocks == "ffn2" else "heads")
    if why:
        return Result("skipped", error=f"skipped: {why}")
    if spec.strategy == "dp" or spec.strategy == "fsdp":
        options = [(spec.n, 1)]
    elif spec.strategy == "tp":
        options = [(1, spec.n)]
    elif spec.split:
        options = [split_of(spec.split)]
    else:
        options = splits(spec.n, tp_units(spec), sequences)
    best = min(
        (evaluate(spec, x, y) for x, y in options), key=lambda m: (m["step_ms"], m["comm_ms"])
    )
    model = ACCOUNTING[spec.blocks or "transformer"]
    bounds = axis_bounds(spec)
    whole_x, whole_y = whole_split(*bounds, tp_units(spec), sequences)
    ffn = pm.ffn_n_max(spec.strategy, spec.batch_tokens, spec.d_ff, spec.flops, spec.egress,
                       m=model.matrices, overlap=True, mesh=spec.mesh)
    metrics = dict(
        best,
        params=sum(model.tensors(cfg)),
        n_max=math.floor(bounds[0] * bounds[1]),
        n_max_whole=whole_x * whole_y,
        n_max_whole_split=f"{whole_x}x{whole_y}",
        n_max_ffn=math.floor(ffn),
        # m: the FFN's weight matrices, 3 for SwiGLU, 2 for the 2025 handout's xxl
        inequality=pm.INEQUALITY[spec.strategy] + f" (m = {model.matrices})",
    )
    if spec.strategy == "fsdp":  # 2025 communication_accounting (b): the N that fits
        metrics["fsdp_fit_n"], metrics["fsdp_fit_tokens_max"] = fsdp_fit(
            model, cfg, spec.batch_tokens, spec.memory_bytes)
    if spec.strategy == "fsdp-tp":  # the handout asks both: axes overlapped, then sharing links
        shared = pm.ffn_n_max(spec.strategy, spec.batch_tokens, spec.d_ff, spec.flops,
                              spec.egress, m=model.matrices, overlap=False)
        metrics["n_max_ffn_shared"] = math.floor(shared)
        if spec.mesh_axes:
            per_device, tp_hides = pm.mesh_batch_per_device(
                spec.d_ff, best["tp_degree"], spec.flops, spec.egress, *spec.mesh,
                m=model.matrices)
            metrics.update(mesh_batch_per_device_min=per_device,
                           mesh_batch_min=per_device * spec.n, mesh_tp_hides=tp_hides)
    return Result("ok", metrics=metrics)


# -- the report section and the declaration ------------------------------------------------


EXPERIMENT = Experiment(
    kind="plan",
    title="Plan: parallelism from first principles",
    analytic=True,
    spec=PlanSpec,
    run=run,
    metrics=(
        *metric_table("""
            fsdp_degree        -       X: devices the weights are sharded (dp: replicated) over
            tp_degree          -       Y: devices each matmul is split over (1 without TP)
            tokens_per_device  tokens  tokens one device's forward sees
            flops_per_step     FLOP    forward + backward matmul FLOPs of the global batch
            compute_fwd_ms     ms      forward FLOPs / (N C)
            compute_bwd_ms     ms      backward FLOPs (2 x forward) / (N C)
            compute_ms         ms      forward + backward compute
            comm_fwd_ms        ms      communication in forward, per device
            comm_bwd_ms        ms      communication in backward, per device
            comm_ms            ms      communication of the step
            allgather_ms       ms      all-gathers of the step: (N-1)/N S/W each
            reducescatter_ms   ms      reduce-scatters of the step: (N-1)/N S/W each
            allreduce_ms       ms      all-reduces of the step: 2(N-1)/N S/W each
            step_ms            ms      max(compute, comm) in forward + the same in backward
            step_serial_ms     ms      compute + comm, nothing overlapped
            hides              -       communication no longer than compute in both phases
            comm_bound         -       not hides
            n_max              -       largest degree that still hides, whole model (each axis's degree a real number)
            n_max_whole        -       largest degree that hides with whole degrees: X dividing the sequences, Y the heads (d_ff), each under its axis's bound
            n_max_whole_split  -       its split XxY (FSDP or DP degree x TP degree)
            n_max_ffn          -       largest degree that still hides, one FFN layer (SwiGLU; xxl: two matrices) (closed form; fsdp-tp: the axes overlapped)
            n_max_ffn_shared   -       fsdp-tp: the same with the two axes' collectives sharing the links (times add)
            mesh_batch_per_device_min  tokens  fsdp-tp with --mesh-axes: the per-device batch above which the forward is compute-bound (Scaling Book)
            mesh_batch_min     tokens  the same over the N devices
            mesh_tp_hides      -       fsdp-tp with --mesh-axes: TP's collectives hide behind compute (mF/(2Y) > C/(W M_Y))
            inequality         -       the closed-form condition for hiding
            params             -       parameters of the model
        """),
        *(
            Metric(f"mem_{k}_bytes", "bytes", f"per device: {k.replace('_', ' ')}")
            for k in (
                "params",
                "grads",
                "opt_state",
                "gathered",
                "act",
                "act_ckpt",
                "total",
                "total_ckpt",
            )
        ),
        *metric_table("""
            fits                 -      total <= the GPU's memory
            fits_ckpt            -      total with checkpointing <= the GPU's memory
            fit_seqs             -      whole sequences per device that fit
            fit_seqs_ckpt        -      the same with checkpointing
            fsdp_fit_n           -      fsdp: the smallest degree whose memory per device fits, (S + sBa)/N + G + (1-s)Ba (plan_model.fsdp_fit); none where the activations kept whole exceed it alone
            fsdp_fit_tokens_max  tokens fsdp: the largest batch some degree fits (xxl: its whole half of the activations under the memory); none where any batch does
            comm_bytes           bytes  the plan's bytes of every collective in one step (S)
            sent_bytes           bytes  what a device sends in them (ring: all-reduce 2(N-1)/N S, the others (N-1)/N S)
            measured_run_id      -      the ddp run set beside this point
            measured_impl        -      its impl
            measured_step_ms     ms     its step time, mean
            measured_comm_ms     ms     its exposed communication, mean
            measured_comm_bytes  bytes  bytes its collectives moved in one step
            measured_sent_bytes  bytes  what a rank sent in them, the ranks' mean
            measured_step_ratio  -      measured / planned step time
            measured_comm_ratio  -      measured / planned communication
        """),
    ),
    tables=(plan_section.TIME, plan_section.MEMORY),
    compare="step_ms",
    section=plan_section.section,
    draws=True,
)
