"""CPU benchmark (docs/store.md): what checking a store before a write costs.

Every command that writes reads the store first (store/db.check_path(writing=True)): its
header, schema version, tables and columns, and SQLite's quick_check over every page. Builds
the 10,000-run store of report_speed.py and times the check with and without quick_check,
median of --repeat; the goal is that the check stays under 0.5 s at that size.

    python benchmarks/store_check.py [--runs 10000] [--repeat 7]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))  # report_speed, beside this file

from report_speed import build

from cs336sys.store.db import check_path

GOAL_S = 0.5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "bench.db"
        build(db, args.runs)
        size = db.stat().st_size / 2**20
        timings = {}
        for writing in (False, True):
            times = []
            for _ in range(args.repeat):
                t = time.perf_counter()
                check_path(db, writing=writing)
                times.append(time.perf_counter() - t)
            timings[writing] = statistics.median(times)
    read, write = timings[False], timings[True]
    verdict = "PASS" if write < GOAL_S else "FAIL"
    print(f"store of {args.runs} runs ({size:.1f} MiB): check for reading {read * 1e3:.1f} ms, "
          f"for writing (with quick_check) {write * 1e3:.1f} ms, median of {args.repeat} "
          f"(goal < {GOAL_S} s): {verdict}")
    return 0 if write < GOAL_S else 1


if __name__ == "__main__":
    sys.exit(main())
