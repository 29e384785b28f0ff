"""Option types shared by the commands: one declaration, one name and one help text for a
concept everywhere (cli/vocabulary.py lists the names).

Each is an `Annotated` type; a command gives the default, e.g. `size: Size = None`. Defaults
that depend on the device are resolved by the experiment's `specs` (None here) and written
into the help by hand. No torch here (imported by `cs336sys.cli`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

ListOpt = list[str] | None

Size = Annotated[
    ListOpt,
    typer.Option(
        help="Size preset(s): tiny, small, medium, large, xl, 2.7B, 10B, 8b (the 2026 leaderboard's). "
        "[default: small on CUDA, tiny on CPU]"
    ),
]
Seq = Annotated[
    ListOpt, typer.Option(help="Sequence length(s). [default: 512 on CUDA, 128 on CPU]")
]
Batch = Annotated[ListOpt, typer.Option(help="Batch size(s). [default: 4]")]
Precision = Annotated[
    ListOpt,
    typer.Option(
        help="fp32, bf16 and/or fp16 (autocast; fp16 with a gradient scaler). [default: fp32]"
    ),
]
Warmup = Annotated[
    int | None, typer.Option(help="Untimed warm-up steps. [default: 5 on CUDA, 2 on CPU]")
]
Iters = Annotated[
    int | None, typer.Option(help="Timed steps. [default: 10 on CUDA, 5 on CPU]")
]
Label = Annotated[
    str | None,
    typer.Option(
        help="Free text stored on this invocation, e.g. 'baseline' or 'after fusing'; "
        "filter with report --where label=TEXT."
    ),
]
Attention = Annotated[
    ListOpt,
    typer.Option(
        help="Attention implementation(s) from the registry: naive, sdpa, compiled, flash-torch, "
        "triton. [default: naive]"
    ),
]
Optimizer = Annotated[
    ListOpt,
    typer.Option(
        help="adamw (our own), adamw-foreach, adamw-triton (fused kernel), torch-adamw, "
        "torch-adamw-fused; train mode only. [default: adamw]"
    ),
]
Compile = Annotated[
    bool, typer.Option("--compile/--no-compile", help="Wrap the model in torch.compile.")
]
Checkpoint = Annotated[
    ListOpt,
    typer.Option(
        help="Activation checkpointing: none, every:K (groups of K blocks), sqrt, or "
        "groups:A,B,... (uneven groups summing to the layers). [default: none]"
    ),
]
Device = Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")]
Seed = Annotated[int, typer.Option(help="Seed for weights and data.")]
DModel = Annotated[int | None, typer.Option(help="Override the preset's d_model.")]
DFF = Annotated[int | None, typer.Option(help="Override the preset's d_ff.")]
NumLayers = Annotated[int | None, typer.Option(help="Override the preset's num_layers.")]
NumHeads = Annotated[int | None, typer.Option(help="Override the preset's num_heads.")]
VocabSize = Annotated[
    int | None, typer.Option(help="Override the vocabulary size (10000; 151936 for 8b).")
]
Resume = Annotated[
    bool,
    typer.Option("--resume", help="Skip points stored ok by this commit on this machine."),
]
Adapters = Annotated[
    Path | None,
    typer.Option(
        "--adapters",
        envvar="CS336SYS_ADAPTERS",
        dir_okay=False,
        help="Your course-layout tests/adapters.py, whose functions become the yours-... "
        "implementations (or set CS336SYS_ADAPTERS). [default: tests/adapters.py at the top "
        "of this git checkout, when there is one]",
    ),
]
UserModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        help="Your Transformer LM instead of cs336sys's: cs336_basics (the course's "
        "BasicsTransformerLM, from cs336-basics/ in a course-layout checkout) or "
        "package.module:Class taking the course's constructor (vocab_size, context_length, "
        "d_model, num_layers, num_heads, d_ff, rope_theta), filled from --size.",
    ),
]


# The options every measuring command ends with, in this order: the store's and the user code's.
LAST = ("resume", "label", "adapters", "db")


def options_of(*commands: Any, drop: tuple[str, ...] = ()) -> Any:
    """Reuse other commands' options, declared once there: the decorated command takes every
    option of `commands` (less `drop`), where it declares one of the same name its own
    in that place, and its other options before the store's (LAST). The body receives the
    borrowed options in `**options`. Typer reads the merged `__signature__`."""

    def wrap(command: Any) -> Any:
        own = {p.name: p for p in inspect.signature(command, eval_str=True).parameters.values()
               if p.kind is not p.VAR_KEYWORD}
        merged: dict[str, inspect.Parameter] = {}
        for source in commands:
            for p in inspect.signature(source, eval_str=True).parameters.values():
                if p.name not in drop and p.name not in merged:
                    merged[p.name] = own.get(p.name, p)
        extra = [p for name, p in own.items() if name not in merged]
        first_last = next((i for i, n in enumerate(merged) if n in LAST), len(merged))
        params = [*list(merged.values())[:first_last], *extra, *list(merged.values())[first_last:]]
        command.__signature__ = inspect.Signature(
            [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
        return command

    return wrap
