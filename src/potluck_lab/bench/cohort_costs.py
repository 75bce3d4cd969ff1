"""What each fault and each link cost a ``potluck bench cohort`` run, measured from its
workers' records (pure).

The cohort's commits, as any worker logged them first (``commit`` records: the step or
round count and the wall time), make a timeline. A fault that fell at time ``t``:

- ``stall_s``: from ``t`` to the next commit;
- ``cost_s``: how much longer the interval between the commits around ``t`` took than
  the run's median interval (0 when it took no longer);
- ``redone``: rounds or steps that failed after ``t`` and before that commit (every
  member redoes them; nothing is trained twice);
- a throttle's ``slower``: the median interval of the commits after it over the one
  before it;
- a machine that came back: ``joined_s``, from its start to its worker's first commit.

A link's ``busy_s`` is its bytes at its rate (the time it spent sending at the least;
the base rate, so a throttled link's is a lower bound), and its share of the run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise
from statistics import median
from typing import Any

from potluck_lab.bench.cohort_figures import Worker
from potluck_lab.bench.cohort_plan import Fault

AROUND = 5  # commits before and after a throttle that its slowdown is read over


@dataclass(frozen=True)
class Fired:
    """A fault, and when it fell (seconds into the run)."""

    fault: Fault
    at_s: float


def timeline(workers: Sequence[Worker], started: float) -> list[tuple[int, float]]:
    """``(count, seconds into the run)`` of each commit, the first worker's to log it."""
    first: dict[int, float] = {}
    for worker in workers:
        for record in worker.of("commit"):
            at = float(record["at"]) - started
            steps = int(record["steps"])
            first[steps] = min(at, first.get(steps, at))
    return sorted(first.items(), key=lambda item: item[1])


def fault_costs(workers: Sequence[Worker], fired: Sequence[Fired],
                started: float) -> list[dict[str, Any]]:
    """One row per fault that fell, with the figures above."""
    commits = timeline(workers, started)
    times = [at for _, at in commits]
    gaps = [b - a for a, b in pairwise(times)]
    typical = median(gaps) if gaps else 0.0
    failed = sorted(float(r["at"]) - started for w in workers for r in w.of("failed"))
    rows = []
    for item in fired:
        row: dict[str, Any] = {"kind": item.fault.kind, "node": item.fault.node,
                               "at_s": round(item.at_s, 2)}
        after = [at for at in times if at > item.at_s]
        before = [at for at in times if at <= item.at_s]
        if after:
            row["stall_s"] = round(after[0] - item.at_s, 2)
            if before:
                row["cost_s"] = round(max(0.0, after[0] - before[-1] - typical), 2)
            row["redone"] = sum(1 for at in failed if item.at_s < at <= after[0])
        if item.fault.kind == "throttle":
            row["slower"] = _slower(before, after)
        if item.fault.kind == "restart":
            row["joined_s"] = _joined(workers, item, started)
        rows.append(row)
    return rows


def _slower(before: list[float], after: list[float]) -> float | None:
    ahead = after[:AROUND + 1]
    behind = before[-(AROUND + 1):]
    if len(ahead) < 2 or len(behind) < 2:
        return None
    gap_after = median(b - a for a, b in pairwise(ahead))
    gap_before = median(b - a for a, b in pairwise(behind))
    return round(gap_after / gap_before, 2) if gap_before > 0 else None


def _joined(workers: Sequence[Worker], item: Fired, started: float) -> float | None:
    """From the machine's start to the first commit of a worker that joined since (it
    comes back as a new node: the only worker to join after it)."""
    firsts = [float(w.of("commit")[0]["at"]) - started for w in workers
              if w.of("commit") and w.of("member")
              and float(w.of("member")[0]["at"]) - started >= item.at_s]
    return round(min(firsts) - item.at_s, 2) if firsts else None


def link_costs(link_bytes: Sequence[tuple[int, int]], mbit: Sequence[float],
               run_s: float) -> list[dict[str, Any]]:
    """Per host: bytes each way, and the seconds its link spent sending the larger."""
    rows = []
    for host, ((sent, received), rate) in enumerate(zip(link_bytes, mbit, strict=True)):
        busy = max(sent, received) * 8 / (rate * 1e6)
        rows.append({"host": host, "mbit": rate, "sent": sent, "received": received,
                     "busy_s": round(busy, 1),
                     "busy_share": round(busy / run_s, 3) if run_s > 0 else None})
    return rows


def cost_lines(faults: Sequence[dict[str, Any]], links: Sequence[dict[str, Any]]) -> list[str]:
    """The report's lines: what each fault and link cost."""
    out = []
    for row in faults:
        parts = [f"{row['kind']} on node {row['node']} at {row['at_s']:.1f} s"]
        if "stall_s" in row:
            parts.append(f"next commit {row['stall_s']:.1f} s later")
        if row.get("cost_s") is not None:
            parts.append(f"{row['cost_s']:.1f} s over a median interval")
        if row.get("redone"):
            parts.append(f"{row['redone']} failed and redone")
        if row.get("slower") is not None:
            parts.append(f"commits {row['slower']:.2f}x apart after it")
        if row.get("joined_s") is not None:
            parts.append(f"its worker committed {row['joined_s']:.1f} s after it came back")
        out.append("  " + "; ".join(parts))
    for row in links:
        share = "" if row["busy_share"] is None else f" ({row['busy_share']:.0%} of the run)"
        out.append(f"  link of host {row['host']} ({row['mbit']:g} Mbit/s): "
                   f"{row['sent'] / 1e6:.1f} MB out, {row['received'] / 1e6:.1f} MB in, "
                   f"busy {row['busy_s']:.1f} s at least{share}")
    return out
