"""Mixed precision, up close: where low-precision accumulation loses accuracy, and which
dtypes autocast really produces.

Two cases, both from CS336 assignment 2 (§"Mixed precision", problems
`mixed_precision_accumulation` and `benchmarking_mixed_precision` (a)):

- accumulate: add `value` (0.01) `additions` (1000) times into a sum, in four dtype
  combinations, and compare with the exact decimal answer (10). The four variants mirror the
  assignment's code line for line, including creating the addend tensor inside the loop.
  Each error is split into the part due to rounding the addend to its dtype (`addend` is
  the value actually added) and the part due to rounding the running sum.
- autocast: the assignment's ToyModel (fc1 = Linear(in, 10, bias=False), ReLU,
  LayerNorm(10), fc2 = Linear(10, out, bias=False)) run once forward and backward under
  `torch.autocast(device, dtype)`. Forward hooks record the dtype each module actually
  returned; the row also says whether autocast was enabled at all and whether the hardware
  computes in that dtype natively (rather than converting to float32 for arithmetic).

Which ops autocast casts is device-specific (torch docs, "Automatic Mixed Precision
package", op lists for CUDA and CPU): on CUDA `layer_norm` is in the float32 list, so the
LayerNorm output is float32; on CPU it is in neither list and runs in its input's dtype.
Cross-entropy is in the float32 list on both (on CPU its bfloat16 logits are cast to float32
before the log-softmax), so the loss is float32.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from fractions import Fraction
from typing import Any

from cs336sys.measure.dtypes import TORCH_NAMES as _TORCH_DTYPE
from cs336sys.report.plots import Ranked
from cs336sys.report.sections import add_plot
from cs336sys.sweep.declaration import (
    Column,
    Experiment,
    Table,
    column_table,
    metric_table,
    setting_columns,
    settings_keys,
)
from cs336sys.sweep.points import (
    MAX_STEPS,
    SpecError,
    check_seed,
    choices,
    device_choice,
    one_value_options,
    positive_ints,
    positive_sizes,
)
from cs336sys.sweep.result import Result

KINDS = ("accumulate", "autocast")
AUTOCAST_DTYPES = ("bf16", "fp16")

# variant -> (accumulator dtype, addend dtype, addend explicitly upcast to float32 first)
VARIANTS: dict[str, tuple[str, str, bool]] = {
    "fp32": ("float32", "float32", False),  # s = fp32; s += fp32(0.01)
    "fp16": ("float16", "float16", False),  # s = fp16; s += fp16(0.01)
    "fp16-into-fp32": ("float32", "float16", False),  # s = fp32; s += fp16(0.01)
    "fp16-upcast": ("float32", "float16", True),  # s = fp32; s += fp16(0.01).type(fp32)
}


@dataclass(frozen=True)
class AccumulateSpec:
    variant: str
    accumulator_dtype: str
    value_dtype: str
    upcast: bool
    additions: int
    value: float
    device: str

    @classmethod
    def of(cls, variant: str, additions: int, value: float, device: str) -> AccumulateSpec:
        acc, val, upcast = VARIANTS[variant]
        return cls(variant, acc, val, upcast, additions, value, device)

    def settings(self) -> dict[str, Any]:
        return {"kind": "accumulate", **asdict(self)}


@dataclass(frozen=True)
class AutocastSpec:
    precision: str  # bf16 | fp16
    in_features: int
    out_features: int
    batch: int
    device: str
    seed: int = 0

    def settings(self) -> dict[str, Any]:
        return {"kind": "autocast", **asdict(self)}


@one_value_options
def accumulate_specs(*, variant: Iterable[str] | None = None, additions: int = 1000,
                     value: float = 0.01, device: str = "auto") -> list[AccumulateSpec]:
    """One point per accumulation variant (default all four). SpecError for a bad option."""
    variants = choices(variant, list(VARIANTS), "--variant", default=list(VARIANTS))
    if additions <= 0:
        raise SpecError(f"--additions must be positive, got {additions}")
    if additions > MAX_STEPS:
        raise SpecError(f"--additions must be at most {MAX_STEPS:,}, got {additions:,}")
    if not (value == value and abs(value) != float("inf")):
        raise SpecError(f"--value must be a finite number, got {value}")
    dev = device_choice(device)
    return [AccumulateSpec.of(v, additions, value, dev) for v in variants]


@one_value_options
def autocast_specs(*, precision: Iterable[str] | None = None, in_features: int = 16,
                   out_features: int = 4, batch: int | Iterable[Any] = 8,
                   device: str = "auto", seed: int = 0) -> list[AutocastSpec]:
    """One point per autocast dtype (default bf16) and batch size (one or a list).
    SpecError for a bad option."""
    dtypes = choices(precision, AUTOCAST_DTYPES, "--precision", default=["bf16"])
    positive_sizes(in_features=in_features, out_features=out_features)
    batches = positive_ints([batch] if isinstance(batch, int) else batch, "--batch")
    check_seed(seed)
    dev = device_choice(device)
    return [AutocastSpec(d, in_features, out_features, b, dev, seed)
            for d in dtypes for b in batches]


def run(spec: AccumulateSpec | AutocastSpec) -> Result:
    if isinstance(spec, AccumulateSpec):
        return run_accumulate(spec)
    return run_autocast(spec)


# -- accumulate ------------------------------------------------------------------------------


def exact_sum(additions: int, value: float) -> Fraction:
    """additions · value in decimal arithmetic (1000 · 0.01 = 10 exactly), exactly."""
    return Fraction(Decimal(repr(value))) * additions


def exact_target(additions: int, value: float) -> float:
    """exact_sum as the nearest float."""
    return _rounded(exact_sum(additions, value))


def run_accumulate(spec: AccumulateSpec) -> Result:
    import torch

    acc = getattr(torch, spec.accumulator_dtype)
    val = getattr(torch, spec.value_dtype)
    device = torch.device(spec.device)
    # The assignment's loop, as written there: a fresh 0-d tensor per addition.
    s = torch.tensor(0, dtype=acc, device=device)
    for _ in range(spec.additions):
        x = torch.tensor(spec.value, dtype=val, device=device)
        s += x.type(torch.float32) if spec.upcast else x
    result = s.item()  # a Python float holds any float16/float32 value exactly
    addend = torch.tensor(spec.value, dtype=val).item()  # what 0.01 becomes in value_dtype
    # The errors in exact rational arithmetic, rounded once: 0.1 x 3 is 0.3 in decimal, and
    # result - 0.3 in float64 is off in its last digits (1.1920928966e-08 for 1.1920928955e-08)
    exact = exact_sum(spec.additions, spec.value)
    target = _rounded(exact)
    ideal = Fraction(addend) * spec.additions if math.isfinite(addend) else addend
    error = _minus(result, exact)
    return Result(
        "ok",
        metrics={
            "result_dtype": str(s.dtype).removeprefix("torch."),
            "target": target,
            "result": result,
            "error_vs_target": error,
            "abs_error": abs(error),
            "rel_error": abs(error) / abs(target) if target else None,
            "addend": addend,
            # error from representing `value` in value_dtype, and from rounding the sum
            "addend_error_total": _rounded(ideal - exact) if math.isfinite(addend) else addend,
            "sum_rounding_error": _minus(result, ideal),
        },
    )


def _minus(x: float, y: Fraction | float) -> float:
    """x - y, computed exactly and rounded once; inf or NaN where x or y is (a float16 sum
    past 65504 is inf, less any exact number still inf)."""
    if not isinstance(y, Fraction):
        return x - y
    return _rounded(Fraction(x) - y) if math.isfinite(x) else x


def _rounded(exact: Fraction) -> float:
    """An exact value as the nearest float, or an infinity of its sign past float64's range
    (1e308 x 1000)."""
    try:
        return float(exact)
    except OverflowError:
        return math.inf if exact > 0 else -math.inf


# -- autocast -----------------------------------------------------------------------------


def toy_model(in_features: int, out_features: int):
    """CS336 assignment 2's ToyModel: fc1 -> ReLU -> LayerNorm -> fc2."""
    import torch.nn as nn

    class ToyModel(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc1 = nn.Linear(in_features, 10, bias=False)
            self.ln = nn.LayerNorm(10)
            self.fc2 = nn.Linear(10, out_features, bias=False)
            self.relu = nn.ReLU()

        def forward(self, x):
            x = self.relu(self.fc1(x))
            x = self.ln(x)
            return self.fc2(x)

    return ToyModel()


def _name(dtypes) -> str:
    """'float32', or 'float32,bfloat16' when tensors disagree (sorted, so rows compare)."""
    return ",".join(sorted({str(d).removeprefix("torch.") for d in dtypes}))


def _autocast_enabled(device_type: str) -> bool:
    import torch

    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        if device_type == "cpu":
            return torch.is_autocast_cpu_enabled()
        return torch.is_autocast_enabled()


def open_autocast(device_type: str, dtype):
    """Enter torch.autocast; returns (context, None) or (None, why autocast cannot run).

    torch raises for an unsupported CUDA dtype (bfloat16 before Ampere) and, on CPU, warns
    and silently disables itself; both become a reason, so the row says so instead of
    recording float32 dtypes as if autocast had run.
    """
    import torch

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            ctx = torch.autocast(device_type, dtype=dtype)
            ctx.__enter__()
        except (RuntimeError, ValueError) as exc:
            return None, f"torch.autocast({device_type!r}, {dtype}) refused: {exc}"
    if not _autocast_enabled(device_type):
        ctx.__exit__(None, None, None)
        said = "; ".join(str(w.message) for w in caught) or "no reason given"
        return None, f"torch.autocast({device_type!r}, {dtype}) disabled itself: {said}"
    return ctx, None


def native_support(device: str, dtype: str) -> tuple[bool | None, str]:
    """Whether the device's matrix units compute in `dtype` (bf16|fp16), and the evidence.

    CUDA: bfloat16 tensor-core math from compute capability 8.0 (Ampere), float16 from 5.3.
    CPU: bfloat16 dot products need AVX512-BF16 or AMX (AMX-BF16 ships with AMX tiles);
    float16 needs AVX512-FP16 or AMX-FP16, which is what oneDNN's fp16 check tests. Without
    them the kernels convert to float32 to compute. (Element-wise kernels such as ReLU and
    LayerNorm compute in float32 internally on every device; "native" is about matmuls.)
    None where torch offers no check.
    """
    import torch

    if device.startswith("cuda"):
        cc = torch.cuda.get_device_capability(device)
        need = (8, 0) if dtype == "bf16" else (5, 3)
        return cc >= need, f"sm_{cc[0]}{cc[1]}; native {dtype} from sm_{need[0]}{need[1]}"
    if device != "cpu":
        return None, f"no check for {device}"

    def check(fn) -> bool | None:
        try:
            return bool(fn())
        except (AttributeError, RuntimeError):  # private helpers that older torch lacks
            return None

    cpu = torch.cpu
    if dtype == "bf16":
        checks = {
            "AVX512-BF16": check(lambda: cpu._is_avx512_bf16_supported()),
            "AMX": check(lambda: cpu._is_amx_tile_supported()),
        }
    else:
        checks = {
            "AVX512-FP16 or AMX-FP16": check(lambda: torch.ops.mkldnn._is_mkldnn_fp16_supported())
        }
        if checks["AVX512-FP16 or AMX-FP16"] is None:  # a build without oneDNN
            checks = {"AMX-FP16": check(lambda: cpu._is_amx_fp16_supported())}
    known = {k: v for k, v in checks.items() if v is not None}
    capability = f"cpu {torch.backends.cpu.get_cpu_capability()}"
    if not known:
        return None, f"{capability}; torch has no {dtype} feature check"
    have = [k for k, v in known.items() if v]
    if have:
        return True, f"{capability}; has {', '.join(have)}"
    return False, f"{capability}; no {' or '.join(known)}: {dtype} math runs via float32"


def run_autocast(spec: AutocastSpec) -> Result:
    import torch
    import torch.nn.functional as F

    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    dtype = getattr(torch, _TORCH_DTYPE[spec.precision])
    with device:
        model = toy_model(spec.in_features, spec.out_features)
    x = torch.randn(spec.batch, spec.in_features, device=device)  # (B, in)
    y = torch.randint(0, spec.out_features, (spec.batch,), device=device)  # (B,)
    native, basis = native_support(spec.device, spec.precision)
    metrics: dict[str, Any] = {"native": native, "native_basis": basis}

    seen: dict[str, str] = {}

    def record(name: str):
        def hook(_module, _inputs, output) -> None:  # returning None keeps the output as is
            seen.setdefault(name, _name([output.dtype]))

        return hook

    ctx, why_not = open_autocast(device.type, dtype)
    if ctx is None:
        return Result("skipped", metrics={**metrics, "autocast_enabled": False}, error=why_not)
    hooks = [getattr(model, n).register_forward_hook(record(n)) for n in ("fc1", "relu", "ln")]
    try:
        # Parameters are not cast in place: autocast casts copies per op (and caches them).
        param_dtype = _name(p.dtype for p in model.parameters())
        logits = model(x)  # (B, out)
        loss = F.cross_entropy(logits, y)
    finally:
        ctx.__exit__(None, None, None)
        for h in hooks:
            h.remove()
    loss.backward()
    return Result(
        "ok",
        metrics={
            **metrics,
            "autocast_enabled": True,
            "param_dtype": param_dtype,
            "fc1_dtype": seen["fc1"],
            "relu_dtype": seen["relu"],
            "ln_dtype": seen["ln"],
            "logits_dtype": _name([logits.dtype]),
            "loss_dtype": _name([loss.dtype]),
            "grad_dtype": _name(p.grad.dtype for p in model.parameters()),
            "loss": loss.item(),
        },
    )


# -- the declaration ------------------------------------------------------------------------


def _value_dtype(row: Mapping[str, Any]) -> str:
    return str(row.get("value_dtype")) + (" -> float32" if row.get("upcast") else "")


def _native(row: Mapping[str, Any]) -> str:
    answer = {True: "yes", False: "no"}.get(row.get("native"), "unknown")
    return f"{answer} ({row['native_basis']})" if row.get("native_basis") else answer


ACCUMULATE = Table(
    "Accumulation: the sum against the exact answer",
    (
        Column("kind", "kind", setting=True),
        Column("variant", "variant", setting=True),
        Column("sum dtype", "accumulator_dtype", setting=True),
        Column("value dtype", cell=_value_dtype, setting=True, covers=("value_dtype", "upcast")),
        *column_table("""
            result            result           exact
            error vs exact    error_vs_target  exact
            addend as stored  addend           exact
        """),
    ),
    where={"kind": "accumulate"},
    note="Results are exact floats (the shortest decimal that reads back as the stored value).",
)
AUTOCAST = Table(
    "Autocast: the dtypes each module returned",
    (
        *setting_columns("kind autocast=precision device"),
        Column("params", "param_dtype"),
        Column("fc1", "fc1_dtype"),
        Column("relu", "relu_dtype"),
        Column("layernorm", "ln_dtype", notes_if=(("float16", (
            "layernorm in a 16-bit dtype: on a CPU autocast runs layer_norm in its input's "
            "dtype; on CUDA layer_norm is on autocast's float32 list and returns float32, "
            "what the handout, which asks about a GPU, expects.")),)),
        Column("logits", "logits_dtype"),
        Column("loss", "loss_dtype"),
        Column("grads", "grad_dtype"),
        Column("native", cell=_native),
    ),
    where={"kind": "autocast"},
)

def section(sec: Any, pts: list) -> None:
    """The accumulation error of each variant, on a log axis: fp32 and fp16 differ by over two
    decades. A variant that came out exact has no bar (a log axis has no zero)."""
    rows = [r for r in pts if r["_settings"].get("kind") == "accumulate"
            and r.get("status") == "ok" and r.get("abs_error") is not None]
    drawn = [r for r in rows if r["abs_error"] and math.isfinite(r["abs_error"])]
    # a sum past float16's largest value (65504) is inf: the finding, with no bar to draw
    undrawn = (("Exact", [r for r in rows if not r["abs_error"]]),
               ("Overflowed to inf", [r for r in rows if not math.isfinite(r["abs_error"])]))
    def named(r: Any) -> str:  # the sum it computed: a second --value or --additions reads apart
        s = r["_settings"]
        return f"{r['variant']} ({s.get('additions', r.get('additions'))} × {s.get('value')})"

    note = " ".join(f"{why}, so not drawn: {', '.join(dict.fromkeys(map(named, some)))}."
                    for why, some in undrawn if some)
    add_plot(sec, "Accumulation error by variant", "precision-accumulate", Ranked(
        tuple((named(r), r["abs_error"], f"accumulator {r['accumulator_dtype']}")
              for r in drawn),
        "|result - exact sum| (log scale)", "Accumulating in low precision: the error",
        logx=True), note=note)


EXPERIMENT = Experiment(
    kind="precision",
    title="Precision: accumulation and autocast",
    spec=(AccumulateSpec, AutocastSpec),
    run=run,
    section=section,
    draws=True,
    settings=tuple(dict.fromkeys(("kind", *settings_keys(AccumulateSpec),
                                  *settings_keys(AutocastSpec)))),
    metrics=(
        *metric_table("""
            result_dtype        -  dtype of the sum
            target              -  additions × value in exact decimal arithmetic
            result              -  the sum, exactly as computed
            error_vs_target     -  result - target
            abs_error           -  |result - target|
            rel_error           -  |result - target| / |target|
            addend              -  the value as stored in the values' dtype
            addend_error_total  -  additions × addend - target: the addend's rounding
            sum_rounding_error  -  result - additions × addend: the running sum's rounding
            autocast_enabled    -  whether autocast ran at all
            param_dtype         -  parameters inside autocast
            fc1_dtype           -  fc1's output
            relu_dtype          -  ReLU's output
            ln_dtype            -  LayerNorm's output
            logits_dtype        -  the logits
            loss_dtype          -  the cross-entropy loss
            grad_dtype          -  the parameters' gradients
            loss                -  the loss value
            native              -  whether the matrix units compute in the dtype
            native_basis        -  the evidence for `native`
        """),
    ),
    tables=(ACCUMULATE, AUTOCAST),
)
