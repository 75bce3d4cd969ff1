"""What a ring all-reduce costs on a cohort's links (pure).

Each of the N members sends and receives ``2 (N - 1) / N`` of the buffer, in
``2 (N - 1)`` steps that each wait for the ring's slowest hop. So

    seconds = 2 (N - 1) / N * S / B  +  2 (N - 1) * a

with ``B`` the slowest member's payload rate (its slower direction) and ``a`` the
longest hop's one-way latency. A hop's latency is the two members' own (each to its
region's exchange point), plus the regions' distance when they differ. The ring
visits the members region by region, so it crosses between regions as few times as
it can.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from potluck.errors import ConfigError
from potluck.plan.machines import Machine

# One-way latency between two regions nobody gave a figure for: about a continent apart.
DEFAULT_BETWEEN_REGIONS_S = 0.040


@dataclass(frozen=True)
class Distances:
    """One-way seconds between regions: ``between[("eu", "us")]`` (either order)."""

    between: Mapping[tuple[str, str], float] = field(default_factory=dict)
    default_s: float = DEFAULT_BETWEEN_REGIONS_S

    def __post_init__(self) -> None:
        for pair, seconds in self.between.items():
            if not (math.isfinite(seconds) and seconds >= 0):
                raise ConfigError(f"latency between regions {pair}: {seconds!r} s must be "
                                  "0 or more")

    def regions(self, a: str, b: str) -> float:
        if a == b:
            return 0.0
        found = self.between.get((a, b), self.between.get((b, a)))
        return self.default_s if found is None else found


NEAR = Distances()  # no figures between regions: each pair the default apart


def latency(a: Machine, b: Machine, distances: Distances = NEAR) -> float:
    """One-way seconds from ``a`` to ``b``."""
    return a.latency_s + b.latency_s + distances.regions(a.region, b.region)


def ring_order(members: Sequence[Machine]) -> list[Machine]:
    """The members in the ring's order: grouped by region, stable within one."""
    return sorted(members, key=lambda m: m.region)


def hop_latency(members: Sequence[Machine], distances: Distances = NEAR) -> float:
    """The longest one-way latency between neighbours of the ring."""
    ring = ring_order(members)
    if len(ring) < 2:
        return 0.0
    return max(latency(a, b, distances)
               for a, b in itertools.pairwise([*ring, ring[0]]))


def allreduce_s(nbytes: float, members: Sequence[Machine],
                distances: Distances = NEAR) -> float:
    """Seconds a ring all-reduce of ``nbytes`` takes among ``members`` (0 alone)."""
    n = len(members)
    if n < 2 or nbytes <= 0:
        return 0.0
    rate = min(m.goodput for m in members)
    return 2 * (n - 1) / n * nbytes / rate + 2 * (n - 1) * hop_latency(members, distances)


def ring_bytes(nbytes: float, world_size: int) -> float:
    """Payload bytes each member sends (and receives) in an all-reduce of ``nbytes``."""
    return 2.0 * (world_size - 1) / world_size * nbytes if world_size > 1 else 0.0


def bytes_sent(nbytes: float, world_size: int) -> float:
    """Payload bytes all members together send for one all-reduce of ``nbytes``."""
    return 2.0 * (world_size - 1) * nbytes if world_size > 1 else 0.0


def slowest_link(members: Sequence[Machine]) -> Machine:
    """The member whose link sets the ring's rate."""
    return min(members, key=lambda m: m.goodput)
