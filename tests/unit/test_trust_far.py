"""The far rule's designed false-positive rate (``potluck.trust.far``, pure)."""

from __future__ import annotations

import random

import pytest

from potluck.errors import ConfigError
from potluck.trust.far import (
    MOST_IN_A_ROW,
    PRIOR_GROSS,
    FarWatch,
    gross_chance,
    needed,
    too_often,
)
from potluck.trust.verdict import FAR, Evidence, Rules, Strikes

MEMBERS = ("w0", "w1", "w2", "w3")


def _step(strikes: Strikes, step: int, far: set[str],
          members: tuple[str, ...] = MEMBERS) -> list[str]:
    """One judged step: record who was far, add their strikes; who is out now."""
    judged = [m for m in members if m not in strikes.quarantined]
    strikes.observe_far(step, judged, far)
    return [m for m in sorted(far) if m in judged
            and strikes.add(Evidence(m, members.index(m), step, FAR, "far"))]


def test_needed_is_the_least_run_whose_honest_chance_is_under_the_rate() -> None:
    assert needed(1e-3, 2, 5e-9) == 3  # (1e-3)^3 = 1e-9; (1e-3)^2 = 1e-6 is over
    assert needed(1e-5, 2, 1e-8) == 2  # never fewer than strikes[FAR]
    assert needed(0.05, 2, 1e-8) == 7  # 0.05^7 = 7.8e-10; 0.05^6 = 1.6e-8
    assert needed(0.0, 2, 1e-8) == 2
    assert needed(0.9, 2, 1e-8) == MOST_IN_A_ROW
    for rate in (1e-4, 3e-3, 0.02, 0.1):
        k = needed(rate, 1, 1e-8)
        assert rate ** k <= 1e-8 * (1 + 1e-9) < rate ** (k - 1)


def test_the_rate_is_an_upper_median_that_fewer_than_half_cannot_move() -> None:
    watch = FarWatch(200)
    for step in range(100):  # w1 and w2 far 5 steps in 100; w3 every step; w0 never
        far = {"w3"} | ({"w1", "w2"} if step % 20 == 0 else set())
        watch.record(step, MEMBERS, far)
    honest = (5 + 0.02) / (100 + 20)
    # judged, w0 is left out; of w1, w2 (honest) and w3 (far always) the upper median
    assert watch.rate("w0") == pytest.approx(honest)
    # w3 judged: the others are w0 (never far), w1, w2: the upper median is honest
    assert watch.rate("w3") == pytest.approx(honest)
    assert watch.in_a_row("w3") == 100 and watch.in_a_row("w1") == 0


def test_colluders_that_are_never_far_cannot_lower_the_rate() -> None:
    """Five senders, two attackers that are never far (a gradient of more samples
    than assigned): the rate an honest sender is judged by stays an honest one."""
    members = ("h0", "h1", "h2", "a0", "a1")
    rng = random.Random(0)
    strikes = Strikes(Rules())
    for step in range(2000):
        far = {m for m in ("h0", "h1", "h2") if rng.random() < 0.05}
        assert _step(strikes, step, far, members) == []
    assert strikes.far.rate("h0") > 0.03  # (a lower median: the never-far ones, 1e-4)
    assert strikes.far_needed("h0") >= 6


def test_a_step_a_member_was_not_judged_in_neither_breaks_nor_extends_its_run() -> None:
    watch = FarWatch(10)
    watch.record(1, MEMBERS, {"w2"})
    watch.record(2, ("w0", "w1", "w3"), set())  # w2 not judged (a step without it)
    watch.record(3, MEMBERS, {"w2"})
    assert watch.in_a_row("w2") == 2
    watch.record(4, MEMBERS, set())
    assert watch.in_a_row("w2") == 0


def test_far_steps_quarantine_in_a_row_only() -> None:
    strikes = Strikes(Rules())
    out: list[str] = []
    for step in range(1, 200):  # w1 far once: an honest blip
        out += _step(strikes, step, {"w1"} if step == 150 else set())
    assert out == [] and strikes.far_needed() == 3
    assert _step(strikes, 200, {"w3"}) == [] and _step(strikes, 201, {"w3"}) == []
    assert _step(strikes, 202, {"w3"}) == ["w3"]  # the third in a row
    assert [e.step for e in strikes.quarantined["w3"]] == [200, 201, 202]
    restored = Strikes(Rules())
    restored.load_state_dict(strikes.state_dict())  # a joiner decides alike
    assert restored.far_needed("w3") == strikes.far_needed("w3")
    assert restored.far.in_a_row("w3") == 3 and restored.far.counts("w1") == (1, 200)


