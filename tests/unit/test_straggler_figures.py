"""The figures of ``potluck bench straggler`` from hand-made step records (no processes)."""

from __future__ import annotations

import math
from typing import Any

import pytest

from potluck_lab.bench.straggler_figures import (
    after_warmup,
    change_figures,
    finite,
    fraction_of_ideal,
    phase_rates,
    rate,
    rebalance_steps,
    spans,
    step_rates,
    summarize_rounds,
    time_split,
)


def steps(times: list[float], rank: int = 0) -> list[dict[str, Any]]:
    """Step records of one rank, step i finished at ``times[i]``."""
    return [{"kind": "step", "time": t, "pid": 1, "step": i, "rank": rank}
            for i, t in enumerate(times)]


@pytest.mark.timeout(10)
def test_spans_pair_each_step_with_the_one_before_in_step_order() -> None:
    records = steps([10.0, 10.5, 11.5])
    shuffled = [records[2], {"kind": "done", "time": 12.0, "pid": 1, "rank": 0},
                records[0], records[1]]
    assert spans(shuffled) == [(10.0, 10.5), (10.5, 11.5)]
    assert spans(steps([1.0])) == []


@pytest.mark.timeout(10)
def test_rate_is_samples_over_the_seconds_of_the_spans_inside_the_window() -> None:
    timed = spans(steps([0.0, 1.0, 2.0, 2.5, 3.0]))  # 1 s, 1 s, 0.5 s, 0.5 s
    assert rate(timed, 100) == pytest.approx(400 / 3.0)
    assert rate(timed, 100, start=2.0) == pytest.approx(200.0)  # the two 0.5 s steps
    assert rate(timed, 100, end=2.0) == pytest.approx(100.0)
    assert rate(timed, 100, start=1.0, skip=1) == pytest.approx(200.0)
    assert math.isnan(rate(timed, 100, start=5.0))  # nothing inside
    assert math.isnan(rate([], 100))


@pytest.mark.timeout(10)
def test_after_warmup_is_when_the_last_warmup_step_ended() -> None:
    records = steps([0.0, 1.0, 2.0, 3.0])
    assert after_warmup(records, 2) == 1.0  # steps 0 and 1 are the warm-up
    assert rate(spans(records), 10, start=after_warmup(records, 2)) == pytest.approx(10.0)
    assert after_warmup(records, 0) == -math.inf  # no warm-up: every span counts
    assert after_warmup(records, 9) == -math.inf  # too few steps: not a crash


@pytest.mark.timeout(10)
def test_phase_rates_split_each_rank_at_the_quota_changes() -> None:
    slow = steps([0.0, 1.0, 2.0, 4.0, 6.0, 8.0, 10.0])  # 1 s steps, then 2 s from t=2
    fast = steps([0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0, 3.5, 4.0, 4.5, 5.0], rank=1)
    rates = phase_rates([slow, fast], 100, [0.0, 2.0], skip=1)
    assert rates[0] == [pytest.approx(100.0), pytest.approx(200.0)]
    assert rates[1] == [pytest.approx(50.0), pytest.approx(200.0)]  # first one left out
    assert fraction_of_ideal(150.0, rates[1]) == pytest.approx(0.6)
    assert math.isnan(fraction_of_ideal(1.0, []))


@pytest.mark.timeout(10)
def test_rebalance_steps_counts_slow_steps_before_hold_steps_near_the_ideal() -> None:
    ideal = 1000.0
    assert rebalance_steps([500, 700, 850, 950, 990, 1000], ideal) == 3
    assert rebalance_steps([950, 990], ideal) == 0  # never out of the tolerance
    # One step near the ideal is not settled yet (hold=2): noise, not balance.
    assert rebalance_steps([500, 950, 600, 920, 940], ideal) == 3
    assert rebalance_steps([500, 950, 600, 920, 940], ideal, hold=1) == 1
    assert rebalance_steps([500, 600, 950], ideal) is None  # not two in a row yet
    assert rebalance_steps([500, 600, 850, 860], ideal, tolerance=0.2) == 2
    assert rebalance_steps([], ideal) is None


@pytest.mark.timeout(10)
def test_step_rates_start_with_the_step_in_flight_at_the_change() -> None:
    timed = spans(steps([0.0, 1.0, 2.0, 3.0, 3.5, 4.0]))
    assert step_rates(timed, 100, after=1.5) == [100.0, 100.0, 200.0, 200.0]
    assert step_rates(timed, 100, after=1.5, until=3.0) == [100.0, 100.0]


