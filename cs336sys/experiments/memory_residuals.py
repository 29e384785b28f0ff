"""What one TransformerBlock keeps for backward, eager and compiled, and which ops keep it.

`cs336sys memory residuals` answers the CS336 question "how much activation memory does a
block need, in units of its residual-stream input?": one block of the chosen size is run
forward on a random (B, T, d) input that requires grad, and the bytes saved for backward are
counted with saved-tensor hooks (each storage once, parameters excluded), then attributed
to autograd node names by walking the graph (`saved_by_node`). Under torch.compile the
whole block becomes one `CompiledFunctionBackward` node, and what it saves is what
AOTAutograd's min-cut partitioner chose to keep rather than recompute (Ansel et al. 2024,
"PyTorch 2", §4.2); the comparison with eager shows what that choice is worth.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, replace
from typing import Any

from cs336sys.experiments import model as model_exp
from cs336sys.measure.compile_backend import compile_backend
from cs336sys.measure.device import synchronize
from cs336sys.measure.dtypes import autocast_dtype
from cs336sys.models.config import ModelConfig
from cs336sys.models.saved import block_saved_bytes
from cs336sys.sweep.declaration import (
    MODEL_COLUMN,
    Column,
    Experiment,
    Metric,
    Table,
    column_table,
    metric_table,
    setting_columns,
)
from cs336sys.sweep.points import SpecError, one_value_options
from cs336sys.sweep.result import Result
from cs336sys.yours.implementations import build_model

TOP = 5


@dataclass(frozen=True)
class ResidualsSpec:
    size: str
    d_model: int
    d_ff: int
    num_heads: int
    seq: int
    batch: int
    precision: str
    compile: bool  # the block under torch.compile, else eager
    attention: str | None  # None for the user's block: it brings its own
    device: str
    seed: int
    model: str | None = None  # the user's model (--model) whose block is measured
    blocks: str | None = None  # where that model keeps its blocks (--blocks)

    def settings(self) -> dict[str, Any]:
        return asdict(self)


@one_value_options
def specs(
    *,
    compile: bool | None = None,
    size: Iterable[str] | None = None,
    seq: Iterable[Any] | None = None,
    batch: Iterable[Any] | None = None,
    precision: Iterable[str] | None = None,
    attention: Iterable[str] | None = None,
    device: str = "auto",
    seed: int = 0,
    d_model: int | None = None,
    d_ff: int | None = None,
    num_heads: int | None = None,
    model: str | None = None,
    blocks: str | None = None,
) -> list[ResidualsSpec]:
    """The points of a `memory residuals` sweep, validated as `model.specs` validates the
    model options (layers play no part: one block; `model`: the user's model's block)."""
    compiles = [False, True] if compile is None else [bool(compile)]  # None: both
    points = model_exp.specs(
        size=["small"] if size is None else size, seq=seq, batch=["4"] if batch is None else batch,
        mode=["forward"], precision=precision, attention=attention, warmup=0, iters=1,
        device=device, seed=seed, d_model=d_model, d_ff=d_ff, num_heads=num_heads, model=model,
        blocks=blocks, rounds=1,
    )
    out = [
        ResidualsSpec(
            size=p.size, d_model=p.d_model, d_ff=p.d_ff, num_heads=p.num_heads,
            seq=p.seq, batch=p.batch, precision=p.precision,
            compile=c, attention=p.attention, device=p.device, seed=p.seed, model=p.model,
            blocks=p.blocks,
        )
        for p in points
        for c in compiles
    ]
    if model is not None and out:
        _check_users_block(out[0])  # the same model at every point's width
    return out


def run(spec: ResidualsSpec) -> Result:
    import torch

    from cs336sys.measure.saved_tensors import (
        saved_by_node,
        saved_bytes_excluding,
        saved_storages,
        saving_nodes,
    )
    from cs336sys.models.checkpointing import block_output
    from cs336sys.models.transformer import TransformerBlock

    torch.manual_seed(spec.seed)
    device = torch.device(spec.device)
    config = _config(spec)
    path = None if spec.model is None else _blocks_path(config, spec.model, spec.blocks)
    B, T, d = spec.batch, spec.seq, spec.d_model
    with device:
        users = None if spec.model is None else _users_model(config, spec.model)
        block = TransformerBlock(config) if users is None else _block_of(users, path)
    params = list(block.parameters())
    x = torch.randn(B, T, d, device=device, requires_grad=True)  # (B, T, d): the residual stream
    if users is None:  # ours: x and the token positions
        args, kwargs = (x, torch.arange(T, device=device)), {}  # positions: (T,)
    else:
        args, kwargs, x = _inputs_of(users, block, x, config.vocab_size)
    fn = torch.compile(block, backend=compile_backend()) if spec.compile else block
    amp_dtype = autocast_dtype(spec.precision)

    def forward() -> torch.Tensor:
        autocast = torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None)
        with autocast:
            return block_output(fn(*args, **kwargs))  # (B, T, d)

    compile_s = None
    if spec.compile:  # compile outside the measurement: it allocates for itself
        t0 = time.perf_counter()
        forward()
        synchronize(spec.device)
        compile_s = time.perf_counter() - t0

    t0 = time.perf_counter()
    out, saved = saved_bytes_excluding(forward, exclude=params)
    synchronize(spec.device)
    fwd_ms = (time.perf_counter() - t0) * 1e3
    walked = saved_storages(out, exclude=params)  # one walk of the graph for both
    per_node = saved_by_node(out, walked=walked)
    counts = saving_nodes(out, walked=walked)
    # memory_profiling (f): the gradient tensors the block's backward produces, its
    # parameters' (as many bytes as they, fp32 under autocast too) and its input's
    out.backward(torch.ones_like(out))
    del out
    grad_bytes = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)
    input_grad = x.grad.numel() * x.grad.element_size() if x.grad is not None else None

    walked = sum(per_node.values())
    residual = B * T * d * x.element_size()
    analytic = (
        block_saved_bytes(B, T, d, spec.d_ff, spec.num_heads)
        if spec.precision == "fp32" and spec.attention == "naive" and not spec.compile
        and spec.model is None
        else None  # counted for cs336sys's eager fp32 block with naive attention only
    )
    metrics: dict[str, Any] = {
        "saved_bytes": saved,
        "walked_bytes": round(walked),
        "analytic_bytes": analytic,
        "residual_bytes": residual,
        "saved_per_residual": saved / residual,
        "nodes_saving": len(per_node),
        "fwd_ms": fwd_ms,
        "compile_s": compile_s,
        "param_bytes": sum(p.numel() * p.element_size() for p in params),
        "grad_bytes": grad_bytes,
        "input_grad_bytes": input_grad,
    }
    top = list(per_node.items())[:TOP]
    for i in range(TOP):
        name, nbytes = top[i] if i < len(top) else (None, None)
        metrics[f"top{i + 1}_op"] = name
        metrics[f"top{i + 1}_nodes"] = counts.get(name) if name is not None else None
        metrics[f"top{i + 1}_bytes"] = round(nbytes) if nbytes is not None else None
        metrics[f"top{i + 1}_share"] = nbytes / walked if nbytes is not None and walked else None
    samples = {"saved_by_node": {k: round(v) for k, v in per_node.items()}}
    return Result("ok", metrics=metrics, samples=samples)


# The user's model is built with two layers, and its blocks are the one ModuleList whose
# length follows the layer count (two layers, then three, on the meta device): with one
# layer every one-module ModuleList (a head kept in one) looked like the blocks, with two
# every pair (a final norm and head).
USERS_LAYERS = 2


def _users_model(config: Any, model: str, layers: int = USERS_LAYERS) -> Any:
    """The user's model `model` built at `config`'s width with `layers` layers."""
    return build_model(replace(config, model=model, attention="naive", num_layers=layers))


def _blocks_path(config: Any, model: str, blocks: str | None, two: Any = None) -> str | None:
    """Where the user's model keeps its blocks: `blocks`, else the one ModuleList whose
    length follows the layer count (`two`: the model of USERS_LAYERS already built on the
    meta device); None where none or several do, or the model cannot be built on the meta
    device (blocks_of then decides, or says what is missing)."""
    if blocks is not None:
        return blocks
    import torch
    from torch import nn

    try:
        with torch.device("meta"):
            two = _users_model(config, model) if two is None else two
            three = _users_model(config, model, USERS_LAYERS + 1)
    except Exception:  # the user's code: the run builds it again and stores what fails
        return None

    def lists(users: Any, n: int) -> set[str]:
        return {path for path, m in users.named_modules()
                if isinstance(m, nn.ModuleList) and len(m) == n}

    follows = lists(two, USERS_LAYERS) & lists(three, USERS_LAYERS + 1)
    return follows.pop() if len(follows) == 1 else None


def _block_of(users: Any, path: str | None) -> Any:
    """The first of the user's blocks, at `path` or found as --checkpoint finds them
    (models/checkpointing.py); ValueError saying what is missing."""
    from cs336sys.models.checkpointing import blocks_of

    return blocks_of(users, USERS_LAYERS, path, needs="memory residuals --model: measuring "
                     f"one block of {{name}} (built with {USERS_LAYERS} layers)")[0]


def _check_users_block(spec: ResidualsSpec) -> None:
    """Refuse, before anything runs, a user's model whose block cannot be found (SpecError),
    built on the meta device; one that cannot be built there is left to its run, which
    stores what goes wrong."""
    import torch

    config = _config(spec)
    try:
        with torch.device("meta"):
            users = _users_model(config, spec.model)
    except Exception:  # the user's code
        return
    try:
        block = _block_of(users, _blocks_path(config, spec.model, spec.blocks, users))
    except ValueError as exc:
        raise SpecError(str(exc)) from None
    # the call the block is measured as, probed on the meta device too (a forward that calls
    # the block's parts itself stored an error, exit 1, at run time)
    try:
        _inputs_of(users, block, torch.empty(1, 2, config.d_model, device="meta"),
                   config.vocab_size)
    except NotHanded as exc:
        raise SpecError(str(exc)) from None
    except Exception:  # not runnable on the meta device: its run says what goes wrong
        return


def _config(spec: ResidualsSpec) -> ModelConfig:
    """One block's model config of the point."""
    return ModelConfig(d_model=spec.d_model, d_ff=spec.d_ff, num_layers=1,
                       num_heads=spec.num_heads, context_length=spec.seq,
                       attention=spec.attention)


