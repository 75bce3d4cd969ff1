"""Whether to swap a member that drags the cohort down for a waiting spare (pure).

The cohort checks itself every few steps. A check holds, per member, its compute per
sample and its link's cost (seconds per byte, from a probe); and the cohort's measured
step time. From these the check predicts the cohort's step without each member, with
the spare in its place:

    step' = compute' + wire * link' / link

``compute'`` is the new set's compute for the global batch (shares by speed, or equal).
``wire`` is what the measured step spends beyond the current set's compute: the
all-reduce and the step's overheads. It scales with the slowest link of the set, since
a ring goes as fast as its slowest member. A spare of unknown speed counts as the
median of the members it joins, on a link no better than their slowest.

A check blames the member whose absence predicts the most throughput, if the measured
throughput is below ``(1 - drag)`` of that prediction. The cohort swaps it when the
last ``checks`` checks (a window of steps) all blamed it. Hysteresis: no check runs in
a generation's first window (its warm-up), so one swap at most per window;
and a member that came in by a swap cannot be blamed for two windows after.
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

    def __post_init__(self) -> None:
        if not 0 < self.drag < 1:
            raise ConfigError(
                f"swap drag {self.drag!r} must be a fraction between 0 and 1 (0.3: swap a "
                "member whose absence would make the cohort 30% faster or more)")
        if self.window < 4:
            raise ConfigError(
                f"swap window {self.window!r} must be at least 4 steps (checks come every "
                "quarter window, and a swap needs several in a row)")

    @property
    def every(self) -> int:
        """Steps between checks."""
        return max(1, self.window // 4)

    @property
    def checks(self) -> int:
        """Checks in a row that must blame the same member."""
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
    """What every member agreed on at one check."""

    step: int  # committed steps at the check
    members: Sequence[MemberCost]
    step_s: float  # the cohort's measured step (median over the check's steps)
    global_batch: int
    spares: int  # workers waiting to be admitted
    balanced: bool = False  # shares follow speed (potluck run --balance)
    protected: frozenset[str] = frozenset()  # came in by a swap lately
    spare_s_per_sample: float | None = None  # the spare's expected speed, if known


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


def predicted_without(check: CheckInput, member: str) -> float:
    """Samples/s predicted with ``member`` swapped for a spare."""
    others = [m for m in check.members if m.member != member]
    mine = [m for m in check.members if m.member == member]
    if not mine or not others:
        raise ValueError(f"predicted_without: {member!r} is not one of several members")
    spare_c = check.spare_s_per_sample or statistics.median(
        m.compute_s_per_sample for m in others)
    spare_l = max(m.link_s_per_byte for m in others)  # (no better than the worst)
    now = [m.compute_s_per_sample for m in check.members]
    then = [m.compute_s_per_sample for m in others] + [spare_c]
    wire = max(0.0, check.step_s - compute_s(now, check.global_batch, check.balanced))
    slowest = max(m.link_s_per_byte for m in check.members)
    slowest_then = max([m.link_s_per_byte for m in others] + [spare_l])
    scale = slowest_then / slowest if slowest > 0 else 1.0
    step = compute_s(then, check.global_batch, check.balanced) + wire * scale
    return check.global_batch / step if step > 0 else float("inf")


def check(rule: SwapRule, data: CheckInput) -> Check:
    """The member whose absence predicts the most, blamed if the cohort drags."""
    measured = data.global_batch / data.step_s if data.step_s > 0 else float("inf")
    eligible = [m for m in data.members if m.member not in data.protected]
    if data.spares < 1 or len(data.members) < 2 or not eligible:
        return Check(data.step, None, measured, measured)
    best = max(eligible, key=lambda m: (predicted_without(data, m.member), m.member))
    predicted = predicted_without(data, best.member)
    blamed = measured < (1 - rule.drag) * predicted
    return Check(data.step, best.member if blamed else None, measured, predicted,
                 best.compute_s_per_sample, best.link_s_per_byte)


def decide(rule: SwapRule, checks: Sequence[Check]) -> SwapDecision | None:
    """Swap when the last ``rule.checks`` checks of this generation blamed one member."""
    if len(checks) < rule.checks:
        return None
    last = checks[-rule.checks:]
    blamed = {c.member for c in last}
    if len(blamed) != 1 or None in blamed:
        return None
    latest = last[-1]
    assert latest.member is not None
    return SwapDecision(latest.member, latest.step, rule.window, latest.measured,
                        latest.predicted, latest.compute_s_per_sample,
                        latest.link_s_per_byte)
