"""The swap rule (pure): who is blamed, when a swap is decided, and what holds it back."""

from __future__ import annotations

import pytest

from potluck.errors import ConfigError
from potluck.population.swap import (
    Check,
    CheckInput,
    MemberCost,
    SwapRule,
    check,
    decide,
    predicted_without,
)

BATCH = 96
FAST = 1e-7  # seconds per byte: 80 Mbit/s
SLOW = 1e-6  # 8 Mbit/s


def cohort(step_s: float, links: tuple[float, ...] = (FAST, FAST, FAST),
           compute: tuple[float, ...] = (1e-3, 1e-3, 1e-3), spares: int = 1,
           **more: object) -> CheckInput:
    members = [MemberCost(f"m{i}", c, link)
               for i, (c, link) in enumerate(zip(compute, links, strict=True))]
    return CheckInput(step=10, members=members, step_s=step_s, global_batch=BATCH,
                      spares=spares, **more)  # type: ignore[arg-type]


RULE = SwapRule(drag=0.3, window=20)


@pytest.mark.timeout(5)
def test_a_slow_link_is_blamed_and_the_prediction_scales_the_wire_by_it() -> None:
    # compute 32 ms (equal shares of 96 at 1 ms), the rest (168 ms) is the wire at m1's
    # slow link; the others' links are 10 times faster: 16.8 ms of wire without it
    data = cohort(0.2, links=(FAST, SLOW, FAST))
    verdict = check(RULE, data)
    assert verdict.member == "m1"
    assert verdict.measured == pytest.approx(BATCH / 0.2)
    assert verdict.predicted == pytest.approx(BATCH / (0.032 + 0.0168))
    assert verdict.link_s_per_byte == SLOW


@pytest.mark.timeout(5)
def test_a_slow_compute_is_blamed_with_equal_shares_and_with_balanced_ones() -> None:
    slow = (1e-3, 1e-3, 4e-3)
    equal = cohort(4e-3 * 32 + 0.01, compute=slow)
    assert check(RULE, equal).member == "m2"
    # balanced: 96 / (1000 + 1000 + 250) = 42.7 ms; without it (a median spare) 32 ms
    balanced = cohort(0.0427 + 0.01, compute=slow, balanced=True)
    verdict = check(RULE, balanced)
    assert verdict.member is None  # 19% faster at best: under the 30% drag
    assert verdict.predicted == pytest.approx(BATCH / (0.032 + 0.01), rel=1e-2)


@pytest.mark.timeout(5)
def test_a_healthy_cohort_blames_nobody() -> None:
    assert check(RULE, cohort(0.05)).member is None


@pytest.mark.timeout(5)
def test_nobody_is_blamed_without_a_spare_or_when_the_dragger_is_protected() -> None:
    assert check(RULE, cohort(0.2, links=(FAST, SLOW, FAST), spares=0)).member is None
    protected = cohort(0.2, links=(FAST, SLOW, FAST), protected=frozenset({"m1"}))
    assert check(RULE, protected).member is None


@pytest.mark.timeout(5)
def test_a_known_spare_speed_enters_the_prediction() -> None:
    data = cohort(0.2, links=(FAST, SLOW, FAST))
    slower = cohort(0.2, links=(FAST, SLOW, FAST), spare_s_per_sample=2e-3)
    assert predicted_without(slower, "m1") < predicted_without(data, "m1")


@pytest.mark.timeout(5)
def test_a_swap_needs_the_same_member_blamed_by_the_last_checks() -> None:
    assert (RULE.every, RULE.checks, RULE.protect) == (5, 3, 40)

    def blames(*members: str | None) -> list[Check]:
        return [Check(5 * (i + 1), m, 100.0, 200.0) for i, m in enumerate(members)]

    assert decide(RULE, blames("m1", "m1")) is None  # too few yet
    assert decide(RULE, blames("m1", None, "m1", "m1")) is None
    assert decide(RULE, blames("m1", "m2", "m1")) is None  # two suspects: no swap
    decision = decide(RULE, blames(None, "m1", "m1", "m1"))
    assert decision is not None and decision.member == "m1" and decision.step == 20
    assert "50% below the 200.0 predicted" in decision.text()


@pytest.mark.timeout(5)
def test_a_decision_comes_within_the_window_of_the_drag() -> None:
    """Drag from step 21 on: checks at 25, 30, 35 blame; the swap comes at 35."""
    checks: list[Check] = []
    decided = None
    for step in range(5, 60, 5):
        dragging = step > 20
        data = cohort(0.2 if dragging else 0.05,
                      links=(FAST, SLOW if dragging else FAST, FAST))
        verdict = check(RULE, data)
        checks.append(Check(step, verdict.member, verdict.measured, verdict.predicted))
        decided = decide(RULE, checks)
        if decided:
            break
    assert decided is not None and decided.member == "m1"
    assert decided.step - 20 <= RULE.window


@pytest.mark.timeout(5)
@pytest.mark.parametrize(("drag", "window"), [(0.0, 20), (1.0, 20), (-0.2, 20), (0.3, 3)])
def test_a_bad_rule_is_refused_with_the_value(drag: float, window: int) -> None:
    with pytest.raises(ConfigError, match=r"swap (drag|window)"):
        SwapRule(drag, window)