class NotHanded(ValueError):
    """The user's model does not hand its first block the residual stream (_inputs_of)."""


class _Seen(Exception):
    """Raised by the hook that has recorded a block's inputs: the model's forward stops."""


def _inputs_of(users: Any, block: Any, x: Any, vocab_size: int) -> tuple[tuple, dict, Any]:
    """The arguments the user's model hands `block`, `x` in place of the residual stream:
    the others (token positions, a RoPE table's slice, a mask: whatever its forward passes,
    `block(x)`, `block(x, positions)`, `block(x, cos, sin)`) recorded as the model's own
    forward calls the block, on random tokens, without gradients; and `x` in the dtype of
    the stream it stands for (a model with bf16 parameters hands its blocks bf16)."""
    import torch

    seen: dict[str, Any] = {}

    def record(module: Any, args: tuple, kwargs: dict) -> None:
        seen.update(args=args, kwargs=kwargs)
        raise _Seen

    hook = block.register_forward_pre_hook(record, with_kwargs=True)
    tokens = torch.randint(vocab_size, tuple(x.shape[:2]), device=x.device)  # (B, T)
    try:
        with torch.no_grad():
            users(tokens)
    except _Seen:
        pass
    finally:
        hook.remove()
    if "args" not in seen:
        raise NotHanded(f"{type(users).__name__}'s forward did not call its first block's "
                        "forward (it calls the block's parts itself?): memory residuals "
                        "measures a block as the model calls it")
    args, kwargs = seen["args"], dict(seen["kwargs"])

    def like(stream: Any) -> Any:
        return x if stream.dtype == x.dtype else x.detach().to(stream.dtype).requires_grad_()

    if args:
        x = like(args[0])
        return (x, *args[1:]), kwargs, x
    # `block(x=h)`: the residual stream is the keyword whose tensor has its shape
    name = next((k for k, v in kwargs.items()
                 if isinstance(v, torch.Tensor) and tuple(v.shape) == tuple(x.shape)), None)
    if name is None:
        raise NotHanded(f"{type(users).__name__}'s forward called its first block with no "
                         f"tensor of the residual stream's shape {tuple(x.shape)}")
    x = like(kwargs[name])
    return (), {**kwargs, name: x}, x


