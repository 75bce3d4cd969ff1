"""The synchronous ceiling of ``potluck bench straggler`` (pure)."""

from __future__ import annotations

import itertools
import math

import pytest

from potluck.balance import BalanceConfig
from potluck_lab.bench.sync_ceiling import (
    BalancerModel,
    Timeline,
    ceiling,
    fraction,
    replay,
    replay_policy,
)


def steady(speed: float, samples: int, steps: int, begin: float = 0.0) -> Timeline:
    """A worker doing ``samples`` a step at a constant ``speed`` (samples/s)."""
    length = samples / speed
    return Timeline([(begin + i * length, begin + (i + 1) * length) for i in range(steps)],
                    samples)


def test_done_by_and_when_are_inverse_within_the_timeline_and_clamp_outside() -> None:
    line = Timeline([(0.0, 1.0), (1.0, 3.0), (3.0, 3.5)], samples=10)
    assert line.done_by(-5.0) == 0.0
    assert line.done_by(0.5) == pytest.approx(5.0)
    assert line.done_by(2.0) == pytest.approx(15.0)  # half of the slower second span
    assert line.done_by(9.0) == pytest.approx(30.0)
    for done in (0.0, 5.0, 10.0, 15.0, 27.5, 30.0):
        assert line.done_by(line.when(done)) == pytest.approx(done)
    assert line.when(30.5) == math.inf  # past the end: no such moment
    assert line.rate(1.0, 3.0) == pytest.approx(5.0)


def test_steady_workers_split_by_speed_reach_the_ideal() -> None:
    fast, slow = steady(3000.0, 512, 40), steady(1000.0, 512, 40)
    result = ceiling([fast, slow], slow=1, total=1024, start=1.0, end=5.0)
    assert result["split"] == [768, 256]
    assert result["fraction"] == pytest.approx(1.0, rel=1e-3)
    # an even split makes the fast one wait: half of the slow one's time per step
    assert replay([fast, slow], [512, 512], 1.0, 5.0).rate == pytest.approx(2000.0, rel=1e-3)


def test_three_workers_split_the_rest_by_their_speeds() -> None:
    lines = [steady(3000.0, 400, 40), steady(2000.0, 400, 40), steady(1000.0, 400, 40)]
    result = ceiling(lines, slow=2, total=1200, start=0.0, end=6.0)
    assert result["split"] == [600, 400, 200]
    assert result["fraction"] == pytest.approx(1.0, rel=1e-6)


def alternating(lengths: list[float], samples: int = 100) -> Timeline:
    times = [0.0]
    for length in lengths:
        times.append(times[-1] + length)
    return Timeline(list(itertools.pairwise(times)), samples)


def test_speeds_that_move_against_each_other_leave_less_than_the_ideal() -> None:
    """Both workers alternate fast (100 samples in 0.25 s) and slow (in 0.75 s) out of
    phase: a step shorter than the swing waits for whichever is slow in it, whatever the
    fixed split; a step as long as two swings averages it out; and a machine that slows
    both at once costs nothing (the timelines run until 40 s: the window is cut there)."""
    a, b = alternating([0.25, 0.75] * 40), alternating([0.75, 0.25] * 40)
    short = ceiling([a, b], slow=1, total=100, start=0.0, end=60.0)
    assert short["fraction"] == pytest.approx(0.748, abs=0.01)
    assert ceiling([a, b], slow=1, total=400, start=0.0, end=60.0)["fraction"] == \
        pytest.approx(1.0)
    assert ceiling([a, a], slow=1, total=100, start=0.0, end=60.0)["fraction"] == \
        pytest.approx(1.0)


def test_bad_input_is_refused_with_what_was_wrong() -> None:
    with pytest.raises(ValueError, match="at least one step span"):
        Timeline([], 4)
    with pytest.raises(ValueError, match="at least 1"):
        Timeline([(0.0, 1.0)], 0)
    with pytest.raises(ValueError, match=r"span 1 ends at 1\.0 before it begins at 2\.0"):
        Timeline([(0.0, 2.0), (2.0, 1.0)], 4)
    line = steady(100.0, 10, 5)
    with pytest.raises(ValueError, match="split of 1 parts for 2"):
        replay([line, line], [5], 0.0, 0.5)
    with pytest.raises(ValueError, match=r"split \[0, 5\]: every rank needs"):
        replay([line, line], [0, 5], 0.0, 0.5)  # (a step of nothing would never end)
    with pytest.raises(ValueError, match="slow rank 2 of 2"):
        ceiling([line, line], slow=2, total=10, start=0.0, end=0.5)
    with pytest.raises(ValueError, match="at least two timelines"):
        ceiling([line], slow=0, total=10, start=0.0, end=0.5)
    with pytest.raises(ValueError, match="is empty"):
        ceiling([line, line], slow=1, total=10, start=0.5, end=0.5)
    with pytest.raises(ValueError, match="warmup=-1"):
        replay_policy([line, line], BalancerModel(2, 20, BalanceConfig()), 0.0, 0.5,
                      warmup=-1)
    with pytest.raises(ValueError, match="every rank needs at least one sample"):
        BalancerModel(2, 1, BalanceConfig())


def test_a_window_shorter_than_one_step_has_no_rate() -> None:
    line = steady(100.0, 10, 5)
    assert math.isnan(replay([line, line], [10, 10], 0.0, 0.05).rate)
    assert math.isnan(ceiling([line, line], slow=1, total=20, start=0.0, end=0.05)["fraction"])


def test_the_balancer_model_plans_from_the_speeds_of_the_step_before_last() -> None:
    """As the balancer: the first step is not measured, a step's speeds are read after
    the next one, and a new plan is taken when two gathers in a row call for it, so the
    fifth step is the first on measured shares."""
    model = BalancerModel(2, 1024, BalanceConfig())
    for _ in range(4):
        assert list(model.split()) == [512, 512]
        model.measured([512, 512], [512 / 3000, 512 / 1000])
    assert list(model.split()) == [768, 256]


def test_the_balancer_model_keeps_equal_shares_when_moving_is_not_worth_it() -> None:
    """Its first plan already weighs the gain against the equal plan before it (the
    balancer plans equal shares from the first, unmeasured gather)."""
    model = BalancerModel(2, 1024, BalanceConfig(min_gain=0.03))
    for _ in range(6):
        model.measured([512, 512], [512 / 1000, 512 / 1020])
    assert list(model.split()) == [512, 512]


@pytest.mark.parametrize(("warmup", "expected"),
                         [(0, 35 / 39), (1, 34 / 37), (2, 33 / 35), (5, 1.0)])
def test_the_planner_replayed_on_steady_workers_counts_after_its_warmup(
        warmup: int, expected: float) -> None:
    """Steps 1-4 on equal shares take 0.512 s (the slow worker's 512 samples), the 31
    after on [768, 256] 0.256 s, the ideal being 4,000 samples/s: counted from the end
    of step ``warmup``."""
    fast, slow = steady(3000.0, 512, 60), steady(1000.0, 512, 60)
    replayed = replay_policy([fast, slow], BalancerModel(2, 1024, BalanceConfig()), 0.0,
                             10.0, warmup=warmup)
    assert replayed.samples == (35 - warmup) * 1024
    assert fraction([fast, slow], replayed) == pytest.approx(expected, rel=1e-9)
