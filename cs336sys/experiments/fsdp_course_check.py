"""What the course's test_fsdp.py asserts of an FSDP besides its training, checked on the user's
FSDP in the point that times it (the training check, training_check.py, sees none of it: it
compares rank 0's full parameters and gradients, and a sharded norm trains right):

- the wrapper keeps the model it wraps as `.module`: the gradient-sync test reads
  `fsdp_model.module.named_parameters()`;
- after the first step's synchronization, every parameter of that module that needs a
  gradient has one, of its own shape and dtype (fp32 master weights under a 16-bit compute
  dtype), as the gradient-sync test asserts;
- the parameters of modules other than Linear and Embedding (the norms, which the handout
  asks to be left unsharded) hold the same gradient on every rank, within that test's
  atol = rtol = 1e-4;
- the full parameters `fsdp_gather_full_params()` returns are rank 0's on every rank: the
  correctness test compares them with one process on every rank, within its tolerance.

`Record` keeps this rank's side after the first synchronization; `verdict()` compares the
ranks (collectives: every rank calls it, at the same point) and names what fails, in words.

`Record` also notes the dtype the first step's Linear and Embedding layers computed in
(`forward_dtype`): an FSDP that ignores a 16-bit compute_dtype passes the course's test (its
16-bit tolerance holds fp32 too), and its point, stored as bf16, timed fp32.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from cs336sys.experiments.training_check import COURSE_TOLERANCE, by_reference_names, few
from cs336sys.measure.check import Verdict
from cs336sys.measure.dtypes import TORCH_NAMES
from cs336sys.sweep.declaration import metric_table
from cs336sys.sweep.ranks import gather
from cs336sys.sweep.result import first_line

# test_fsdp.py's comparison of the replicated gradients between ranks
REPLICATED_ATOL = REPLICATED_RTOL = 1e-4
SHARDED_KINDS = ("Linear", "Embedding")  # the course's test skips their parameters' gradients
SAID = "the course's test_fsdp.py"
SHORT = {torch_name: name for name, torch_name in TORCH_NAMES.items()}  # float32 -> fp32

METRICS = metric_table("""
    forward_dtype  -  the user's FSDP: the dtype its Linear and Embedding layers' outputs had in
                        the first step (fp32 at a 16-bit point: compute_dtype ignored)