# -- the declaration ------------------------------------------------------------------------


def _top(row: Mapping[str, Any]) -> str:
    """`MulBackward0 ×6 34%, BmmBackward0 ×2 16%, SoftmaxBackward0 12%, ...`: a name's share is
    every node of that name's (the block's six multiplications), their count said."""
    out = []
    for i in range(1, TOP + 1):
        op, share, nodes = (row.get(f"top{i}_{k}") for k in ("op", "share", "nodes"))
        if op is not None:
            op += f" ×{nodes}" if isinstance(nodes, int) and nodes > 1 else ""
            out.append(op if share is None else f"{op} {share:.0%}")
    return ", ".join(out)


TABLE = Table(
    "Bytes one block saves for backward, by operation",
    (
        *setting_columns("size seq batch precision"),
        Column("compiled", "compile", "yes_no", setting=True),
        MODEL_COLUMN,
        *column_table("""
            saved MiB         saved_bytes         mib
            analytic MiB      analytic_bytes      mib
            residual MiB      residual_bytes      mib
            saved / residual  saved_per_residual  num
            param grads MiB   grad_bytes          mib  optional
            params MiB        param_bytes         mib  optional
            input grad MiB    input_grad_bytes    mib  optional
        """),
        Column("top operations (share)", cell=_top),
    ),
)

