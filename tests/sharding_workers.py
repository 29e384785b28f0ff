"""Models, data and rank workers for tests/test_sharding.py (ShardedOptimizer and FSDP).

A module of its own because spawned ranks import the workers by name. Everything a rank
returns is numpy (torch would pickle CPU tensors through shared-memory file descriptors
that vanish with the rank).
"""

from __future__ import annotations

import contextlib
import gc
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from cs336sys.models.transformer import LMHead
from cs336sys.parallel.comm_counter import CommCounter
from cs336sys.parallel.fsdp import FSDP
from cs336sys.parallel.sharded_optimizer import ShardedOptimizer

WORLD_SIZE = 2
ROUNDS = 3  # each case is trained 3 times, from fresh seeds
VOCAB, D, HIDDEN = 17, 11, 13  # odd sizes: every sharded weight needs padding


def np_state(tensors: dict) -> dict:
    return {k: v.detach().float().cpu().numpy().copy() for k, v in tensors.items()}


# -- ShardedOptimizer ------------------------------------------------------------------------


class OptToy(nn.Module):
    """fc1 and fc2 train from the start; `late` is frozen until add_param_group unfreezes it."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 9)
        self.fc2 = nn.Linear(9, 5)
        self.late = nn.Linear(5, 5)
        self.late.requires_grad_(False)

    def forward(self, x):
        return self.late(self.fc2(torch.tanh(self.fc1(x))))


OPT_STEPS, UNFREEZE_AT, RELOAD_AT = 5, 2, 3


def opt_batch(round_: int, step: int):
    g = torch.Generator().manual_seed(1000 * round_ + step)
    return torch.randn(8, 6, generator=g, dtype=torch.float64), torch.randn(8, 5, generator=g, dtype=torch.float64)


def opt_groups(model: OptToy, kind: str) -> tuple[list, type, dict]:
    """(param groups, optimizer class, defaults): AdamW in one group, SGD in two."""
    if kind == "adamw":
        return [{"params": [*model.fc1.parameters(), *model.fc2.parameters()]}], torch.optim.AdamW, dict(lr=0.01, weight_decay=0.1)
    return ([{"params": model.fc1.parameters(), "lr": 0.1},
             {"params": model.fc2.parameters(), "lr": 0.02}],
            torch.optim.SGD, dict(lr=0.05, momentum=0.9))


LATE_GROUP = {"lr": 0.03}


def train_sharded(ctx, kind: str, round_: int) -> dict:
    """Every rank sees the whole batch, so gradients agree without DDP: the optimizer alone
    is under test. Unfreezes `late` mid-training and swaps in a reloaded optimizer."""
    from cs336sys.parallel import sharded_optimizer

    # SGD's run broadcasts in 64-byte buckets: several per owner, and parameters too large
    # for one sent alone in place; AdamW's in the default 25 MiB, everything in one.
    sharded_optimizer.BUCKET_BYTES = 64 if kind == "sgd" else 25 * 2**20
    torch.manual_seed(round_)
    model = OptToy().double()
    initial = np_state(model.state_dict())
    groups, cls, defaults = opt_groups(model, kind)
    opt = ShardedOptimizer(groups, cls, **defaults)
    losses = []
    for step in range(OPT_STEPS):
        if step == UNFREEZE_AT:
            model.late.requires_grad_(True)
            opt.add_param_group({"params": model.late.parameters(), **LATE_GROUP})
        if step == RELOAD_AT:  # this rank's shard saved and restored into a new optimizer
            saved = opt.state_dict()
            groups, cls, defaults = opt_groups(model, kind)
            groups.append({"params": model.late.parameters(), **LATE_GROUP})
            opt = ShardedOptimizer(groups, cls, **defaults)
            opt.load_state_dict(saved)
        x, y = opt_batch(round_, step)

        def closure(x=x, y=y, opt=opt):
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(model(x), y)
            loss.backward()
            return loss

        losses.append(float(opt.step(closure).detach()))
    names = {id(p): n for n, p in model.named_parameters()}
    owned = sorted(names[id(p)] for p, r in opt.owner.items() if r == ctx.rank)
    state_params = sorted(names[id(p)] for p in opt.local.state)
    opt.zero_grad(set_to_none=True)
    return dict(
        initial=initial, final=np_state(model.state_dict()), losses=losses, owned=owned,
        state_params=state_params, state_elements=sum(
            v.numel() for s in opt.local.state.values() for v in s.values()
            if torch.is_tensor(v) and v.dim() > 0),
        grads_cleared=all(p.grad is None for p in model.parameters()),
        is_optimizer=isinstance(opt, torch.optim.Optimizer),
    )


# -- FSDP ------------------------------------------------------------------------------------


class TinyLM(nn.Module):
    """Embedding, linear layers with biases, LayerNorms, an optional frozen projection and
    an LM head (cs336sys's: given the targets, the fused loss), optionally tied to the
    embedding."""

    def __init__(self, tied: bool = False, frozen: bool = False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, D)
        self.fc1 = nn.Linear(D, HIDDEN)
        self.norm = nn.LayerNorm(HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, D)
        self.proj = nn.Linear(D, D, bias=False)
        self.ln_f = nn.LayerNorm(D)
        self.head = LMHead(D, VOCAB, bias=False)
        if tied:
            self.head.weight = self.emb.weight
        if frozen:
            self.proj.weight.requires_grad_(False)

    def forward(self, tokens, targets=None):
        h = self.emb(tokens)  # (B, T, D)
        h = h + self.fc2(torch.tanh(self.norm(self.fc1(h))))
        if targets is None:
            return self.head(self.ln_f(self.proj(h)))  # (B, T, V)
        return self.head(self.ln_f(self.proj(h)), targets)  # (,): summed, logits never whole


FSDP_CASES = {  # name -> (tied, frozen, compute dtype, optimizer)
    "fp32-adamw": (False, False, None, "adamw"),
    "fp32-sgd": (False, False, None, "sgd"),
    "tied": (True, False, None, "adamw"),
    "frozen": (False, True, None, "sgd"),
    # plain SGD: AdamW's m / sqrt(v) turns fp16 rounding of a near-zero gradient into an
    # update of +-lr, which would test AdamW rather than the casting
    "fp16": (False, False, torch.float16, "plain-sgd"),
    # a frozen weight, left unsharded, computes in the compute dtype too (it stayed fp32 and
    # its matmul met fp16 inputs)
    "frozen-fp16": (False, True, torch.float16, "plain-sgd"),
    # the LM head's weight read by the fused loss inside the head's forward, where the unit
    # has gathered it; the reference trains on the materialised logits
    "fused-ce": (False, False, None, "adamw"),
}
FSDP_STEPS, LOCAL_BATCH = 3, 2


def lm_batch(round_: int, step: int):
    g = torch.Generator().manual_seed(500 * round_ + step)
    n = LOCAL_BATCH * WORLD_SIZE
    return torch.randint(0, VOCAB, (n, 5), generator=g), torch.randint(0, VOCAB, (n, 5), generator=g)


def make_optimizer(kind: str, params):
    """Ours for AdamW (any optimizer steps the slices), torch's SGD with or without momentum."""
    from cs336sys.models.adamw import AdamW

    if kind == "adamw":
        return AdamW(params, lr=0.02, weight_decay=0.1)
    if kind == "plain-sgd":
        return torch.optim.SGD(params, lr=0.1)
    return torch.optim.SGD(params, lr=0.2, momentum=0.9)


def lm_loss(model, tokens, targets, fused: bool = False):
    if fused:
        return model(tokens, targets) / targets.numel()  # the mean, as cross_entropy's
    return F.cross_entropy(model(tokens).float().flatten(0, 1), targets.flatten())


def train_fsdp(ctx, case: str, round_: int) -> dict:
    tied, frozen, dtype, kind = FSDP_CASES[case]
    torch.manual_seed(100 * round_ + 7 * ctx.rank)  # differs per rank: FSDP broadcasts rank 0's
    model = TinyLM(tied, frozen)
    fsdp = FSDP(model, compute_dtype=dtype)
    seen = {}  # the dtype of a norm's gain and of a Linear's bias, inside their forwards
    model.norm.register_forward_pre_hook(lambda m, a: seen.update(norm=str(m.weight.dtype)))
    model.fc1.register_forward_pre_hook(lambda m, a: seen.update(bias=str(m.bias.dtype)))
    initial = fsdp.full_state_dict()  # rank 0's weights, whole, as every rank now shards them
    opt = make_optimizer(kind, fsdp.parameters())
    part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
    grads, gathered = {}, None
    for step in range(FSDP_STEPS):
        x, y = lm_batch(round_, step)
        # the second step's all-gathers, counted by torch's dispatcher rather than by FSDP
        with CommCounter() if step == 1 else contextlib.nullcontext() as comm:
            lm_loss(fsdp, x[part], y[part], fused=case == "fused-ce").backward()
            fsdp.finish_gradient_synchronization()
        if step == 1:
            gathered = comm.bytes["all_gather"]
        if step == FSDP_STEPS - 1:
            grads = {
                "sharded": [(tuple(p.grad.shape), tuple(p.shape), str(p.grad.dtype))
                            for p in fsdp.shards],
                "replicated": {n: p.grad.numpy().copy()
                               for n, p in fsdp.module.named_parameters() if p.requires_grad},
            }
        opt.step()
        opt.zero_grad(set_to_none=True)
    return dict(
        initial=np_state(initial), final=np_state(fsdp.full_state_dict()), grads=grads,
        param_bytes=sum(p.numel() * p.element_size() for p in fsdp.parameters() if p.requires_grad),
        full_param_bytes=sum(p.numel() * 4 for p in model_params(tied, frozen)),
        frozen_left=frozen and type(fsdp.module.proj.weight) is nn.Parameter
        and not fsdp.module.proj.weight.requires_grad,
        calls=dict(fsdp.comm_calls), gathered_bytes=gathered, seen=seen,
    )


def model_params(tied: bool, frozen: bool) -> list:
    """The trainable parameters of an unwrapped TinyLM, each once."""
    return [p for p in TinyLM(tied, frozen).parameters() if p.requires_grad]


class Tower(nn.Module):
    """Large weights, tiny activations: any full weight kept after forward shows."""

    def __init__(self, width=128, depth=6):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width, bias=False) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers:
            x = torch.tanh(layer(x))
        return x


