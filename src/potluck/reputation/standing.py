"""What the record says about a worker now (pure).

Runs in the last ``window_s`` (a week) count, the newest weighing most (a weight that
halves every ``half_life_s``, a day). A worker's availability is its time in the
cohort over its runs' time, and its losses (restarts included) are per hour in the
cohort; both start from a prior worth ``PRIOR_H`` hours of a steady machine, so one
short run says little and a long steady history ranks a machine above an unknown
one. Its speed is the median of its measured ones. A quarantine in the window, or
``strike_limit`` strikes, excludes it.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from potluck.reputation.record import RunRecord

WEEK_S = 7 * 24 * 3600.0
DAY_S = 24 * 3600.0
PRIOR_H = 2.0  # hours of the prior below
PRIOR_AVAILABILITY = 0.9  # an unknown machine's
PRIOR_LOSSES_PER_H = 0.25  # an unknown machine's
STRIKE_LIMIT = 3


@dataclass(frozen=True)
class Standing:
    worker: str
    runs: int
    hours: float  # in the cohort, within the window
    availability: float
    losses_per_h: float
    losses: int
    restarts: int
    strikes: int
    quarantined: bool
    samples_per_s: float | None

    @property
    def excluded(self) -> str | None:
        if self.quarantined:
            return "quarantined in a run of the last week"
        if self.strikes >= STRIKE_LIMIT:
            return f"{self.strikes} trust strikes in the last week"
        return None

    def note(self) -> str:
        """The record in a few words."""
        return (f"{self.runs} runs, {self.hours:.1f} h in a cohort, lost {self.losses} "
                f"times, restarted {self.restarts}, {self.availability:.0%} present")


def standing(records: Iterable[RunRecord], worker: str, now: float,
             window_s: float = WEEK_S, half_life_s: float = DAY_S) -> Standing:
    """``worker``'s standing at ``now`` from ``records`` (any workers')."""
    mine = [r for r in records if r.worker == worker and 0 <= now - r.time <= window_s]
    weights = [0.5 ** ((now - r.time) / half_life_s) for r in mine]
    inside = sum(w * r.in_cohort_s for w, r in zip(weights, mine, strict=True)) / 3600.0
    total = sum(w * r.run_s for w, r in zip(weights, mine, strict=True)) / 3600.0
    lost = sum(w * (r.losses + r.restarts) for w, r in zip(weights, mine, strict=True))
    speeds = [r.samples_per_s for r in mine if r.samples_per_s]
    return Standing(
        worker=worker, runs=len(mine), hours=sum(r.in_cohort_s for r in mine) / 3600.0,
        availability=(inside + PRIOR_H * PRIOR_AVAILABILITY) / (total + PRIOR_H),
        losses_per_h=(lost + PRIOR_H * PRIOR_LOSSES_PER_H) / (inside + PRIOR_H),
        losses=sum(r.losses for r in mine), restarts=sum(r.restarts for r in mine),
        strikes=sum(r.strikes for r in mine), quarantined=any(r.quarantined for r in mine),
        samples_per_s=statistics.median(speeds) if speeds else None)
