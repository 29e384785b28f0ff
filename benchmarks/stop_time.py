"""How long a stopped command's ranks outlive it (docs/distributed.md):
`cs336sys comm` with two Gloo ranks in a long all-reduce gets SIGTERM, or SIGKILL; the time
from the signal until the last rank is gone, over --runs tries (Linux: reads /proc).

    python benchmarks/stop_time.py [--runs 5]
"""

from __future__ import annotations

import argparse
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.test_signals import LONG, alive, ranks, start  # noqa: E402


def once(sig: int) -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(LONG, Path(tmp) / "r.db")
        pids, _ = ranks(proc.pid, 2)
        t0 = time.perf_counter()
        proc.send_signal(sig)
        while alive(pids):
            time.sleep(0.005)
        took = time.perf_counter() - t0
        proc.communicate(timeout=60)
        return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL)):
        times = [once(sig) for _ in range(args.runs)]
        print(f"{name}: last rank gone after median {statistics.median(times) * 1e3:.0f} ms, "
              f"max {max(times) * 1e3:.0f} ms over {args.runs} runs (target: under 5 s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