def _settled(tracker, quiet_s: float = 0.05, limit_s: float = 2.0) -> int:
    """The tracker's live bytes once nothing is being freed any more. Two things free
    tensors after the fact: the cycle collector (the full weights before sharding, seen
    freed inside the measured forward: -62 KB) and Gloo's worker threads, which drop their
    reference to an async all-gather's output a moment after `wait()` returns (seen as one
    64 KiB weight still alive after forward, +68 KB, on a loaded box). A weight that autograd
    really saved for backward stays alive however long this waits."""
    import time

    gc.collect()
    last, end = tracker.current, time.monotonic() + limit_s
    while time.monotonic() < end:
        time.sleep(quiet_s)
        gc.collect()
        now = tracker.current
        if now == last:
            return now
        last = now
    return last


def gathers_and_memory(ctx) -> dict:
    """How far gathers run ahead, and what a forward leaves alive for backward."""
    from cs336sys.measure.live_tensors import LiveTensorTracker

    tracker = LiveTensorTracker()
    with tracker:
        torch.manual_seed(0)
        fsdp = FSDP(Tower())
        ahead = []
        for layer in fsdp.module.layers:  # registered after FSDP's hooks: runs after them
            layer.register_forward_pre_hook(lambda m, a: ahead.append(len(fsdp._gathered)))
        x = torch.randn(1, 128)
        before = _settled(tracker)
        out = fsdp(x).sum()
        after_forward = _settled(tracker)
        out.backward()
        fsdp.finish_gradient_synchronization()
        del out
        after_step = _settled(tracker)
    weight_bytes = 128 * 128 * 4
    return dict(ahead=ahead, kept=after_forward - before, weight_bytes=weight_bytes,
                grads_ok=all(p.grad is not None for p in fsdp.shards),
                left=after_step - before,
                grad_bytes=sum(p.grad.numel() * p.grad.element_size() for p in fsdp.shards))


