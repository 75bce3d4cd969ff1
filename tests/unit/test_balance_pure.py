"""The balancer's pure core: the speed meter and the share planner."""

from __future__ import annotations

import itertools
import math
import random

import pytest

from potluck.balance import BalanceConfig, Plan, SpeedMeter, plan_shares, replan
from potluck.balance.speed import PRIOR_SPREAD
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
    assert other.speed == meter.speed and other.uncertainty == meter.uncertainty
    seeded = SpeedMeter(0.5)
    seeded.seed(42.0)
    assert seeded.speed == pytest.approx(42.0)
    seeded.add(10, 1.0)  # the next real step counts (no warm-up skip after a seed)
    assert seeded.speed is not None and seeded.speed < 42.0


def test_the_meter_keeps_the_spread_of_single_steps_and_the_speeds_uncertainty() -> None:
    meter = SpeedMeter(0.5, skip=0)
    assert meter.uncertainty is None and meter.spread == PRIOR_SPREAD  # nothing measured
    meter.add(10, 1.0)
    assert meter.uncertainty == pytest.approx(PRIOR_SPREAD)  # one step: a step's spread
    for seconds in (1.1, 0.9) * 20:  # about 10% either way
        meter.add(10, seconds)
    assert 0.08 < meter.spread < 0.2
    # the average of many steps is surer than one: by sqrt((1 - a) / (1 + a))
    assert meter.uncertainty == pytest.approx(meter.spread / math.sqrt(3), rel=1e-6)
    meter.add(10, 2.0)  # a lone slow step: a jump, so the average restarts from it
    assert meter.spread > 0.3 and meter.uncertainty == pytest.approx(meter.spread)


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


def test_a_difference_within_the_speeds_noise_keeps_the_plan() -> None:
    """1000 vs 800 samples/s would move 24/24 to 27/21 (11% faster): only if the speeds
    are surer than that difference."""
    equal = plan_shares([1.0, 1.0], 48)
    speeds = [1000.0, 800.0]
    assert plan_shares(speeds, 48, current=equal).counts == (27, 21)  # taken as exact
    assert plan_shares(speeds, 48, current=equal, noise=[0.1, 0.1]).counts == (24, 24)
    assert plan_shares(speeds, 48, current=equal, noise=[0.02, 0.02]).counts == (27, 21)
    # a rank whose noise is unknown gives no evidence: nothing to compare with
    assert plan_shares(speeds, 48, current=equal, noise=[0.02, None]).counts == (24, 24)


def test_replan_moves_when_two_gathers_in_a_row_call_for_it() -> None:
    speeds, noise = [1000.0, 800.0], [0.02, 0.02]
    plan, calls = replan(speeds, 48, current=None, calls=0, noise=noise)
    assert plan.counts == (24, 24) and calls == 1  # None is equal shares; held once
    again, calls = replan(speeds, 48, current=plan, calls=calls, noise=noise)
    assert again.counts == (27, 21) and calls == 0
    # a gather within the noise between two calls starts the count again
    plan, calls = replan(speeds, 48, current=None, calls=0, noise=noise)
    plan, calls = replan([1000.0, 990.0], 48, current=plan, calls=calls, noise=noise)
    assert plan.counts == (24, 24) and calls == 0
    plan, calls = replan(speeds, 48, current=plan, calls=calls, noise=noise)
    assert plan.counts == (24, 24) and calls == 1
    # a kept plan takes the caps of the gather
    assert replan(speeds, 48, current=None, calls=0, noise=noise,
                  caps=[10, None])[0].micro_batches == (3, 1)
    with pytest.raises(ConfigError, match=r"calls=-1 is invalid"):
        replan(speeds, 48, current=None, calls=-1, noise=noise)


def _noisy_seconds(seed: int, speeds: list[float], steps: int = 120) -> list[list[float]]:
    """Seconds per sample of each worker, step by step, noisy as the compute times
    ``SpeedMeter`` took on this project's 2-core VM: a few percent from step to step
    (0.04-0.05 in log on pinned workers), and, on one step in ten, other work on the
    machine: a slow spell of 1-2 steps, 1.5-3x slower, on one worker or both (steps
    1.5-2.2x slower were 22% of a busy run's)."""
    rng = random.Random(seed)
    left, factor = 0, 1.0
    slowed: tuple[int, ...] = ()
    rows = []
    for _ in range(steps):
        if left == 0 and rng.random() < 0.1:
            left, factor = rng.randint(1, 2), rng.uniform(1.5, 3.0)
            slowed = rng.choice([(0,), (1,), (0, 1)])
        rows.append([math.exp(rng.gauss(0.0, 0.05)) / speed
                     * (factor if left and rank in slowed else 1.0)
                     for rank, speed in enumerate(speeds)])
        left = max(0, left - 1)
    return rows


def _balanced_splits(per_sample: list[list[float]],
                     global_batch: int = 48) -> list[tuple[int, ...]]:
    """Each step's split as the balancer makes it: every worker's meter (its first
    step not counted), the gather of a step read after the next one, ``replan``."""
    meters = [SpeedMeter() for _ in per_sample[0]]
    plan, calls, gathered, splits = None, 0, [], []
    for seconds in per_sample:
        split = plan.counts if plan is not None else tuple(
            plan_shares([1.0] * len(meters), global_batch).counts)
        splits.append(split)
        for meter, part, taken in zip(meters, split, seconds, strict=True):
            meter.add(part, part * taken)
        gathered.append(([m.speed for m in meters], [m.uncertainty for m in meters]))
        if len(gathered) >= 2:
            speeds, noise = gathered[-2]
            plan, calls = replan(speeds, global_batch, current=plan, calls=calls,
                                 noise=noise, min_gain=BalanceConfig().min_gain)
    return splits


def _moves(splits: list[tuple[int, ...]]) -> int:
    return sum(before != after for before, after in itertools.pairwise(splits))


@pytest.mark.parametrize("seed", range(10))
def test_two_equal_workers_keep_equal_shares_through_the_noise(seed: int) -> None:
    """Each re-plan of equal workers is noise, and a move there and back again;
    without the noise test and the second gather they re-planned 22-41 times in 120
    steps here, as `potluck run --balance` did on two equal workers."""
    splits = _balanced_splits(_noisy_seconds(seed, [1000.0, 1000.0]))
    assert _moves(splits) <= 2, splits
    assert splits[-1] == (24, 24), splits


@pytest.mark.parametrize("seed", range(10))
def test_a_worker_at_0_4_of_the_others_speed_gets_its_share_soon(seed: int) -> None:
    """1000 and 400 samples/s: 34/14 of 48. The shares move within a few steps (the
    first is not measured, a gather is read a step late, and two must call for the
    move), and stay."""
    splits = _balanced_splits(_noisy_seconds(seed, [1000.0, 400.0]))
    near = [abs(split[0] - 34) <= 2 for split in splits]
    first = near.index(True)
    assert first <= 20, splits
    assert sum(near[first:]) >= 0.9 * len(near[first:]), splits
    assert near[-1], splits


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
    ([1.0, 1.0], 8, {"noise": [0.1]}, r"noise has 1 entries for 2 ranks"),
    ([1.0, 1.0], 8, {"noise": [0.1, -0.1]}, r"noise\[1\]=-0.1 is invalid"),
    ([1.0, 1.0], 8, {"noise": [math.nan, 0.1]}, r"noise\[0\]=nan is invalid"),
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

    from potluck.reducer.clock import ComputeClock

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
