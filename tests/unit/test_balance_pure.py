"""The balancer's pure core: the speed meter and the share planner."""

from __future__ import annotations

import math

import pytest

from potluck.balance import BalanceConfig, Plan, SpeedMeter, plan_shares
from potluck.errors import ConfigError
from potluck.reducer.contribution import Contribution

# ------------------------------------------------------------------------ speed meter


def test_the_first_measurement_counts_in_full_bias_corrected() -> None:
    meter = SpeedMeter(0.9, skip=0)
    assert meter.speed is None and not meter.measured
    meter.add(100, 2.0)  # 50 samples/s; an uncorrected EMA would say 500
    assert meter.speed == pytest.approx(50.0)


def test_the_meter_smooths_noise_and_follows_a_small_change_within_a_few_steps() -> None:
    meter = SpeedMeter(0.5, skip=0)
    for seconds in (1.0, 1.2, 0.9, 1.1, 1.0):  # 10 samples/s, noisy
        meter.add(10, seconds)
    assert meter.speed is not None and 9.5 < meter.speed < 10.5
    for _ in range(4):
        meter.add(10, 0.8)  # now 12.5 samples/s: within the jump, averaged in
    assert 12.0 < meter.speed < 12.5


def test_a_jump_restarts_the_average_at_once() -> None:
    meter = SpeedMeter(0.5, skip=0)
    for _ in range(10):
        meter.add(10, 1.0)  # 10 samples/s
    meter.add(10, 1 / 0.3)  # the owner started a game: 3 samples/s
    assert meter.speed == pytest.approx(3.0)
    meter.add(10, 1.0)  # and quit it
    assert meter.speed == pytest.approx(10.0)
    never = SpeedMeter(0.5, skip=0, jump=math.inf)
    never.add(10, 1.0)
    never.add(10, 10.0)
    assert never.speed == pytest.approx(10 / ((0.25 * 1.0 + 0.5 * 10.0) / 0.75))


def test_skipped_and_empty_measurements_teach_nothing() -> None:
    meter = SpeedMeter(0.5, skip=1)
    meter.add(10, 100.0)  # the first pass (warm-up) is skipped
    meter.add(0, 1.0)  # nothing trained
    meter.add(10, 0.0)  # a clock that did not run
    meter.add(10, math.nan)
    assert meter.speed is None
    meter.add(10, 1.0)
    assert meter.speed == pytest.approx(10.0)


def test_meter_state_round_trips_and_seed_starts_from_a_record() -> None:
    meter = SpeedMeter(0.5, skip=0)
    meter.add(30, 1.0)
    meter.add(10, 1.0)
    other = SpeedMeter(0.5)
    other.load_state_dict(meter.state_dict())
    assert other.speed == meter.speed
    seeded = SpeedMeter(0.5)
    seeded.seed(42.0)
    assert seeded.speed == pytest.approx(42.0)
    seeded.add(10, 1.0)  # the next real step counts (no warm-up skip after a seed)
    assert seeded.speed is not None and seeded.speed < 42.0


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, "0.5"])
def test_bad_smoothing_is_refused(smoothing: object) -> None:
    with pytest.raises(ConfigError, match=r"smoothing=.* must be in \[0, 1\)"):
        SpeedMeter(smoothing)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=r"jump=1.0 is invalid: it is a ratio > 1"):
        SpeedMeter(jump=1.0)


# ---------------------------------------------------------------------------- planner


def test_shares_are_proportional_to_speed_and_sum_to_the_batch() -> None:
    plan = plan_shares([300.0, 100.0], 64)
    assert plan.counts == (48, 16) and plan.micro_batches == (1, 1)
    plan = plan_shares([1.0, 1.0, 1.0], 10)
    assert sum(plan.counts) == 10 and sorted(plan.counts) == [3, 3, 4]


def test_every_rank_keeps_one_sample_even_at_zero_speed() -> None:
    plan = plan_shares([100.0, 0.0, 1e-9], 8)
    assert plan.counts == (6, 1, 1)
    assert plan_shares([0.0, 0.0], 8).counts == (4, 4)  # nothing known: equal
    assert plan_shares([5.0, 1.0, 1.0], 3).counts == (1, 1, 1)  # batch == world size


def test_a_joiner_not_yet_measured_gets_the_mean_speed() -> None:
    plan = plan_shares([100.0, 300.0, None], 60)
    assert plan.counts == (10, 30, 20)
    assert plan_shares([None, None], 9).counts == (5, 4)  # nobody measured: equal


def test_a_single_rank_takes_the_whole_batch() -> None:
    assert plan_shares([None], 32) == Plan((32,), (1,))
    assert plan_shares([12.5], 32, caps=[10]) == Plan((32,), (4,))


