"""`cs336sys memory`: peak memory of the LM's forward pass or training step, measured and
accounted; `cs336sys memory residuals`: what one block saves for backward, by operation."""

from __future__ import annotations

from typing import Any

import typer

from cs336sys.cli.common import fail, run_experiment
from cs336sys.cli.options import estimate_options, list_option, model_command, nsys_options, option

memory_app = typer.Typer(name="memory", add_completion=False, pretty_exceptions_enable=False)


def _memory_only(
    mode: list_option("forward (no grad) and/or train (forward, backward, AdamW step). [default: "
                      "train]") = None,
    snapshot: option("Directory for each point's memory timeline PNG (and, on CUDA, the pickle "
                     "pytorch.org/memory_viz loads); created if missing.", str | None) = None,
    warmup: option("Untracked warm-up steps.", int) = 1,
    iters: option("Timed steps (untracked), before the measured one.", int) = 3,
) -> None:
    """The options of `memory` beyond the model's (cli/options.py, model_options)."""


@memory_app.callback(invoke_without_command=True)
@model_command(_memory_only, estimate_options, nsys_options)
def memory(ctx: typer.Context, **options: Any) -> None:
    """Peak memory of a forward pass or training step, next to its analytic breakdown; one row per point.

    Per point: the bytes after model init, the peak of the step and of each phase, the bytes just before and after the optimizer step, and the bytes saved for backward (parameters excluded); beside them parameters, gradients and AdamW state (4P, 4P, 8P bytes; in a bf16 model 2P, 2P, and 8P for our AdamW, 4P for torch's and yours), the counted activations (fp32, naive attention) and the residual-stream tensor B·T·d·bytes. On CUDA the allocator's figures; elsewhere the live tensor bytes counted by a tracker (not RSS). A sweep over --checkpoint marks the setting with the lowest peak in each group. View: memory_runs.

    Example:

        cs336sys memory --size small --checkpoint none,every:1,sqrt

    Subcommand `cs336sys memory residuals` measures one block's saved bytes, by operation.
    """
    if ctx.invoked_subcommand is not None:
        _refuse_options_before_subcommand(ctx)
        return
    from cs336sys.experiments import memory as exp

    # (a point's timeline never replaces a file: experiments/memory.unused_name)
    run_experiment(exp.EXPERIMENT, exp.specs, {**options, "ctx": ctx}, describe=_label,
                   after=_snapshots)


def _snapshots(points: list) -> None:
    """Where each point's CUDA snapshot went, and how to open it."""
    from cs336sys.experiments.memory_section import memory_viz_line

    for p in points:
        line = memory_viz_line(p.result.metrics.get("snapshot_pickle"))
        if line:
            typer.echo(line)


def _residuals_only(
    size: list_option("Size preset(s) of the block. [default: small]") = None,
    batch: list_option("Batch size(s). [default: 4, the handout's]") = None,
    compile: option("Only the block under torch.compile (--compile), or only eager "
                    "(--no-compile). [default: both]", bool | None, "--compile/--no-compile") = None,
) -> None:
    """The options of `memory residuals` beyond the model's."""


@memory_app.command()
@model_command(_residuals_only,
               drop=("optimizer", "checkpoint", "warmup", "iters", "num_layers", "vocab_size"))
def residuals(**options: Any) -> None:
    """Bytes one TransformerBlock (ours, or your model's with --model) saves for backward, eager and compiled, and the top 5 operations by saved bytes.

    Saved-tensor hooks count each saved storage once, parameters excluded; the bytes are attributed to autograd node names by walking the graph (a storage saved by several nodes is split among them), so the shares add up to 1. A compiled block is one CompiledFunctionBackward node. The analytic count is given for the eager fp32 block with naive attention. View: memory_residuals_runs.

    Example:

        cs336sys memory residuals --size xl --seq 2048
    """
    from cs336sys.experiments import memory_residuals as exp

    run_experiment(exp.EXPERIMENT, exp.specs, options, command="memory residuals",
                   describe=lambda s: f"{s.size} T={s.seq} {'compiled' if s.compile else 'eager'}",
                   emulation=False)


# -- validation -------------------------------------------------------------------------------


def _refuse_options_before_subcommand(ctx: typer.Context) -> None:
    """`memory --size xl residuals` would silently drop --size: say where it belongs."""
    # By name: typer may bring its own copy of click, whose ParameterSource is another enum.
    given = [n for n in ctx.params
             if getattr(ctx.get_parameter_source(n), "name", "") == "COMMANDLINE"]
    if given:
        flag = "--" + given[0].replace("_", "-")
        fail(f"{flag} belongs after the subcommand: cs336sys memory {ctx.invoked_subcommand} "
             f"{flag} ...")


def _label(spec) -> str:
    m = spec.point
    return f"{m.size} T={m.seq} {m.mode} {m.precision} {m.checkpoint}"