""")


def _sharded_kind(module: Any) -> bool:
    """A Linear or Embedding by its class or a base class's name: cs336_basics.model's (the
    course's test imports those) or torch.nn's (cs336sys's model)."""
    return any(cls.__name__ in SHARDED_KINDS for cls in type(module).__mro__)


class Record:
    """This rank's parameters as the gradient-sync test reads them, after the first step's
    finish_gradient_synchronization(): called then, it keeps what that test asserts."""

    def __init__(self, wrapper: Any) -> None:
        inner = getattr(wrapper, "module", None)
        self.module = inner if callable(getattr(inner, "named_parameters", None)) else None
        self.kept = False
        self.wrong: list[str] = []  # parameters whose gradient is missing or misshapen
        self.replicated: dict[str, Any] = {}  # name: gradient (CPU)
        self.outputs: set[str] = set()  # the dtypes of the first step's Linear/Embedding outputs
        self._hooks = [m.register_forward_hook(self._seen) for m in
                       (self.module.modules() if self.module is not None else ())
                       if _sharded_kind(m) and hasattr(m, "register_forward_hook")]

    def _seen(self, module: Any, args: Any, output: Any) -> None:
        if getattr(output, "is_floating_point", lambda: False)():
            self.outputs.add(_dtype(output))

    def __call__(self) -> None:
        for hook in self._hooks:  # the first step's forward alone: none in the timed steps
            hook.remove()
        self._hooks = []
        if self.kept or self.module is None:
            return
        self.kept = True
        modules = dict(self.module.named_modules())
        for name, p in self.module.named_parameters():
            if not p.requires_grad:
                continue
            g = p.grad
            if g is None:
                self.wrong.append(f"{name} has no gradient")
            elif g.shape != p.shape:
                self.wrong.append(f"{name}'s gradient is shaped {tuple(g.shape)}, the parameter "
                                  f"{tuple(p.shape)}")
            elif g.dtype != p.dtype:
                self.wrong.append(f"{name}'s gradient is {_dtype(g)}, the parameter {_dtype(p)}")
            if g is not None and not _sharded_kind(modules[name.rpartition(".")[0]]):
                self.replicated[name] = g.detach().cpu().clone()


def why_failed(record: Record | None, exc: Exception) -> Exception | None:
    """Where the first step's synchronization left a gradient misshapen (`record`, kept
    before the optimizer step), an error for `exc` that says so first, else None: AdamW then
    failed on it with "The size of tensor a (5000) must match the size of tensor b (10000)"
    alone, the cause the course's test names lost with the point."""
    if record is None or not record.wrong:
        return None
    return RuntimeError(f"after the first step's finish_gradient_synchronization(), "
                        f"{few(record.wrong, 2)}: {SAID} asserts every parameter's gradient "
                        f"has the parameter's shape and dtype; the optimizer step then "
                        f"failed: {type(exc).__name__}: {first_line(exc)}")


def _dtype(t: Any) -> str:
    return str(t.dtype).removeprefix("torch.")


def _shape(t: Any) -> tuple | None:
    return tuple(t.shape) if hasattr(t, "shape") else None


def _off_from_rank0(tensors: dict, names: list[str], device: Any, atol: float, rtol: float
                    ) -> dict[str, float]:
    """{name: largest |x - x_0|} of the tensors of `names` (alike in shape on every rank) that
    are not within `atol` + `rtol` |x| of rank 0's, as torch.allclose(x_0, x) reads it: one
    tensor at a time, rank 0's broadcast to the others."""
    import torch
    import torch.distributed as dist

    off = {}
    for name in names:
        mine = tensors[name].detach().to(device)
        theirs = mine.clone()
        dist.broadcast(theirs, src=0)
        if not torch.allclose(theirs.float(), mine.float(), atol=atol, rtol=rtol):
            off[name] = float((theirs.float() - mine.float()).abs().max())
    return off


def _alike(shapes: list[dict]) -> list[str]:
    """Rank 0's names of tensors that every rank holds, shaped alike."""
    return [n for n, s in shapes[0].items()
            if s is not None and all(r.get(n, ()) == s for r in shapes)]


def verdict(record: Record, full: dict, device: Any, precision: str,
            whole: dict[str, Any]) -> Verdict | None:
    """The failures of `record` (this rank's) and `full` (this rank's full parameters) on
    every rank, against rank 0's, as a failing Verdict with its causes in words; where the
    course's test would find nothing, a passing one with the dtype the forward computed in
    (and, where it ignored a 16-bit compute_dtype, a note that says so), or None. `whole`
    is the model's own parameters (rank 0's reference; empty on the others), to say a
    replicated parameter is sharded and a full one is in another dtype. Every rank calls
    it."""
    import torch.distributed as dist

    rank = dist.get_rank()
    given = "" if isinstance(full, Mapping) else type(full).__name__  # None off rank 0
    full = full if isinstance(full, Mapping) else {}
    grads = {n: _shape(g) for n, g in record.replicated.items()}
    fulls = {n: _shape(t) for n, t in full.items()}
    facts = gather({"module": record.module is not None, "wrong": record.wrong,
                    "grads": grads, "full": fulls, "given": given})
    atol, rtol = COURSE_TOLERANCE["test_fsdp.py"][precision]
    alike = _alike([f["grads"] for f in facts])  # the replicated gradients every rank holds
    grads_off = _off_from_rank0(record.replicated, alike, device, REPLICATED_ATOL,
                                REPLICATED_RTOL)
    full_off = _off_from_rank0(full, _alike([f["full"] for f in facts]), device, atol, rtol)
    offs = gather((grads_off, full_off))
    if rank != 0:
        return None
    causes = []
    if not facts[0]["module"]:
        causes.append(f"your FSDP keeps no `.module` (the model it wraps): {SAID} reads "
                      f"fsdp_model.module.named_parameters()")
    for r, f in enumerate(facts):
        if f["wrong"]:
            causes.append(f"after finish_gradient_synchronization() on rank {r}, "
                          f"{few(f['wrong'], 2)}: {SAID} asserts every parameter's gradient "
                          f"has the parameter's shape and dtype (fp32 master weights)")
            break
    differ = {n: d for r, (g, _) in enumerate(offs) for n, d in g.items()}
    unlike = [n for n in facts[0]["grads"] if n not in alike]
    if differ or unlike:
        name = next(iter(differ), None) or unlike[0]
        held = facts[0]["grads"][name]
        ref = next(iter(by_reference_names({name: None}, whole)), None)
        own = tuple(whole[ref].shape) if ref is not None else None
        sharded = (f"; rank 0 holds {held} of {name}'s {own}: sharded, where the handout asks "
                   f"the norms left whole" if own is not None and held != own else "")
        causes.append(f"the gradients of {few([*differ, *unlike], 2)} (no Linear's or "
                      f"Embedding's) differ between the ranks after "
                      f"finish_gradient_synchronization()"
                      + (f" (largest difference {differ[name]:.3g})" if name in differ else "")
                      + f", where {SAID} asserts them alike within atol=rtol="
                      f"{REPLICATED_ATOL:g}{sharded}")
    named = by_reference_names(full, whole)
    cast = [n for n, t in named.items() if getattr(t, "dtype", whole[n].dtype) != whole[n].dtype]
    if cast:
        causes.append(f"fsdp_gather_full_params() gave {few(cast, 2)} in "
                      f"{_dtype(named[cast[0]])}, the model's parameters in "
                      f"{_dtype(whole[cast[0]])}: {SAID} compares them with torch.allclose, "
                      f"which refuses two dtypes")
    for r, f in enumerate(facts):
        if f["given"]:
            causes.append(f"fsdp_gather_full_params() on rank {r} gave {f['given']}, not the "
                          f"full parameters by name: {SAID} reads them on every rank")
            break
    for r, f in enumerate(facts[1:], start=1):
        missing = [n for n, s in facts[0]["full"].items() if f["full"].get(n, ()) != s]
        far = offs[r][1]
        if missing or far:
            name = (missing or list(far))[0]
            got = f["full"].get(name)
            what = ("lacks " + name if got is None else f"gave {name} shaped {got}, rank 0 "
                    f"{facts[0]['full'][name]}") if missing else \
                f"gave {name} {far[name]:.3g} away from rank 0's"
            causes.append(f"fsdp_gather_full_params() on rank {r} {what}: {SAID} compares the "
                          f"full parameters with one process on every rank")
            break
    seen = {"forward_dtype": "/".join(sorted(SHORT.get(d, d) for d in record.outputs))} \
        if record.outputs else {}
    if precision != "fp32" and record.outputs == {"float32"}:
        note = (f"every Linear and Embedding of the first step computed in float32 at a "
                f"compute_dtype of {TORCH_NAMES[precision]}: your FSDP ignores "
                f"compute_dtype ({SAID} passes it: its 16-bit tolerance holds fp32 too), and "
                f"this point timed fp32")
        if not causes:
            return Verdict(True, {**seen, "check": "pass", "check_detail": note})
        causes.append(note)
    elif precision == "fp16" and "bfloat16" in record.outputs and "float16" not in \
            record.outputs:  # the course's fp16 tolerance fails it
        causes.append(f"every Linear and Embedding of the first step computed in bfloat16 at "
                      f"a compute_dtype of float16: your FSDP casts to a 16-bit dtype of its "
                      f"own, not compute_dtype, and {SAID}'s fp16 tolerance does not hold "
                      f"bfloat16's 8-bit mantissa (this point timed bf16)")
    if not causes:
        return Verdict(True, seen) if seen else None
    text = "; ".join(causes)
    return Verdict(False, {**seen, "check": "fail", "check_detail": text}, "wrong: " + text)


def gather_changes(module: Any, gather_full: Any) -> str | None:
    """What fsdp_gather_full_params() (`gather_full`) changed of the model it gathered from,
    on any rank, in words (None: nothing): the course's test_fsdp.py calls it after every
    step and trains on, and a gather that kept the full weights as the parameters failed
    its next step there (`The size of tensor a (256) must match ... (128)`), which passed
    here, where it was called once, last. The point trains on after it too; this says why
    where it then fails. Every rank calls it, at the same point (collectives)."""
    import torch

    with torch.no_grad():
        before = {n: (tuple(p.shape), p.dtype, p.detach().clone())
                  for n, p in module.named_parameters()}
        gather_full()  # (its result is not kept)
        after = dict(module.named_parameters())
        said = None
        for name in [*(n for n in after if n not in before), *before]:
            now, was = after.get(name), before.get(name)
            if was is None or now is None:
                said = f"{name} is {'new' if was is None else 'gone'}"
            elif (tuple(now.shape), now.dtype) != was[:2]:
                said = f"{name} went from {list(was[0])} {_dtype(was[2])} to " \
                       f"{list(now.shape)} {_dtype(now)}"
            elif not torch.allclose(now.detach(), was[2], rtol=0, atol=0, equal_nan=True):
                said = f"{name} changed its values"
            if said:
                break
    rank, said = next(((r, s) for r, s in enumerate(gather(said)) if s), (None, None))
    if said is None:
        return None
    return (f"fsdp_gather_full_params() changed the model on rank {rank} ({said}), where "
            f"{SAID} gathers after every step and trains on")