EXPERIMENT = Experiment(
    kind="memory-residuals",
    title="Memory: saved residuals per block",
    spec=ResidualsSpec,
    run=run,
    metrics=(
        *metric_table("""
            saved_bytes         bytes  saved for backward (saved-tensor hooks)
            walked_bytes        bytes  the same, attributed by walking the autograd graph
            analytic_bytes      bytes  counted from the code (eager fp32 naive only)
            residual_bytes      bytes  the block's input, B·T·d
            saved_per_residual  -      saved bytes in units of the residual stream
            nodes_saving        -      autograd nodes that save something
            param_bytes         bytes  the block's parameters
            grad_bytes          bytes  the gradients of its parameters its backward produces (measured)
            input_grad_bytes    bytes  the gradient of its input its backward produces, B·T·d
        """),
        *(Metric(f"top{i}_{k}", u, f"the {i}. operation by saved bytes: {w}")
          for i in range(1, TOP + 1)
          for k, u, w in (("op", "", "its node name"), ("bytes", "bytes", "its bytes"),
                          ("share", "", "its share"),
                          ("nodes", "", "the nodes of that name whose bytes those are"))),
        Metric("fwd_ms", "ms", "the measured forward (one call)"),
        Metric("compile_s", "s", "torch.compile's first call"),
    ),
    tables=(TABLE,),
    compare="saved_bytes",
)
