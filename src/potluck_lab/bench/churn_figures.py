"""Pure parts of ``potluck bench chaos --churn``: the churn schedule and the figures.

``churn_schedule`` draws, from a seed, when a member is killed or a new one joins. A
pool of about ``fraction`` of the members churns: each kill takes a live pool slot
down, each join fills a slot that is down with a new member. The others stay for the
whole run. ``losses`` turns the workers' failed and committed steps into loss events
(first detection, next committed step); ``percentile`` is the nearest-rank one.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

KILL, JOIN = "kill", "join"


@dataclass(frozen=True)
class ChurnEvent:
    """At ``at`` seconds into the run, ``kind`` happens to pool slot ``slot``."""

    at: float
    kind: str  # KILL or JOIN
    slot: int


def pool_size(members: int, fraction: float) -> int:
    """How many members churn: ``fraction`` of them, rounded, at least one."""
    return max(1, round(members * fraction))


def churn_schedule(seed: int, members: int, seconds: float, *, fraction: float = 0.3,
                   gap: tuple[float, float] = (2.0, 6.0)) -> list[ChurnEvent]:
    """Events ``gap`` seconds apart (uniform) up to ``seconds``. A slot that is up may
    be killed, one that is down joins again; with both kinds possible, a coin picks."""
    rng = random.Random(seed)
    up = [True] * pool_size(members, fraction)
    events: list[ChurnEvent] = []
    at = rng.uniform(*gap)
    while at < seconds:
        live = [s for s, alive in enumerate(up) if alive]
        down = [s for s, alive in enumerate(up) if not alive]
        kind = KILL if not down or (live and rng.random() < 0.5) else JOIN
        slot = rng.choice(live if kind == KILL else down)
        up[slot] = kind == JOIN
        events.append(ChurnEvent(round(at, 3), kind, slot))
        at += rng.uniform(*gap)
    return events


def pool_nodes(seed: int, members: int, fraction: float = 0.3) -> list[int]:
    """Which of the founding nodes (0 .. members-1) make up the churning pool."""
    return sorted(random.Random(seed ^ 0x5EED).sample(range(members),
                                                      pool_size(members, fraction)))


@dataclass(frozen=True)
class Loss:
    """One loss as the cohort lived it: first seen (a failed step), then recovered."""

    detected: float  # the earliest failed step's time, over the workers
    recovered: float  # the first committed step after it (nan: none came)

    @property
    def seconds(self) -> float:
        return self.recovered - self.detected


def losses(failures: Sequence[float], commits: Sequence[float]) -> list[Loss]:
    """Group failed steps (their times, any worker) into losses: a failure before the
    open loss's recovery belongs to it. Each loss recovers at the first commit after
    its first failure."""
    ordered = sorted(commits)
    found: list[Loss] = []
    for failed in sorted(failures):
        if found and not failed > found[-1].recovered:
            continue  # (nan compares false: a loss never recovered takes the rest)
        after = next((c for c in ordered if c > failed), math.nan)
        found.append(Loss(failed, after))
    return found


def from_kills(kills: Sequence[float], found: Sequence[Loss]) -> list[float]:
    """For each kill, the seconds to the recovery of the first loss seen after it
    (skipped: a kill that no failed step followed before the next kill)."""
    out = []
    ordered = sorted(kills)
    for i, kill in enumerate(ordered):
        until = ordered[i + 1] if i + 1 < len(ordered) else math.inf
        loss = next((f for f in found if kill <= f.detected < until), None)
        if loss is not None and not math.isnan(loss.recovered):
            out.append(loss.recovered - kill)
    return out


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank ``q``-th percentile (nan for no values)."""
    seen = sorted(v for v in values if not math.isnan(v))
    if not seen:
        return math.nan
    return seen[max(0, math.ceil(q / 100 * len(seen)) - 1)]


def stop_epoch(last_step: int, steps_per_epoch: int, margin: int = 2) -> int:
    """The epochs to train, told to workers that have committed about ``last_step``
    steps: the end of an epoch at least ``margin`` epochs ahead, so every worker reads
    it before its last step whatever it lagged."""
    return last_step // steps_per_epoch + 1 + margin
