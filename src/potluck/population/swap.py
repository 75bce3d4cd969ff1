"""Whether to swap a member that drags the cohort down for a waiting spare (pure).

The cohort checks itself every few steps. A check holds, per member, its compute per
sample and its link's cost (seconds per byte, from one probe); the cohort's measured
step time is the median over the window's steps. From the window's checks a check
predicts the cohort's step without each member, with the spare in its place:

    step' = compute' + wire * link' / link

``compute'`` is the new set's compute for the global batch (shares by speed, or equal).
``wire`` is what the measured step spends beyond the current set's compute: the
all-reduce and the step's overheads. It scales with the slowest link of the set, since
a ring goes as fast as its slowest member. A spare of unknown speed counts as the
median of the members it joins, on a link no better than their slowest.

Probes are noisy: on a loaded host a probe can take two or three times its link's
time. So a check weighs the window's checks (``rule.checks``, a window of steps)
together, and leans against a swap: the member it weighs at its best over them (its
fastest compute and probe), the others at their worst. That handles noise that comes
and goes. For errors that stay (a member on a busier host reads its link slower all
run; a shaper's burst allowance larger than the probe's blob), a link counts as slower
than another only by what its probes show beyond ``rule.spread`` (2): one that reads
10x slower counts as 5x. A member is blamed, and swapped, if the measured throughput
is still below ``(1 - drag)`` of that prediction.

Hysteresis: a generation's checks start afresh, a swap needs a full window of them
(so one swap at most per window), and a member that came in by a swap cannot be blamed
for two windows after.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass

from potluck.errors import ConfigError


@dataclass(frozen=True)
class SwapRule:
    """Swap a member when the cohort runs below ``1 - drag`` of its prediction without
    it, over ``window`` steps."""

    drag: float
    window: int = 20
    spread: float = 2.0
    """How far apart two equal links' probes may read for a while: a link counts as
    slower only by what its probes show beyond this factor (see the module doc)."""

    def __post_init__(self) -> None:
        if not 0 < self.drag < 1:
            raise ConfigError(
                f"swap drag {self.drag!r} must be a fraction between 0 and 1 (0.3: swap a "
                "member whose absence would make the cohort 30% faster or more)")
        if self.window < 4:
            raise ConfigError(
                f"swap window {self.window!r} must be at least 4 steps (checks come every "
                "quarter window, and a swap weighs several of them)")
        if not self.spread >= 1:
            raise ConfigError(f"swap spread {self.spread!r} must be 1 or more (a factor)")

    @property
    def every(self) -> int:
        """Steps between checks."""
        return max(1, self.window // 4)

    @property
    def checks(self) -> int:
        """Checks that a verdict weighs together: a window's, less one (so that a drag
        that starts between two checks is swapped within the window)."""
        return max(2, self.window // self.every - 1)

    @property
    def protect(self) -> int:
        """Steps a member that came in by a swap cannot be blamed."""
        return 2 * self.window


@dataclass(frozen=True)
class MemberCost:
    """One member over the last check's steps."""

    member: str
    compute_s_per_sample: float
    link_s_per_byte: float


@dataclass(frozen=True)
class CheckInput:
    """What every member agreed on at one check, with the window's earlier checks."""

    step: int  # committed steps at the check
    rows: Sequence[Sequence[MemberCost]]  # one per check, oldest first, same members
    step_s: float  # the cohort's measured step (median over the window's steps)
    global_batch: int
    spares: int  # workers waiting to be admitted
    balanced: bool = False  # shares follow speed (potluck run --balance)
    protected: frozenset[str] = frozenset()  # came in by a swap lately
    spare_s_per_sample: float | None = None  # the spare's expected speed, if known

    @property
    def members(self) -> list[str]:
        return [m.member for m in self.rows[-1]] if self.rows else []


@dataclass(frozen=True)
class Check:
    """One check's verdict: ``member`` is blamed (None: nobody)."""

    step: int
    member: str | None
    measured: float  # samples/s
    predicted: float  # samples/s without ``member``, the spare in its place
    compute_s_per_sample: float = 0.0  # the blamed member's
    link_s_per_byte: float = 0.0  # the blamed member's


