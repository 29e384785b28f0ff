"""The user's DDP, FSDP or sharded optimizer against single-process training (docs/yours.md,
"Checked before timed"), and, for a failure, what the code does instead.

Two things are compared, each against one process training the whole global batch from
rank 0's weights with the same AdamW (`TrainingReference`):

- the gradients rank 0 holds after `finish_gradient_synchronization()` in the first step,
  tensor by tensor: whole, or an FSDP's shard where its values place it in the model
  (shard_locate.py), else under the layouts its name allows. They must be the mean over the
  global batch. This is the comparison that sees gradients summed instead of averaged:
  AdamW divides the first moment by the root of the second, so a gradient scaled by the
  world size moves the parameters exactly as the mean does (to within eps), and the
  parameters alone would pass it. The course's tests train with SGD, where it shows; here it
  shows in the gradients.
- every parameter after the timed steps, |p - p_ref| / |p_ref - p_0| (L2 norms).

A failure is named by the alternative it matches: the gradients `world_size` times the mean
(summed, not averaged), the mean / world_size (divided twice), rank 0's own slice of the
batch (never all-reduced), the mean of another rank's part of the weight; parameters that
never left their initial values (a shard whose optimizer never stepped); else where rank 0's
loss left the reference's (`loss_problem`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from cs336sys.experiments.shard_locate import MAX_LOCATED, WholeModel
from cs336sys.experiments.training_step import adamw_kwargs, cross_entropy, make_model
from cs336sys.measure.check import Verdict
from cs336sys.measure.dtypes import autocast_dtype

# Measured (benchmarks/check_tolerances.py: a 2-layer d64 model, 2 Gloo ranks, 8 AdamW steps):
# 1.9e-5 for each of our DDP variants in fp32, 2.4e-2 under bf16 autocast (rounding of
# half-batch activations); a DDP that does not all-reduce is at 1.0. The same bounds hold for
# the first step's gradients (relative L2 error per tensor).
TRAINING_TOLERANCE = {"fp32": 1e-3, "bf16": 0.1, "fp16": 0.1}
# An FSDP's own 16-bit compute (the course's: Linear and Embedding weights cast to it) is not
# the reference's autocast, and RMSNorm weights barely move, so their ratio is the largest:
# right FSDPs reached 0.11 (bf16 at seeds 5-7, fp16 with the norms cast too), which the
# course's tests pass; one that sums or never reduces is at 1 or more.
FSDP_16_BIT_TOLERANCE = 0.25


@dataclass
class TrainingReference:
    """Single-process training of the global batch, on the CPU: the parameters before and
    after, the first step's gradients (the mean over the batch), and the gradients of rank
    0's slice alone at the same weights (what a DDP that never all-reduces holds); the loss
    of rank 0's slice at each step's weights (what rank 0's training step reports)."""

    initial: dict
    final: dict
    grads: dict
    local_grads: dict
    world_size: int
    local_losses: list = field(default_factory=list)


def training_reference(config: Any, device: str, seed: int, x: Any, y: Any, precision: str,
                       iters: int, world_size: int, optimizer_cls: Any = None
                       ) -> TrainingReference:
    """`iters` steps of single-process training on the whole batch (x, y): the model with
    rank 0's weights, the same AdamW (`optimizer_cls`, ours by default), autocast in
    `precision` as the replicas train."""
    import torch

    from cs336sys.models.adamw import AdamW

    model = make_model(config, device, seed)
    low = autocast_dtype(precision)
    x, y = x.to(device), y.to(device)

    def loss_of(x_part, y_part) -> Any:
        with torch.autocast(torch.device(device).type, dtype=low, enabled=low is not None):
            return cross_entropy(model(x_part), y_part)

    def backward(x_part, y_part) -> dict:
        loss_of(x_part, y_part).backward()
        return {k: v.grad.detach().float().cpu().clone() for k, v in model.named_parameters()
                if v.grad is not None}

    local = x.shape[0] // world_size
    local_grads = backward(x[:local], y[:local])  # (B / world, T): rank 0's slice
    model.zero_grad(set_to_none=True)
    initial = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    cls = optimizer_cls or AdamW
    opt = cls(model.parameters(), **adamw_kwargs(cls))
    grads: dict = {}
    losses = []
    for i in range(iters):
        with torch.no_grad():
            losses.append(float(loss_of(x[:local], y[:local])))
        step_grads = backward(x, y)
        if i == 0:
            grads = step_grads
        opt.step()
        opt.zero_grad(set_to_none=True)
    final = {k: v.detach().cpu().clone() for k, v in model.named_parameters()}
    return TrainingReference(initial, final, grads, local_grads, world_size, losses)


def first_step_grads(module: Any, into: dict, values: dict | None = None) -> Any:
    """A hook that copies the gradients `module` holds on this rank, by its parameter names,
    into `into` (to the CPU, once: the first step's), and those parameters' values, before
    the step, into `values` (what places a shard in the model: shard_locate.py)."""

    def keep() -> None:
        if not into:
            held = {name: p for name, p in every_name(module).items() if p.grad is not None}
            into.update({name: p.grad.detach().float().cpu().clone()
                         for name, p in held.items()})
            if values is not None:
                values.update({name: p.detach().float().cpu().clone()
                               for name, p in held.items()})

    return keep


def every_name(module: Any) -> dict:
    """{name: parameter} of `module` under every name it has: a wrapper that keeps a handle
    on a parameter (`self.first = next(module.parameters())`) has it under that name first,
    and named_parameters() yields each tensor once, so its model's name went missing. A
    wrapper of the user's that is no nn.Module has a named_parameters() of its own."""
    try:
        return dict(module.named_parameters(remove_duplicate=False))
    except TypeError:
        return dict(module.named_parameters())


def _reference_name(name: str, reference: dict) -> str | None:
    """The longest dotted suffix of a wrapper's `name` (`module.layers.0...`) that the
    reference has, or None."""
    parts = name.split(".")
    return next((".".join(parts[i:]) for i in range(len(parts))
                 if ".".join(parts[i:]) in reference), None)


def by_reference_names(named: dict, reference: dict) -> dict:
    """`named` ({name: tensor} of a wrapper) keyed by the reference's names
    (`_reference_name`); a tensor under no such name is left out."""
    out = {}
    for name, tensor in named.items():
        key = _reference_name(name, reference)
        if key is not None:
            out.setdefault(key, tensor)
    return out


def _relative(x: Any, ref: Any) -> float:
    scale = float(ref.norm())
    diff = float((x - ref).norm())
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _part(got: Any, ref: Any) -> Any:
    """What of `ref` rank 0's tensor `got` holds: all of it, or for a shard the first
    got.numel() elements of ref flattened, rank 0's part under a flat split or a split along
    dim 0 (the layouts FSDPs use most); None where a shard is no smaller than the whole."""
    if tuple(got.shape) == tuple(ref.shape):
        return ref
    if got.numel() == 0 or got.numel() >= ref.numel():
        return None
    return ref.reshape(-1)[:got.numel()]


def _layouts(n: int, ref: Any, world: int) -> list[Any]:
    """Rank 0's part of a whole tensor shaped as `ref`, flattened, under each layout of a
    shard of n elements an FSDP may use: the first n elements (a flat split, or one along
    dim 0), every world-th element from the first (`flat[rank::world]`), the first columns
    (a split along the last dim), and a later chunk of n (rank 0 holding the last: a summed
    gradient there passed, unseen)."""
    out = [lambda t: t.reshape(-1)[:n], lambda t: t.reshape(-1)[::world][:n],
           *(lambda t, i=i: t.reshape(-1)[i * n:(i + 1) * n] for i in range(1, world))]
    rows = ref.numel() // ref.shape[-1] if ref.dim() >= 2 else 0
    if rows and n % rows == 0:
        out.append(lambda t: t[..., :n // rows].reshape(-1))
    return out


class Against(NamedTuple):
    """How far a gradient is (relative error) from each thing it may be: the mean over the
    global batch, world x the mean, rank 0's own slice, the mean / world (divided twice),
    the mean of another part of the same weight than the shard holds (another rank's), and
    rank 0's own slice / world (divided, never reduced)."""

    mean: float
    summed: float
    own: float
    twice: float
    elsewhere: float = float("inf")
    own_divided: float = float("inf")


def _against(mine: Any, part: Any, local: Any, world: int) -> Against:
    own = (_relative(mine, local), _relative(mine, local / world)) if local is not None else (
        float("inf"), float("inf"))
    return Against(_relative(mine, part), _relative(mine, world * part), own[0],
                   _relative(mine, part / world), float("inf"), own[1])


def _as_laid_out(got: Any, ref: Any, local: Any, world: int, tol: float) -> Against | None:
    """Rank 0's flattened tensor `got` against the mean `ref`, world x the mean, rank 0's
    own slice `local` and the mean / world (divided twice): the whole tensors, or for a
    shard under the first layout (`_layouts`) where it matches one of them within `tol`;
    None where it matches none. For a shard whose place in the model its values could not
    tell (`_Located`)."""
    whole = got.numel() == ref.numel()
    for layout in [lambda t: t.reshape(-1)] if whole else _layouts(got.numel(), ref, world):
        part = layout(ref)
        # the last chunk of a padded split is shorter than the shard: its padding holds no
        # gradient (a shard whose tail is not zero is not this layout)
        if part.numel() > got.numel() or bool(got[part.numel():].any()):
            continue
        found = _against(got[:part.numel()], part,
                         layout(local) if local is not None else None, world)
        if whole or any(x <= tol for x in found):
            return found
    return None


class _Located:
    """The reference's model flattened (shard_locate.WholeModel) with its gradients, built
    once the first tensor that no name and shape place is met."""

    def __init__(self, reference: TrainingReference) -> None:
        self.model = WholeModel(reference.initial)
        located = self.model.size <= MAX_LOCATED
        self.mean = self.model.flatten(reference.grads) if located else None
        self.local = self.model.flatten(reference.local_grads) if located else None

    def against(self, raw: str, got: Any, value: Any, world: int, tol: float,
                name: str | None = None) -> tuple[str, Against] | None:
        """Rank 0's flattened gradient `got` (named `raw` by the wrapper; `name`, the
        model's weight that name ends in, if any) against the reference's at the places the
        parameter's values `value` were found, with the name of the weight they fall in (or
        `raw` and how many), or None where they were not, or fall outside `name`."""
        located = self.model.locate(value)
        if located is None:
            return None
        mine, where = got[located.at], located.where
        names = self.model.names_at(where)
        if name is not None and names != [name]:  # values met by chance: not this shard's
            return None
        found = _against(mine, self.mean[where], self.local[where], world)
        if not found.mean <= tol and len(names) == 1:  # another rank's part of one weight?
            n = got.numel()
            shifts = {k * s for k in range(1, world) for s in (n, 1)}
            found = found._replace(elsewhere=min(
                _relative(mine, self.mean[self.model.shifted(where, names[0], by)])
                for by in shifts))
        return (names[0] if len(names) == 1 else f"{raw} (parts of {len(names)} weights)"), found


def gradient_problem(grads: dict, reference: TrainingReference, tol: float,
                     values: dict | None = None) -> str | None:
    """What rank 0's first-step gradients do wrong, in words, or None when every tensor it
    holds is the mean over the global batch within `tol`.

    `grads` is keyed by the wrapper's names (or the model's). A tensor whose name ends in a
    model's name and has its shape is compared whole. Any other (an FSDP's shard, or a flat
    buffer under a name of its own) is placed by its parameter's values before the first
    step (`values`, by the same names; shard_locate.py) and compared there; failing that,
    by name under the layouts of `_layouts`. AdamW moves the parameters of a summed
    gradient as it moves those of the mean, so only the gradient shows it. A shard placed
    neither way is left to the parameters' comparison."""
    world = reference.world_size
    off: dict[str, Against] = {}  # the tensors that are not the mean
    compared: set[str] = set()
    located: _Located | None = None
    for raw, got in sorted(grads.items(), key=lambda kv: _reference_name(kv[0],
                                                                         reference.grads) is None):
        name = _reference_name(raw, reference.grads)
        ref = reference.grads.get(name) if name is not None else None
        flat = got.detach().float().cpu().reshape(-1)
        value = (values or {}).get(raw)
        found = None
        if ref is not None and tuple(got.shape) == tuple(ref.shape):
            found = _as_laid_out(flat, ref, reference.local_grads.get(name), world, tol)
        elif value is not None and value.numel() == got.numel() and reference.initial:
            located = located or _Located(reference)
            placed = located.against(raw, flat, value, world, tol,
                                     name if name in reference.initial else None)
            if placed is not None:
                name, found = placed
        if found is None and ref is not None and _part(got, ref) is not None:
            found = _as_laid_out(flat, ref, reference.local_grads.get(name), world, tol)
        if found is None or name in compared:  # another layout, or a second handle on it
            continue
        compared.add(name)
        if not found.mean <= tol:  # NaN too
            off[name] = found
    if not off:
        return None
    count = f"{len(off)} of {len(compared)} gradient tensors"
    held = f"{count} rank 0 holds after finish_gradient_synchronization()"
    if all(o.summed <= tol for o in off.values()):
        return (f"{held} match world_size ({world}) x the reference: summed, not averaged "
                f"(AdamW hides it in the parameters, SGD would not)")
    if all(o.twice <= tol for o in off.values()):
        return (f"{held} match the reference / world_size ({world}): divided by the world "
                f"size twice (AdamW hides it in the parameters, SGD would not)")
    if all(o.own <= tol for o in off.values()):
        return f"{held} match rank 0's own slice of the batch: never all-reduced ({few(list(off))})"
    if all(o.own_divided <= tol for o in off.values()):
        return (f"{held} match rank 0's own slice of the batch / world_size ({world}): divided "
                f"by the world size but never all-reduced ({few(list(off))})")
    if all(o.elsewhere <= tol for o in off.values()):
        return (f"{held} are the mean gradient of another part of their weight than the one "
                f"rank 0's shard holds ({few(list(off))}): each rank kept the reduced "
                f"gradient of another rank's shard")
    name = max(off, key=lambda n: off[n].mean if off[n].mean == off[n].mean else float("inf"))
    mean = off[name].mean
    return (f"{held} differ from the mean over the global batch (worst {name}: relative error "
            f"{mean:.2g}, allowed {tol:g}); they match neither the sum, the mean / world_size "
            f"nor rank 0's own slice")


def few(names: list[str], shown: int = 3) -> str:
    """`a, b, c, ...`: the first names of a list a failure points at, and whether more follow."""
    return ", ".join(names[:shown]) + (", ..." if len(names) > shown else "")


def zero_gradients(grads: dict, reference: TrainingReference) -> list[str]:
    """The tensors (by the reference's names) rank 0 holds all zero after the first step's
    finish_gradient_synchronization() where the reference's gradient is not: a cause to name
    once the check fails (a correct FSDP may keep its gradients in tensors of its own)."""
    out = []
    for name, ref in reference.grads.items():
        got = grads.get(name)
        part = _part(got, ref) if got is not None else None
        if part is not None and not bool(got.detach().any()) and bool(part.any()):
            out.append(name)
    return out


# How close rank 0's loss must be to the reference's on the same slice at the same step:
# fp32 differs by the order of sums (~1e-7 relative); 16-bit by an FSDP's own casts against
# the reference's autocast.
LOSS_TOLERANCE = {"fp32": 1e-4, "bf16": 1e-2, "fp16": 1e-2}


def loss_problem(losses: list, reference: TrainingReference, precision: str) -> str | None:
    """Where rank 0's per-step loss left single-process training's on rank 0's slice, in
    words, and, where it then stayed at the first step's while the reference's fell, that
    the forward ran on the first step's weights. None where they agree throughout, or differ
    from the first step on (the forward itself, which the model check compares)."""
    ref = reference.local_losses
    n = min(len(losses), len(ref))
    rel = LOSS_TOLERANCE[precision]
    apart = [i for i in range(n) if not abs(losses[i] - ref[i]) <= rel * abs(ref[i])]
    if n < 2 or not apart or apart[0] == 0:
        return None
    k = apart[0]
    said = (f"rank 0's loss followed single-process training's on its slice for {k} "
            f"step{'s' if k > 1 else ''} and left it at step {k + 1} ({losses[k]:.6g} against "
            f"{ref[k]:.6g})")
    if abs(losses[n - 1] - losses[0]) < 0.1 * abs(ref[n - 1] - ref[0]):
        said += (f", then stayed at the first step's ({losses[0]:.6g} to {losses[n - 1]:.6g} "
                 f"in {n} steps, against {ref[0]:.6g} to {ref[n - 1]:.6g}): the forward kept "
                 f"running on the first step's weights (full weights gathered once and "
                 f"reused?)")
    return said


# The course's tests compare parameters elementwise, |p - p_ref| <= atol + rtol |p_ref|, each
# with its own (atol, rtol): test_ddp.py torch.allclose's defaults; test_fsdp.py fp32 atol
# 1e-6 rtol 1e-4, with a 16-bit compute dtype 1e-4 and 1e-4. test_sharded_optimizer.py's
# numpy assert_allclose (rtol 1e-7) is said of none: a right sharded optimizer differs from
# one process by more than that over this model's steps (its rounding), which its test
# (a toy model, one process's order of sums) does not see.
COURSE_TOLERANCE = {
    "test_ddp.py": {"fp32": (1e-8, 1e-5)},  # fp32 alone: the DDP tests run no other
    "test_ddp_individual_parameters.py": {"fp32": (1e-8, 1e-5)},  # 2025's
    "test_fsdp.py": {"fp32": (1e-6, 1e-4), "bf16": (1e-4, 1e-4), "fp16": (1e-4, 1e-4)},
}


def _course_verdict(mine: Any, ref: Any, precision: str, tests: tuple[str, ...]) -> str:
    """The largest |p - p_ref| of one tensor and whether the tolerance of each of the course's
    `tests` that judges the user's code here passes it, in words: so that a disagreement
    with the course's tests shows."""
    import torch

    mine, ref = mine.detach().float().cpu(), ref.float()
    verdicts = []
    for test in tests:
        if precision not in COURSE_TOLERANCE.get(test, {}):  # that test runs no such dtype
            continue
        if test == "test_fsdp.py" and precision != "fp32":  # its reference casts weights,
            continue  # ours autocasts: right FSDPs read `would fail` at 16 bits
        atol, rtol = COURSE_TOLERANCE[test][precision]
        passes = bool(torch.allclose(mine, ref, atol=atol, rtol=rtol))
        verdicts.append(f"the course's {test} tolerance (atol={atol:g}, rtol={rtol:g}) would "
                        f"{'pass' if passes else 'fail'}")
    largest = f"max |p - p_ref| {float((mine - ref).abs().max()):.2g}"
    return f"{largest}, which {', '.join(verdicts)}" if verdicts else largest


def _misshapen(name: str, mine: Any, ref: Any) -> str:
    """`w is (5000, 512), the model's (10000, 512) (2x fewer elements: ...)`: a full
    parameter of another shape than the model's, and what a whole fraction of it most
    likely is (a gather that returned each rank's shard read as bare shapes)."""
    part = ref.numel() / max(1, mine.numel())
    shard = (f" ({part:g}x fewer elements: this rank's shard, not the gathered weight?)"
             if part > 1 and part.is_integer() else "")
    return f"{name} is {tuple(mine.shape)}, the model's {tuple(ref.shape)}{shard}"


def training_check(full: dict, reference: TrainingReference, precision: str,
                   grads: dict | None = None, values: dict | None = None,
                   spread: float | None = None, tests: tuple[str, ...] = ("test_fsdp.py",),
                   losses: list | None = None) -> Verdict:
    """The user's parameters after training (`full`, by the unwrapped model's names) and
    rank 0's first-step gradients (`grads`, by the wrapper's names; `values`, the
    parameters they belong to, before the step: gradient_problem) against the
    single-process reference (see TRAINING_TOLERANCE). `spread`, the largest difference
    of a replicated parameter between the ranks after training, names the cause of a
    failure where the ranks ended apart; `tests`, the course's tests of the user's code
    here, whose tolerances are said of the worst tensor (COURSE_TOLERANCE); `losses`, rank
    0's loss at each step, where it left the reference's (`loss_problem`)."""
    fsdp = "test_fsdp.py" in tests
    tol = FSDP_16_BIT_TOLERANCE if fsdp and precision != "fp32" else TRAINING_TOLERANCE[precision]
    worst, where, problems, frozen = 0.0, None, [], []
    if not isinstance(full, dict):  # a gather that returns nothing: every parameter missing
        problems.append(f"the full parameters are {type(full).__name__}, not a dict by name")
        full = {}
    if fsdp:  # the course's test_fsdp.py looks each parameter up by the model's own name
        prefixed = [n for n in reference.final if n not in full
                    and any(k.endswith("." + n) for k in full)]
        if prefixed:
            theirs = next(k for k in full if k.endswith("." + prefixed[0]))
            problems.append(f"the full parameters are named otherwise than the model names them "
                            f"({theirs} for {prefixed[0]}): the course's test_fsdp.py looks "
                            f"them up by the model's names")
    full = by_reference_names(full, reference.final)
    for name, ref in reference.final.items():
        mine = full.get(name)
        if mine is None or tuple(mine.shape) != tuple(ref.shape):
            problems.append(f"{name} is missing" if mine is None else _misshapen(name, mine, ref))
            continue
        mine = mine.detach().float().cpu()
        start = reference.initial[name].float()
        diff = float((mine - ref.float()).norm())
        moved = float((ref.float() - start).norm())
        ratio = diff / moved if moved > 0 else (0.0 if diff == 0 else float("inf"))
        if moved > 0 and bool((mine == start).all()):
            frozen.append(name)
        if where is None or not ratio <= worst:  # NaN too; the first (a bit-exact match)
            worst, where = ratio, name
    metrics: dict[str, Any] = {"check_worst": worst}
    detail = (f"per parameter |p - p_ref| / |p_ref - p_0| against single-process training, at "
              f"most {tol:g}: worst {worst:.2g} ({where}")
    if where is not None and where in full:
        detail += ", " + _course_verdict(full[where], reference.final[where], precision, tests)
    detail += ")"
    named = by_reference_names(grads, reference.grads) if grads is not None else None
    gradients = gradient_problem(grads, reference, tol, values) if grads is not None else None
    passed = not problems and worst <= tol and gradients is None
    causes = []
    zeros = zero_gradients(named, reference) if named is not None and not passed else []
    if zeros:
        causes.append(f"{len(zeros)} gradient tensors rank 0 holds after the first step's "
                      f"finish_gradient_synchronization() are all zero ({few(zeros)}): no gradient "
                      f"had reached them yet "
                      f"(reduced a step late, into other tensors than the ones the optimizer "
                      f"steps, or in a bucket all-reduced before this gradient had "
                      f"arrived?)")
    if frozen and not passed:
        causes.append(f"{len(frozen)} of {len(reference.final)} parameter tensors never left "
                      f"their initial values ({few(frozen)}): their optimizer step never ran "
                      f"here, or its result never reached rank 0 (a shard no rank steps, or "
                      f"one its owner never broadcasts?)")
    if spread and not passed and not frozen:  # (parameters nobody stepped differ as well)
        # rank 0's first-step mean rules out weights never broadcast, not what the others did
        why = ("rank 0's first-step gradients were the mean, so its weights reached the "
               "others, but their updates differ from its: averaged on rank 0 alone (a reduce, "
               "not an all-reduce?) or not at a later step (a bucket or counter never reset?)"
               if grads is not None and gradients is None else
               "rank 0's weights never broadcast to the others at the start, or their updates "
               "differ")
        causes.append(f"the ranks ended with different parameters (largest difference "
                      f"{spread:.2g}): {why}")
    if gradients:
        causes.append(gradients)
    # where nothing else names the cause: any update that makes no progress (another rank's
    # chunk's gradient, parameters that never moved) leaves the loss where it started, as a
    # stale forward does
    left = loss_problem(losses, reference, precision) if losses and not passed and not causes \
        else None
    if left is not None:
        causes.append(left)
    if causes:
        detail = "; ".join(causes) + "; " + detail
    metrics.update(check="pass" if passed else "fail", check_detail=detail)
    why = None
    if not passed:
        why = "wrong: " + ("; ".join(problems[:3]) if problems else detail)
    return Verdict(passed, metrics, why)
