"""Which candidates to take (pure): the cohort with the highest expected throughput, or
the cheapest that meets a target, in one sync mode.

The expected throughput is the predicted one, discounted by what the members' records
say (``Risk``): a member present a fraction ``a`` of its runs brings its speed that
fraction of the time, and each loss stalls the whole cohort for ``recovery_s``:

    expected = predicted * sum(s_i a_i) / sum(s_i) * max(0, 1 - sum(losses_i/s) * recovery_s)

A member whose record excludes it (quarantined) is never taken. Every subset of a
group of up to ``EXHAUSTIVE`` candidates is tried; a larger one is pruned one member
at a time, the member whose removal helps most, keeping the best cohort seen.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from potluck.plan.groups import CLOSE_S, latency_groups
from potluck.plan.machines import Machine, Workload
from potluck.plan.modes import SyncMode
from potluck.plan.predict import Prediction, predict
from potluck.plan.ring import Distances

EXHAUSTIVE = 12
RECOVERY_S = 60.0  # what one member's loss costs the cohort: detect, regroup, redo


@dataclass(frozen=True)
class Risk:
    """What a machine's record says: the share of its runs it was in the cohort, its
    losses (and restarts) per hour in a cohort, and why it must not be taken."""

    availability: float = 1.0
    losses_per_h: float = 0.0
    excluded: str | None = None
    note: str = ""  # the record in a few words, for the reasons


@dataclass(frozen=True)
class Choice:
    mode: SyncMode
    members: tuple[Machine, ...]
    prediction: Prediction
    expected: float  # samples a second, after the members' risks
    price_per_h: float | None  # None: a member's price is unknown


@dataclass(frozen=True)
class Search:
    """What ``choose`` is told: the job, the candidates' distances and records, and
    a target rate (samples a second; None: the highest expected throughput)."""

    workload: Workload
    distances: Distances = field(default_factory=Distances)
    risks: Mapping[str, Risk] = field(default_factory=dict)
    target: float | None = None
    close_s: float = CLOSE_S
    recovery_s: float = RECOVERY_S

    def risk(self, machine: Machine) -> Risk:
        return self.risks.get(machine.name, Risk())


def expected(members: Sequence[Machine], mode: SyncMode, search: Search) -> Choice:
    """The cohort ``members`` in ``mode``: its prediction and expected throughput."""
    prediction = predict(members, search.workload, mode, search.distances)
    risks = [search.risk(m) for m in members]
    speed = sum(m.speed for m in members)
    present = sum(m.speed * r.availability for m, r in zip(members, risks, strict=True))
    stalls = sum(r.losses_per_h for r in risks) / 3600.0 * search.recovery_s
    value = prediction.samples_per_s * present / speed * max(0.0, 1.0 - stalls)
    prices = [m.price_per_h for m in members]
    price = None if None in prices else sum(p for p in prices if p is not None)
    return Choice(mode, tuple(members), prediction, value, price)


def choose(candidates: Sequence[Machine], mode: SyncMode, search: Search) -> Choice | None:
    """The best cohort of ``candidates`` in ``mode``; None if none can be taken, or
    none meets the target."""
    allowed = [m for m in candidates if search.risk(m).excluded is None]
    pools = (latency_groups(allowed, search.distances, search.close_s)
             if not mode.rounds else [allowed])
    best: Choice | None = None
    for pool in pools:
        for choice in _cohorts(pool, mode, search):
            if _better(choice, best, search.target):
                best = choice
    if best is not None and search.target is not None and best.expected < search.target:
        return None
    return best


def _cohorts(pool: Sequence[Machine], mode: SyncMode, search: Search) -> list[Choice]:
    if len(pool) <= EXHAUSTIVE:
        return [expected(c, mode, search) for size in range(1, len(pool) + 1)
                for c in itertools.combinations(pool, size)]
    seen, cohort = [], list(pool)
    while cohort:
        seen.append(expected(cohort, mode, search))
        if len(cohort) == 1:
            break
        cohort = max((cohort[:i] + cohort[i + 1:] for i in range(len(cohort))),
                     key=lambda c: expected(c, mode, search).expected)
    return seen


def _better(a: Choice, b: Choice | None, target: float | None) -> bool:
    """Without a target: the higher expected throughput. With one: a cohort that meets
    it beats one that does not; among those that do, the cheaper (a known price
    beats an unknown one), then the fewer members, then the faster."""
    if b is None:
        return True
    if target is None:
        return a.expected > b.expected
    meets_a, meets_b = a.expected >= target, b.expected >= target
    if meets_a != meets_b:
        return meets_a
    if not meets_a:
        return a.expected > b.expected
    return _cost(a) < _cost(b)


def _cost(c: Choice) -> tuple[float, int, float]:
    price = float("inf") if c.price_per_h is None else c.price_per_h
    return (price, len(c.members), -c.expected)


def pick(choices: Sequence[Choice | None], target: float | None) -> Choice | None:
    """The best of the modes' choices, by the same rule as within a mode."""
    best: Choice | None = None
    for choice in choices:
        if choice is not None and _better(choice, best, target):
            best = choice
    return best
