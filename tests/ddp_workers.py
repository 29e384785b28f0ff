"""Toy models, data and the rank worker for tests/test_ddp_wrappers.py.

A module of its own because spawned ranks import the worker by name. Everything is float64
so that DDP and single-process training can be compared with a tight tolerance.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from cs336sys.parallel.ddp import IMPLS, TorchDDP, make_ddp

WORLD_SIZE = 2
STEPS = 5
ROUNDS = 3  # each case is trained 3 times, from fresh seeds
LR = 0.1
LOCAL_BATCH = 4
MIB = 2**20


class FrozenToy(nn.Module):
    """An MLP with a frozen parameter (used in forward) and a buffer."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.scale = nn.Parameter(torch.rand(16) + 0.5, requires_grad=False)
        self.fc2 = nn.Linear(16, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x, use_extra=True):
        return self.fc2(torch.tanh(self.fc1(x)) * self.scale) + self.shift


class TiedToy(nn.Module):
    """A tiny LM whose output projection is the embedding matrix (tied weights)."""

    def __init__(self, vocab=11, d=6):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.mix = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight  # one Parameter, registered under two names

    def forward(self, tokens, use_extra=True):
        return self.head(torch.tanh(self.mix(self.emb(tokens))))  # (B, T, vocab)


class BranchyToy(nn.Module):
    """`extra` is used only when asked (per rank), `never` is never used: no grad."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(5, 7)
        self.extra = nn.Linear(7, 7)
        self.never = nn.Parameter(torch.randn(3))
        self.fc2 = nn.Linear(7, 3)

    def forward(self, x, use_extra=True):
        h = torch.tanh(self.fc1(x))
        if use_extra:
            h = h + torch.tanh(self.extra(h))
        return self.fc2(h)


MODELS = {"frozen": FrozenToy, "tied": TiedToy, "branchy": BranchyToy}


def new_model(name: str, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]().double()


def global_batch(name: str, round_: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The whole batch of a step, the same on every rank: (inputs, targets)."""
    g = torch.Generator().manual_seed(10_000 * round_ + step)
    n = LOCAL_BATCH * WORLD_SIZE
    if name == "tied":
        tokens = torch.randint(0, 11, (n, 5), generator=g)  # (B, T)
        return tokens, torch.randint(0, 11, (n, 5), generator=g)
    d_in, d_out = (8, 4) if name == "frozen" else (5, 3)
    x = torch.randn(n, d_in, generator=g, dtype=torch.float64)
    return x, torch.randn(n, d_out, generator=g, dtype=torch.float64)


def local_loss(name: str, model, x, y, use_extra: bool) -> torch.Tensor:
    out = model(x, use_extra=use_extra)
    if name == "tied":
        return F.cross_entropy(out.flatten(0, 1), y.flatten())  # mean over B*T tokens
    return F.mse_loss(out, y)


def uses_extra(rank: int) -> bool:
    return rank == 0  # BranchyToy's extra branch: used on rank 0 only


def trainable_bytes(model: nn.Module) -> list[int]:
    """Bytes of each unique trainable parameter, in registration order."""
    return [p.numel() * p.element_size() for p in model.parameters() if p.requires_grad]


def cases(name: str) -> list[tuple[str, float | None, int | None]]:
    """(impl, bucket_size_mb, expected bucket count) for one model."""
    sizes = trainable_bytes(MODELS[name]().double())
    total, first = sum(sizes), sizes[0]
    out: list[tuple[str, float | None, int | None]] = [
        ("naive", None, None),
        ("flat", None, None),
        ("overlap", None, len(sizes)),
        ("bucketed", total / MIB, 1),  # everything fits exactly
        ("bucketed", (total - first) / MIB, 2),  # all but the first-registered, then it
        ("bucketed", 1e-6, len(sizes)),  # ~1 byte: every parameter exceeds it
        ("torch", None, None),
    ]
    assert {c[0] for c in out} == set(IMPLS)
    return out


