"""`cs336sys precision accumulate|autocast`: mixed-precision facts, measured and stored."""

from __future__ import annotations

from typing import Any

import typer

from cs336sys.cli.common import run_experiment
from cs336sys.cli.options import list_option, option, options_of, store_options

DeviceOpt = option("auto, cpu, cuda or cuda:N.", str)

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
        cs336sys precision autocast --precision bf16,fp16
    """


def _accumulate_only(
    variant: list_option("fp32, fp16, fp16-into-fp32 (float16 values, float32 sum), fp16-upcast "
                         "(values "
                         "cast to float32 explicitly). [default: all four]") = None,
    additions: option("How many times to add the value.", int) = 1000,
    value: option("The value added each time.", float) = 0.01,
    device: DeviceOpt = "auto",
) -> None:
    """The options of `precision accumulate` beyond the store's (no user code: no --adapters)."""


@precision.command()
@options_of(_accumulate_only, store_options, drop=("adapters",))
def accumulate(**options: Any) -> None:
    """Add 0.01 a thousand times in four dtype combinations; error against the exact 10.

    The CS336 assignment-2 accumulation experiment: a float32 sum of float32 values, a float16 sum of float16 values, a float32 sum of float16 values, and the same with the values upcast explicitly. Each row keeps the result, its error, the addend as stored in its dtype, and the error split into the addend's rounding and the running sum's rounding.

    Example:

        cs336sys precision accumulate --variant fp32,fp16
    """
    from cs336sys.experiments import precision as exp

    run_experiment(exp.EXPERIMENT, exp.accumulate_specs, options, command="precision accumulate",
                   describe=lambda s: s.variant, emulation=False)


def _autocast_only(
    precision: list_option("bf16 and/or fp16. [default: bf16]") = None,
    in_features: option("The toy model's input width.", int) = 16,
    out_features: option("The toy model's output width.", int) = 4,
    batch: list_option("Rows in the random batch. [default: 8]") = None,
    device: DeviceOpt = "auto",
    seed: option("Seed for weights and data.", int) = 0,
) -> None:
    """The options of `precision autocast` beyond the store's (no user code: no --adapters)."""


@precision.command()
@options_of(_autocast_only, store_options, drop=("adapters",))
def autocast(**options: Any) -> None:
    """The dtypes autocast produces in the CS336 toy model, as observed on this device.

    ToyModel: fc1 = Linear(in, 10) -> ReLU -> LayerNorm(10) -> fc2 = Linear(10, out), one forward under torch.autocast and one backward. The row records the dtypes of the parameters inside autocast, of the fc1, ReLU and LayerNorm outputs, the logits, the cross-entropy loss and the gradients, and whether the hardware computes in the dtype natively. Where autocast refuses or disables itself for the dtype, the row is stored as skipped with torch's reason.

    Example:

        cs336sys precision autocast --precision bf16,fp16 --device cpu
    """
    from cs336sys.experiments import precision as exp

    def why_skipped(points: list) -> None:
        for p in points:
            if p.result.status == "skipped":
                typer.echo(f"{p.spec.precision} on {p.spec.device}: {p.result.error}", err=True)

    options["batch"] = options["batch"] or [8]
    run_experiment(exp.EXPERIMENT, exp.autocast_specs, options, command="precision autocast",
                   describe=lambda s: s.precision, emulation=False, after=why_skipped)