@pytest.mark.parametrize("rate", [0.002, 0.01, 0.03])
def test_honest_senders_far_at_random_are_not_quarantined(rate: float) -> None:
    """Honest senders far independently with probability ``rate`` each step, once the
    window measured it (its first 200 steps are left to the prior): over 3 x 20,000
    sender-steps the expected count of false quarantines is about 6e-4."""
    for seed in range(3):
        rng = random.Random(seed)
        strikes = Strikes(Rules())
        for step in range(200):  # (the window fills; the prior rules it)
            strikes.observe_far(step, MEMBERS, {m for m in MEMBERS if rng.random() < rate})
        for step in range(200, 5200):
            assert _step(strikes, step, {m for m in MEMBERS if rng.random() < rate}) == []
        assert strikes.far_needed() == needed(strikes.far.rate(), 2, 5e-9) >= 3


def test_an_attacker_far_on_most_steps_but_never_long_in_a_row_is_quarantined() -> None:
    strikes = Strikes(Rules())
    out: list[str] = []
    step = 0
    while not out and step < 200:  # w3 far 2 steps in 3, never 3 in a row
        out = _step(strikes, step, {"w3"} if step % 3 else set())
        step += 1
    assert out == ["w3"] and step < 40  # by the count in the window
    assert too_often(10, 20, 0.01, 5e-9) and not too_often(2, 200, 0.01, 5e-9)


def test_a_redone_step_is_recorded_once() -> None:
    watch = FarWatch(20)
    watch.record(1, MEMBERS, {"w1"})
    watch.record(2, MEMBERS, {"w1"})
    watch.record(2, MEMBERS, {"w1"})  # the same step again, after a redo
    assert watch.counts("w1") == (2, 2) and watch.in_a_row("w1") == 2
    for step in range(3, 40):  # the window drops its oldest steps
        watch.record(step, MEMBERS, set())
    assert watch.counts("w1") == (0, 20)


@pytest.mark.parametrize("bad", [0, 1, 1.5, -1e-3, True, "1e-8"])
def test_rules_refuse_a_false_positive_rate_that_is_not_a_probability(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"false_positive=.* must be a probability"):
        Rules(false_positive=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="far_window=8 must be an int >= 16"):
        Rules(far_window=8)


def _round(strikes: Strikes, step: int, far: set[str], gross: set[str]) -> list[str]:
    """One judged round: ``gross`` of the ``far`` ones far beyond ``far_ratio``."""
    judged = [m for m in MEMBERS if m not in strikes.quarantined]
    strikes.observe_far(step, judged, far, gross)
    return [m for m in sorted(far) if m in judged
            and strikes.add(Evidence(m, MEMBERS.index(m), step, FAR, "far"))]


def _rounds(far: str) -> Strikes:
    """A new cohort's strikes after rounds in which w2 was far (``F``), gross (``G``) or
    neither (``.``); asserts nobody was out before the last round."""
    strikes = Strikes(Rules(), gross=True)
    for step, mark in enumerate(far, start=1):
        out = _round(strikes, step, {"w2"} if mark in "FG" else set(),
                     {"w2"} if mark == "G" else set())
        assert out == ([] if step < len(far) else out), (far, step, out)
    return strikes


@pytest.mark.parametrize("pattern, out", [
    ("G", False),  # one round never does (strikes[FAR] = 2)
    ("GG", True), ("FG", True), ("GF", True),  # 2 * 1e-3 * 1e-6 + 1e-12 <= 1e-8 / 3
    ("FF", False), ("FFF", True),  # far alone: the third in a row, (1e-3)^3
    ("G.G", False),  # a round that is not far breaks the run
])
def test_a_gross_round_with_a_far_one_quarantines_a_new_cohorts_member(
        pattern: str, out: bool) -> None:
    strikes = _rounds(pattern)
    assert ("w2" in strikes.quarantined) is out
    if out:  # the evidence: the run's last rounds (2 for a gross pair, 3 in a row)
        steps = [e.step for e in strikes.quarantined["w2"]]
        assert steps == list(range(len(pattern) - len(steps) + 1, len(pattern) + 1))
        assert len(steps) == (3 if pattern == "FFF" else 2)


