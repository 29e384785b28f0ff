"""`make gpu-check`: everything cs336sys knows to check on a GPU, in one command.

For a machine where torch and Triton are installed already and nothing can be downloaded
(docs/gpu.md). In order:

1. every `gpu`-marked test (pytest -m gpu; target: under 120 s on an H100);
2. the reference set, each step a `cs336sys` command into one results store:
   - triton against SDPA (cuDNN where SDPA picks it) over head dims 16..128 and sequences
     1k..64k, bf16, causal, 16 heads, do_bench;
   - the leaderboard shape: triton and naive, then SDPA's cuDNN and flash backends by name;
   - the model sweep small..xl (the 2026 handout's sizes) x fp32/bf16 x forward/forward-backward/train at context 512;
   - memory for xl at context 128 and 2048;
   - profile model for small and xl in bf16;
   - the training step of xl (context 512, batch 4) with each optimisation alone and all;
   then benchmarks/attention_host_overhead.py: host us per triton forward call at seq 1024,
   into host-overhead.json beside the store;
3. the report of exactly that run, in HTML and markdown, into reports/<gpu>/ (the store is
   results.db beside it), and one .tar.gz of both to copy off the machine;
4. a verdict table: each target the docs set, the figure measured, met or not.

    python benchmarks/gpu_check.py [--out DIR] [--archive FILE] [--skip-tests] [--budget S]

With `--budget S` the whole check ends within about S seconds, for a GPU lent with a time
limit: a step still running when the time is up is stopped (SIGTERM: a cs336sys command
stores the point it was in as an error, and every point before it stays), later steps are
not started, and the report, verdict and archive of what ran are still written.

Exits 2 without CUDA or on a bad option (one line), 1 when a test failed, a step could not run
or was stopped, or the budget left steps out, 0 otherwise (a target not met is a finding,
shown in the verdict, not a failure of the check).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import tarfile
import time
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ATTENTION = ["--impl", "triton,sdpa", "--seq", "1024,4096,16384,65536", "--d-head", "16,32,64,128",
             "--precision", "bf16", "--batch", "1", "--heads", "16", "--causal", "--timer", "do-bench"]
LEADERBOARD = ["--preset", "leaderboard"]
STEPS = [  # (what, cs336sys arguments)
    ("attention: triton vs SDPA, d 16..128 x seq 1k..64k", ["attention", *ATTENTION]),
    ("leaderboard: triton and naive", ["attention", *LEADERBOARD, "--impl", "triton,naive"]),
    ("leaderboard: SDPA cuDNN", ["attention", *LEADERBOARD, "--impl", "sdpa", "--sdpa-backend", "cudnn"]),
    ("leaderboard: SDPA flash (FlashAttention-2)",
     ["attention", *LEADERBOARD, "--impl", "sdpa", "--sdpa-backend", "flash"]),
    ("model: small..xl x fp32/bf16 x 3 modes, context 512",
     ["model", "--size", "small,medium,large,xl", "--mode", "forward,forward-backward,train",
      "--precision", "fp32,bf16", "--seq", "512", "--warmup", "3", "--iters", "6"]),
    ("memory: xl at context 128 and 2048",
     ["memory", "--size", "xl", "--seq", "128,2048", "--mode", "forward,train",
      "--precision", "fp32,bf16"]),
    ("profile model: small and xl, bf16",
     ["profile", "model", "--size", "small,xl", "--precision", "bf16", "--seq", "512",
      "--warmup", "3", "--iters", "5"]),
    ("step: xl at context 512, batch 4, bf16 weights, each switch alone and all",
     ["step", "--size", "xl", "--seq", "512", "--batch", "4", "--switches", "ablation",
      "--param-dtype", "bf16"]),
]
# The host-overhead benchmark (not a cs336sys command, so not in STEPS), run with --json;
# the tests add options that shorten it.
HOST_OVERHEAD = ["benchmarks/attention_host_overhead.py"]
STEP_MFU = 0.45  # the xl bf16 train step with every switch on (docs/gpu.md)
TESTS_TARGET_S, CHECK_TARGET_S = 120.0, 480.0
LEADERBOARD_MS, VS_NAIVE = 5.4, 15.0  # docs/experiments/attention.md
SWEEP_VS_SDPA = 1.5  # no point of the attention sweep slower than this times SDPA's (docs/gpu.md)


def slug(name: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'nvidia-h100-80gb-hbm3' (the folder under reports/)."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


# A step over its time gets SIGTERM, then SIGKILL after this grace (a cs336sys command stores
# the point it was in and reaps its ranks within it); its exit status is then STOPPED.
TERM_GRACE_S, STOPPED = 30.0, 124
# Kept back from --budget for the report and the archive; a step gets at least MIN_STEP_S.
RESERVE_S, MIN_STEP_S = 45.0, 20.0


def archive_for(given: Path | None, out: Path) -> Path:
    """Where the call's .tar.gz goes: --archive, else $OUT/<out's name>.tar.gz where the
    device machine sets OUT (what it copies back), else beside `out`. Its folder is made,
    and checked writable, before any step runs: a missing one lost a whole call's figures
    at its end. OSError where it cannot be."""
    if given is None:
        given = (Path(os.environ["OUT"]) / f"{out.name}.tar.gz" if os.environ.get("OUT")
                 else out.with_suffix(".tar.gz"))
    archive = given.resolve()
    if archive.is_dir():  # `--archive $OUT`: it failed at the end, every figure lost
        raise IsADirectoryError(f"{archive} is a folder: give the file, "
                                f"{archive / (out.name + '.tar.gz')}")
    archive.parent.mkdir(parents=True, exist_ok=True)
    if not os.access(archive.parent, os.W_OK):
        raise PermissionError(f"{archive.parent} is not writable")
    return archive


def write_archive(archive: Path, out: Path) -> None:
    """`out` as a .tar.gz at `archive`, replacing the last one whole (written beside, then
    renamed): after every step, so that a call killed from outside (the device's limit, a
    SIGKILL) still returns what its finished steps measured."""
    partial = archive.with_name(archive.name + ".partial")
    with tarfile.open(partial, "w:gz") as tar:
        tar.add(out, arcname=out.name)
    partial.replace(archive)


def stop_on_sigterm() -> None:
    """SIGTERM (a limit reached outside) ends the call as Ctrl-C does: run() stops the step's
    process group, which has a session of its own and would run on, and the caller still
    writes its report and archive."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt("SIGTERM")

    signal.signal(signal.SIGTERM, handler)


