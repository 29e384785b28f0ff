"""The course's DDP test, run on the user's DDP before it is timed (its test_ddp.py; 2025's
test_ddp_individual_parameters.py is the same): two toy models, one with parameters that
need no gradient and one with two layers sharing a weight, each rank starting from its own
weights; five SGD steps (lr 0.1, MSE) on each rank's equal share of a batch of 20 (rounded up
to a multiple of the world size, which the course's test asserts divides 20), shuffled alike
between steps, against one process training rank 0's initial model on the whole batch; every
parameter within torch.allclose's defaults, as that test compares them.

The Transformer LM that the rest of the check trains has neither a frozen parameter nor a
shared one, so a DDP whose bucket never launches for want of a frozen parameter's gradient,
or that reduces a tied weight twice, passed it while the course's test fails it."""

from __future__ import annotations

from typing import Any

from cs336sys import yours
from cs336sys.experiments import ddp_yours
from cs336sys.experiments.training_check import by_reference_names, every_name
from cs336sys.measure.check import Verdict
from cs336sys.sweep.ranks import gather

STEPS, LR, BATCH = 5, 0.1, 20  # the course's batch of 20, cut into equal halves
# The course's bucket sizes (test_ddp.py): two buckets, three (a parameter each), one. The
# point's own size, 100 or 1,000 MB, put the toy models in one bucket, and a DDP that
# registered its hooks again each step failed the course's test and passed here.
COURSE_BUCKETS_MB = (0.0016, 0.0001, 0.01)
# torch.allclose's defaults, as the course's test_ddp.py compares the parameters
ATOL, RTOL = 1e-8, 1e-5


def _toy_models() -> dict[str, Any]:
    """The course's two toy models by what they test, in words."""
    import torch
    from torch import nn

    class Frozen(nn.Module):  # the course's ToyModel
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(10, 10, bias=False)
            self.fc2 = nn.Linear(10, 50)
            self.fc2.bias.requires_grad = False
            self.fc3 = nn.Linear(50, 10, bias=False)
            self.no_grad_fixed_param = nn.Parameter(torch.tensor([2.0, 2.0]), requires_grad=False)

        def forward(self, x: Any) -> Any:  # (B, 10) -> (B, 10)
            return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))

    class Tied(nn.Module):  # the course's ToyModelWithTiedWeights
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(10, 10, bias=False)
            self.fc2 = nn.Linear(10, 50, bias=False)
            self.fc3 = nn.Linear(50, 10, bias=False)
            self.fc4 = nn.Linear(10, 50, bias=False)
            self.fc5 = nn.Linear(50, 10, bias=False)
            self.fc4.weight = self.fc2.weight

        def forward(self, x: Any) -> Any:  # (B, 10) -> (B, 10)
            for layer in (self.fc1, self.fc2, self.fc3, self.fc4):
                x = torch.relu(layer(x))
            return self.fc5(x)

    return {"parameters that need no gradient (the course's ToyModel)": Frozen,
            "two layers sharing one weight (the course's ToyModelWithTiedWeights)": Tied}


