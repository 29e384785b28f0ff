"""One option name per concept, in every command, and the old spellings kept as
hidden aliases until 0.3.

    --seq        sequence length           (was --context-length in model, memory, ddp, profile)
    --batch      sequences per step        (was --batch-size; ddp's --global-batch)
    --precision  fp32, bf16, fp16          (was --dtype in attention, comm, precision autocast)
    --iters      timed iterations          (was --steps in model, memory, ddp, profile model)
    --warmup     untimed iterations before them
    --attention  the attention implementation (attention commands also take --impl)
    --impl       the implementation under test (attention, ddp, memory residuals)
    --size       a model size preset (plan's was --model); comm's buffer size is --bytes (was
                 --size)
    --label      free text stored on the invocation

An alias is not declared on the command, so --help shows only the shared name; the root
group rewrites an old spelling to the new one before the command parses its arguments and
says so once on stderr. No torch here.
"""

from __future__ import annotations

import sys
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

# Old spelling -> new, in every command (0.2 names; accepted until 0.3).
ALIASES = {
    "--context-length": "--seq",
    "--batch-size": "--batch",
    "--global-batch": "--batch",
    "--dtype": "--precision",
    "--steps": "--iters",
}
# Old spellings that meant something else elsewhere: per command path.
COMMAND_ALIASES = {"comm": {"--size": "--bytes"}, "plan": {"--model": "--size"}}
# Flags that became options with a value: given bare (followed by another option, or last),
# they mean this value, as they did (ddp's --shard-optimizer was a switch for ours).
BARE_VALUES = {"ddp": {"--shard-optimizer": "ours"}}


def aliases_for(path: Sequence[str]) -> dict[str, str]:
    """The old -> new spellings that apply in the command at `path` (e.g. ['memory'])."""
    return {**ALIASES, **COMMAND_ALIASES.get(" ".join(path), {})}


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


def bare_values_for(path: Sequence[str]) -> dict[str, str]:
    """The flags that take a value now, and what they mean bare, in the command at `path`."""
    return BARE_VALUES.get(" ".join(path), {})


def value_options(command: Any) -> dict[str, int]:
    """Every name of each option of `command` that takes values -> how many (its nargs):
    the token after such a name is a value, never an option to rewrite."""
    out: dict[str, int] = {}
    for param in getattr(command, "params", []):
        if getattr(param, "param_type_name", None) == "option" and not getattr(param, "is_flag", False):
            for name in (*param.opts, *getattr(param, "secondary_opts", ())):
                out[name] = max(1, param.nargs)
    return out


def rewrite(args: Sequence[str], aliases: dict[str, str], warn: bool = True,
            bare: dict[str, str] | None = None, values: dict[str, int] | None = None) -> list[str]:
    """`args` with old spellings (`--steps 5`, `--steps=5`) replaced by the new ones, and the
    `bare` flags given without a value followed by the value they mean; stops at `--`. Each
    old spelling used is named once on stderr. A token that is the value of an option
    (`values`: the names that take values, and how many) passes untouched, whatever it looks
    like: `--label --steps` stores the label `--steps`."""
    out, said = [], set()
    bare, values = bare or {}, values or {}
    pending = 0  # values still owed to the option before
    for i, token in enumerate(args):
        if pending:
            pending -= 1
            out.append(token)
            continue
        if token == "--":
            out.extend(args[i:])
            break
        if token in bare:
            following = args[i + 1] if i + 1 < len(args) else None
            out.append(token)
            if following is None or following.startswith("-"):
                out.append(bare[token])
            else:
                pending = 1
            continue
        name, eq, value = token.partition("=")
        new = aliases.get(name) if name.startswith("--") else None
        if not eq:
            pending = values.get(new or name, 0)
        if new is None:
            out.append(token)
            continue
        out.append(new + eq + value)
        if warn and name not in said:
            said.add(name)
            print(f"note: {name} is now {new} (the old name is accepted until 0.3)", file=sys.stderr)
    return out


def typed_spellings(command: Any, args: Sequence[str], aliases: dict[str, str]) -> dict[str, str]:
    """Each option of `command` given in `args` under another of its names (`--impl` for
    `--attention`, an old spelling): every name of it -> the one typed; stops at `--`."""
    out: dict[str, str] = {}
    for token in args:
        if token == "--":
            break
        name = token.partition("=")[0]
        if not name.startswith("--"):
            continue
        canonical = aliases.get(name, name)
        for param in getattr(command, "params", []):
            names = [*getattr(param, "opts", []), *getattr(param, "secondary_opts", [])]
            if canonical in names:
                out.update({n: name for n in names if n != name})
    return out