def out_folder(out: Path) -> str | None:
    """Make --out; why it cannot be, in one line, else None."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        return f"--out {out}: " + ("a file, not a folder" if isinstance(exc, FileExistsError)
                                   else str(exc))
    return None


class Budget:
    """The seconds left for steps under --budget (None: no limit)."""

    def __init__(self, seconds: float | None) -> None:
        self.deadline = None if seconds is None else time.monotonic() + seconds - RESERVE_S

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def allows_a_step(self) -> bool:
        left = self.left()
        return left is None or left >= MIN_STEP_S


def run(cmd: list[str], log, timeout: float | None = None) -> tuple[int, float]:
    """Run cmd in its own process group, output to log; (exit status, seconds). Past
    `timeout` seconds the group is stopped and the status is STOPPED."""
    t0 = time.monotonic()
    print("$ " + " ".join(cmd), file=log, flush=True)
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _stop(proc)
        print(f"stopped after {timeout:.0f} s: the budget was spent", file=log, flush=True)
        rc = STOPPED
    except BaseException:  # Ctrl-C here: its own session would not see it
        _stop(proc)
        raise
    return rc, time.monotonic() - t0


def step_failed(argv: list[str], rc: int) -> bool:
    """Whether a step's exit status fails the check. A cs336sys command exits 1 when some
    point was stored as an error: a finding, shown in the report, not a failure."""
    return rc != 0 and not (rc == 1 and argv[1:3] == ["-m", "cs336sys"])


def _stop(proc: subprocess.Popen) -> None:
    for sig, wait in ((signal.SIGTERM, TERM_GRACE_S), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def arg_parser(description: str) -> argparse.ArgumentParser:
    """An ArgumentParser whose errors are one line on stderr and exit 2, as the CLI's."""
    p = argparse.ArgumentParser(description=description)

    def error(message: str):
        print(f"Error: {message}", file=sys.stderr)
        sys.exit(2)

    p.error = error
    return p