def case_id(impl: str, expected_buckets: int | None) -> str:
    if impl != "bucketed":
        return impl
    return f"bucketed-{expected_buckets}"


def _state(model: nn.Module) -> dict:
    # numpy, not tensors: torch pickles CPU tensors through shared-memory file descriptors,
    # which the parent can no longer fetch once the rank has exited.
    return {k: v.detach().cpu().numpy().copy() for k, v in model.state_dict().items()}


def train_all(ctx, name: str) -> list[dict]:
    """On every rank: each case of `name`, ROUNDS times; returns what the parent checks."""
    out = []
    for round_ in range(ROUNDS):
        for impl, bucket_mb, expected in cases(name):
            model = new_model(name, seed=1000 * round_ + 17 * ctx.rank)  # differs per rank
            initial = _state(model)
            watch: dict = {"ddp": None, "seen": []}
            if impl in ("overlap", "bucketed"):
                # Registered before the wrapper's hooks, so on each parameter it runs before
                # that parameter's all-reduce can start: an all-reduce already in flight
                # then proves communication started while backward was still running.
                for p in model.parameters():
                    if p.requires_grad:
                        p.register_post_accumulate_grad_hook(
                            lambda p, watch=watch: watch["seen"].append(watch["ddp"].num_inflight)
                        )
            if impl == "torch" and name == "branchy":
                ddp = TorchDDP(model, find_unused_parameters=True)  # torch must be told
            else:
                ddp = make_ddp(impl, model, bucket_mb)
            watch["ddp"] = ddp
            constructed = _state(model)
            opt = torch.optim.SGD(ddp.parameters(), lr=LR)
            calls, nbytes, inflight_after_backward = [], [], []
            for step in range(STEPS):
                x, y = global_batch(name, round_, step)
                part = slice(ctx.rank * LOCAL_BATCH, (ctx.rank + 1) * LOCAL_BATCH)
                c0, b0 = ddp.comm_calls, ddp.comm_bytes
                local_loss(name, ddp, x[part], y[part], uses_extra(ctx.rank)).backward()
                if hasattr(ddp, "num_inflight"):
                    inflight_after_backward.append(ddp.num_inflight)
                ddp.finish_gradient_synchronization()
                calls.append(ddp.comm_calls - c0)
                nbytes.append(ddp.comm_bytes - b0)
                opt.step()
                opt.zero_grad(set_to_none=True)
            out.append(
                dict(
                    round=round_,
                    impl=impl,
                    case=case_id(impl, expected),
                    expected_buckets=expected,
                    buckets=getattr(ddp, "buckets", None),
                    initial=initial,
                    constructed=constructed,
                    final=_state(model),
                    calls=calls,
                    bytes=nbytes,
                    inflight_after_backward=inflight_after_backward,
                    seen_in_backward=watch["seen"],
                    inflight_after_finish=getattr(ddp, "num_inflight", None),
                )
            )
    return out


def second_backward(ctx) -> dict[str, tuple[str | None, bool]]:
    """A second backward before finish must fail loudly in the hook variants, and the
    wrapper must still work for the next step: {impl: (error message, next step ok)}."""
    out = {}
    for impl, bucket_mb in (("overlap", None), ("bucketed", 1.0)):
        ddp = make_ddp(impl, new_model("frozen", 0), bucket_mb)
        x, y = global_batch("frozen", 0, 0)
        local_loss("frozen", ddp, x, y, True).backward()
        try:
            local_loss("frozen", ddp, x, y, True).backward()
            message = None
        except RuntimeError as exc:
            message = str(exc)
        ddp.finish_gradient_synchronization()
        ddp.zero_grad(set_to_none=True)
        local_loss("frozen", ddp, x, y, True).backward()
        ddp.finish_gradient_synchronization()
        ok = all(p.grad is not None for p in ddp.parameters() if p.requires_grad)
        out[impl] = (message, ok and ddp.num_inflight == 0)
    return out


