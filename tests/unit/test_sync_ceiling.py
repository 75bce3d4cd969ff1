"""The synchronous ceiling of ``potluck bench straggler`` (pure)."""

from __future__ import annotations

import itertools
import math

import pytest

from potluck.balance import BalanceConfig
from potluck.bench.sync_ceiling import (
    BalancerModel,
    Timeline,
    ceiling,
    ideal,
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
    assert replay([fast, slow], [512, 512], 1.0, 5.0) == pytest.approx(2000.0, rel=1e-3)


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
    with pytest.raises(ValueError, match="time order"):
        Timeline([(0.0, 2.0), (2.0, 1.0)], 4)
    line = steady(100.0, 10, 5)
    with pytest.raises(ValueError, match="split of 1 parts for 2"):
        replay([line, line], [5], 0.0, 0.5)
    with pytest.raises(ValueError, match="slow rank 2 of 2"):
        ceiling([line, line], slow=2, total=10, start=0.0, end=0.5)
    with pytest.raises(ValueError, match="is empty"):
        ceiling([line, line], slow=1, total=10, start=0.5, end=0.5)


def test_a_window_shorter_than_one_step_has_no_rate() -> None:
    line = steady(100.0, 10, 5)
    assert math.isnan(replay([line, line], [10, 10], 0.0, 0.05))
    assert math.isnan(ceiling([line, line], slow=1, total=20, start=0.0, end=0.05)["fraction"])


def test_the_balancer_model_plans_from_the_speeds_of_the_step_before_last() -> None:
    """As the balancer: the first step is not measured, a step's speeds are read after
    the next one, so the fourth step is the first on measured shares."""
    model = BalancerModel(2, 1024, BalanceConfig())
    for _ in range(3):
        assert list(model.split()) == [512, 512]
        model.measured([512, 512], [512 / 3000, 512 / 1000])
    assert list(model.split()) == [768, 256]


def test_the_planner_replayed_on_steady_workers_reaches_the_ideal_after_its_warmup() -> None:
    fast, slow = steady(3000.0, 512, 60), steady(1000.0, 512, 60)
    warm = replay_policy([fast, slow], BalancerModel(2, 1024, BalanceConfig()), 0.0, 10.0,
                         warmup=5)
    assert warm / ideal([fast, slow], 0.0, 10.0) == pytest.approx(1.0, rel=1e-3)
    # counted from the first step, the three on equal shares cost what they cost
    cold = replay_policy([fast, slow], BalancerModel(2, 1024, BalanceConfig()), 0.0, 10.0,
                         warmup=0)
    assert 0.8 < cold / ideal([fast, slow], 0.0, 10.0) < 0.97
