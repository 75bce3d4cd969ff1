"""Which rank holds the cohort back (``potluck.status.attribution``, pure)."""

from __future__ import annotations

import math

import pytest

from potluck.errors import ConfigError
from potluck.status.attribution import (
    AttributionRule,
    RankWindow,
    Verdict,
    slowest,
    slowest_compute,
)


def windows(*computes: list[float]) -> list[RankWindow]:
    """Rank i's last steps' compute is ``computes[i]``; nobody silent."""
    return [RankWindow(rank, values) for rank, values in enumerate(computes)]


# ------------------------------------------------------------------ nobody stands out


@pytest.mark.timeout(10)
def test_equal_computes_name_nobody() -> None:
    ranks = windows([0.1, 0.1, 0.1], [0.1, 0.1, 0.1], [0.1, 0.1, 0.1])
    assert slowest_compute(ranks) is None
    assert slowest(ranks) is None


@pytest.mark.timeout(10)
def test_a_rank_below_the_ratio_is_not_named() -> None:
    # 0.115 s vs 0.1 s: 1.15 times the others, under the default 1.2, gap 15 ms
    assert slowest_compute(windows([0.1], [0.115])) is None
    # the same figures under a looser rule do name it: the ratio is what held it back
    named = slowest_compute(windows([0.1], [0.115]), AttributionRule(ratio=1.1))
    assert named is not None and named.rank == 1


@pytest.mark.timeout(10)
def test_a_rank_below_min_gap_is_not_named_however_large_the_ratio() -> None:
    # 1.5 ms vs 1 ms: 1.5 times the others but only 0.5 ms longer (timer noise)
    assert slowest_compute(windows([0.001], [0.0015])) is None
    named = slowest_compute(windows([0.001], [0.0015]), AttributionRule(min_gap_s=0.0001))
    assert named is not None and named.rank == 1


# ---------------------------------------------------------------------- the right rank


@pytest.mark.timeout(10)
def test_names_the_slower_of_two_ranks_with_a_reason_in_ms() -> None:
    assert slowest_compute(windows([0.3], [0.1])) == Verdict(
        0, "rank 0: forward+backward 300 ms vs median 100 ms of the others")
    verdict = slowest_compute(windows([0.1], [0.25]))
    assert verdict is not None and verdict.rank == 1 and not verdict.silent
    assert verdict.reason == "rank 1: forward+backward 250 ms vs median 100 ms of the others"


@pytest.mark.timeout(10)
def test_names_the_slow_one_of_three_ranks() -> None:
    verdict = slowest_compute(windows([0.10, 0.10], [0.12, 0.12], [0.30, 0.30]))
    assert verdict is not None and verdict.rank == 2
    # the others' median is the middle of 0.10 and 0.12
    assert verdict.reason == "rank 2: forward+backward 300 ms vs median 110 ms of the others"


@pytest.mark.timeout(10)
def test_names_the_slow_one_of_eight_ranks_whatever_its_position() -> None:
    base = [0.100, 0.104, 0.098, 0.101, 0.099, 0.103, 0.102, 0.097]
    for slow in range(8):
        computes = [[value] * 3 for value in base]
        computes[slow] = [0.2] * 3
        verdict = slowest_compute(windows(*computes))
        assert verdict is not None and verdict.rank == slow, slow
    assert slowest_compute(windows(*[[value] * 3 for value in base])) is None


@pytest.mark.timeout(10)
def test_the_window_median_drops_a_single_outlier_step() -> None:
    # one 1 s hiccup in rank 1's last three steps: its median stays 100 ms
    assert slowest_compute(windows([0.1, 0.1, 0.1], [0.1, 1.0, 0.1])) is None
    # two slow steps out of three are a trend, not an outlier
    verdict = slowest_compute(windows([0.1, 0.1, 0.1], [0.1, 1.0, 0.9]))
    assert verdict is not None and verdict.rank == 1
    assert "900 ms" in verdict.reason


@pytest.mark.timeout(10)
def test_only_the_last_window_steps_count() -> None:
    # rank 1 was slow long ago; its last three steps are like everybody's
    old_slow = windows([0.1] * 6, [0.5, 0.5, 0.5, 0.1, 0.1, 0.1])
    assert slowest_compute(old_slow) is None
    wide = slowest_compute(old_slow, AttributionRule(window=6))
    assert wide is not None and wide.rank == 1  # median of 6: (0.5 + 0.1) / 2 = 0.3