@dataclass(frozen=True)
class SwapDecision:
    """Swap ``member`` for a spare: the figures behind it."""

    member: str
    step: int
    window: int
    measured: float  # samples/s, the latest check's
    predicted: float  # samples/s without it
    compute_s_per_sample: float
    link_s_per_byte: float

    def text(self) -> str:
        return (f"swapped {self.member} for a waiting spare after step {self.step}: the "
                f"cohort ran {self.measured:.1f} samples/s, "
                f"{1 - self.measured / self.predicted:.0%} below the "
                f"{self.predicted:.1f} predicted without it, over {self.window} steps "
                f"(its compute {self.compute_s_per_sample * 1e3:.3f} ms a sample, its "
                f"link {8e-6 / max(self.link_s_per_byte, 1e-18):.1f} Mbit/s by the probe)")


def compute_s(costs: Sequence[float], global_batch: int, balanced: bool) -> float:
    """The set's compute for the global batch: by speed, or equal shares."""
    if balanced:
        return global_batch / sum(1.0 / c for c in costs)
    return max(costs) * global_batch / len(costs)


def weighed(rows: Sequence[Sequence[MemberCost]], member: str) -> list[MemberCost]:
    """Each member's cost over ``rows``: ``member`` at its best, the others at their
    worst (a swap must pay off even so)."""
    out = []
    for i, latest in enumerate(rows[-1]):
        column = [row[i] for row in rows]
        pick = min if latest.member == member else max
        out.append(MemberCost(latest.member, pick(c.compute_s_per_sample for c in column),
                              pick(c.link_s_per_byte for c in column)))
    return out


def predicted_without(check: CheckInput, member: str, spread: float = 1.0) -> float:
    """Samples/s predicted with ``member`` swapped for a spare; a slowest link counts
    as slower than the next by what the probes show beyond ``spread``."""
    costs = weighed(check.rows, member)
    others = [m for m in costs if m.member != member]
    if len(others) == len(costs) or not others:
        raise ValueError(f"predicted_without: {member!r} is not one of several members")
    spare_c = check.spare_s_per_sample or statistics.median(
        m.compute_s_per_sample for m in others)
    spare_l = max(m.link_s_per_byte for m in others)  # (no better than the worst)
    now = [m.compute_s_per_sample for m in costs]
    then = [m.compute_s_per_sample for m in others] + [spare_c]
    wire = max(0.0, check.step_s - compute_s(now, check.global_batch, check.balanced))
    slowest = max(m.link_s_per_byte for m in costs)
    slowest_then = max([m.link_s_per_byte for m in others] + [spare_l])
    scale = min(1.0, spread * slowest_then / slowest) if slowest > 0 else 1.0
    step = compute_s(then, check.global_batch, check.balanced) + wire * scale
    return check.global_batch / step if step > 0 else float("inf")


def check(rule: SwapRule, data: CheckInput) -> Check:
    """The member whose absence predicts the most, blamed if the cohort drags: with a
    full window of checks (``rule.checks``) only."""
    measured = data.global_batch / data.step_s if data.step_s > 0 else float("inf")
    eligible = [m for m in data.members if m not in data.protected]
    if (data.spares < 1 or len(data.members) < 2 or not eligible
            or len(data.rows) < rule.checks):
        return Check(data.step, None, measured, measured)
    best = max(eligible, key=lambda m: (predicted_without(data, m, rule.spread), m))
    predicted = predicted_without(data, best, rule.spread)
    blamed = measured < (1 - rule.drag) * predicted
    mine = next(m for m in weighed(data.rows, best) if m.member == best)
    return Check(data.step, best if blamed else None, measured, predicted,
                 mine.compute_s_per_sample, mine.link_s_per_byte)


def decide(rule: SwapRule, verdict: Check) -> SwapDecision | None:
    """A swap when the check, weighing its window, blamed a member."""
    if verdict.member is None:
        return None
    return SwapDecision(verdict.member, verdict.step, rule.window, verdict.measured,
                        verdict.predicted, verdict.compute_s_per_sample,
                        verdict.link_s_per_byte)