def _trained(impl: str, bucket_mb: float | None, toy: Any, rank: int, world: int,
             device: Any) -> str | None:
    """What this rank's DDP of `toy` does otherwise than one process, in words; None when
    its parameters end as that process's."""
    import torch

    torch.manual_seed(0)  # rank 0's initial weights: what the ranks must start from
    reference = toy().to(device)
    torch.manual_seed(rank)  # each rank its own, as the course's test starts them
    wrapper, finish, start = ddp_yours.replica(impl, toy().to(device), bucket_mb)
    contract = _course_contract(wrapper)
    if contract is not None:  # the same on every rank: none of them trains
        return contract
    want = dict(reference.named_parameters())
    got = by_reference_names(every_name(wrapper), want)
    unsent = [name for name, p in want.items()
              if name in got and not torch.allclose(got[name].detach(), p.detach())]
    g = torch.Generator().manual_seed(0)
    local = -(-BATCH // world)  # the course asserts world | 20; past it, 20 rounded up
    x, y = (torch.randn(local * world, 10, generator=g) for _ in range(2))
    theirs = torch.optim.SGD(wrapper.parameters(), lr=LR)
    ours = torch.optim.SGD(reference.parameters(), lr=LR)
    for _ in range(STEPS):
        if start is not None:
            start(theirs)
        for opt in (theirs, ours):
            opt.zero_grad()
        torch.nn.functional.mse_loss(reference(x.to(device)), y.to(device)).backward()
        ours.step()
        part = slice(rank * local, (rank + 1) * local)
        torch.nn.functional.mse_loss(wrapper(x[part].to(device)), y[part].to(device)).backward()
        finish(theirs)
        theirs.step()
        order = torch.randperm(len(x), generator=g)  # the same on every rank
        x, y = x[order], y[order]
    if unsent:  # said once every rank has run the same collectives
        frozen = " (it needs no gradient)" if not want[unsent[0]].requires_grad else ""
        return (f"after wrapping, rank {rank}'s {unsent[0]}{frozen} is not rank 0's: rank 0's "
                "weights were not broadcast to it")
    got = by_reference_names(every_name(wrapper), want)
    for name, p in want.items():
        if name not in got:
            return f"its wrapper holds no parameter {name}"
        mine = got[name].detach()
        if not torch.allclose(mine, p.detach(), atol=ATOL, rtol=RTOL):
            off = float((mine - p.detach()).abs().max())
            return (f"after {STEPS} SGD steps rank {rank}'s {name} is not one process's "
                    f"(max |p - p_ref| {off:.2g}; torch.allclose's defaults, as the test)")
    return None


LATE_S = 0.3  # how much later rank 1 starts its backward in the probe below


def _returns_early(impl: str, bucket_mb: float | None, rank: int, device: Any) -> bool:
    """Whether the user's finish_gradient_synchronization returns before its all-reduces
    have ended (a handle never waited for), on every rank: one step of the toy model with
    rank 1 starting its backward LATE_S after rank 0, so that rank 0's all-reduces cannot
    have ended when its finish returns unless it waits; rank 0's gradients are read then,
    and again after a barrier, which waits for every collective launched before it (Gloo's
    for the work before it, NCCL's on its stream). In the training itself the race is
    often won, and the toy's result alone read as weights never broadcast."""
    import time

    import torch
    import torch.distributed as dist

    toy = next(iter(_toy_models().values()))
    torch.manual_seed(0)
    try:  # (a wrapper that cannot be built twice: the toy check's verdict stands alone)
        wrapper, finish, start = ddp_yours.replica(impl, toy().to(device), bucket_mb)
        opt = torch.optim.SGD(wrapper.parameters(), lr=LR)
        if start is not None:
            start(opt)
        # each rank its own input: alike gradients averaged (ReduceOp.AVG) would not change
        x = torch.randn(4, 10, generator=torch.Generator().manual_seed(rank)).to(device)
        if rank == 1:
            time.sleep(LATE_S)
        wrapper(x).square().mean().backward()
        finish(opt)
        grads = [(p, p.grad.detach().clone()) for p in wrapper.parameters()
                 if p.grad is not None]
        dist.barrier()
        changed = any(not torch.equal(p.grad, g) for p, g in grads if p.grad is not None)
        return any(gather(changed))
    except Exception:
        return False


def _course_contract(wrapper: Any) -> str | None:
    """What of the course's test's reading of a DDP wrapper this one lacks, in words: it
    reads the wrapped model as `ddp_model.module` (validate_ddp_net_equivalence, tests/
    common.py) and zips `ddp_model.parameters()` with the model's, in order."""
    import torch

    module = getattr(wrapper, "module", None)
    if not isinstance(module, torch.nn.Module):
        return ("it keeps the wrapped model in no attribute `module` (the course's test reads "
                "ddp_model.module.state_dict() in validate_ddp_net_equivalence, tests/common.py)")
    mine = [id(p) for p in module.parameters()]
    if [id(p) for p in wrapper.parameters()][: len(mine)] != mine:
        return ("its parameters() do not start with the wrapped model's, in their order (the "
                "course's test zips ddp_model.parameters() with the model's)")
    return None


def _sharded(sharding: str, toy: Any, device: Any) -> str | None:
    """What the user's sharded optimizer `sharding` does to `toy` otherwise than one AdamW,
    as the course's test_sharded_optimizer.py runs it: the same weights on every rank (seed
    42), torch.optim.AdamW inside (lr 0.1, weight decay 0.1), ten steps of a summed squared
    error on the same random batch of 32 everywhere; None when every parameter ends within
    numpy's assert_allclose (rtol 1e-7), as that test compares them."""
    import copy

    import torch

    torch.manual_seed(42)
    model = toy().to(device)
    theirs_model = copy.deepcopy(model)
    settings = dict(lr=0.1, weight_decay=0.1, betas=(0.9, 0.999), eps=1e-8)
    ours = torch.optim.AdamW(model.parameters(), **settings)
    theirs = ddp_yours.optimizer(sharding, theirs_model.parameters(), torch.optim.AdamW,
                                 **settings)
    for _ in range(10):
        x, y = torch.rand(32, 10).to(device), torch.rand(32, 10).to(device)
        for net, opt in ((model, ours), (theirs_model, theirs)):
            opt.zero_grad()
            ((y - net(x)) ** 2).sum().backward()
            opt.step()
    mine = dict(theirs_model.named_parameters())
    for name, p in model.named_parameters():
        if not torch.allclose(mine[name].detach(), p.detach(), atol=0.0, rtol=1e-7):
            off = float((mine[name].detach() - p.detach()).abs().max())
            return (f"after 10 AdamW steps {name} is not one AdamW's (max |p - p_ref| "
                    f"{off:.2g}; numpy's assert_allclose, as the test)")
    return None


def checked(impl: str, bucket_mb: float | None, rank: int, world: int, device: Any,
            sharding: str | None = None) -> Verdict | None:
    """The verdict of the course's tests on the user's DDP `impl` (test_ddp.py, a bucketed
    one at the test's three bucket sizes whatever the point's `bucket_mb`) and sharded
    optimizer `sharding` (test_sharded_optimizer.py), run on their toy models, the same on
    every rank (None where neither is the user's)."""
    runs = []
    if ddp_yours.kind_of(impl) == "ddp":
        test = ddp_yours.course_tests(impl, None)[0]
        for size in COURSE_BUCKETS_MB if bucket_mb is not None else (None,):
            runs.append((test, "" if size is None else f" with buckets of {size:g} MB",
                         lambda toy, size=size: _trained(impl, size, toy, rank, world, device)))
    if sharding and yours.is_yours(sharding):
        runs.append(("test_sharded_optimizer.py", "",
                     lambda toy: _sharded(sharding, toy, device)))
    if not runs:
        return None
    found = []
    # all on every rank, so that their collectives match; an exception in the user's code
    # ends the point as one anywhere in it does (a rank's error, its file and line)
    for test, at, run in runs:
        for words, toy in _toy_models().items():
            off = run(toy)
            if off is not None:
                found.append(f"as the course's {test} runs it{at}, on a model with {words}: "
                             f"{off}")
    # a rank's weights never broadcast first: what the other failures follow from
    failures = sorted((f for on_rank in gather(found) for f in on_rank),
                      key=lambda f: "after wrapping" not in f)
    if not failures:
        return Verdict(True, {})
    if ddp_yours.kind_of(impl) == "ddp" and _returns_early(impl, bucket_mb, rank, device):
        failures[0] = f"{ddp_yours.UNWAITED}; {failures[0]}"  # what the rest follows from
    return Verdict(False, {"check": "fail", "check_detail": failures[0]}, f"wrong: {failures[0]}")
