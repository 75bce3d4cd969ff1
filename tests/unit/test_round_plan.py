"""The round plan (pure): local steps by speed, each rank at least one, hysteresis, a
user's fixed split, and the weight of a pseudo-gradient."""

from __future__ import annotations

import pytest

from potluck.errors import ConfigError
from potluck.sync import local_steps, plan_round, weight


def test_local_steps_in_proportion_to_speed_each_at_least_one() -> None:
    assert plan_round([None, None], 4) == (4, 4)  # nobody measured: equal
    assert plan_round([300.0, 100.0], 4) == (6, 2)
    assert plan_round([1000.0, 1.0, 1.0], 2) == (4, 1, 1)  # never below one
    assert plan_round([0.0, 0.0], 3) == (3, 3)  # zero speeds: equal, not a division by 0
    assert plan_round([5.0], 10) == (10,)


def test_hysteresis_keeps_a_plan_close_enough() -> None:
    assert plan_round([310.0, 100.0], 4, current=(6, 2), min_gain=0.05) == (6, 2)
    assert plan_round([100.0, 100.0], 4, current=(6, 2), min_gain=0.05) == (4, 4)
    assert plan_round([310.0, 100.0], 4, current=(5, 5), min_gain=0.05) == (6, 2)  # stale


def test_a_fixed_split_is_checked_against_the_cohort() -> None:
    assert plan_round([1.0, 9.0], 2, split=(3, 1)) == (3, 1)
    with pytest.raises(ConfigError, match="summing to 2 x 2 = 4"):
        plan_round([1.0, 9.0], 2, split=(3, 2))
    with pytest.raises(ConfigError, match="one count per rank"):
        plan_round([1.0, 9.0, 1.0], 2, split=(3, 1))


def test_local_steps_of_a_part_and_its_weight() -> None:
    # global batch 12 on 2 ranks: about 6 samples a local step
    assert local_steps(42, 12, 2) == 7 and local_steps(6, 12, 2) == 1
    assert local_steps(2, 12, 2) == 1 and local_steps(1, 120, 2) == 1  # a short last round
    assert local_steps(5, 2, 2) == 5  # never more steps than samples
    assert weight(6, 48) == 0.125
    with pytest.raises(ConfigError, match="within the round"):
        weight(49, 48)
