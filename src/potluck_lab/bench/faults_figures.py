"""The figures of ``potluck bench faults``, computed from a run's logs alone (pure).

Input: the commit logs of every worker of one run, ``potluck.metrics.journal`` records
(a ``step`` record, with ``step``, ``generation``, ``workers`` and ``time``, per committed
global step; a ``redo`` per in-flight step abandoned and redone; a ``done`` at the end)
and the times the bench killed a worker. A *generation* is the job's membership epoch:
potluck's cohort generation, or torchrun's restart count. The same step (or redo) of the
same generation, logged by several workers, is one event at the earliest of their times.

- **steps lost**: commits of a step that was committed again later: work thrown away
  (torchrun: the steps since the last checkpoint, at each kill). Goal for potluck: 0.
- **redone**: in-flight steps abandoned and redone (no commit was thrown away).
- **recovery**: from a kill to the first commit of a later generation: the job trains
  again. **catch-up**: to the first commit of a step beyond every step committed before
  (differs from recovery only when steps were lost). **whole**: to the first commit
  with the full world size again (potluck: the restarted worker rejoined).
- **goodput**: the fault-free run's wall time over the faulty run's, for the same
  committed steps; wall time runs from the first commit to the first commit of the last
  step, so the start-up of the processes (the same for both) is left out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class KillFigures:
    """What one kill cost; times in seconds from the kill, NaN if never reached."""

    at: float
    recovery_s: float
    catch_up_s: float
    whole_s: float
    lost: int


@dataclass(frozen=True)
class RunFigures:
    """One run of one contender, from its logs."""

    steps: int  # distinct global steps committed
    commits: int  # commit records, counting a step committed again
    steps_lost: int
    redone: int
    wall_s: float
    done: bool
    kills: tuple[KillFigures, ...] = field(default=())

    @property
    def steps_per_s(self) -> float:
        return (self.steps - 1) / self.wall_s if self.wall_s > 0 else math.nan


def run_figures(records: Sequence[Mapping[str, Any]], kill_times: Sequence[float],
                *, world_size: int) -> RunFigures:
    """The figures of one run: ``records`` from its commit log, the kills' times."""
    commits = _events(records, "step")
    first_of: dict[int, float] = {}
    for record in commits:
        first_of.setdefault(int(record["step"]), float(record["time"]))
    wall = first_of[max(first_of)] - float(commits[0]["time"]) if commits else math.nan
    return RunFigures(
        steps=len(first_of),
        commits=len(commits),
        steps_lost=len(commits) - len(first_of),
        redone=len(_events(records, "redo")),
        wall_s=wall,
        done=any(r["kind"] == "done" for r in records),
        kills=tuple(_kill(commits, at, world_size) for at in sorted(kill_times)),
    )


def _events(records: Sequence[Mapping[str, Any]], kind: str) -> list[Mapping[str, Any]]:
    """One record of ``kind`` per (step, generation), the earliest; sorted by time."""
    earliest: dict[tuple[int, int], Mapping[str, Any]] = {}
    for record in records:
        if record["kind"] != kind:
            continue
        key = (int(record["step"]), int(record.get("generation", 0)))
        if key not in earliest or float(record["time"]) < float(earliest[key]["time"]):
            earliest[key] = record
    return sorted(earliest.values(), key=lambda r: float(r["time"]))


def _kill(commits: Sequence[Mapping[str, Any]], at: float, world_size: int) -> KillFigures:
    before = [r for r in commits if float(r["time"]) <= at]
    generation = int(before[-1]["generation"]) if before else -1
    recovered = next((r for r in commits
                      if float(r["time"]) > at and int(r["generation"]) > generation), None)
    if recovered is None:  # the job never trained again after this kill
        return KillFigures(at, math.nan, math.nan, math.nan, 0)
    # Commits of the old generation may land just after the kill (its collectives had
    # completed): they count as committed before it.
    t_recovered = float(recovered["time"])
    high = max((int(r["step"]) for r in commits if float(r["time"]) < t_recovered),
               default=-1)
    later = [r for r in commits if float(r["time"]) >= t_recovered]
    caught_up = next((float(r["time"]) for r in later if int(r["step"]) > high), math.nan)
    whole = next((float(r["time"]) for r in later if int(r["workers"]) >= world_size),
                 math.nan)
    return KillFigures(at=at, recovery_s=t_recovered - at, catch_up_s=caught_up - at,
                       whole_s=whole - at, lost=max(0, high - int(recovered["step"]) + 1))


def goodput(fault_free_wall_s: float, faulty_wall_s: float) -> float:
    """Fault-free wall time over faulty wall time for the same committed steps."""
    if not faulty_wall_s > 0 or math.isnan(fault_free_wall_s):
        return math.nan
    return fault_free_wall_s / faulty_wall_s


def summarize(runs: Sequence[RunFigures],
              fault_free: Sequence[RunFigures] = ()) -> dict[str, Any]:
    """One contender over its rounds: totals of counts, medians of times.

    ``fault_free``: the same system's runs without kills, round for round; goodput is
    the median of the per-round ratios (rounds are interleaved, so drift cancels).
    """
    kills = [k for run in runs for k in run.kills]
    recovery = [k.recovery_s for k in kills if not math.isnan(k.recovery_s)]
    ratios = [goodput(clean.wall_s, run.wall_s)
              for clean, run in zip(fault_free, runs, strict=False)]
    return {
        "rounds": len(runs),
        "steps": min((run.steps for run in runs), default=0),
        "kills": len(kills),
        "steps_lost": sum(run.steps_lost for run in runs),
        "redone": sum(run.redone for run in runs),
        "recovery_median_s": _median(recovery),
        "recovery_max_s": max(recovery, default=math.nan),
        "catch_up_median_s": _median([k.catch_up_s for k in kills]),
        "whole_median_s": _median([k.whole_s for k in kills]),
        "wall_s": _median([run.wall_s for run in runs]),
        "steps_per_s": _median([run.steps_per_s for run in runs]),
        "goodput": _median(ratios),
    }


def _median(values: Sequence[float]) -> float:
    finite = sorted(v for v in values if not math.isnan(v))
    if not finite:
        return math.nan
    middle = len(finite) // 2
    return finite[middle] if len(finite) % 2 else (finite[middle - 1] + finite[middle]) / 2
