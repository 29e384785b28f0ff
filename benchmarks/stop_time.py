"""How long a stopped command's ranks outlive it (docs/distributed.md):
`cs336sys comm` with two Gloo ranks in a long all-reduce gets SIGTERM, or SIGKILL; the time
from the signal until the last rank is gone, over --runs tries (Linux: reads /proc). And
Ctrl-C (SIGINT) to the command while its fork server still imports torch: the time until
the command's output is closed, which is what a pipe's reader (`| tee log`) waits for.

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
from tests.test_signals import LONG, alive, fork_server_below, ranks, start


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


def output_closed_after_ctrl_c_in_start_up() -> float:
    with tempfile.TemporaryDirectory() as tmp:
        proc = start(LONG, Path(tmp) / "r.db")
        fork_server_below(proc.pid)  # started, so still importing torch for seconds
        t0 = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=60)  # until stdout and stderr are closed
        return time.perf_counter() - t0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    for name, sig in (("SIGTERM", signal.SIGTERM), ("SIGKILL", signal.SIGKILL)):
        times = [once(sig) for _ in range(args.runs)]
        print(f"{name}: last rank gone after median {statistics.median(times) * 1e3:.0f} ms, "
              f"max {max(times) * 1e3:.0f} ms over {args.runs} runs (target: under 5 s)")
    times = [output_closed_after_ctrl_c_in_start_up() for _ in range(args.runs)]
    print(f"SIGINT while the fork server imports: output closed after median "
          f"{statistics.median(times) * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms over "
          f"{args.runs} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
