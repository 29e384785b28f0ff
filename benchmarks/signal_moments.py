"""Ctrl-C at random moments of every command that starts ranks (docs/bad-input.md): each run
starts the command, waits a random 0.1 to 4 s (start-up, torch's import, the fork server,
the ranks' start, the sweep), sends SIGINT, and checks what tests/test_signals.py checks:
exit 130, no traceback, a last line that says what was stored (and the store agreeing), no
process left. `make test-slow` (and CI) holds four random moments per command and signal (one in each of
four strata, new with each commit); this holds --runs per command, which take minutes.

With --merge N it also sends Ctrl-C or SIGTERM (drawn) at N random moments of `cs336sys db
merge` of a 40,000-run store (benchmarks/report_speed.py builds it) into a small one: the
merge is all or nothing, and the last line says which (`stored nothing`, or what it added).

    python benchmarks/signal_moments.py [--runs 20] [--seed 0] [--merge 16]
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from benchmarks.report_speed import build
from tests.test_signals import (
    DDP_SWEEP,
    LONG,
    STEP_RANKS,
    descendants,
    gone_within,
    start,
    stored_runs,
)

COMMANDS = {"comm": LONG, "ddp": DDP_SWEEP, "step --world-size 2": STEP_RANKS}


def once(args: list[str], after_s: float) -> str | None:
    """What broke the promise in one run, or None."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "r.db"
        proc = start(args, db)
        time.sleep(after_s)
        below = descendants(proc.pid)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        if proc.returncode != 130:
            return f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"
        if "Traceback" in err:
            return "a traceback"
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if last == "Interrupted: this command stored nothing":
            if stored_runs(db):
                return "rows stored, said nothing"
        elif "point(s) stored in" in last and "--resume" in last:
            stored = int(last.split(": ", 1)[1].split()[0])
            if len(stored_runs(db)) != stored:
                return f"said {stored} point(s), stored another count"
        else:
            return f"last line: {last!r}"
        try:
            gone_within(below | descendants(proc.pid), 10.0)
        except AssertionError:
            return "a process outlived the command"
    return None


def merge_once(big: Path, after_s: float, sig: int) -> str | None:
    """What broke the promise in one signalled `db merge`, or None."""
    with tempfile.TemporaryDirectory() as tmp:
        db = Path(tmp) / "r.db"
        proc = start(["precision", "accumulate"], db)  # a small store of 4 runs to merge into
        proc.communicate(timeout=120)
        before = len(stored_runs(db))
        proc = start(["db", "merge", str(big)], db)
        time.sleep(after_s)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=120)
        now = len(stored_runs(db))
        if proc.returncode in (0, -sig) and out.startswith("merged "):
            # done before the signal came, or it came in the interpreter's last moments, once
            # everything was stored and said: Python's own window (docs/bad-input.md)
            return None if now == before + 40_000 else f"finished with {now - before} added"
        if proc.returncode != 128 + sig or "Traceback" in err:
            return f"exit {proc.returncode}: {err.strip().splitlines()[-1:]}"
        last = err.strip().splitlines()[-1] if err.strip() else ""
        if last.endswith("this command stored nothing"):
            return None if now == before else f"said nothing stored, {now - before} added"
        if "run(s) added" in last:
            said = int(last.rsplit(" and ", 1)[1].split()[0])
            return None if now == before + said else f"said {said} added, {now - before} were"
        return f"last line: {last!r}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20, help="runs per command")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--merge", type=int, default=0, help="signalled db merge runs")
    opts = parser.parse_args()
    rng = random.Random(opts.seed)
    failed = 0
    for name, args in COMMANDS.items():
        broke = []
        for _ in range(opts.runs):
            after_s = rng.uniform(0.1, 4.0)
            why = once(args, after_s)
            if why is not None:
                broke.append(f"{after_s:.2f} s: {why}")
        failed += len(broke)
        print(f"{name}: {opts.runs - len(broke)} of {opts.runs} held"
              + "".join(f"\n  {b}" for b in broke))
    if opts.merge:
        with tempfile.TemporaryDirectory() as tmp:
            big = Path(tmp) / "big.db"
            build(big, 40_000)
            broke = []
            for _ in range(opts.merge):
                after_s, sig = rng.uniform(0.05, 1.2), rng.choice([signal.SIGINT, signal.SIGTERM])
                why = merge_once(big, after_s, sig)
                if why is not None:
                    broke.append(f"{signal.Signals(sig).name} at {after_s:.2f} s: {why}")
            failed += len(broke)
            print(f"db merge: {opts.merge - len(broke)} of {opts.merge} held"
                  + "".join(f"\n  {b}" for b in broke))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