def positive_seconds(text: str) -> float:
    """argparse type of --budget."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > RESERVE_S + MIN_STEP_S or value == float("inf"):
        raise argparse.ArgumentTypeError(
            f"takes seconds above {RESERVE_S + MIN_STEP_S:g} (the report keeps {RESERVE_S:g}), "
            f"got {text!r}"
        )
    return value


def first_row(conn: sqlite3.Connection, sql: str, *params) -> tuple | None:
    try:
        return conn.execute(sql, params).fetchone()
    except sqlite3.OperationalError:  # no such view: nothing of that kind was stored
        return None


def one(conn: sqlite3.Connection, sql: str, *params):
    row = first_row(conn, sql, *params)
    return None if row is None else row[0]


def _step(prefix: str) -> str:
    """The name of the STEPS entry that starts with `prefix`: the step that measures a target
    (the prefix itself where a test has replaced STEPS)."""
    return next((what for what, _ in STEPS if what.startswith(prefix)), prefix)


def verdict(db: Path, tests_s: float | None, total_s: float, since: str,
            not_run: Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """(target, measured, met) rows from the store this check wrote. A target without an ok
    figure says why: the status of what its step stored instead ("error: ...", "oom"), "not
    run" when its step was left out (`not_run`, for the budget), else "not measured" (the
    store holds nothing, or does not exist)."""
    from cs336sys.store.db import open_untouched  # no -wal/-shm left in the archived folder

    conn = open_untouched(db) if db.exists() else sqlite3.connect(":memory:")
    recent = "created >= ?"
    shape = "seq = 16384 AND d_head = 64 AND heads = 16 AND precision = 'bf16' AND causal = 1"

    def e2e(where: str):
        return one(conn, f"SELECT min(e2e_ms_median) FROM attention_runs WHERE status = 'ok' AND "
                         f"{recent} AND {shape} AND {where}", since)

    def instead(view: str, where: str, params: tuple, step: str) -> tuple[str, str]:
        """(measured, met) of a target with no ok figure."""
        found = first_row(conn, f"SELECT status, error FROM {view} WHERE status != 'ok' AND "
                                f"{recent} AND {where} ORDER BY created DESC", since, *params)
        if found is not None:
            first = str(found[1] or "").strip().splitlines()[0:1]
            return (f"{found[0]}: {first[0][:80]}" if first else found[0]), found[0]
        if step in not_run:
            return "not run", "not run"
        return "not measured", "n/a"

    def figure(value, judge, view: str, where: str, params: tuple, step: str):
        """(measured, met) of a target: `judge(value)` -> (text, ok) where there is a figure,
        else what its step left instead."""
        if value is None:
            return instead(view, where, params, step)
        text, ok = judge(value)
        return text, met(ok)

    def model(size: str, precision: str, column: str):
        return one(conn, f"SELECT {column} FROM model_runs WHERE status = 'ok' AND {recent} AND "
                         "size = ? AND precision = ? AND mode = 'train' ORDER BY created DESC",
                   since, size, precision)

    def profiled(size: str, column: str):
        return one(conn, f"SELECT {column} FROM profile_runs WHERE status = 'ok' AND {recent} "
                         "AND size = ? ORDER BY created DESC", since, size)

    def met(ok):
        return "n/a" if ok is None else ("met" if ok else "NOT met")

    def both(a, b):
        return None if None in (a, b) else (a, b)

    board, tests_left = _step("leaderboard: triton"), "gpu tests" in not_run
    triton, naive = e2e("impl = 'triton'"), e2e("impl = 'naive'")
    cudnn = e2e("impl = 'sdpa' AND sdpa_backend_used = 'cudnn'")
    on_board = f"{shape} AND impl = 'triton'"  # the ratios have no figure without triton's
    rows = [
        ("gpu tests under 120 s",
         "not run" if tests_left else "skipped" if tests_s is None else f"{tests_s:.0f} s",
         "not run" if tests_left else met(None if tests_s is None else tests_s < TESTS_TARGET_S)),
        # met only when every step ran: a check cut short by its budget is no whole check
        ("gpu-check under 8 minutes",
         f"{total_s / 60:.1f} min" + (f", {len(not_run)} steps not run" if not_run else ""),
         "not run" if not_run else met(total_s < CHECK_TARGET_S)),
        (f"leaderboard: triton fwd+bwd under {LEADERBOARD_MS} ms",
         *figure(triton, lambda t: (f"{t:.3f} ms", t < LEADERBOARD_MS), "attention_runs",
                 on_board, (), board)),
        (f"leaderboard: triton at least {VS_NAIVE:g}x faster than naive",
         *figure(both(triton, naive), lambda tn: (f"{tn[1] / tn[0]:.1f}x", tn[1] / tn[0] >= VS_NAIVE),
                 "attention_runs", on_board if triton is None else f"{shape} AND impl = 'naive'",
                 (), board)),
        ("leaderboard: triton faster than SDPA cuDNN in the same run",
         *figure(both(triton, cudnn), lambda tc: (f"{tc[0]:.3f} vs {tc[1]:.3f} ms", tc[0] < tc[1]),
                 "attention_runs", on_board if triton is None else f"{shape} AND impl = 'sdpa'",
                 (), board if triton is None else _step("leaderboard: SDPA cuDNN"))),
    ]
    # The sweep's worst point: triton's time over SDPA's at the same d and seq (both ok).
    best = ("SELECT d_head, seq, min(e2e_ms_median) AS ms FROM attention_runs WHERE status = 'ok' "
            f"AND {recent} AND heads = 16 AND batch = 1 AND precision = 'bf16' AND causal = 1 AND "
            "impl = ? GROUP BY d_head, seq")
    worst = first_row(conn, f"SELECT t.d_head, t.seq, t.ms / s.ms FROM ({best}) t JOIN "
                            f"({best}) s USING (d_head, seq) ORDER BY 3 DESC LIMIT 1",
                      since, "triton", since, "sdpa")
    rows.append((f"attention sweep: no point of triton over {SWEEP_VS_SDPA:g}x SDPA's time",
                 *figure(worst, lambda w: (f"worst {w[2]:.2f}x at d {w[0]}, seq {w[1]}",
                                           w[2] <= SWEEP_VS_SDPA),
                         "attention_runs", "heads = 16 AND batch = 1 AND impl = 'triton'", (),
                         _step("attention: triton vs SDPA"))))
    train = "size = ? AND precision = ? AND mode = 'train'"
    for size, precision, bound, words in (("small", "bf16", 1, "is launch-bound"),
                                          ("xl", "fp32", 0, "is not launch-bound")):
        label = "small bf16 train (batch 4, context 512)" if size == "small" else "xl fp32 train"
        rows.append((f"{label} {words}",
                     *figure(model(size, precision, "launch_bound"),
                             lambda got, s=size, p=precision, want=bound: (
                                 str(model(s, p, "launch_bound_phases")), got == want),
                             "model_runs", train, (size, precision), _step("model: "))))
    every = "switches = 'fused-adamw+fused-ce+flash+compile'"
    mfu = one(conn, f"SELECT mfu FROM step_runs WHERE status = 'ok' AND {recent} AND size = 'xl' "
                    f"AND {every} ORDER BY created DESC", since)
    rows.append((f"step: xl bf16 with every switch at {STEP_MFU:.0%} MFU or more",
                 *figure(mfu, lambda m: (f"{m:.1%}", m >= STEP_MFU), "step_runs",
                         f"size = 'xl' AND {every}", (), _step("step: "))))
    for size in ("small", "xl"):
        fb = both(profiled(size, "fwd_profiled_ms_mean"), profiled(size, "bwd_profiled_ms_mean"))
        rows.append((f"profile {size}: backward kernel time above forward's",
                     *figure(fb, lambda fb: (f"{fb[1]:.1f} vs {fb[0]:.1f} ms", fb[1] > fb[0]),
                             "profile_runs", "size = ?", (size,), _step("profile model"))))
    conn.close()
    return rows


def host_overhead(path: Path, ran: bool = True) -> tuple[str, str, str]:
    """The verdict row of benchmarks/attention_host_overhead.py, from its JSON ("not run"
    when its step never ran)."""
    got = json.loads(path.read_text()) if path.exists() else {}
    us, target = got.get("ours_forward_us"), got.get("target_us", 40.0)
    absent = "not run" if not ran else "not measured"
    return (f"attention host cost: triton forward at seq 1024 at most {target:g} us per call",
            absent if us is None else f"{us:.1f} us",
            ("not run" if not ran else "n/a") if us is None else ("met" if us <= target else "NOT met"))


# What the checkout needs besides torch and Triton; the GPU hosts lack the first three, which
# `make wheels` fetches. (numpy comes with torch.)
NEEDED = ("sqlite_utils", "sqlite_fts4", "click_default_group", "typer", "jinja2", "matplotlib",
          "tabulate", "pytest")


def preflight() -> str | None:
    """Why this machine cannot run the check, in one line; None when it can."""
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return f"make gpu-check needs torch with CUDA; {sys.executable} has no torch"
    import torch

    if not torch.cuda.is_available():
        return "make gpu-check needs a CUDA GPU (torch.cuda.is_available() is False)"
    missing = [m for m in NEEDED if importlib.util.find_spec(m) is None]
    if missing:
        return (f"make gpu-check: {', '.join(missing)} missing; make wheels (where the "
                "registry is reachable) puts sqlite-utils and its needs in .whl/, which git "
                "ignores: carry it to the device (the device tool's carry: [\".whl\"])")
    return None


def main() -> int:
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="report folder [default: reports/<gpu>]")
    parser.add_argument("--archive", type=Path,
                        help="the .tar.gz [default: $OUT/<gpu>.tar.gz, else <out>.tar.gz]")
    parser.add_argument("--skip-tests", action="store_true", help="only the reference set")
    parser.add_argument("--budget", type=positive_seconds, metavar="S",
                        help="end within about S seconds, report included")
    args = parser.parse_args()
    problem = preflight()
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    import torch

    gpu = torch.cuda.get_device_name(0)
    out = args.out or ROOT / "reports" / slug(gpu)
    problem = out_folder(out)
    if problem:
        print(f"Error: {problem}", file=sys.stderr)
        return 2
    try:
        archive = archive_for(args.archive, out)
    except OSError as exc:
        print(f"Error: --archive: {exc}", file=sys.stderr)
        return 2
    stop_on_sigterm()
    db = out / "results.db"  # an earlier check's rows stay; the report covers this one only
    since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    py, t0, failed, not_run = sys.executable, time.monotonic(), [], []
    budget = Budget(args.budget)
    host = out / "host-overhead.json"  # not a cs336sys command, so not in STEPS
    host.unlink(missing_ok=True)
    steps = [] if args.skip_tests else [
        ("gpu tests", [py, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider"])]
    steps += [(what, [py, "-m", "cs336sys", *argv, "--db", str(db)]) for what, argv in STEPS]
    steps.append(("attention host overhead", [py, *HOST_OVERHEAD, "--json", str(host)]))
    with open(out / "gpu-check.log", "a") as log:
        tests_s = None
        try:
            for what, argv in steps:
                if not budget.allows_a_step():
                    not_run.append(what)
                    continue
                rc, secs = run(argv, log, budget.left())
                print(f"{what}: exit {rc}, {secs:.0f} s", flush=True)
                if what == "gpu tests" and rc != STOPPED:  # a stopped run meets no time target
                    tests_s = secs
                if what == "gpu tests" and rc == STOPPED:
                    not_run.append("gpu tests (stopped)")
                if step_failed(argv, rc):
                    failed.append(what)
                write_archive(archive, out)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what ran is reported and archived
            not_run.append("the rest (interrupted)")
        title = f"{gpu}: make gpu-check"
        if db.exists():  # no step stored a row: no report to write, and none failed
            rc, _ = run([py, "-m", "cs336sys", "report", "--db", str(db), "--since",
                         f"{since}Z", "--out", str(out), "--title", title], log)
            if rc != 0:
                failed.append("report")
    total = time.monotonic() - t0
    rows = verdict(db, tests_s, total, since, not_run)
    rows.append(host_overhead(out / "host-overhead.json", "attention host overhead" not in not_run))
    table = ["| target | measured | |", "| --- | --- | --- |", *(f"| {a} | {b} | {c} |" for a, b, c in rows)]
    text = "\n".join([f"# make gpu-check on {gpu}", "", *table, ""])
    (out / "verdict.md").write_text(text)
    write_archive(archive, out)
    print(text)
    print(f"report: {out}/report.html; store: {db}; archive: {archive}")
    if failed:
        print(f"failed: {', '.join(failed)} (see {out / 'gpu-check.log'})", file=sys.stderr)
    if not_run:
        print(f"not run, for the budget: {', '.join(not_run)}", file=sys.stderr)
    return 1 if failed or not_run else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
