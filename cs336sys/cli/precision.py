"""`cs336sys precision accumulate|autocast`: mixed-precision facts, measured and stored."""

from __future__ import annotations

from typing import Annotated

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    check_db,
    choices,
    fail,
    progress,
    recording,
    table,
)

ListOpt = list[str] | None
DeviceOpt = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]

precision = typer.Typer(
    name="precision",
    no_args_is_help=True,
    add_completion=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)


@precision.callback()
def _group() -> None:
    """Mixed precision up close: accumulation error, and the dtypes autocast produces.

    Both subcommands store one row per case in the view `precision_runs`.

    Example:

        cs336sys precision accumulate
        cs336sys precision autocast --dtype bf16,fp16
    """


def _device(device: str) -> str:
    from cs336sys.bench.device import resolve_device

    try:
        return resolve_device(device)
    except ValueError as exc:
        fail(exc)


def _measure(db, command: str, dev: str, specs: list, label) -> list:
    from cs336sys.bench.result import guarded
    from cs336sys.experiments.precision import EXPERIMENT, run
    from cs336sys.store.db import now

    results = []
    with recording(db, command, dev) as rec:
        for spec in progress(specs, command, show=label):
            started = now()
            result = guarded(run, spec)
            rec.add(EXPERIMENT, spec.settings(), result, started)
            results.append((spec, result))
        if rec.errors:
            typer.echo(_table(command, results))
            raise typer.Exit(1)
    return results


@precision.command()
def accumulate(
    variant: Annotated[
        ListOpt,
        typer.Option(
            help="fp32, fp16, fp16-into-fp32 (float16 values, float32 sum), fp16-upcast "
            "(values cast to float32 explicitly). [default: all four]"
        ),
    ] = None,
    additions: Annotated[int, typer.Option(help="How many times to add the value.")] = 1000,
    value: Annotated[float, typer.Option(help="The value added each time.")] = 0.01,
    device: DeviceOpt = "auto",
    db: DbOption = DEFAULT_DB,
) -> None:
    """Add 0.01 a thousand times in four dtype combinations; error against the exact 10.

    The CS336 assignment-2 accumulation experiment: a float32 sum of float32 values, a float16 sum of float16 values, a float32 sum of float16 values, and the same with the values upcast explicitly. Each row keeps the result, its error, the addend as stored in its dtype, and the error split into the addend's rounding and the running sum's rounding.

    Example:

        cs336sys precision accumulate --variant fp32,fp16
    """  # noqa: E501
    from cs336sys.experiments.precision import VARIANTS, AccumulateSpec

    variants = choices(variant, list(VARIANTS), "--variant", default=list(VARIANTS))
    if additions <= 0:
        fail(f"--additions must be positive, got {additions}")
    if not (value == value and abs(value) != float("inf")):
        fail(f"--value must be a finite number, got {value}")
    dev = _device(device)
    check_db(db)
    specs = [AccumulateSpec.of(v, additions, value, dev) for v in variants]
    results = _measure(db, "precision accumulate", dev, specs, lambda s: s.variant)
    typer.echo(_table("precision accumulate", results))


@precision.command()
def autocast(
    dtype: Annotated[ListOpt, typer.Option(help="bf16 and/or fp16. [default: bf16]")] = None,
    in_features: Annotated[int, typer.Option(help="The toy model's input width.")] = 16,
    out_features: Annotated[int, typer.Option(help="The toy model's output width.")] = 4,
    batch_size: Annotated[int, typer.Option(help="Rows in the random batch.")] = 8,
    device: DeviceOpt = "auto",
    seed: Annotated[int, typer.Option(help="Seed for weights and data.")] = 0,
    db: DbOption = DEFAULT_DB,
) -> None:
    """The dtypes autocast produces in the CS336 toy model, as observed on this device.

    ToyModel: fc1 = Linear(in, 10) -> ReLU -> LayerNorm(10) -> fc2 = Linear(10, out), one forward under torch.autocast and one backward. The row records the dtypes of the parameters inside autocast, of the fc1, ReLU and LayerNorm outputs, the logits, the cross-entropy loss and the gradients, and whether the hardware computes in the dtype natively. Where autocast refuses or disables itself for the dtype, the row is stored as skipped with torch's reason.

    Example:

        cs336sys precision autocast --dtype bf16,fp16 --device cpu
    """  # noqa: E501
    from cs336sys.experiments.precision import AUTOCAST_DTYPES, AutocastSpec

    dtypes = choices(dtype, AUTOCAST_DTYPES, "--dtype", default=["bf16"])
    for name, n in (("in-features", in_features), ("out-features", out_features),
                    ("batch-size", batch_size)):  # fmt: skip
        if n <= 0:
            fail(f"--{name} must be positive, got {n}")
    dev = _device(device)
    check_db(db)
    specs = [AutocastSpec(d, in_features, out_features, batch_size, dev, seed) for d in dtypes]
    results = _measure(db, "precision autocast", dev, specs, lambda s: s.dtype)
    typer.echo(_table("precision autocast", results))
    for spec, r in results:
        if r.status == "skipped":
            typer.echo(f"{spec.dtype} on {spec.device}: {r.error}", err=True)


def _table(command: str, results) -> str:
    if command == "precision accumulate":
        rows = [
            [s.variant, s.accumulator_dtype, s.value_dtype + (" -> float32" if s.upcast else ""),
             r.status, _num(r.metrics.get("result")), _num(r.metrics.get("error_vs_target"), "+.6g"),
             _num(r.metrics.get("addend"))]
            for s, r in results
        ]  # fmt: skip
        headers = ["variant", "sum dtype", "value dtype", "status", "result", "error vs exact",
                   "addend as stored"]  # fmt: skip
        return table(rows, headers, numparse=False)
    cols = ("param", "fc1", "relu", "ln", "logits", "loss", "grad")
    rows = [
        [s.dtype, s.device, r.status, *(r.metrics.get(f"{c}_dtype", "") for c in cols),
         _native(r.metrics)]
        for s, r in results
    ]  # fmt: skip
    headers = ["autocast", "device", "status", "params", "fc1", "relu", "layernorm", "logits",
               "loss", "grads", "native"]  # fmt: skip
    return table(rows, headers, numparse=False)


def _native(m: dict) -> str:
    answer = {True: "yes", False: "no"}.get(m.get("native"), "unknown")
    return f"{answer} ({m['native_basis']})" if m.get("native_basis") else answer


def _num(x: float | None, fmt: str = "") -> str:
    """repr() by default: the shortest text that reads back as exactly the stored float."""
    if x is None:
        return ""
    return format(x, fmt) if fmt else repr(x)
