"""What ``potluck demo --uneven`` prints at the end, from rank 0's step records.

Pure: records in, numbers and text out. The split of the global batch at the first and
the last balanced step, how often it changed and where it settled; the per-worker
speeds the balancer measured last; the throughput (global batch / median step time,
warm-up left out); and the throughput of the steps trained after it on equal shares
(``phase`` ``equal``: the same workers and slowdown, balancing off), measured, not
estimated: a prediction from the speeds would be biased, as a worker's samples/s
depends on how many samples it gets (fixed costs per step weigh more on a small share).
The two are compared only when each phase timed ``MIN_TIMED_STEPS`` steps after its
warm-up, and when the balanced steps mostly ran on shares other than equal ones.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from potluck.data.split import equal_shares, split_counts
from potluck_lab.demo.progress import format_shares, format_speeds
from potluck_lab.demo.report import MIN_TIMED_STEPS

Record = Mapping[str, Any]


@dataclass(frozen=True)
class ShareChange:
    step: int  # the first step (from 0) trained on the new split
    before: tuple[int, ...]
    after: tuple[int, ...]


@dataclass(frozen=True)
class UnevenSummary:
    steps: int
    first: tuple[int, ...]  # the split of the first step
    last: tuple[int, ...]  # and of the last one
    changes: tuple[ShareChange, ...]
    usual: tuple[int, ...]  # the split most steps after warm-up trained on
    usual_steps: int  # how many
    ranges: tuple[tuple[int, int], ...]  # each worker's fewest and most after warm-up
    speeds: tuple[float | None, ...]  # samples/s per worker, the balancer's last measure
    step_s: float  # median over the steps after warm-up
    timed: int  # how many that median is over
    samples_per_s: float
    equal: tuple[int, ...]  # equal shares of the global batch
    equal_step_s: float | None  # median of the equal-share steps (None: none ran)
    equal_steps: int  # how many that median is over


def share_changes(records: Sequence[Record]) -> list[ShareChange]:
    """Every step whose split differs from the step before it."""
    changes, before = [], None
    for record in records:
        shares = tuple(int(count) for count in record.get("shares") or ())
        if before is not None and shares and shares != before:
            changes.append(ShareChange(int(record["step"]), before, shares))
        before = shares or before
    return changes


def summarize(records: Sequence[Record], global_batch: int, warmup: int,
              equal_warmup: int = 2) -> UnevenSummary:
    """The summary of a run's ``step`` records (in step order, one balanced at least);
    ``equal_warmup`` first equal-share steps are left out (a new model's first steps)."""
    steps = [r for r in records if r.get("kind", "step") == "step"
             and r.get("phase", "balanced") == "balanced"]
    if not steps:
        raise ValueError("no balanced step records: the run trained no step")
    split = [tuple(int(c) for c in r.get("shares") or ()) for r in steps]
    workers = len(split[-1]) or int(steps[-1]["workers"])
    tail = _steady(steps, warmup)
    step_s = statistics.median(float(r["step_s"]) for r in tail)
    equal_tail = _steady([r for r in records if r.get("phase") == "equal"], equal_warmup)
    settled = split[len(split) - len(tail):]
    (usual, usual_steps), = Counter(settled).most_common(1)
    ranges = tuple((min(column), max(column)) for column in zip(*settled, strict=True))
    return UnevenSummary(
        steps=len(steps), first=split[0], last=split[-1],
        changes=tuple(share_changes(steps)), usual=usual, usual_steps=usual_steps,
        ranges=ranges, speeds=tuple(steps[-1].get("speeds") or ()), step_s=step_s,
        timed=len(tail), samples_per_s=global_batch / step_s,
        equal=tuple(split_counts(global_batch, equal_shares(workers))),
        equal_step_s=(statistics.median(float(r["step_s"]) for r in equal_tail)
                      if equal_tail else None),
        equal_steps=len(equal_tail),
    )


def _steady(records: Sequence[Record], warmup: int) -> list[Record]:
    """The records after warm-up, or the last half of a short run (as metrics.figures)."""
    return list(records[warmup:] if len(records) > warmup else records[len(records) // 2:])


def summary_lines(summary: UnevenSummary, global_batch: int) -> list[str]:
    """The closing lines of the uneven demo."""
    s = summary
    lines = [f"shares of the global batch of {global_batch} (samples per step, worker "
             f"{'/'.join(str(r) for r in range(len(s.last)))}): {format_shares(s.first)} "
             f"at step 1 -> {format_shares(s.last)} at step {s.steps}; "
             f"{_changes(s.changes)}"]
    if s.changes:
        spread = ", ".join(f"worker {rank} {low}" if low == high else
                           f"worker {rank} {low} to {high}"
                           for rank, (low, high) in enumerate(s.ranges))
        lines.append(f"after the warm-up: most often {format_shares(s.usual)} "
                     f"({s.usual_steps} steps); {spread}")
    if s.speeds:
        lines.append(f"measured speeds at the end: {format_speeds(s.speeds)} samples/s "
                     "(each worker's forward-to-last-gradient time, as the balancer "
                     "measures it)")
    lines.append(f"throughput, balanced: {s.samples_per_s:,.1f} samples/s (global batch / "
                 f"median step {_ms(s.step_s)})")
    if s.equal_step_s is not None:
        rate = global_batch / s.equal_step_s
        lines.append(f"throughput, equal shares ({format_shares(s.equal)}): {rate:,.1f} "
                     f"samples/s (median step {_ms(s.equal_step_s)} over {s.equal_steps} "
                     "steps trained after the balanced ones, same workers, balancing off); "
                     + _gain(s, s.equal_step_s))
    return lines


def _gain(s: UnevenSummary, equal_step_s: float) -> str:
    """What balancing gained, or why the two throughputs do not tell."""
    timed = min(s.timed, s.equal_steps)
    if timed < MIN_TIMED_STEPS:
        return (f"too short to compare: {timed} timed step(s) in the shorter phase, "
                f"{MIN_TIMED_STEPS} needed; run potluck demo --uneven (about a minute) to "
                "see what balancing gains")
    if s.usual == s.equal:
        return ("nothing to compare: the balanced steps too ran mostly on equal shares, as "
                "the workers measured about as fast (other work on the machine may have "
                "slowed the fast one too); run it again on a quieter machine")
    return f"balancing made the step {equal_step_s / s.step_s:.2f}x as fast"


def _changes(changes: Sequence[ShareChange]) -> str:
    if not changes:
        return "the split never changed"
    first = f"first at step {changes[0].step + 1}"
    return (f"it changed once, at step {changes[0].step + 1}" if len(changes) == 1
            else f"it changed {len(changes)} times, {first}")


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"
