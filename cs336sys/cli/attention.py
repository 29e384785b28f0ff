"""`cs336sys attention`: naive, compiled, SDPA and FlashAttention-2 side by side."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from cs336sys.cli.common import (
    DEFAULT_DB,
    DbOption,
    check_db,
    check_triton,
    choices,
    fail,
    positive_ints,
    progress,
    recording,
    table,
)

ListOpt = list[str] | None

# Presets fill in what the user did not give; an explicit option always wins.
PRESETS: dict[str, dict[str, Any]] = {
    # CS336 assignment 2, "pytorch_attention": where naive attention's memory goes.
    "pytorch-attention": dict(
        batch=[8], heads=None, d_head=[16, 32, 64, 128], seq=[256, 1024, 4096, 8192, 16384],
        iters=100, passes="both",
    ),
    # CS336 assignment 2, "flash_benchmarking": Triton FlashAttention-2 against naive.
    "flash-benchmarking": dict(
        batch=[1], heads=None, causal=True, seq=[2**i for i in range(7, 17)],
        d_head=[16, 32, 64, 128], dtype=["bf16", "fp32"], impl=["naive", "triton"],
        passes="both",
    ),
    # The CS336 leaderboard shape: causal, 16 heads of 64, 16k tokens, bf16, fwd+bwd.
    "leaderboard": dict(
        batch=[1], heads=16, d_head=[64], seq=[16384], dtype=["bf16"], causal=True,
        passes="both", impl=["triton", "sdpa", "naive"], timer_cuda="do-bench",
    ),
}  # fmt: skip

DEFAULTS: dict[str, Any] = dict(
    seq=[256, 1024, 4096, 8192, 16384], d_head=[16, 32, 64, 128], batch=[8], heads=None,
    dtype=["fp32"], causal=True, passes="both", warmup=10, iters=100, timer="loop",
)  # fmt: skip
DEFAULT_IMPLS = {"cuda": ["naive", "compiled", "sdpa", "flash-torch", "triton"],
                 "cpu": ["naive", "sdpa", "flash-torch"]}  # fmt: skip


def attention(
    impl: Annotated[
        ListOpt,
        typer.Option(
            help="naive, compiled, sdpa, flash-torch, triton. [default: all but triton/compiled on CPU]"
        ),
    ] = None,
    seq: Annotated[
        ListOpt, typer.Option(help="Sequence length(s). [default: 256,1024,4096,8192,16384]")
    ] = None,
    d_head: Annotated[
        ListOpt, typer.Option(help="Head dimension(s). [default: 16,32,64,128]")
    ] = None,
    batch: Annotated[ListOpt, typer.Option(help="Batch size(s). [default: 8]")] = None,
    heads: Annotated[
        int | None,
        typer.Option(help="Heads, for (batch, heads, seq, d) inputs; omit for (batch, seq, d)."),
    ] = None,
    dtype: Annotated[ListOpt, typer.Option(help="fp32, bf16 and/or fp16. [default: fp32]")] = None,
    causal: Annotated[
        bool | None, typer.Option("--causal/--no-causal", help="Causal mask. [default: causal]")
    ] = None,
    passes: Annotated[
        str | None,
        typer.Option("--pass", help="forward, backward or both (adds end-to-end). [default: both]"),
    ] = None,
    warmup: Annotated[
        int | None,
        typer.Option(help="Untimed calls before each timed pass (loop timer). [default: 10]"),
    ] = None,
    iters: Annotated[
        int | None, typer.Option(help="Timed calls per pass (loop timer). [default: 100]")
    ] = None,
    timer: Annotated[
        str | None,
        typer.Option(
            help="loop (sync around each call) or do-bench (triton.testing.do_bench, CUDA). [default: loop]"
        ),
    ] = None,
    sdpa_backend: Annotated[
        str, typer.Option(help="For --impl sdpa: auto, flash, efficient or math.")
    ] = "auto",
    preset: Annotated[
        str | None, typer.Option(help="pytorch-attention, flash-benchmarking or leaderboard.")
    ] = None,
    skip_after_oom: Annotated[
        bool,
        typer.Option(
            "--skip-after-oom/--no-skip-after-oom",
            help="After an OOM, store longer sequences of the same impl, d and dtype as skipped.",
        ),
    ] = True,
    device: Annotated[str, typer.Option(help="auto, cpu, cuda or cuda:N.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed for the random inputs.")] = 0,
    resume: Annotated[
        bool, typer.Option("--resume", help="Skip points stored ok for this commit.")
    ] = False,
    db: DbOption = DEFAULT_DB,
) -> None:
    """Time attention implementations forward, backward and end to end; one row per point.

    Each point is checked once against a float32 reference (max_err), and records the memory in use before backward (CUDA: allocated bytes; CPU: bytes saved for backward), peak memory, FLOPs and TFLOP/s. Without CUDA, --impl triton needs TRITON_INTERPRET=1 (rows are marked interpreted).

    Example:

        cs336sys attention --seq 16384 --impl triton,sdpa --dtype bf16
    """  # noqa: E501
    dev, specs = attention_specs(
        impl=impl, seq=seq, d_head=d_head, batch=batch, heads=heads, dtype=dtype, causal=causal,
        passes=passes, warmup=warmup, iters=iters, timer=timer, sdpa_backend=sdpa_backend,
        preset=preset, device=device, seed=seed,
    )  # fmt: skip
    check_db(db)

    # -- measure ----------------------------------------------------------------------------
    from cs336sys.bench.result import Result, guarded
    from cs336sys.experiments.attention import EXPERIMENT, run
    from cs336sys.store.db import now

    results = []
    oom_at: dict[tuple, int] = {}  # (impl, dtype, d_head, batch) -> shortest seq that OOM'd
    with recording(db, "attention", dev) as rec:
        specs = rec.pending(EXPERIMENT, specs, resume)
        for spec in progress(specs, "attention", show=_label):
            family = (spec.impl, spec.dtype, spec.d_head, spec.batch)
            started = now()
            if skip_after_oom and family in oom_at and spec.seq > oom_at[family]:
                result = Result("skipped", error=f"skipped: seq {oom_at[family]} ran out of memory "
                                f"for this impl, d_head, dtype and batch (--no-skip-after-oom runs it)")  # fmt: skip
            else:
                result = guarded(run, spec)
                if result.status == "oom":
                    oom_at[family] = min(spec.seq, oom_at.get(family, spec.seq))
            rec.add(EXPERIMENT, spec.settings(), result, started)
            results.append((spec, result))
        typer.echo(_summary(results))
        if rec.errors:
            raise typer.Exit(1)


def attention_specs(
    *,
    impl: ListOpt,
    seq: ListOpt,
    d_head: ListOpt,
    batch: ListOpt,
    heads: int | None,
    dtype: ListOpt,
    causal: bool | None,
    passes: str | None,
    warmup: int | None,
    iters: int | None,
    timer: str | None,
    sdpa_backend: str,
    preset: str | None,
    device: str,
    seed: int,
) -> tuple[str, list]:
    """Validate the attention options (exit 2 on bad input) and expand them into AttentionSpecs.

    Shared by the commands that run attention points (`attention`, `profile attention`).
    """
    from cs336sys.attention.registry import names as attention_names
    from cs336sys.bench.device import resolve_device
    from cs336sys.bench.sweep import split_list
    from cs336sys.experiments import attention as exp

    # -- resolve options: explicit > preset > default; validate before anything is written --
    if preset is not None and preset not in PRESETS:
        fail(f"--preset: unknown value {preset!r}; choose from {', '.join(PRESETS)}")
    chosen = PRESETS.get(preset, {})

    def pick(name: str, given: Any) -> Any:
        return given if given is not None else chosen.get(name, DEFAULTS.get(name))

    try:
        dev = resolve_device(device)
    except ValueError as exc:
        fail(exc)
    on_cuda = dev.startswith("cuda")
    impls = split_list(impl) or chosen.get("impl") or DEFAULT_IMPLS["cuda" if on_cuda else "cpu"]
    for name in impls:
        if name not in attention_names():
            fail(f"--impl: unknown value {name!r}; choose from {', '.join(attention_names())}")
    seqs = sorted(positive_ints(seq, "--seq") or pick("seq", None))
    d_heads = positive_ints(d_head, "--d-head") or pick("d_head", None)
    batches = positive_ints(batch, "--batch") or pick("batch", None)
    n_heads = pick("heads", heads)
    if n_heads is not None and n_heads <= 0:
        fail(f"--heads must be positive, got {n_heads}")
    dtypes = choices(dtype, exp.DTYPES, "--dtype") or pick("dtype", None)
    is_causal = pick("causal", causal)
    which = pick("passes", passes)
    if which not in exp.PASSES:
        fail(f"--pass: unknown value {which!r}; choose from {', '.join(exp.PASSES)}")
    n_warmup, n_iters = pick("warmup", warmup), pick("iters", iters)
    if n_iters <= 0:
        fail(f"--iters must be positive, got {n_iters}")
    if n_warmup < 0:
        fail(f"--warmup must be zero or more, got {n_warmup}")
    how = (
        timer
        if timer is not None
        else chosen.get("timer_cuda" if on_cuda else "timer", DEFAULTS["timer"])
    )
    if how not in exp.TIMERS:
        fail(f"--timer: unknown value {how!r}; choose from {', '.join(exp.TIMERS)}")
    if how == "do-bench" and not on_cuda:
        fail("--timer do-bench needs CUDA (triton.testing.do_bench times with CUDA events)")
    if sdpa_backend not in exp.SDPA_BACKENDS:
        fail(
            f"--sdpa-backend: unknown value {sdpa_backend!r}; choose from {', '.join(exp.SDPA_BACKENDS)}"
        )
    if any(i in exp.FLASH_IMPLS for i in impls):
        lo, hi = exp.FLASH_D_RANGE
        for d in d_heads:
            if not lo <= d <= hi:
                fail(f"--d-head {d}: flash-torch and triton support head dims {lo} to {hi}")
    if "triton" in impls:
        check_triton(on_cuda, "--impl triton")

    from cs336sys.bench.sweep import expand
    from cs336sys.experiments.attention import AttentionSpec

    specs = [
        AttentionSpec(
            impl=p["impl"], seq=p["seq"], d_head=p["d_head"], batch=p["batch"], heads=n_heads,
            dtype=p["dtype"], causal=is_causal, passes=which, warmup=n_warmup, iters=n_iters,
            timer=how, sdpa_backend=sdpa_backend if p["impl"] == "sdpa" else None, device=dev,
            seed=seed,
        )
        for p in expand({"impl": impls, "dtype": dtypes, "d_head": d_heads, "batch": batches,
                         "seq": seqs})
    ]  # fmt: skip
    return dev, specs


def _label(spec) -> str:
    return f"{spec.impl} seq={spec.seq} d={spec.d_head} {spec.dtype}"


def _ms(m: dict, phase: str) -> str:
    mean = m.get(phase)
    return "" if mean is None else f"{mean:.3f} ± {m.get(f'{phase}_std') or 0:.3f}"


def _summary(results) -> str:
    # Speed-up against naive at the same shape, where naive ran in the same sweep.
    def key(spec):
        return (spec.seq, spec.d_head, spec.batch, spec.dtype)

    def main_ms(m):
        return m.get("e2e_ms") or m.get("fwd_ms") or m.get("bwd_ms")

    naive = {
        key(s): main_ms(r.metrics) for s, r in results if s.impl == "naive" and r.status == "ok"
    }
    rows = []
    for spec, r in results:
        m = r.metrics
        base, mine = naive.get(key(spec)), main_ms(m)
        mem = m.get("mem_before_bwd_bytes")
        tflops = m.get("tflops_e2e") or m.get("tflops_fwd") or m.get("tflops_bwd")
        impl = spec.impl + (f"[{m['sdpa_backend_used']}]" if m.get("sdpa_backend_used") else "")
        rows.append([
            impl + (" (interp.)" if m.get("interpreted") else ""), spec.seq, spec.d_head,
            spec.dtype, r.status, _ms(m, "fwd_ms"), _ms(m, "bwd_ms"), _ms(m, "e2e_ms"),
            "" if mem is None else f"{mem / 2**20:.2f}",
            "" if tflops is None else f"{tflops:.3g}",
            "" if m.get("max_err") is None else f"{max(m['max_err'], m.get('max_err_grad') or 0):.1e}",
            f"{base / mine:.2f}x" if base and mine else "",
        ])  # fmt: skip
    headers = ["impl", "seq", "d", "dtype", "status", "fwd ms", "bwd ms", "e2e ms",
               "MiB before bwd", "TFLOP/s", "max err", "vs naive"]  # fmt: skip
    return table(rows, headers, numparse=False)
