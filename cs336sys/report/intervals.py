"""A ratio of two points' medians with the bootstrap interval of their samples, and when
that interval may be called a change: the ratio cells of tables (report/tables.py) and the
model's speed-up tables. A verdict needs samples taken side by side: of one command, with
the points' timed steps interleaved, both native or both in Triton's interpreter."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from cs336sys.measure.sampling import (
    BOOTSTRAP_MIN,
    ratio_interval,
    rounds_interval,
    verdict,
    wider,
)
from cs336sys.report.sections import (
    Row,
    compared,
    median_or_mean,
    num,
    ratio_side,
    samples_of,
    skey,
    timed_samples,
)

# Ratio cells of two points stored by different commands: the interval, no verdict.
RUNS_APART = "runs apart"
RUNS_APART_NOTE = (
    "runs apart: the two points were stored by different commands; the interval sees the "
    "spread within each run, not the drift between runs (two runs of one model point "
    "differed by 23 % on an H100), so it gives no verdict: measure both in one command.")


# A ratio of a point whose Triton kernel ran in the CPU interpreter to a native one: the
# emulator against the machine, no verdict on the kernel (fused-ce read `0.10× slower`).
ONE_INTERPRETED = "one side interpreted"
ONE_INTERPRETED_NOTE = (
    "one side interpreted: a Triton kernel of one point ran in Triton's CPU interpreter "
    "(TRITON_INTERPRET=1), whose time is the emulator's, not the kernel's; no verdict.")



def interpreted(row: Mapping[str, Any]) -> bool:
    """A point timed under TRITON_INTERPRET=1 (the stored `interpreted` metric): the CPU
    emulating a Triton kernel, not comparable to native timings."""
    return bool(row.get("interpreted"))


# An experiment's `apart` for them: a table of their own, with this after its title.
INTERPRETED_APART = (interpreted, " — Triton interpreted (TRITON_INTERPRET=1): the CPU "
                     "emulates the kernels, so these times are not comparable to native ones")

TOO_FEW = "too few samples to tell"  # measure/significance.py's judge says the same

NOT_INTERLEAVED = "not interleaved"
NOT_INTERLEAVED_NOTE = (
    "not interleaved: the two points ran one after the other, so the interval sees the spread "
    "within each, not how the machine's load changed between them (on a loaded CPU two runs "
    "of one step read 6.22x and 1.29x faster, and torch's DDP against itself 0.64x and 1.34x); "
    "it gives no verdict: attention and step interleave the points' timed steps with --rounds "
    "2 or more (the default on CUDA), model with --rounds 2 or more; memory, ddp and comm run "
    "one point at a time, "
    "so repeat the command and compare the runs (report --compare).")


def _interleaved(row: Row) -> bool:
    """Whether the point's timed steps came in interleaved rounds with other points' (never,
    where its experiment has no rounds: memory, ddp, comm run points one by one)."""
    settings = row.get("_settings") or {}
    return "rounds" in settings and (row.get("rounds_done") or settings.get("rounds") or 1) >= 2


def sample_interval(name: str | None, base: Row, row: Row, speedup: bool) -> str:
    """` faster (1.65–2.58)`: the bootstrap interval of row's median of the samples `name`
    over base's (base's over row's when `speedup`) and its verdict; '' without samples, and
    TOO_FEW with too few a side to tell (under BOOTSTRAP_MIN: measure/sampling.py):
    a bootstrap of one sample a side has an interval of zero width, a certainty it lacks,
    and a bare ratio read as a change (0.74x of 2.5 ± 1.5 s against 2.7 ± 1.5).
    Two rows of different invocations get the interval and RUNS_APART instead of a verdict:
    resampling steps within each run cannot see how far runs drift apart; nor, in one run,
    between points that did not interleave their steps (NOT_INTERLEAVED: torch's DDP against
    itself, one point after the other, read 0.64x and 1.34x)."""
    if not name:
        return ""
    a = timed_samples(base.get("_samples"), name)
    b = timed_samples(row.get("_samples"), name)
    if not a or not b:
        return ""
    apart = ""
    if interpreted(base) != interpreted(row):  # the emulator's time
        apart = ONE_INTERPRETED
    elif base.get("invocation_id") != row.get("invocation_id"):
        apart = RUNS_APART
    if min(len(a), len(b)) < BOOTSTRAP_MIN:  # with why its sides are apart, where they are
        return f" ({TOO_FEW}; {apart})" if apart else f" ({TOO_FEW})"
    found = ratio_interval(a, b)  # row over base: a time ratio
    if found is None:
        return ""
    if not apart and not (_interleaved(base) and _interleaved(row)):
        apart = NOT_INTERLEAVED
    elif not apart:  # paired round by round: a round that load slowed widens it
        found = wider(found, rounds_interval(_round_medians(base, name),
                                             _round_medians(row, name)))
    low, high = (1 / found.high, 1 / found.low) if speedup else (found.low, found.high)
    if apart:
        return f" ({low:.2f}–{high:.2f}, {apart})"
    return f" {verdict(found)} ({low:.2f}–{high:.2f})"


def _round_medians(row: Row, name: str) -> list[float]:
    """Each round's median of the samples `name`, in the order the rounds ran: attention
    keeps them by name, a training step (model, step) those of `step_ms`; [] for rows
    stored without them."""
    kept = samples_of(row.get("_samples")).get("round_medians")
    if isinstance(kept, dict):
        kept = kept.get(name)
    elif name != "step_ms":
        kept = None
    if not isinstance(kept, list) or not all(isinstance(v, (int, float)) for v in kept):
        return []
    return [float(v) for v in kept]


def speedups(rows: list[Row], key: str, a: Any, b: Any, samples: str,
             label: Callable[[Row], str]) -> list[list[str]]:
    """Points differing only in `key` (a vs b): the median of `samples` (`step_ms`) at a,
    at b, and a/b (>1: b faster) with its interval and verdict from the raw samples where
    the runs stored them. Medians, not means: one slow step in six moves a mean by a fifth
    (63.9 ± 29 ms against a median of 58)."""
    groups: dict[tuple, dict[Any, Row]] = {}
    for r in rows:
        if not compared(r) or not ratio_side(median_or_mean(r, samples)):
            continue
        groups.setdefault((r.get("gpu"), skey(r, drop=(key,))), {})[r["_settings"].get(key)] = r
    out = []
    for pair in groups.values():
        if a in pair and b in pair:
            ra, rb = pair[a], pair[b]
            ta, tb = median_or_mean(ra, samples), median_or_mean(rb, samples)
            ratio = f"{ta / tb:.2f}×" + sample_interval(samples, ra, rb, True)
            out.append([label(ra), num(ta), num(tb), ratio])
    return out