def test_hysteresis_keeps_the_plan_unless_the_step_gets_faster_enough() -> None:
    current = plan_shares([100.0, 100.0], 100)
    assert current.counts == (50, 50)
    # 2% faster on rank 0: the new plan would gain 1%, under min_gain=0.05: kept.
    assert plan_shares([102.0, 100.0], 100, current=current).counts == (50, 50)
    # Rank 1 at half speed: 50/50 takes 1.0 s, 67/33 0.67 s: worth it.
    moved = plan_shares([100.0, 50.0], 100, current=current)
    assert moved.counts == (67, 33)
    # 10% faster: a 4% gain, kept at min_gain=0.05, taken without hysteresis.
    assert plan_shares([110.0, 100.0], 100, current=current, min_gain=0.05).counts == (50, 50)
    assert plan_shares([110.0, 100.0], 100, current=current, min_gain=0.0).counts == (52, 48)
    # A plan for another world size or batch is never kept.
    assert plan_shares([1.0, 1.0, 1.0], 99, current=current).counts == (33, 33, 33)


def test_memory_caps_split_a_share_into_micro_batches() -> None:
    plan = plan_shares([300.0, 100.0], 64, caps=[16, None])
    assert plan.counts == (48, 16)  # caps do not limit the share, accumulation does it
    assert plan.micro_batches == (3, 1)
    assert plan_shares([1.0, 1.0], 64, caps=[32, 31]).micro_batches == (1, 2)


def test_step_time_is_the_slowest_ranks() -> None:
    assert Plan((60, 40), (1, 1)).step_time([60.0, 20.0]) == pytest.approx(2.0)
    assert math.isinf(Plan((1, 1), (1, 1)).step_time([1.0, 0.0])) is False


@pytest.mark.parametrize(("speeds", "batch", "kwargs", "message"), [
    ([], 8, {}, r"speeds=\[\] is invalid"),
    ([1.0, -1.0], 8, {}, r"speeds\[1\]=-1.0 is invalid"),
    ([1.0, math.inf], 8, {}, r"speeds\[1\]=inf is invalid"),
    ([1.0, True], 8, {}, r"speeds\[1\]=True is invalid"),
    ([1.0, 1.0, 1.0], 2, {}, r"global_batch=2 is invalid for 3 rank\(s\).*>= 3"),
    ([1.0], 8.0, {}, r"global_batch=8.0 is invalid"),
    ([1.0, 1.0], 8, {"caps": [4]}, r"caps has 1 entries for 2 ranks"),
    ([1.0, 1.0], 8, {"caps": [4, 0]}, r"caps\[1\]=0 is invalid"),
    ([1.0], 8, {"min_gain": 1.5}, r"min_gain=1.5 is invalid"),
])
def test_bad_planner_input_is_refused_with_the_value_and_the_rule(
        speeds: list[float], batch: int, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_shares(speeds, batch, **kwargs)  # type: ignore[arg-type]


def test_balance_config_is_checked_when_made() -> None:
    with pytest.raises(ConfigError, match=r"BalanceConfig\(max_micro_batch=0\) must be an "
                                          "int >= 1"):  # its own name, not the planner's caps
        BalanceConfig(max_micro_batch=0)
    with pytest.raises(ConfigError, match="min_gain"):
        BalanceConfig(min_gain=-0.1)


# ----------------------------------------------------------------------- contribution


def test_a_contribution_is_this_ranks_part_of_the_step() -> None:
    part = Contribution()
    assert not part.ready
    part.set(3, 3.0, 12.0)
    assert part.scale == 0.25 and not part.needs_total
    part.set(3, 57.0, None)  # tokens: the total is summed across ranks
    assert part.scale == 57.0 and part.needs_total
    part.set(3, 0.0, None)  # a part of padding only still takes part in the step
    assert part.ready and part.scale == 0.0
    with pytest.raises(ConfigError, match="must be a finite number >= 0"):
        part.set(3, -1.0, None)
    with pytest.raises(ConfigError, match="below this rank's"):
        part.set(3, 5.0, 4.0)


def test_the_compute_clock_leaves_out_the_time_blocked_in_collectives() -> None:
    import time

    from potluck.balance.clock import ComputeClock

    clock = ComputeClock("cpu")
    began = time.perf_counter()
    clock.forward_started()
    time.sleep(0.05)
    clock.backward_done(waited=0.02)  # a micro-batch's pass: its wait counts too
    clock.backward_done(waited=0.01)
    wall = time.perf_counter() - began
    seconds = clock.take()
    assert seconds is not None and 0.05 - 0.03 <= seconds <= wall - 0.03
    clock.forward_started()
    clock.backward_done(waited=1.0)  # nothing left: no measurement, not a negative one
    assert clock.take() is None
    clock.forward_started()
    time.sleep(0.01)
    clock.backward_done()
    later = clock.take()
    assert later is not None and later >= 0.01  # the last step's wait was reset
