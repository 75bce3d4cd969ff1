"""A round's plan follows speeds beyond their noise, not each round's noise.

Each rank smooths its own round speeds (``SpeedMeter``) and sends them with their
noise; ``replan_round`` moves local steps only for a difference beyond that noise that
two syncs in a row call for. Following one round's raw speeds moved a whole local step
back and forth on equal ranks, and the round waited for the rank that got it."""

from __future__ import annotations

import random
import statistics
from collections.abc import Callable

import pytest

from potluck.balance.speed import SpeedMeter
from potluck.sync.diloco import ROUND_JUMP, ROUND_SMOOTHING
from potluck.sync.round_plan import plan_round, replan_round

pytestmark = pytest.mark.timeout(60)

H = 8


def _rounds(true: Callable[[int], list[float]], scatter: float, *, smoothed: bool,
            rounds: int = 200, seed: int = 0) -> tuple[list[float], list[tuple[int, ...]]]:
    """Each round's wall time over a perfectly balanced round's (ranks at ``true(r)``
    local steps a second, each round's measured speed off by a lognormal ``scatter``),
    and the plan each sync made."""
    rng = random.Random(seed)
    n = len(true(0))
    meters = [SpeedMeter(ROUND_SMOOTHING, skip=0, jump=ROUND_JUMP, jump_is_change=True)
              for _ in range(n)]
    plan: tuple[int, ...] | None = None
    calls = 0
    over, plans = [], []
    for r in range(rounds):
        speeds = true(r)
        counts = plan or (H,) * n
        ideal = n * H / sum(speeds)
        over.append(max(c / s for c, s in zip(counts, speeds, strict=True)) / ideal)
        measured = [s * rng.lognormvariate(0.0, scatter) for s in speeds]
        if smoothed:
            for meter, speed, count in zip(meters, measured, counts, strict=True):
                meter.add(count, count / speed)
            plan, calls = replan_round([m.speed for m in meters],
                                       [m.uncertainty for m in meters], H,
                                       current=plan, calls=calls)
        else:  # the rule before: last round's raw speeds
            plan = plan_round(measured, H, current=plan)
        plans.append(plan)
    return over, plans


@pytest.mark.parametrize("scatter", [0.1, 0.2])
def test_equal_ranks_keep_an_even_plan_through_noisy_rounds(scatter: float) -> None:
    def equal(r: int) -> list[float]:
        return [1.0] * 4

    smoothed, plans = _rounds(equal, scatter, smoothed=True)
    raw, _ = _rounds(equal, scatter, smoothed=False)
    assert statistics.mean(smoothed) <= 1.01
    assert plans.count((H,) * 4) >= 0.95 * len(plans)
    assert statistics.mean(raw) >= 1.08  # what following each round's noise cost


def test_uneven_ranks_get_shares_by_speed_and_lose_less_than_following_noise() -> None:
    def uneven(r: int) -> list[float]:
        return [1.0, 0.7, 0.5, 0.3]

    smoothed, plans = _rounds(uneven, 0.1, smoothed=True)
    raw, _ = _rounds(uneven, 0.1, smoothed=False)
    assert plans[5][0] > plans[5][1] > plans[5][3]  # by speed within a few rounds
    assert statistics.mean(smoothed[5:]) <= min(1.12, statistics.mean(raw[5:]))


def test_a_rank_that_slows_down_for_good_gets_fewer_steps_within_three_syncs() -> None:
    def slows_at_50(r: int) -> list[float]:
        return [1.0, 1.0, 1.0, 1.0] if r < 50 else [1.0, 1.0, 1.0, 0.4]

    over, plans = _rounds(slows_at_50, 0.05, smoothed=True, rounds=80)
    assert plans[49] == (H,) * 4
    assert plans[52][3] < H and over[53] < 1.15
    assert statistics.mean(over[53:]) < 1.15


def test_a_rank_at_half_speed_for_good_gets_fewer_steps_within_six_syncs() -> None:
    """Half speed sits at the jump: the average may move to it instead of restarting."""
    def halves_at_50(r: int) -> list[float]:
        return [1.0, 1.0, 1.0, 1.0] if r < 50 else [1.0, 1.0, 1.0, 0.5]

    _, plans = _rounds(halves_at_50, 0.05, smoothed=True, rounds=80)
    assert plans[55][3] < H


def test_quotas_that_start_after_the_first_round_are_followed_by_the_third_sync() -> None:
    """The cohort bench's machines: equal in the first round, then held to 1.0, 0.7,
    0.5 and 0.3 of a core. The jump restarts each rank's average and its spread; a
    spread widened by the jump itself kept the plan even for rounds on end."""
    def quotas(r: int) -> list[float]:
        return [1.0] * 4 if r < 1 else [1.0, 0.7, 0.5, 0.3]

    _, plans = _rounds(quotas, 0.1, smoothed=True, rounds=12)
    assert plans[1] == (H,) * 4  # one sync of the new speeds: not yet
    assert plans[2][0] > plans[2][1] > plans[2][2] > plans[2][3]


def test_a_jump_starts_the_spread_again_where_it_is_a_change() -> None:
    change, noise = SpeedMeter(0.5, skip=0, jump_is_change=True), SpeedMeter(0.5, skip=0)
    for meter in (change, noise):
        meter.add(100, 1.0)
        meter.add(100, 3.3)  # a quota of 0.3 from here on
    assert change.uncertainty == pytest.approx(0.1)  # the prior's: one new measurement
    assert noise.uncertainty is not None and noise.uncertainty > 0.5  # the jump as noise