class _Marker(torch.autograd.Function):
    """Identity; its backward (which runs just before the backward of the layer before it)
    records how many all-gathers the step has issued so far."""

    @staticmethod
    def forward(ctx, x, log, comm):
        ctx.log, ctx.comm = log, comm
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        ctx.log.append(ctx.comm.calls["all_gather"])
        return grad, None, None


class MarkedTower(Tower):
    """Tower with a _Marker after each layer, logging into `log` from the counter `comm`."""

    log: list
    comm: CommCounter

    def forward(self, x):
        for layer in self.layers:
            x = _Marker.apply(torch.tanh(layer(x)), self.log, self.comm)
        return x


def backward_gathers(ctx) -> dict:
    """All-gathers issued before each Tower layer's backward starts, counted by torch's
    dispatcher, last layer first."""
    torch.manual_seed(0)
    fsdp = FSDP(MarkedTower())
    x = torch.randn(1, 128, requires_grad=True)  # so that every layer saves its weight
    with CommCounter() as comm:
        fsdp.module.log, fsdp.module.comm = [], comm
        out = fsdp(x).sum()
        forward = comm.calls["all_gather"]
        out.backward()
        fsdp.finish_gradient_synchronization()
    return dict(forward=forward, before_layer=[n - forward for n in fsdp.module.log],
                total=comm.calls["all_gather"])


