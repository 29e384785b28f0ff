"""Speed target: `cs336sys --help` answers in under 0.25 s, median of 5 runs,
without importing torch, numpy or sqlite-utils.

    python benchmarks/cli_startup.py [--runs 5] [--target 0.25]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HEAVY = ("torch", "numpy", "sqlite_utils")  # what --help must not import


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--target", type=float, default=0.25, help="seconds")
    args = parser.parse_args()

    exe = shutil.which("cs336sys", path=str(Path(sys.executable).parent)) or shutil.which(
        "cs336sys"
    )
    cmd = [exe, "--help"] if exe else [sys.executable, "-m", "cs336sys", "--help"]
    subprocess.run(cmd, capture_output=True, check=True)  # warm the page cache once, untimed
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, check=True)
        times.append(time.perf_counter() - t0)

    probe = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; from cs336sys.cli import app\nHEAVY = {HEAVY!r}\n"
            "try: app(['--help'])\n"
            "except SystemExit: pass\n"
            "print(*sorted(m for m in HEAVY if m in sys.modules), file=sys.stderr)",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    heavy = probe.stderr.split()
    median = statistics.median(times)
    print(f"command: {' '.join(cmd)}")
    print(f"runs: {', '.join(f'{t:.3f}' for t in times)} s")
    print(f"median: {median:.3f} s (target < {args.target} s)")
    print(f"imported by --help: {', '.join(heavy) or 'none'} of {', '.join(HEAVY)}")
    ok = median < args.target and not heavy
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
