"""`make gpu-owed`: the GPU figures issues 15-17, 38 and 41 still owe, in one command, for a
session that is lent a GPU for minutes (after `make gpu-check`, or instead of it when time is
short).

Each step is a command; its output goes to owed.log and its figures into the store
(cs336sys commands) or the log (benchmarks/ scripts), under reports/<gpu>/owed/:

- issue 15: the host cost per call (40 us target), the leaderboard shape with the pointer
  kernels, the opt-in TMA kernels, the opt-in atomic-dQ backward (atomics, TMA reductions)
  and cuDNN side by side, and the GPU tests of the opt-ins;
- issue 41: the same backwards at d 128 beside cuDNN in one invocation;
- issue 17: the AdamW step over xl's parameters (ours against torch fused), the fused LM head
  + cross-entropy at the leaderboard's size, the xl step with each switch (45 % MFU target),
  the 8B at 8 layers, and the largest 8B that fits at context 8192 with checkpointing;
- issue 38: the leaderboard's own timing (do_bench) of the 8B step beside ours;

then the report of the stored rows, and one .tar.gz of the folder. Steps run in this order,
cheapest first, so that a session cut short still has the first figures; `--only` picks some
by number. With `--budget S` it ends within about S seconds (as gpu_check.py: a step still
running when the time is up is stopped, keeping what it stored, and later steps are not
started); the last line then names the `--only` that runs the rest.

    python benchmarks/gpu_owed.py [--out DIR] [--archive FILE] [--only 1,2,5] [--budget S] [--list]

Exits 2 without CUDA or on a bad option (one line), 1 when a step could not run or was
stopped, or the budget left steps out, 0 otherwise.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from gpu_check import (
    ROOT,
    STOPPED,
    Budget,
    archive_for,
    arg_parser,
    out_folder,
    positive_seconds,
    preflight,
    run,
    slug,
    step_failed,
    stop_on_sigterm,
    write_archive,
)

PY = sys.executable
CLI = [PY, "-m", "cs336sys"]
STEPS: list[tuple[str, list[str], dict[str, str]]] = [  # (what, argv, extra environment)
    ("issue 15: host cost per triton call at seq 1024 (target 40 us)",
     [PY, "benchmarks/attention_host_overhead.py"], {}),
    ("issue 15: TMA kernels, atomic dQ and the forward opt-ins against float64 on this GPU",
     [PY, "-m", "pytest", "-q", "-m", "gpu", "-p", "no:cacheprovider",
      "tests/test_gpu_attention.py", "-k", "tma or plans or atomic or opt_ins"], {}),
    ("issue 15: leaderboard shape, pointer vs TMA vs atomic dQ (atomics, TMA reductions) vs "
     "longest tiles first vs lazy rescaling vs warp groups vs cuDNN (target "
     "< 4.4 ms, below cuDNN)",
     [PY, "benchmarks/attention_leaderboard.py", "--atomic-dq", "--heavy-first", "--db", "{db}"],
     {}),
    ("issue 41: d 128, seq 16384, causal bf16: the backward in 7 products (default) and in 5, "
     "dQ by atomics and by TMA reductions, the longest tiles first, lazy rescaling, the "
     "warp groups, beside cuDNN in the same invocation",
     [*CLI, "attention", "--preset", "leaderboard", "--d-head", "128", "--impl", "triton,sdpa",
      "--sdpa-backend", "cudnn", "--triton-opt-in",
      "default,heavy-first,lazy-rescale,warp-specialize,atomic-dq,reduce-dq,"
      "heavy-first+lazy-rescale+reduce-dq,heavy-first+warp-specialize+reduce-dq",
      "--db", "{db}"], {}),
    ("issue 17: AdamW over xl's parameters, fp32 (target: adamw-triton <= torch fused)",
     [PY, "benchmarks/adamw.py", "--size", "xl"], {}),
    ("issue 17: AdamW over xl's parameters, bf16 weights with fp32 moments",
     [PY, "benchmarks/adamw.py", "--size", "xl", "--param-dtype", "bf16"], {}),
    ("issue 41: fused LM head + CE at rows 65,536, vocab 151,936, d 4096: chunk rows and how "
     "grad_W is summed, beside the materialised baseline (target: faster than it)",
     [PY, "benchmarks/fused_ce.py", "--impls", "baseline,torch,triton", "--chunk-rows",
      "1024,4096,8192", "--grad-w-sum", "add,addmm"], {}),
    ("issue 17: xl step at context 512, batch 4, bf16 weights, each switch (target 45 % MFU "
     "with all)",
     [*CLI, "step", "--size", "xl", "--seq", "512", "--batch", "4", "--switches", "ablation",
      "--param-dtype", "bf16", "--db", "{db}"], {}),
    ("issue 17: the 8B at 8 layers, context 8192, batch 2, each switch",
     [*CLI, "step", "--db", "{db}"], {}),
    ("issue 17: the largest 8B that fits at context 8192, batch 2, all switches",
     [*CLI, "step", "--size", "8b", "--seq", "8192", "--batch", "2", "--param-dtype", "bf16",
      "--num-layers", "8,12,16,20,24,28,34", "--checkpoint", "sqrt", "--switches", "all",
      "--iters", "3", "--db", "{db}"], {}),
    ("issue 38: the 8B at 8 layers, all switches, timed the leaderboard's way (do_bench, 30 s "
     "after 10 s of warm-up) beside ours",
     [*CLI, "step", "--switches", "all", "--course-timing", "--db", "{db}"], {}),
]


def main() -> int:
    parser = arg_parser(__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="folder [default: reports/<gpu>/owed]")
    parser.add_argument("--archive", type=Path,
                        help="the .tar.gz [default: $OUT/owed.tar.gz, else <out>.tar.gz]")
    parser.add_argument("--budget", type=positive_seconds, metavar="S",
                        help="end within about S seconds, report included")
    parser.add_argument("--only", help="comma list of step numbers (see --list)")
    parser.add_argument("--list", action="store_true", help="print the steps and exit")
    args = parser.parse_args()
    if args.list:
        for i, (what, argv, env) in enumerate(STEPS, 1):
            prefix = " ".join(f"{k}={v}" for k, v in env.items())
            print(f"{i}. {what}\n   {prefix + ' ' if prefix else ''}{shlex.join(argv[1:])}")
        return 0
    try:
        only = {int(x) for x in args.only.split(",")} if args.only else set(range(1, len(STEPS) + 1))
    except ValueError:
        print(f"Error: --only takes step numbers 1..{len(STEPS)}, got {args.only!r}", file=sys.stderr)
        return 2
    if not only <= set(range(1, len(STEPS) + 1)):
        print(f"Error: --only takes step numbers 1..{len(STEPS)}, got {args.only!r}", file=sys.stderr)
        return 2
    problem = preflight()
    if problem:
        print(f"Error: {problem.replace('make gpu-check', 'make gpu-owed')}", file=sys.stderr)
        return 2
    import torch

    gpu = torch.cuda.get_device_name(0)
    out = args.out or ROOT / "reports" / slug(gpu) / "owed"
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
    db = out / "results.db"
    since = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f")
    failed, not_run, t0, budget = [], [], time.monotonic(), Budget(args.budget)
    with open(out / "owed.log", "a") as log:
        todo = [i for i in range(1, len(STEPS) + 1) if i in only]
        ended: list[int] = []  # the steps that ran to an end, stopped ones included
        try:
            for i in todo:
                what, argv, env = STEPS[i - 1]
                if not budget.allows_a_step():
                    not_run.append(str(i))
                    ended.append(i)
                    continue
                print(f"\n## {i}. {what}", file=log, flush=True)
                os.environ.update(env)
                try:
                    rc, secs = run([a.replace("{db}", str(db)) for a in argv], log,
                                   budget.left())
                finally:
                    for k in env:
                        os.environ.pop(k, None)
                stopped = " (stopped: the budget was spent)" if rc == STOPPED else ""
                print(f"{i}. {what}: exit {rc}, {secs:.0f} s{stopped}", flush=True)
                if step_failed(argv, rc):
                    failed.append(str(i))
                if rc == STOPPED:  # cut short: run again with the steps not started
                    not_run.append(str(i))
                ended.append(i)
                write_archive(archive, out)
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM: what ran is reported and archived
            not_run += [str(i) for i in todo if i not in ended]
        if db.exists():
            rc, _ = run([*CLI, "report", "--db", str(db), "--since", f"{since}Z", "--out", str(out),
                         "--title", f"{gpu}: what issues 15-17 owed"], log)
            if rc != 0:
                failed.append("report")
    write_archive(archive, out)
    print(f"{time.monotonic() - t0:.0f} s; log: {out / 'owed.log'}; report: {out}/report.html; "
          f"archive: {archive}")
    if failed:
        print(f"failed: {', '.join(failed)} (see the log)", file=sys.stderr)
    if not_run:
        print(f"not run, or stopped, for the budget: steps {','.join(not_run)}; run them with "
              f"--only {','.join(not_run)}", file=sys.stderr)
    return 1 if failed or not_run else 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