# ---------------------------------------------------------------------------- silence


@pytest.mark.timeout(10)
def test_a_silent_rank_beats_a_slow_one() -> None:
    ranks = [RankWindow(0, [0.1]), RankWindow(1, [0.5]),
             RankWindow(2, [0.1], silent_s=5.0, last_seen="computing step 41")]
    assert slowest_compute(ranks) == Verdict(
        1, "rank 1: forward+backward 500 ms vs median 100 ms of the others")
    verdict = slowest(ranks)
    assert verdict == Verdict(2, "rank 2: no report for 5.0 s, last seen computing step 41",
                              silent=True)


@pytest.mark.timeout(10)
def test_the_longest_silent_rank_is_named() -> None:
    ranks = [RankWindow(0, [0.1]),
             RankWindow(1, [0.1], silent_s=4.0, last_seen="computing step 7"),
             RankWindow(2, [0.1], silent_s=12.25,
                        last_seen="in the gradient all-reduce of step 6"),
             RankWindow(3, [0.1], silent_s=3.5, last_seen="computing step 7")]
    verdict = slowest(ranks)
    assert verdict is not None and verdict.silent and verdict.rank == 2
    assert verdict.reason == ("rank 2: no report for 12.2 s, "
                              "last seen in the gradient all-reduce of step 6")


@pytest.mark.timeout(10)
def test_silence_counts_only_past_silent_after_s() -> None:
    rule = AttributionRule(silent_after_s=3.0)
    quiet = [RankWindow(0, [0.1]), RankWindow(1, [0.1], silent_s=3.0, last_seen="x")]
    assert slowest(quiet, rule) is None  # exactly at the limit: not yet silent
    gone = [RankWindow(0, [0.1]), RankWindow(1, [0.1], silent_s=3.01, last_seen="x")]
    verdict = slowest(gone, rule)
    assert verdict is not None and verdict.rank == 1 and verdict.silent


@pytest.mark.timeout(10)
def test_a_silent_rank_never_seen_says_so() -> None:
    verdict = slowest([RankWindow(0, []), RankWindow(1, [], silent_s=9.0)])
    assert verdict is not None and verdict.silent
    assert verdict.reason == "rank 1: no report for 9.0 s, last seen nowhere yet"


# ----------------------------------------------------------------- too little to judge


@pytest.mark.timeout(10)
def test_fewer_than_two_ranks_with_timings_name_nobody() -> None:
    assert slowest_compute([]) is None
    assert slowest_compute(windows([0.5])) is None
    assert slowest_compute(windows([0.5], [])) is None  # rank 1 has no timings yet
    assert slowest(windows([], [0.5], [])) is None
    assert slowest_compute(windows([0.5], [], [0.1])) is not None  # two with timings


# -------------------------------------------------------------------------- the rule


@pytest.mark.timeout(10)
@pytest.mark.parametrize("bad", [
    {"ratio": 1.0}, {"ratio": 0.5}, {"ratio": math.nan}, {"min_gap_s": -0.001},
    {"silent_after_s": 0.0}, {"silent_after_s": -1.0}, {"silent_after_s": math.nan},
    {"window": 0}, {"window": -3},
])
def test_bad_rule_values_raise_config_error_naming_them(bad: dict[str, float]) -> None:
    with pytest.raises(ConfigError) as raised:
        AttributionRule(**bad)  # type: ignore[arg-type]
    (name, value), = bad.items()
    assert f"{name}={value}" in str(raised.value)
    assert "ratio must exceed 1" in str(raised.value)


@pytest.mark.timeout(10)
def test_good_rule_values_are_accepted() -> None:
    rule = AttributionRule(ratio=1.01, min_gap_s=0.0, silent_after_s=0.1, window=1)
    assert (rule.ratio, rule.min_gap_s, rule.silent_after_s, rule.window) == (
        1.01, 0.0, 0.1, 1)


@pytest.mark.timeout(10)
def test_a_nan_min_gap_is_rejected() -> None:
    with pytest.raises(ConfigError):
        AttributionRule(min_gap_s=math.nan)