@pytest.mark.timeout(10)
def test_change_figures_take_the_worse_change_and_the_pace_the_run_settled_at() -> None:
    # 100 samples a step; the quota drops at t=1.0 (ideal 100/s) and comes back at
    # t=10.0 (ideal 200/s); the run settles at 80/s after the drop: never within 10%.
    ends = [0.0, 0.5, 1.0, 3.0, 4.5, 5.75, 7.0, 8.25, 9.5, 10.0, 10.75, 11.25, 11.75, 12.25]
    figures = change_figures(spans(steps(ends)), 100, [1.0, 10.0], [100.0, 200.0])
    assert figures["step_samples_per_s"][0] == pytest.approx([50, 200 / 3, 80, 80, 80, 80,
                                                              200])
    assert figures["rebalance_steps_each"] == [None, 1]
    assert figures["rebalance_steps"] is None  # one change never got there
    assert figures["settle_steps_each"] == [2, 1]  # within 10% of 80/s, of 200/s
    both = change_figures(spans(steps(ends)), 100, [1.0, 10.0], [80.0, 200.0])
    assert both["rebalance_steps_each"] == [2, 1] and both["rebalance_steps"] == 2
    assert change_figures([], 100, [], [])["rebalance_steps"] is None


@pytest.mark.timeout(10)
def test_time_split_medians_after_the_warmup_and_cpu_per_wall() -> None:
    parts = {"load_s": 0.01, "fwd_s": 0.04, "bwd_s": 0.03, "wait_s": 0.01, "opt_s": 0.01}
    records = [{**r, **parts, "cpu_s": 0.05} for r in steps([0.0, 0.1, 0.2, 0.3])]
    records[0]["fwd_s"] = 9.0  # the warm-up step: left out
    split = time_split(records, warmup=1)
    assert split["fwd_s"] == pytest.approx(0.04)
    assert split["cpu_per_wall"] == pytest.approx(0.5)
    assert time_split(steps([0.0]), warmup=0) == {}  # records without timings


@pytest.mark.timeout(10)
def test_summarize_rounds_takes_the_ratios_within_each_round() -> None:
    rounds = [
        {"solo": {"samples_per_s": [100.0, 50.0], "ideal": 150.0},
         "ddp": {"samples_per_s": 100.0}, "balanced": {"samples_per_s": 144.0}},
        {"solo": {"samples_per_s": [200.0, 100.0], "ideal": 300.0},  # a faster moment
         "ddp": {"samples_per_s": 200.0}, "balanced": {"samples_per_s": 294.0}},
        {"solo": {"samples_per_s": [100.0, 50.0], "ideal": 150.0},
         "ddp": {"samples_per_s": 100.0}, "balanced": {"samples_per_s": 150.0}},
    ]
    top = summarize_rounds(rounds, ("ddp", "balanced"), workers=2)
    assert top["balanced_vs_ddp"] == pytest.approx(1.47)  # median of 1.44, 1.47, 1.5
    assert top["fraction_of_ideal"] == pytest.approx(0.98)  # median of 0.96, 0.98, 1.0
    assert top["ideal_vs_ddp"] == pytest.approx(1.5)  # 150 / (2 x 50)
    assert top["samples_per_s"] == {"ddp": 100.0, "balanced": 150.0}
    assert top["solo_samples_per_s"] == [100.0, 50.0]
    alone = summarize_rounds(rounds, ("balanced",), workers=2)
    assert math.isnan(alone["balanced_vs_ddp"]) and alone["balanced_vs_ddp_rounds"] == []
    assert math.isnan(top["sync_ceiling"])  # rounds without a ceiling: none to report
    for round_, ceiling, planner, best in zip(rounds, (0.96, 0.95, 0.98), (0.9, 0.97, 0.95),
                                              (150.0, 290.0, 147.0), strict=True):
        round_["solo"]["sync_ceiling"] = {"fraction": ceiling, "planner": planner,
                                          "rate": best}
    top = summarize_rounds(rounds, ("ddp", "balanced"), workers=2)
    assert top["sync_ceiling"] == pytest.approx(0.96)
    assert top["planner_replay"] == pytest.approx(0.95)
    assert top["planner_replay_rounds"] == [0.9, 0.97, 0.95]
    assert top["sync_ceiling_rounds"] == [0.96, 0.95, 0.98]
    # the balanced run's samples/s over the ceiling's, within each round: 0.96, 1.014, 1.02
    assert top["fraction_of_ceiling"] == pytest.approx(294.0 / 290.0)


@pytest.mark.timeout(10)
def test_finite_makes_nan_null_for_json() -> None:
    assert finite({"a": math.nan, 1: [1.0, (math.nan, 2)]}) == {"a": None, "1": [1.0,
                                                                              [None, 2]]}
