"""The command line of `cs336sys model`: its options, help, examples and how a point is named
on the progress bar, declared as a `Command` (sweep/declaration.py) that the kind's
`EXPERIMENT` carries and the CLI builds (cli/declared.py). `profile model` takes these
options too, so this module stays light (it imports the sweep's declarations alone): the
command line imports it as it starts."""

from __future__ import annotations

from typing import Any

from cs336sys.sweep.declaration import Command
from cs336sys.sweep.options import list_option, option


def options(
    mode: list_option("forward, forward-backward and/or train. [default: train]") = None,
    warmup: list_option("Untimed warm-up steps; a list is the warm-up study, a point per count "
                        "(0,1,2,5). [default: 5 on CUDA, 2 on CPU]") = None,
    compile: option("Wrap the model in torch.compile.", bool, "--compile/--no-compile") = False,
    nvtx: option("Emit NVTX ranges (for nsys); no-op without CUDA.", bool, "--nvtx") = False,
    rounds: option("Interleaved rounds: every point builds its model, warms it up and times its "
                   "share of --iters, then the next round, so that drift falls on every point "
                   "alike (fp32 against bf16 gets a verdict). [default: 1, the handout's "
                   "method]",
                   int | None) = None,
) -> None:
    """The options of `model` beyond the model's (cli/options.py, model_options)."""


def point_name(spec: Any) -> str:
    """A point in a few words, for the progress bar."""
    model = f"{spec.model} {spec.size}" if spec.model else spec.size  # the sizes of yours too
    opt = optimizer_word(spec.mode, getattr(spec, "optimizer", None))
    return f"{model} T={spec.seq} {spec.mode} {spec.precision}" + (f" {opt}" if opt else "")


# What the course's model calls for attention, a function of the module its class is in
# (profile splits it into QKᵀ, softmax and PV).
ATTENTION_FUNCTION = "scaled_dot_product_attention"


def optimizer_word(mode: str | None, optimizer: str | None) -> str | None:
    """A training step's optimizer where it is not ours (nsys_profile (d)'s, the user's)."""
    ours = optimizer in (None, "adamw")
    return f"optimizer={optimizer}" if mode == "train" and not ours else None


COMMAND = Command(
    options=options,
    help=(
        "Every list option takes comma lists or repetition, and the sweep is their cartesian "
        "product. Weights and data are random. Out-of-memory points are stored with status `oom` "
        "and the sweep goes on; other failures are stored as `error` (exit code 1 at the end)."
    ),
    examples=(
        "cs336sys model --size small,medium --precision fp32,bf16 --seq 256",
        "cs336sys model --size small --warmup 0,1,2,5",
        "cs336sys model --model cs336_basics --size tiny,small",
        "cs336sys model --attention flash-torch,yours-torch",
    ),
    groups=("model", "estimate", "nsys"),
    describe=point_name,
)