LATE_S = 1.0  # how much later rank 1 starts its backward in allreduce_in_flight


def allreduce_in_flight(ctx) -> dict[str, list[tuple[float, float]]]:
    """Per wrapper, two steps: the first with rank 1 starting its backward LATE_S after rank
    0, the second not; each step's (allreduce_ms, ms from the start of backward to the end
    of finish_gradient_synchronization) on this rank."""
    import time

    out = {}
    for impl in ("naive", "flat", "overlap", "bucketed"):
        ddp = make_ddp(impl, new_model("frozen", seed=5), 1e-4 if impl == "bucketed" else None)
        x, y = global_batch("frozen", 0, 0)
        steps = []
        for late in (True, False):
            if late and ctx.rank == 1:
                time.sleep(LATE_S)
            t0 = time.perf_counter()
            local_loss("frozen", ddp, x, y, True).backward()
            ddp.finish_gradient_synchronization()
            steps.append((ddp.allreduce_ms, (time.perf_counter() - t0) * 1e3))
        out[impl] = steps
    return out


def run_all(ctx) -> dict:
    """Everything the test module needs, in one launch (spawning a rank costs seconds)."""
    return {
        "train": {name: train_all(ctx, name) for name in MODELS},
        "second_backward": second_backward(ctx),
        "in_flight": allreduce_in_flight(ctx),
    }


def toy_check(ctx) -> list:
    """The course's toy-model checks (experiments/ddp_toy_check.py) on ours, as if they were
    the user's: the naive DDP, one that broadcasts only parameters needing a gradient, our
    sharded optimizer, one that moves frozen parameters; [passed, why] of each (one launch:
    starting ranks costs seconds)."""
    return [_toy_check(ctx, False), _toy_check(ctx, True),
            _sharded_toy_check(ctx, False), _sharded_toy_check(ctx, True)]


def _toy_check(ctx, rank_zero_only_broadcast: bool) -> list:
    from cs336sys.experiments import ddp_toy_check, ddp_yours
    from cs336sys.parallel.ddp import NaiveDDP

    class TrainableOnly(NaiveDDP):
        def __init__(self, module):
            frozen = [p for p in module.parameters() if not p.requires_grad]
            before = [p.detach().clone() for p in frozen]
            super().__init__(module)
            with torch.no_grad():  # undo the broadcast of what needs no gradient
                for p, mine in zip(frozen, before, strict=True):
                    p.copy_(mine)

    wrapper = TrainableOnly if rank_zero_only_broadcast else NaiveDDP

    def replica(impl, model, bucket_mb):
        ddp = wrapper(model)
        return ddp, (lambda opt: ddp.finish_gradient_synchronization()), None

    ddp_yours.replica, ddp_yours.kind_of = replica, (lambda impl: "ddp")
    verdict = ddp_toy_check.checked("yours", None, ctx.rank, ctx.world_size, "cpu")
    return [verdict.passed, verdict.why]


def _sharded_toy_check(ctx, decays_frozen: bool) -> list:
    """The course's sharded-optimizer test on its toy models, on our ShardedOptimizer as if
    it were the user's, or on one that gives every parameter a zero gradient before
    stepping, so that AdamW's weight decay moves the frozen ones."""
    from cs336sys.experiments import ddp_toy_check, ddp_yours
    from cs336sys.parallel.sharded_optimizer import ShardedOptimizer

    class DecaysFrozen(ShardedOptimizer):
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is None:
                        p.grad = torch.zeros_like(p)
            return super().step(closure)

    cls = DecaysFrozen if decays_frozen else ShardedOptimizer
    ddp_yours.optimizer = lambda name, params, optimizer_cls, **kw: cls(params, optimizer_cls, **kw)
    ddp_yours.kind_of = lambda impl: None
    ddp_toy_check.yours.is_yours = lambda name: name == "yours"
    verdict = ddp_toy_check.checked("naive", None, ctx.rank, ctx.world_size, "cpu", "yours")
    return [verdict.passed, verdict.why]