def comm_time(ctx, delay_s: float = 0.25) -> dict:
    """Rank 1 starts its forward, and its backward, `delay_s` late: rank 0's all-gathers in
    each wait that long for rank 1's part, while its finish_gradient_synchronization does
    not wait at all."""
    torch.manual_seed(0)
    fsdp = FSDP(Tower())
    x = torch.randn(1, 128)
    steps = []
    for _ in range(2):  # the second step also prefetches by the first one's order
        dist.barrier()
        t0 = time.perf_counter()
        if ctx.rank == 1:
            time.sleep(delay_s)
        out = fsdp(x).sum()
        if ctx.rank == 1:
            time.sleep(delay_s)
        out.backward()
        t1 = time.perf_counter()
        fsdp.finish_gradient_synchronization()
        t2 = time.perf_counter()
        steps.append(dict(comm_ms=fsdp.comm_ms, step_ms=(t2 - t0) * 1e3, finish_ms=(t2 - t1) * 1e3))
    return dict(delay_ms=delay_s * 1e3, steps=steps)


def compiled_training(ctx, steps: int = 3) -> dict:
    """TinyLM's forward under torch.compile (aot_eager: dynamo and AOTAutograd, without
    inductor's build) inside our FSDP, against the same training eager."""
    from torch._dynamo.utils import counters

    def train(compiled: bool) -> list[float]:
        torch.manual_seed(11)
        model = TinyLM()
        if compiled:
            model.forward = torch.compile(model.forward, backend="aot_eager")
        fsdp = FSDP(model)
        opt = make_optimizer("adamw", fsdp.parameters())
        part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
        losses = []
        for step in range(steps):
            x, y = lm_batch(7, step)
            loss = lm_loss(fsdp, x[part], y[part])
            loss.backward()
            fsdp.finish_gradient_synchronization()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(float(loss))
        return losses

    torch._dynamo.reset()
    counters.clear()
    eager, compiled = train(False), train(True)
    return dict(eager=eager, compiled=compiled, graphs=counters["stats"]["unique_graphs"])


class MixedToy(nn.Module):
    """fc1 in float64, fc2 in float32: one owner holds parameters of two dtypes."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 9).double()
        self.fc2 = nn.Linear(9, 5)

    def forward(self, x):
        return self.fc2(torch.tanh(self.fc1(x)).float())


def mixed_dtypes(ctx, steps: int = 3) -> dict:
    """ShardedOptimizer over a model of two dtypes (it sorted its broadcasts by dtype, which
    torch cannot order, and raised TypeError in step), against AdamW unsharded."""
    torch.manual_seed(7)
    model = MixedToy()
    initial = np_state(model.state_dict())
    opt = ShardedOptimizer(model.parameters(), torch.optim.AdamW, lr=0.01, weight_decay=0.1)
    for step in range(steps):
        x, y = opt_batch(0, step)
        opt.zero_grad(set_to_none=True)
        F.mse_loss(model(x), y.float()).backward()
        opt.step()
    names = {id(p): n for n, p in model.named_parameters()}
    dtypes = {str(p.dtype) for p, r in opt.owner.items() if r == ctx.rank}
    return dict(initial=initial, final=np_state(model.state_dict()), owned_dtypes=sorted(dtypes),
                owned=sorted(names[id(p)] for p, r in opt.owner.items() if r == ctx.rank))


class TiedByReading(nn.Module):
    """An LM head tied by reading the embedding's weight, outside the embedding's forward."""

    def __init__(self):
        super().__init__()
        self.emb, self.lin = nn.Embedding(VOCAB, D), nn.Linear(D, D)

    def forward(self, x):
        return torch.relu(self.lin(self.emb(x))) @ self.emb.weight.T


def weight_read_outside_its_forward(ctx) -> str:
    """What FSDP says when a sharded weight is read outside its module's forward (a meta
    placeholder was read: garbage on a CPU, and training went on)."""
    torch.manual_seed(0)
    fsdp = FSDP(TiedByReading())
    try:
        fsdp(torch.randint(0, VOCAB, (2, 5)))
    except RuntimeError as exc:
        return str(exc)
    return "no error"


def run_all(ctx) -> dict:
    """Everything the test module needs, in one launch (spawning ranks costs seconds)."""
    return {
        "sharded": {k: [train_sharded(ctx, k, r) for r in range(ROUNDS)] for k in ("adamw", "sgd")},
        "mixed_dtypes": mixed_dtypes(ctx),
        "read_outside": weight_read_outside_its_forward(ctx),
        "fsdp": {c: [train_fsdp(ctx, c, r) for r in range(ROUNDS)] for c in FSDP_CASES},
        "gathers": gathers_and_memory(ctx),
        "backward_gathers": backward_gathers(ctx),
        "comm_time": comm_time(ctx),
        "compiled": compiled_training(ctx),
    }
