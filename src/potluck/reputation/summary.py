"""A run's record of one machine, from its workers' ``rank_step`` journals (pure).

- speed: at each committed step, the sum of this host's workers' own samples a second
  (their samples over their compute); the median over the steps;
- time in the cohort: the gaps between a worker's consecutive steps, each counted up
  to ``GAP_STEPS`` typical steps (a longer gap is time it was out), summed over its
  workers and divided by ``nproc``;
- restarts: worker processes beyond the ``nproc`` it runs at once (each restart is a
  new process, with a journal of its own); losses: processes whose steps ended while
  the run went on (more than ``GAP_STEPS`` typical steps before its last step), plus
  one if the run failed while this machine's workers still trained;
- strikes and quarantines: trust's notes about this host's workers.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from potluck.reputation.record import RunRecord

GAP_STEPS = 10.0  # a gap longer than this many typical steps is time out of the cohort


def summarize(records: Iterable[Mapping[str, Any]], *, host: str, nproc: int, run: str,
              worker: str, began: float, ended: float, failed: bool) -> RunRecord:
    """``worker``'s record of the run from the journal ``records`` (any hosts')."""
    steps = [r for r in records if r.get("kind") == "rank_step"]
    mine = sorted((r for r in steps if r.get("host") == host and r["time"] >= began),
                  key=lambda r: r["time"])
    names = {str(r.get("worker")) for r in mine}
    notes = [r for r in records if r.get("kind") == "event" and r.get("member") in names]
    times: dict[int, list[float]] = defaultdict(list)
    for r in mine:
        times[int(r["pid"])].append(float(r["time"]))
    gaps = [b - a for series in times.values() for a, b in itertools.pairwise(series)]
    cap = GAP_STEPS * statistics.median(gaps) if gaps else 0.0
    end = max((float(r["time"]) for r in steps), default=ended)
    lost = sum(1 for series in times.values() if end - series[-1] > cap)
    return RunRecord(
        time=ended, run=run, worker=worker, samples_per_s=_speed(mine),
        in_cohort_s=sum(min(g, cap) for g in gaps) / max(1, nproc),
        run_s=max(0.0, ended - began),
        losses=lost + (1 if failed and mine else 0),
        restarts=max(0, len(times) - nproc),
        strikes=sum(1 for r in notes if r.get("what") == "strike"),
        quarantined=any(r.get("what") == "quarantine" for r in notes))


def _speed(mine: list[Mapping[str, Any]]) -> float | None:
    per_step: dict[tuple[int, int], float] = defaultdict(float)
    for r in mine:
        speed = r.get("samples_per_s")
        if speed:
            per_step[(int(r.get("generation", 0)), int(r["step"]))] += float(speed)
    return statistics.median(per_step.values()) if per_step else None
