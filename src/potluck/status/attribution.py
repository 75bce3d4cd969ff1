"""Which rank holds the cohort back, and why, in words (pure).

The all-reduce makes every rank's step time equal, so step times name nobody. What does
is each rank's *local compute* (forward and backward, until its last gradient is ready):
the rank whose compute is longest is the one the others wait for. A rank is named when
its compute (median of the last few steps) exceeds the median of the others' by
``ratio`` and by ``min_gap_s``; with balanced shares nobody stands out, as it should be.

A rank whose pulses stopped (``silent_s`` past ``silent_after_s``) is named first: it is
stopped, dead or cut off, and the others are blocked waiting for it. Its reason says
where it was last seen.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError


@dataclass(frozen=True)
class AttributionRule:
    ratio: float = 1.2
    """A rank stands out when its compute is this many times the others' median ..."""
    min_gap_s: float = 0.002
    """... and longer by at least this much (timer noise on tiny steps names nobody)."""
    silent_after_s: float = 3.0
    """No pulse for this long: the rank is stopped, dead or cut off."""
    window: int = 3
    """Steps whose median compute is compared (a switch is seen within about half)."""

    def __post_init__(self) -> None:
        if not self.ratio > 1 or not self.min_gap_s >= 0 or not self.silent_after_s > 0 \
                or self.window < 1:
            raise ConfigError(
                f"AttributionRule(ratio={self.ratio}, min_gap_s={self.min_gap_s}, "
                f"silent_after_s={self.silent_after_s}, window={self.window}): ratio must "
                "exceed 1, min_gap_s be >= 0, silent_after_s > 0 and window >= 1")


@dataclass(frozen=True)
class RankWindow:
    """What the board knows of one member."""

    rank: int
    compute_s: Sequence[float]  # its last steps' local compute, oldest first
    silent_s: float = 0.0  # seconds since its last pulse arrived
    last_seen: str = ""  # where that pulse said it was ("computing step 41")


@dataclass(frozen=True)
class Verdict:
    rank: int
    reason: str
    silent: bool = False


def slowest(ranks: Sequence[RankWindow], rule: AttributionRule | None = None
            ) -> Verdict | None:
    """The rank holding the cohort back, or None when nobody stands out."""
    rule = rule or AttributionRule()
    silent = [r for r in ranks if r.silent_s > rule.silent_after_s]
    if silent:
        worst = max(silent, key=lambda r: r.silent_s)
        return Verdict(worst.rank, f"rank {worst.rank}: no report for {worst.silent_s:.1f} s, "
                                   f"last seen {worst.last_seen or 'nowhere yet'}", silent=True)
    return slowest_compute(ranks, rule)


def slowest_compute(ranks: Sequence[RankWindow], rule: AttributionRule | None = None
                    ) -> Verdict | None:
    """The compute bottleneck among ranks with timings, if one stands out."""
    rule = rule or AttributionRule()
    medians = {r.rank: statistics.median(r.compute_s[-rule.window:])
               for r in ranks if r.compute_s}
    if len(medians) < 2:
        return None
    rank = max(medians, key=lambda k: medians[k])
    others = statistics.median(v for k, v in medians.items() if k != rank)
    mine = medians[rank]
    if mine < rule.ratio * others or mine - others < rule.min_gap_s:
        return None
    return Verdict(rank, f"rank {rank}: forward+backward {mine * 1e3:.0f} ms vs median "
                         f"{others * 1e3:.0f} ms of the others")
