"""Option types shared by the commands: one declaration, one name and one help text for a
concept everywhere (cli/vocabulary.py lists the names), declared with sweep/options.py's
`list_option` and `option`.

Each is an `Annotated` type; a command gives the default, e.g. `size: Size = None`. Defaults
that depend on the device are resolved by the experiment's `specs` (None here) and written
into the help by hand. No torch here (imported by `cs336sys.cli`).
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Any

import typer

from cs336sys.cli.common import DEFAULT_DB, DbOption
from cs336sys.sweep.options import list_option, option

Size = list_option("Size preset(s) of the handout's table: small, medium, large, xl (2560 wide, 32 "
                   "layers; 1600 x 48 with --handout 2025), 10B, also 2.7B (2025's 2560-wide), "
                   "tiny (assignment 1's) and 8b (the 2026 leaderboard's). [default: small on "
                   "CUDA, tiny on CPU]")
Handout = option("The handout release whose size table --size names: 2026 or 2025 (only xl "
                 "differs).", str | None, "--handout", envvar="CS336SYS_HANDOUT",
                 show_default="2026")
Seq = list_option("Sequence length(s). [default: 512 on CUDA, 128 on CPU]")
Batch = list_option("Batch size(s). [default: 4]")
Precision = list_option("fp32, bf16 and/or fp16 (autocast; fp16 with a gradient scaler). [default: "
                        "fp32]")
Warmup = option("Untimed warm-up steps. [default: 5 on CUDA, 2 on CPU]", int | None)
Iters = option("Timed steps. [default: 10 on CUDA, 5 on CPU]", int | None)
Label = option("Free text stored on this invocation, e.g. 'baseline' or 'after fusing'; filter "
               "with report --where label=TEXT.", str | None)
Attention = list_option("Attention implementation(s) from the registry: naive, sdpa, compiled, "
                        "flash-torch, triton. [default: naive]")
Optimizer = list_option("adamw (our own), adamw-foreach, adamw-triton (fused kernel), torch-adamw, "
                        "torch-adamw-fused, or your own: yours-adamw (your adapters' "
                        "get_adamw_cls) or yours=package.module:Class (your AdamW, checked "
                        "against torch's first); train mode only. [default: adamw]")
Compile = option("Wrap the model in torch.compile.", bool, "--compile/--no-compile")
Checkpoint = list_option("Activation checkpointing: none, every:K (groups of K blocks), sqrt, or "
                         "groups:A,B,... (uneven groups summing to the layers). [default: none]")
Device = option("auto, cpu, cuda or cuda:N.", str)
Seed = option("Seed for weights and data.", int)
DModel = option("Override the preset's d_model.", int | None)
DFF = option("Override the preset's d_ff.", int | None)
NumLayers = option("Override the preset's num_layers.", int | None)
NumHeads = option("Override the preset's num_heads.", int | None)
VocabSize = option("Override the vocabulary size (10000; 151936 for 8b).", int | None)
Resume = option("Skip points stored ok by this commit on this machine, with your code as it is "
                "now, committed or not (with --label, those stored under that label).", bool,
                "--resume")
Adapters = option("Your course-layout tests/adapters.py, whose functions become the yours-... "
                  "implementations (or set CS336SYS_ADAPTERS). [default: tests/adapters.py at the "
                  "top of this git checkout, when there is one]",
                  Path | None, "--adapters", envvar="CS336SYS_ADAPTERS")
UserModel = option("Your Transformer LM instead of cs336sys's: cs336_basics (the course's "
                   "BasicsTransformerLM, from cs336-basics/ in a course-layout checkout) or "
                   "package.module:Class taking the course's constructor (vocab_size, "
                   "context_length, d_model, num_layers, num_heads, d_ff, rope_theta), filled from "
                   "--size.", str | None, "--model")
Blocks = option("Where your model (--model) keeps its blocks, as a dotted attribute path "
                "(layers, transformer.h): the nn.ModuleList that --checkpoint wraps. [default: "
                "its `layers`, else its only ModuleList of --num-layers modules]", str | None,
                "--blocks")

TIMES = ("today, yesterday, 13:30 (today), 7d / 12h / 2w ago, 2026-01-05 or 2026-01-05T13:00; in "
         "this machine's time zone unless it carries an offset (Z, +02:00)")
Since = option(f"Runs created since: {TIMES}; or a git ref of this folder's repository (HEAD~3, a "
               "branch, a tag): the runs of that commit and the later ones up to HEAD, "
               "cs336sys's or your code's.", str | None)
Until = option(f"Runs created before this: {TIMES} (a day means its end); a time only, not a "
               "git ref.", str | None)
Gpu = option("Only runs on this GPU (its name, as `cs336sys env` prints it).", str | None)
Commit = option("Only runs at this git commit, cs336sys's or your code's: a prefix, or a git ref "
                "of this folder's repository (HEAD, a branch).", str | None)
Where = list_option("KEY=VALUE on the run's settings (size=small) or its label, host or "
                    "command (repeatable).")


# -- groups: a function whose parameters are options that several commands take ------------------
def model_options(
    size: Size = None,
    seq: Seq = None,
    batch: Batch = None,
    precision: Precision = None,
    attention: Attention = None,
    optimizer: Optimizer = None,
    checkpoint: Checkpoint = None,
    warmup: Warmup = None,
    iters: Iters = None,
    device: Device = "auto",
    seed: Seed = 0,
    model: UserModel = None,
    blocks: Blocks = None,
    handout: Handout = None,
) -> None:
    """What a point of the Transformer LM is: model, memory, step, ddp, profile model (with
    shape_options)."""


def shape_options(
    d_model: DModel = None,
    d_ff: DFF = None,
    num_layers: NumLayers = None,
    num_heads: NumHeads = None,
    vocab_size: VocabSize = None,
) -> None:
    """The size preset's shape, overridden: every command that builds the model."""


