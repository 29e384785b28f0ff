"""`cs336sys model`: end-to-end timing of the Transformer LM over a sweep of settings."""

from __future__ import annotations

from typing import Any

from cs336sys.cli.common import run_experiment
from cs336sys.cli.options import (
    Compile,
    estimate_options,
    list_option,
    model_command,
    nsys_options,
    option,
)


def _model_only(
    mode: list_option("forward, forward-backward and/or train. [default: train]") = None,
    warmup: list_option("Untimed warm-up steps; a list is the warm-up study, a point per count "
                        "(0,1,2,5). [default: 5 on CUDA, 2 on CPU]") = None,
    compile: Compile = False,
    nvtx: option("Emit NVTX ranges (for nsys); no-op without CUDA.", bool, "--nvtx") = False,
) -> None:
    """The options of `model` beyond the model's (cli/options.py, model_options)."""


@model_command(_model_only, estimate_options, nsys_options)
def model(**options: Any) -> None:
    """Time forward, backward and optimizer steps of the Transformer LM; one row per point.

    Every list option takes comma lists or repetition, and the sweep is their cartesian product. Weights and data are random. Out-of-memory points are stored with status `oom` and the sweep goes on; other failures are stored as `error` (exit code 1 at the end).

    Example:

        cs336sys model --size small,medium --precision fp32,bf16 --seq 256

        cs336sys model --size small --warmup 0,1,2,5

        cs336sys model --model cs336_basics --size tiny,small

        cs336sys model --attention flash-torch,yours-torch
    """
    from cs336sys.experiments import model as exp

    run_experiment(exp.EXPERIMENT, exp.specs, options, describe=point_name)


def point_name(spec) -> str:
    """A point in a few words, for the progress bar."""
    return f"{spec.model or spec.size} T={spec.seq} {spec.mode} {spec.precision}"