def test_the_gross_chance_sums_the_patterns_with_a_gross_round() -> None:
    r, g = 1e-3, 1e-6
    assert gross_chance(r, g, 2) == pytest.approx(2 * r * g + g * g)
    assert gross_chance(r, g, 3) == pytest.approx(3 * r * r * g + 3 * r * g * g + g ** 3)
    assert gross_chance(r, 0.0, 2) == 0.0


def test_every_step_marks_no_gross_step_and_keeps_its_two_rules() -> None:
    """Without gross steps (every-step trust) the rule never applies and each of the
    two rules holds half of ``false_positive``; under rounds a third each."""
    assert Strikes(Rules()).alpha == pytest.approx(5e-9)
    assert Strikes(Rules(), gross=True).alpha == pytest.approx(1e-8 / 3)
    strikes = Strikes(Rules())  # (a caller that marks gross steps, without the rule)
    assert _round(strikes, 1, {"w2"}, {"w2"}) == [] and _round(strikes, 2, {"w2"}, {"w2"}) == []
    assert _round(strikes, 3, {"w2"}, {"w2"}) == ["w2"]  # in a row, as before


def test_a_gross_step_outside_the_far_ones_is_not_recorded() -> None:
    """A gross sender is far too: a caller's gross set outside ``far`` is dropped."""
    watch = FarWatch(20)
    watch.record(1, MEMBERS, {"w2"}, {"w1", "w2"})
    assert watch.state_dict()["steps"] == [[1, list(MEMBERS), ["w2"], ["w2"]]]
    assert watch.run("w1") == [] and watch.run("w2") == [True]


def test_a_redone_step_replaces_its_gross_record() -> None:
    watch = FarWatch(20)
    pair = ("w0", "w1")
    watch.record(1, pair, {"w1"}, {"w1"})
    assert watch.gross_rate("w0") == pytest.approx((1 + PRIOR_GROSS) / 21)  # w1's rate
    watch.record(1, pair, {"w1"}, set())  # the same step again, after a redo
    assert watch.run("w1") == [False]
    assert watch.gross_rate("w0") == pytest.approx(PRIOR_GROSS / 21)  # (its count undone)


@pytest.mark.parametrize("rate", [0.02, 0.05])
def test_honest_senders_gross_at_random_are_not_quarantined(rate: float) -> None:
    """A workload whose honest rounds are far at ``rate``, half of those gross: once the
    window measured both rates, the rule's honest chance is theirs, and nobody is out.
    (Where honest rounds are gross at 0.5% a round, the window of the others saw none
    in about a third of its draws, and two in a row then quarantine: the design's
    limit, ``docs/trust.md``.)"""
    for seed in range(3):
        rng = random.Random(seed)
        strikes = Strikes(Rules(), gross=True)

        def draw(rng: random.Random = rng) -> tuple[set[str], set[str]]:
            far = {m for m in MEMBERS if rng.random() < rate}
            return far, {m for m in far if rng.random() < 0.5}

        for step in range(200):
            strikes.observe_far(step, MEMBERS, *draw())
        seen = 0
        for step in range(200, 3200):
            far, gross = draw()
            seen += len(gross)
            assert _round(strikes, step, far, gross) == []
        assert seen > 3000 * len(MEMBERS) * rate / 4  # (the rounds were there to judge)


def test_the_gross_record_survives_a_state_dict_and_an_older_one_loads() -> None:
    strikes = Strikes(Rules(), gross=True)
    _round(strikes, 1, {"w3"}, {"w3"})
    restored = Strikes(Rules(), gross=True)
    restored.load_state_dict(strikes.state_dict())
    assert restored.far.run("w3") == [True]
    assert _round(restored, 2, {"w3"}, {"w3"}) == ["w3"]  # a joiner decides alike
    older = FarWatch(20)
    older.load_state_dict({"steps": [[1, list(MEMBERS), ["w3"]]]})  # (no gross column)
    assert older.run("w3") == [False]
