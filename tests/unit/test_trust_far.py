"""The far rule's designed false-positive rate (``potluck.trust.far``, pure)."""

from __future__ import annotations

import itertools
import random

import pytest

from potluck.errors import ConfigError
from potluck.trust.far import MOST_IN_A_ROW, FarWatch, needed
from potluck.trust.verdict import FAR, Evidence, Rules, Strikes

MEMBERS = ("w0", "w1", "w2", "w3")


def _step(strikes: Strikes, step: int, far: set[str]) -> list[str]:
    """One judged step: record who was far, add their strikes; who is out now."""
    judged = [m for m in MEMBERS if m not in strikes.quarantined]
    strikes.observe_far(step, judged, far)
    return [m for m in sorted(far) if m in judged
            and strikes.add(Evidence(m, MEMBERS.index(m), step, FAR, "far"))]


def test_needed_is_the_least_run_whose_honest_chance_is_under_the_rate() -> None:
    assert needed(1e-3, 2, 1e-8) == 3  # (1e-3)^3 = 1e-9; (1e-3)^2 = 1e-6 is over
    assert needed(1e-5, 2, 1e-8) == 2  # never fewer than strikes[FAR]
    assert needed(0.05, 2, 1e-8) == 7  # 0.05^7 = 7.8e-10; 0.05^6 = 1.6e-8
    assert needed(0.0, 2, 1e-8) == 2
    assert needed(0.9, 2, 1e-8) == MOST_IN_A_ROW
    for rate in (1e-4, 3e-3, 0.02, 0.1):
        k = needed(rate, 1, 1e-8)
        assert rate ** k <= 1e-8 * (1 + 1e-9) < rate ** (k - 1)


def test_an_attacker_far_every_step_does_not_raise_the_honest_rate() -> None:
    watch = FarWatch(200)
    for step in range(150):
        watch.record(step, MEMBERS, {"w3"} | ({"w1"} if step % 50 == 0 else set()))
    # w3 (far every step) is left out: the honest three were far 3 times in 450 steps
    assert watch.rate() == pytest.approx((3 + 0.1) / (450 + 100))
    assert watch.in_a_row("w3") == 150 and watch.in_a_row("w1") == 0
    # judged itself, w3 is left out, and so is the most often far of the others (w1)
    assert watch.rate("w3") == pytest.approx((0 + 0.1) / (300 + 100))


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
    for step in range(1, 200):  # w1 far every 7th step: never in a row
        out += _step(strikes, step, {"w1"} if step % 7 == 0 else set())
    assert out == [] and strikes.far_needed() == 3
    assert _step(strikes, 200, {"w3"}) == [] and _step(strikes, 201, {"w3"}) == []
    assert _step(strikes, 202, {"w3"}) == ["w3"]  # the third in a row
    assert [e.step for e in strikes.quarantined["w3"]] == [200, 201, 202]
    restored = Strikes(Rules())
    restored.load_state_dict(strikes.state_dict())  # a joiner decides alike
    assert restored.far_needed() == strikes.far_needed()
    assert restored.far.in_a_row("w3") == 3


@pytest.mark.parametrize("rate", [0.002, 0.01, 0.03])
def test_honest_senders_far_at_random_are_not_quarantined(rate: float) -> None:
    """The designed rate: honest senders far independently with probability ``rate``
    each step. Over 20,000 sender-steps the expected count of false quarantines is
    at most 20,000 x 1e-8 (once the rate is learned; 3 in a row from the prior)."""
    for seed in range(3):
        rng = random.Random(seed)
        strikes = Strikes(Rules())
        for step in range(5000):
            assert _step(strikes, step, {m for m in MEMBERS if rng.random() < rate}) == []
        assert strikes.far_needed() == needed(strikes.far.rate(), 2, 1e-8) >= 3


def test_the_old_rule_would_have_quarantined_these_honest_senders() -> None:
    """The same random honest senders under two far strikes within 50 steps: the
    check above can fail."""
    rng = random.Random(0)
    far_steps: dict[str, list[int]] = {m: [] for m in MEMBERS}
    for step in range(5000):
        for m in MEMBERS:
            if rng.random() < 0.01:
                far_steps[m].append(step)
    assert any(b - a < 50 for steps in far_steps.values() for a, b in itertools.pairwise(steps))


@pytest.mark.parametrize("bad", [0, 1, 1.5, -1e-3, True, "1e-8"])
def test_rules_refuse_a_false_positive_rate_that_is_not_a_probability(bad: object) -> None:
    with pytest.raises(ConfigError, match=r"false_positive=.* must be a probability"):
        Rules(false_positive=bad)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="far_window=0 must be an int >= 1"):
        Rules(far_window=0)
