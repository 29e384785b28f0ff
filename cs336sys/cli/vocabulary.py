"""One option name per concept, in every command.

    --seq        sequence length
    --batch      sequences per step
    --precision  fp32, bf16, fp16
    --iters      timed iterations
    --warmup     untimed iterations before them
    --attention  the attention implementation (attention commands also take --impl)
    --impl       the implementation under test (attention, ddp)
    --size       a model size preset; comm's buffer size is --bytes
    --label      free text stored on the invocation

The 0.2 spellings (--context-length, --batch-size, --global-batch, --dtype, --steps, plan's
--model, comm's --size) are gone: click refuses them as any unknown option. The root group
notes which name of an option with several was typed, so that errors use it, and gives the
options whose value may be left out (BARE_VALUES) the value they mean. No torch here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# Python parameter name -> the option every command that has the concept spells it with.
SHARED = {
    "seq": "--seq",
    "batch": "--batch",
    "precision": "--precision",
    "iters": "--iters",
    "warmup": "--warmup",
    "attention": "--attention",
    "size": "--size",
    "label": "--label",
    "world_size": "--world-size",
    "device": "--device",
    "seed": "--seed",
    "resume": "--resume",
    "db": "--db",
}

# Options whose value may be left out: given bare (followed by another option, or last), they
# mean this value (ddp's `--shard-optimizer` alone shards with ours).
BARE_VALUES = {"ddp": {"--shard-optimizer": "ours"}}


def command_path(group: Any, args: Sequence[str]) -> list[str]:
    """The subcommand names at the front of `args`, walking down from the root `group`."""
    path: list[str] = []
    cmd = group
    for token in args:
        commands = getattr(cmd, "commands", None)
        if token.startswith("-") or not commands or token not in commands:
            break
        path.append(token)
        cmd = commands[token]
    return path


def command_at(group: Any, path: Sequence[str]) -> Any:
    """The command that the subcommand names `path` (command_path's) lead to from `group`."""
    command = group
    for name in path:
        command = command.commands[name]
    return command


def value_options(command: Any) -> dict[str, int]:
    """Every name of each option of `command` that takes values -> how many (its nargs):
    the token after such a name is a value, never an option's name."""
    out: dict[str, int] = {}
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", None) == "option" and not getattr(param, "is_flag", False):
            for name in (*param.opts, *getattr(param, "secondary_opts", ())):
                out[name] = max(1, param.nargs)
    return out


def _is_bare(args: Sequence[str], i: int, bare: Any) -> bool:
    """args[i] is an option of `bare` given without its value (last, or before an option)."""
    return args[i] in bare and (i + 1 == len(args) or args[i + 1].startswith("-"))


def option_names(args: Sequence[str], command: Any, bare: Any = ()) -> list[int]:
    """The indexes of the tokens of `args` that name an option of `command`, not a value: the
    token after a name that takes a value is that value, whatever it looks like (`--label
    --impl`), except after a `bare` option given without one; nothing after `--` is read."""
    values = value_options(command)
    out: list[int] = []
    pending = 0  # values still owed to the option before
    for i, token in enumerate(args):
        if pending:
            pending -= 1
            continue
        if token == "--":
            break
        name, eq, _ = token.partition("=")
        if not name.startswith("-"):
            continue
        out.append(i)
        if not eq and not _is_bare(args, i, bare):
            pending = values.get(name, 0)
    return out


def typed_spellings(command: Any, args: Sequence[str], bare: Any = ()) -> dict[str, str]:
    """Each option of `command` given in `args` under another of its names (`--impl` for
    `--attention`): every name of it -> the one typed (option_names says which tokens are
    names)."""
    out: dict[str, str] = {}
    for i in option_names(args, command, bare):
        name = args[i].partition("=")[0]
        if not name.startswith("--"):
            continue
        for param in getattr(command, "params", []):
            names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
            if name in names:
                out.update({n: name for n in names if n != name})
    return out


def with_bare_values(args: Sequence[str], path: Sequence[str], command: Any) -> list[str]:
    """`args` with the value each bare option of BARE_VALUES means put after it; values and
    what follows `--` pass untouched (option_names)."""
    bare = BARE_VALUES.get(" ".join(path), {})
    named = set(option_names(args, command, bare))
    out: list[str] = []
    for i, token in enumerate(args):
        out.append(token)
        if i in named and _is_bare(args, i, bare):
            out.append(bare[token])
    return out


def without_value(args: list[str], value: str) -> list[str]:
    """`args` with `value` taken out of each comma list (an option left empty goes too)."""
    out: list[str] = []
    for word in args:
        if "," in word or word == value:
            kept = ",".join(v for v in word.split(",") if v != value)
            if not kept:
                if out and out[-1].startswith("--"):
                    out.pop()
                continue
            word = kept
        out.append(word)
    return out
