"""Choosing a cohort, the reasons for the others, and grouping by latency (pure)."""

from __future__ import annotations

import pytest

from potluck.plan import (
    Distances,
    Machine,
    Risk,
    Search,
    Workload,
    choose,
    diloco,
    every_step,
    latency_groups,
    left_out,
)
from potluck.plan.select import EXHAUSTIVE


def _m(name: str, speed: float, mbit: float, latency_ms: float = 1.0, region: str = "eu",
       price: float | None = None) -> Machine:
    return Machine(name, speed, mbit * 1e6, mbit * 1e6, latency_ms / 1e3, region, price)


WORK = Workload(parameters=1_000_000, global_batch=64)
MIX = [_m("m0", 100, 1000), _m("m1", 120, 8), _m("m2", 80, 1000), _m("m3", 50, 1000),
       _m("m4", 10, 1000)]


@pytest.mark.timeout(10)
def test_a_slow_uplink_is_left_out_with_its_rate_and_cost_in_words() -> None:
    choice = choose(MIX, every_step(), Search(WORK))
    assert choice is not None
    names = [m.name for m in choice.members]
    assert "m1" not in names and {"m0", "m2"} <= set(names)
    reasons = dict(line.split(": ", 1) for line in left_out(MIX, choice, Search(WORK)))
    assert reasons["m1"].startswith("its 8 Mbit/s uplink would cost the cohort ")
    assert reasons["m1"].endswith("%")
    every = choose(MIX, every_step(), Search(WORK))
    assert every is not None and every.expected >= max(
        choose(c, every_step(), Search(WORK)).expected  # type: ignore[union-attr]
        for c in ([m] for m in MIX))


@pytest.mark.timeout(10)
def test_rounds_take_the_slow_link_when_the_sync_is_rare() -> None:
    choice = choose(MIX, diloco(500), Search(WORK))
    assert choice is not None and "m1" in [m.name for m in choice.members]


@pytest.mark.timeout(10)
def test_a_quarantined_machine_is_never_taken_and_a_flaky_one_is_ranked_down() -> None:
    twins = [_m("a", 100, 1000), _m("b", 100, 1000), _m("c", 100, 1000)]
    risks = {"a": Risk(excluded="quarantined in a run of the last week"),
             "b": Risk(availability=0.5, losses_per_h=20.0, note="lost 3 times")}
    search = Search(WORK, risks=risks)
    choice = choose(twins, diloco(50), search)
    assert choice is not None and [m.name for m in choice.members] == ["c"]
    reasons = left_out(twins, choice, search)
    assert reasons[0] == "a: quarantined in a run of the last week"
    assert reasons[1].startswith("b: its record (lost 3 times) would cost the cohort")


@pytest.mark.timeout(10)
def test_a_target_is_met_at_least_cost() -> None:
    priced = [_m("big", 200, 1000, price=4.0), _m("mid", 100, 1000, price=1.0),
              _m("mid2", 100, 1000, price=1.0)]
    choice = choose(priced, diloco(100), Search(WORK, target=150.0))
    assert choice is not None
    assert sorted(m.name for m in choice.members) == ["mid", "mid2"]
    assert choose(priced, diloco(100), Search(WORK, target=1e6)) is None


@pytest.mark.timeout(10)
def test_far_candidates_are_grouped_and_an_every_step_cohort_stays_in_one_group() -> None:
    far = Distances({("eu", "asia"): 0.090})
    mixed = [_m("e0", 100, 1000), _m("e1", 100, 1000), _m("a0", 150, 1000, region="asia"),
             _m("a1", 150, 1000, region="asia")]
    groups = latency_groups(mixed, far)
    assert [[m.name for m in g] for g in groups] == [["e0", "e1"], ["a0", "a1"]]
    search = Search(WORK, distances=far)
    choice = choose(mixed, every_step(), search)
    assert choice is not None and {m.region for m in choice.members} == {"asia"}
    reasons = left_out(mixed, choice, search)
    assert reasons[0].startswith("e0: 92 ms from the cohort")


@pytest.mark.timeout(30)
def test_many_candidates_are_pruned_one_at_a_time() -> None:
    many = [_m(f"m{i}", 50 + i, 1000 if i % 5 else 10) for i in range(EXHAUSTIVE + 4)]
    choice = choose(many, every_step(), Search(WORK))
    assert choice is not None
    slow_links = {f"m{i}" for i in range(0, EXHAUSTIVE + 4, 5)}
    assert not slow_links & {m.name for m in choice.members}