Wide = option("Print every column of the tables in one piece, settings shared by every row "
              "included (by default those are one line above a table, and a table wider than "
              "the terminal is cut between columns).", bool, "--wide")


Force = option("Run the points estimated not to fit in the device's free memory too (without it "
               "they are stored as skipped, with the estimate, and not started).", bool,
               "--force")


Replace = option("Write over an existing output file that cs336sys did not write (someone's file, "
                 "a SQLite database, a store's -wal); without it the command refuses.", bool,
                 "--force")


def estimate_options(force: Force = False) -> None:
    """Points estimated not to fit: the commands whose experiment estimates its points
    (experiments/preflight.py)."""


DryRun = option("Print how many points the command would run, their estimated time and how "
                "many its memory estimate would skip, and stop: nothing is measured or written.",
                bool, "--dry-run")


Nsys = option("Record each point with Nsight Systems instead of measuring it here: the same "
              "command again under `nsys profile` (the handout's flags), one report per point "
              "named after it, in nsys/<command>-<time>/, capturing only the timed steps (NVTX "
              "range measured_steps); each command is printed first. Each run stores its point's "
              "row. Needs nsys on PATH and CUDA; with --dry-run the commands are printed only.",
              bool, "--nsys")


def nsys_options(ctx: typer.Context, nsys: Nsys = False) -> None:
    """Nsight Systems: the commands whose points run on a GPU (the context: what --nsys runs
    again is the command as it was given)."""


def store_options(
    wide: Wide = False,
    dry_run: DryRun = False,
    resume: Resume = False,
    label: Label = None,
    adapters: Adapters = None,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Where and how the points are stored, and the user's code: every measuring command."""


# The options every measuring command ends with, in this order: the store's and the user code's.
LAST = ("resume", "label", "adapters", "db")


def options_of(*groups: Any, drop: tuple[str, ...] = ()) -> Any:
    """Declare options once and reuse them: the decorated command takes the parameters of
    each of `groups` (option groups above, or other commands) in order, less `drop`, then
    its own; where two declare an option of the same name, the later one replaces the earlier
    in its place (a command's own help for --seq, say). The store's options (LAST) come last.
    The command's body receives the options in `**options`; Typer reads the merged
    `__signature__`."""

    def wrap(command: Any) -> Any:
        merged: dict[str, inspect.Parameter] = {}
        for group in (*groups, command):
            for p in inspect.signature(group, eval_str=True).parameters.values():
                if p.kind is not p.VAR_KEYWORD and p.name not in drop:
                    merged[p.name] = p
        params = [p for name, p in merged.items() if name not in LAST]
        params += [merged[name] for name in LAST if name in merged]
        command.__signature__ = inspect.Signature(
            [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in params])
        return command

    return wrap


def model_command(*own: Any, drop: tuple[str, ...] = ()) -> Any:
    """`options_of` for a command that measures the Transformer LM: the model's options and
    its shape's, the command's `own` groups, then the store's."""
    return options_of(model_options, shape_options, *own, store_options, drop=drop)
