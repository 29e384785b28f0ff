"""How long a small command takes from start to exit: `model` in one process, `comm`, `ddp`
and `step` on two Gloo ranks, median of N runs, against another checkout of cs336sys run
side by side.

    python benchmarks/rank_start.py [--runs 5] [--against /path/to/an/older/checkout]

Each run is a fresh process (the command as a user types it, into a new store). With
--against, the two checkouts take turns, command by command, so that drift falls on both;
the other checkout runs with this interpreter and its packages (PYTHONPATH), so only
cs336sys's own code differs. The points are tiny: what is timed is the command's start (its
imports, the fork server's, the ranks') and its end (the interpreter's teardown of torch took
0.3 to 0.9 s of it before the command ended with os._exit: sweep/stopping.py `done`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "model": ["model", "--size", "tiny", "--seq", "16", "--mode", "forward", "--warmup", "0",
              "--iters", "1", "--device", "cpu"],
    "comm": ["comm", "--op", "all-reduce", "--bytes", "1KB", "--warmup", "0", "--iters", "2",
             "--world-size", "2", "--device", "cpu"],
    "ddp": ["ddp", "--size", "tiny", "--seq", "16", "--impl", "flat", "--warmup", "0",
            "--iters", "1", "--world-size", "2", "--device", "cpu"],
    "step": ["step", "--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers", "2",
             "--num-heads", "4", "--vocab-size", "256", "--seq", "16", "--batch", "2",
             "--switches", "none", "--warmup", "0", "--iters", "1", "--world-size", "2",
             "--device", "cpu"],
}


def timed(args: list[str], checkout: Path) -> float:
    """Seconds from the command's start to its exit, in a folder and store of its own."""
    with tempfile.TemporaryDirectory() as folder:
        env = {**os.environ, "PYTHONPATH": str(checkout)}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "cs336sys", *args, "--db",
                               f"{folder}/r.db"], env=env, cwd=folder, capture_output=True,
                              text=True)
        seconds = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(args)} ({checkout}) failed:\n{done.stderr[-2000:]}")
    return seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--against", type=Path, help="another checkout of cs336sys")
    args = parser.parse_args()
    checkouts = {"this": ROOT} | ({"against": args.against.resolve()} if args.against else {})
    for command in COMMANDS.values():  # warm the page cache once, untimed
        timed(command, ROOT)
    times: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.runs):
        for name, command in COMMANDS.items():
            for which, checkout in checkouts.items():
                times.setdefault((name, which), []).append(timed(command, checkout))
    for name in COMMANDS:
        line = []
        for which in checkouts:
            runs = times[name, which]
            line.append(f"{which} {statistics.median(runs):.2f} s "
                        f"({', '.join(f'{t:.2f}' for t in runs)})")
        if args.against:
            ratio = statistics.median(times[name, "against"]) / statistics.median(
                times[name, "this"])
            line.append(f"against/this {ratio:.2f}x")
        print(f"{name}: " + "; ".join(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
